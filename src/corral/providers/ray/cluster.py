"""A real Ray cluster on loopback: a head and worker nodes as ``ray start`` processes.

For tests, benchmarks and trying the Ray provider on one machine. Each node runs
``ray start --block`` in a session of its own, with its own temp dir under one
private root, on its own loopback address (``127.0.0.2`` for the head, then
``127.0.0.3`` ...: Ray turns ``127.0.0.1`` into the machine's external address).
Usage statistics are off (``RAY_USAGE_STATS_ENABLED=0``), ``HOME`` points into the
private root (Ray writes an auth token under it) and token auth is disabled
(``RAY_AUTH_MODE=disabled``): the cluster is reachable only on loopback.

Nodes are stopped by the process ids of their sessions (every daemon ``ray start``
starts stays in its session), never by process name: other Ray clusters on the same
machine are left alone. :meth:`LocalCluster.kill_raylet` SIGKILLs one node's raylet
(the node-loss fault); :meth:`add_worker` starts a node again.

``worker_cpus`` pins each worker node to CPUs of its own: its ``ray start`` gets that
CPU affinity before it runs, and every process it starts inherits it (the raylet, the
node actor's worker, the node's strict sandboxes and every process in them), so "each
node has its own core" holds on one machine. The head and any driver are not pinned.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from corral.core.errors import ProviderError

__all__ = ["LocalCluster", "LocalNode", "cpus_allowed", "ray_env"]


def ray_env(root: str) -> dict[str, str]:
    """The environment for a node, or a driver, of a cluster rooted at ``root``."""
    env = dict(os.environ)
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "HOME": root,
                "RAY_DISABLE_DOCKER_CPU_WARNING": "1"})
    return env


def cpus_allowed(pid: int) -> str | None:
    """Process ``pid``'s ``Cpus_allowed_list`` ("0", "0-1" ...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Cpus_allowed_list:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


@dataclass(slots=True)
class LocalNode:
    """One ``ray start --block`` process (the session leader) and its address."""

    ip: str
    proc: subprocess.Popen[bytes]
    log: str
    head: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    #: the CPUs the node's processes may run on (None: not pinned)
    cpus: frozenset[int] | None = None

    def session_pids(self) -> list[int]:
        """Every live process of the node's session (the leader's pid is the session id)."""
        sid = self.proc.pid
        out = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z":
                out.append(int(name))
        return out

    def affinities(self) -> dict[str, int]:
        """The CPU lists the node's session processes may run on, with how many have each
        (one entry, its pin, when pinned)."""
        out: dict[str, int] = {}
        for pid in self.session_pids():
            got = cpus_allowed(pid)
            if got is not None:
                out[got] = out.get(got, 0) + 1
        return out

    def raylet_pid(self) -> int | None:
        """The pid of this node's raylet (the process of its session running the raylet
        binary), or None."""
        for pid in self.session_pids():
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
            if os.path.basename(exe) == "raylet":
                return pid
        return None


class LocalCluster:
    """A head and ``workers`` worker nodes on 127.0.0.x (see the module doc).

    Args:
        workers: worker nodes to start (each ``num_cpus`` CPUs).
        num_cpus: CPUs each node offers Ray (the head too).
        head_cpus: CPUs the head offers (default ``num_cpus``; 0 keeps work off it).
        port: the head's GCS port.
        object_store_mb: each node's object store (Ray's default takes 30 % of RAM).
        root: the private root dir (default: a fresh one under /tmp, removed by stop).
        worker_resource: a custom resource every worker offers (1 unit), none on the head:
            ``RayProvider(node_resource=...)`` then places sandboxes on workers only.
        worker_cpus: pin the i-th worker node started to CPU ``worker_cpus[i % len]``
            (its whole process tree; see the module doc). Default: not pinned.
    """

    def __init__(self, *, workers: int = 2, num_cpus: int = 1, head_cpus: int | None = None,
                 port: int = 6390, object_store_mb: int = 100, root: str | None = None,
                 first_ip: int = 2, worker_resource: str | None = "corral",
                 worker_cpus: list[int] | None = None) -> None:
        if worker_cpus is not None:
            have = os.sched_getaffinity(0)
            bad = [c for c in worker_cpus if c not in have]
            if not worker_cpus or bad:
                raise ProviderError(f"worker_cpus {worker_cpus!r}: CPUs {bad} are not "
                                    f"available here (this process may use {sorted(have)})")
        self.worker_cpus = list(worker_cpus) if worker_cpus else None
        self._started_workers = 0
        self.n_workers = workers
        self.num_cpus = num_cpus
        self.head_cpus = num_cpus if head_cpus is None else head_cpus
        self.port = port
        self.object_store_mb = object_store_mb
        self._own_root = root is None
        # short: Ray's unix socket paths must fit in 107 bytes
        self.root = root or tempfile.mkdtemp(prefix="crl-", dir="/tmp")
        self.first_ip = first_ip
        self.worker_resource = worker_resource
        self.head: LocalNode | None = None
        self.workers: list[LocalNode] = []
        self._next_ip = first_ip + 1

    @property
    def address(self) -> str:
        return f"127.0.0.{self.first_ip}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return ray_env(self.root)

    def _ray_bin(self) -> str:
        here = os.path.join(os.path.dirname(sys.executable), "ray")
        return here if os.path.exists(here) else "ray"

    def _start(self, ip: str, args: list[str], *, cpus: int, head: bool,
               uid: int | None = None, pin: frozenset[int] | None = None) -> LocalNode:
        tmp = os.path.join(self.root, ip)
        os.makedirs(tmp, exist_ok=True)
        log = os.path.join(self.root, f"{ip}.log")
        argv = [self._ray_bin(), "start", "--block", f"--node-ip-address={ip}",
                f"--num-cpus={cpus}", f"--temp-dir={tmp}", "--disable-usage-stats",
                f"--object-store-memory={self.object_store_mb * 1024 * 1024}", *args]
        env = self.env
        if uid is not None:  # a node run by an unprivileged user (its own HOME, temp dir)
            os.chmod(self.root, 0o711)
            os.chown(tmp, uid, uid)
            env = {**env, "HOME": tmp}
            argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
        if pin is not None:  # set before exec: every process of the node inherits it
            argv = ["taskset", "--cpu-list", ",".join(map(str, sorted(pin))), *argv]
        with open(log, "ab") as fh:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                                    env=env, start_new_session=True, cwd=tmp)
        return LocalNode(ip=ip, proc=proc, log=log, head=head, cpus=pin)

    def _next_pin(self) -> frozenset[int] | None:
        if self.worker_cpus is None:
            return None
        cpu = self.worker_cpus[self._started_workers % len(self.worker_cpus)]
        self._started_workers += 1
        return frozenset({cpu})

    def start(self, timeout: float = 90.0) -> LocalCluster:
        """Start the head, then the workers; return once every node is alive in Ray."""
        ip = f"127.0.0.{self.first_ip}"
        self.head = self._start(ip, ["--head", f"--port={self.port}",
                                     "--include-dashboard=false"],
                                cpus=self.head_cpus, head=True)
        self._wait_log(self.head, timeout)
        for _ in range(self.n_workers):
            self.add_worker(wait=False)
        for w in self.workers:
            self._wait_log(w, timeout)
        return self

    def _worker_args(self) -> list[str]:
        args = [f"--address={self.address}"]
        if self.worker_resource:
            args.append(f'--resources={{"{self.worker_resource}": 1}}')
        return args

    def add_worker(self, *, wait: bool = True, timeout: float = 90.0,
                   uid: int | None = None) -> LocalNode:
        """Start one more worker node on the next loopback address; ``uid``: run it as that
        unprivileged user (as root only), a node whose strict provider has no cgroup."""
        ip = f"127.0.0.{self._next_ip}"
        self._next_ip += 1
        node = self._start(ip, self._worker_args(), cpus=self.num_cpus, head=False, uid=uid,
                           pin=self._next_pin())
        self.workers.append(node)
        if wait:
            self._wait_log(node, timeout)
        return node

    def restart_worker(self, node: LocalNode, *, timeout: float = 90.0) -> LocalNode:
        """Start a worker again on ``node``'s address (after it was killed)."""
        self.stop_node(node)
        again = self._start(node.ip, self._worker_args(), cpus=self.num_cpus, head=False,
                            pin=node.cpus)
        self.workers[self.workers.index(node)] = again
        self._wait_log(again, timeout)
        return again

    @staticmethod
    def _wait_log(node: LocalNode, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(node.log, "rb") as fh:
                if b"block forever" in fh.read():
                    return
            if node.proc.poll() is not None:
                break
            time.sleep(0.1)
        with open(node.log, "rb") as fh:
            tail = fh.read()[-2000:].decode(errors="replace")
        raise ProviderError(f"ray node {node.ip} did not start: {tail}")

    def kill_raylet(self, node: LocalNode) -> int:
        """SIGKILL ``node``'s raylet (the node-loss fault); returns its pid."""
        pid = node.raylet_pid()
        if pid is None:
            raise ProviderError(f"no raylet found for node {node.ip}")
        os.kill(pid, signal.SIGKILL)
        return pid

    @staticmethod
    def stop_node(node: LocalNode, grace: float = 3.0) -> None:
        """End every process of the node's session: SIGTERM, then SIGKILL after ``grace``."""
        pids = node.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and node.session_pids():
            time.sleep(0.1)
        for pid in node.session_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            node.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        """Stop every node (workers first) and remove the private root."""
        for w in self.workers:
            self.stop_node(w)
        self.workers = []
        if self.head is not None:
            self.stop_node(self.head)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
