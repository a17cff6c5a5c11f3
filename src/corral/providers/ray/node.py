"""The node actor: one per Ray node, long-lived, hosting that node's strict provider.

:class:`NodeHost` is a plain class; the driver makes it a Ray actor (detached, named
``corral-node-<node id>`` in namespace ``corral``, pinned to its node, zero CPUs) so
every driver on the cluster shares it and it outlives any one of them. It owns a
:class:`~corral.providers.linux.LinuxProvider` with its warm spares, the sandboxes it
built and the processes running in them, and serves them by sandbox and process id.

Leases: every sandbox belongs to an *owner* (one driver-side provider). The owner
renews its lease while it lives; when a lease passes unrenewed (the driver died, or
lost the cluster) the actor destroys every sandbox of that owner. So a dead caller's
sandboxes never outlive it by more than a lease.

Every method returns a tagged reply (:mod:`._wire`), never raises across Ray.
Untrusted code never runs in this process: only the node's strict sandboxes run it.

The calls on sandboxes and processes (:data:`CHANNEL_METHODS`) are served over the
actor's data channel (:mod:`._channel`: a TCP listener on the node's IP, authenticated by
a per-actor secret a driver gets through Ray once), not Ray: a Ray actor call costs
milliseconds, a channel call a small fraction of one. Placement, creation, leases and
node reports stay on Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from corral.core.contract import (
    Sandbox,
    SandboxProvider,
    SupportsForkEntry,
    SupportsPause,
    SupportsProcessCount,
    SupportsRestore,
    SupportsSnapshot,
    SupportsStreamingExec,
    SupportsWarmFork,
)
from corral.core.errors import ConfigInvalidError, LevelNotSupportedError, ProviderError
from corral.core.result import RunResult
from corral.core.spec import ExecOpts, ProcessOpts, SandboxLimits, SandboxSpec, SnapshotHandle
from corral.providers.ray._wire import Reply, err, ok

__all__ = ["NodeHost"]

#: the methods a driver calls over the data channel (the hot path)
CHANNEL_METHODS = frozenset({"exec", "exec_start", "start", "write", "poll", "kill", "count",
                             "read_file", "write_file", "destroy", "lifecycle", "preload",
                             "files"})
#: the contract's file operations ``files`` relays (capability "files")
_FILE_OPS: Final = frozenset({"list_files", "get_info", "exists", "make_dir", "remove"})
#: the most output of one stream one poll hands out (the rest waits for the next poll):
#: a sandbox's output reaches the driver in bounded pieces
POLL_MAX_BYTES = 1 << 20
_LIMIT_PROBES = {"mem_mb": 64, "cpu_ms": 1000, "disk_mb": 16, "max_processes": 16}
#: how long a finished process's record waits for its last poll
_UNPOLLED_S = 60.0
#: Ray's fixed default ports (GCS, dashboard and job API, dashboard agent, client server,
#: object manager, metrics) and its default worker port range (core workers' gRPC
#: servers, bound to every address): refused on the node's own addresses whatever a
#: sandbox's policy lists, beside the ports each node reports (``_ray_services``)
_RAY_PORTS: Final = frozenset({6379, 8265, 8076, 10001, 52365, 52366, 44217, 44227}
                              | set(range(10002, 20000)))
#: the cluster's services are looked up again at most this often
_NEVER_REFRESH_S = 2.0


@dataclass(slots=True)
class _Box:
    sb: Sandbox
    owner: str
    tenant: str
    procs: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Proc:
    """A started process or streaming exec: output buffered until the driver polls."""

    sid: str
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    out_eof: bool = False
    err_eof: bool = False
    final: Reply | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    handle: Any = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    ended_at: float = 0.0
    #: stdin operations are applied in the driver's order (Ray does not order the calls
    #: of an async actor): the sequence number of the next one
    next_seq: int = 0
    turn: asyncio.Condition = field(default_factory=asyncio.Condition)


class NodeHost:
    """The body of a node actor (see the module doc)."""

    def __init__(self, node_id: str, *, spares: int = 1, provider: str = "linux") -> None:
        self.node_id = node_id
        self._spares = spares
        self._provider_name = provider
        self._p: SandboxProvider | None = None
        self._why_not = ""
        self._boxes: dict[str, _Box] = {}
        self._procs: dict[str, _Proc] = {}
        self._leases: dict[str, float] = {}   # owner -> deadline (monotonic)
        self._reaper: asyncio.Task[None] | None = None
        self._limits: frozenset[str] | None = None
        self._chan: Any = None
        self.reaped = 0
        from corral.providers.linux.host.egress import NeverReach
        #: the cluster's own services (node addresses, Ray's ports): every sandbox's
        #: egress proxy on this node refuses them whatever its policy lists
        self.never = NeverReach(what="a service of the Ray cluster")
        self._never_at = 0.0     # when it was last filled (monotonic; 0: never)
        self._never_lock: asyncio.Lock | None = None

    # -- set-up ------------------------------------------------------------------------
    def _where(self) -> str:
        return f"node {self.node_id[:12]}"

    def _provider(self) -> SandboxProvider:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())
        if self._p is None:
            if self._why_not:
                raise LevelNotSupportedError("strict", (), self._why_not,
                                             missing=f"a usable provider on {self._where()}")
            from corral.providers import get_provider_class
            try:
                cls = get_provider_class(self._provider_name)
                self._p = (cls(spares=self._spares, egress_never=self.never)
                           if self._provider_name == "linux" else cls())
            except Exception as e:
                self._why_not = f"{type(e).__name__}: {e}"
                raise
        return self._p

    def _limits_enforced(self, p: SandboxProvider) -> frozenset[str]:
        """The limit fields this node's provider enforces: each planned alone (no launch)."""
        if self._limits is None:
            plan = getattr(p, "plan", None)
            got = set()
            for name, value in _LIMIT_PROBES.items():
                if plan is None:
                    break
                try:
                    plan(SandboxSpec(limits=SandboxLimits(**{name: value})))
                except (LevelNotSupportedError, ConfigInvalidError):
                    continue
                got.add(name)
            self._limits = frozenset(got)
        return self._limits

    async def info(self) -> Reply:
        """What this node can give: levels, limits, capabilities, the host's strict rows
        (``corral doctor``'s report for this node), spares, live sandboxes by tenant."""
        try:
            report = _doctor()
            levels: list[str] = []
            caps: list[str] = []
            limits: list[str] = []
            default_mem = None
            spares = 0
            try:
                p = self._provider()
                levels = sorted(lv.value for lv in p.levels)
                caps = sorted(p.capabilities)
                limits = sorted(self._limits_enforced(p))
                opts = getattr(p, "options", None)
                default_mem = getattr(getattr(opts, "default_limits", None), "mem_mb", None)
                spares = _idle_spares(p)
            except Exception as e:
                self._why_not = self._why_not or f"{type(e).__name__}: {e}"
            usable = [r for r in report.get("providers", []) if r.get("name") == "linux"]
            if usable and not usable[0].get("usable"):
                self._why_not = self._why_not or str(usable[0].get("summary", "not usable"))
                levels = []
            tenants: dict[str, int] = {}
            for box in self._boxes.values():
                tenants[box.tenant] = tenants.get(box.tenant, 0) + 1
            return ok({
                "node_id": self.node_id, "hostname": socket.gethostname(), "pid": os.getpid(),
                "levels": levels, "why_not": self._why_not, "limits": limits,
                "capabilities": caps, "default_mem_mb": default_mem, "spares": spares,
                "live": len(self._boxes), "tenants": tenants, "procs": len(self._procs),
                "reaped": self.reaped, "doctor": report,
                "host_pids": self._host_pids(),
            })
        except Exception as e:
            return err(e, where=self._where())

    def _host_pids(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for sid, box in self._boxes.items():
            fn = getattr(box.sb, "host_pids", None)
            out[sid] = list(fn()) if callable(fn) else []
        return out

    # -- the data channel ------------------------------------------------------------------
    async def channel(self) -> Reply:
        """``(host, port, secret)`` of this actor's data channel, started on first use on
        this node's IP (the address Ray knows the node by; never a wildcard)."""
        try:
            if self._chan is None:
                from corral.providers.ray._channel import ChannelServer
                self._chan = ChannelServer(self._serve_call, where=self._where())
            host, port = await self._chan.start(_node_ip())
            return ok((host, port, self._chan.secret))
        except Exception as e:
            return err(e, where=self._where())

    async def _serve_call(self, method: str, args: tuple[Any, ...]) -> Reply:
        """One authenticated channel request: a method of :data:`CHANNEL_METHODS`."""
        if method not in CHANNEL_METHODS:
            return err(ProviderError(f"{method!r} is not served on the channel"),
                       where=self._where())
        try:
            reply: Reply = await getattr(self, method)(*args)
            return reply
        except Exception as e:  # wrong arguments
            return err(e, where=self._where())

    # -- leases ------------------------------------------------------------------------
    async def renew(self, owner: str, lease_s: float) -> Reply:
        """Extend ``owner``'s lease; returns the ids of its live sandboxes here."""
        self._leases[owner] = time.monotonic() + lease_s
        return ok(sorted(s for s, b in self._boxes.items() if b.owner == owner))

    async def release(self, owner: str) -> Reply:
        """Destroy every sandbox of ``owner`` and forget its lease (its provider closed)."""
        self._leases.pop(owner, None)
        for sid in [s for s, b in self._boxes.items() if b.owner == owner]:
            await self._destroy(sid, orphaned=True)
        return ok(None)

    async def _reap_loop(self) -> None:
        while True:
            try:
                await self._reap_once()
            except Exception:  # never let one failure stop the reaping
                pass

    async def _reap_once(self) -> None:
        """Destroy the sandboxes of every expired lease; drop stale process records;
        keep the cluster's services current for the sandboxes' proxies (nodes join)."""
        await asyncio.sleep(0.25)
        if self._never_at and any(b.sb.spec.network.kind != "none"
                                  for b in self._boxes.values()):
            with contextlib.suppress(ProviderError):
                await self._refresh_never()
        now = time.monotonic()
        owners = {b.owner for b in self._boxes.values()}
        for owner in owners - set(self._leases):  # a sandbox never outlives a lease
            self._leases[owner] = now
        for owner in [o for o, t in self._leases.items() if t < now]:
            del self._leases[owner]
            for sid in [s for s, b in self._boxes.items() if b.owner == owner]:
                self.reaped += 1
                try:
                    await asyncio.wait_for(self._destroy(sid, orphaned=True), 20.0)
                except Exception:  # keep reaping the others
                    pass
        for pid in [p for p, r in self._procs.items()
                    if r.ended_at and now - r.ended_at > _UNPOLLED_S]:
            del self._procs[pid]

    # -- the cluster's services, never reachable from a sandbox ---------------------------
    async def _refresh_never(self, *, force: bool = False) -> None:
        """Fill :attr:`never` with every node's address (all ports) and Ray's ports (on
        this host's own addresses); at most every ``_NEVER_REFRESH_S`` unless forced.
        Raises ProviderError if Ray cannot say (the caller refuses a network then)."""
        if self._never_lock is None:
            self._never_lock = asyncio.Lock()
        async with self._never_lock:
            if not force and time.monotonic() - self._never_at < _NEVER_REFRESH_S:
                return
            try:
                addrs, ports = await asyncio.to_thread(_ray_services)
            except Exception as e:
                raise ProviderError(f"cannot list the Ray cluster's services on "
                                    f"{self._where()} to keep them from sandboxes: "
                                    f"{type(e).__name__}: {e}") from None
            if self._chan is not None and self._chan.address is not None:
                ports.add(self._chan.address[1])  # the data channel, on every local address
            addrs.add(_node_ip())
            self.never.update(addrs, ports)
            self._never_at = time.monotonic()

    # -- sandboxes -----------------------------------------------------------------------
    async def create(self, owner: str, lease_s: float, spec: SandboxSpec) -> Reply:
        try:
            p = self._provider()
            if spec.network.kind != "none":  # fail closed: no network without the deny
                await self._refresh_never(force=not self._never_at)
            if owner not in self._leases:
                self._leases[owner] = time.monotonic() + lease_s
            sb = await p.create(spec)
            sid = f"{self.node_id[:8]}-{sb.id}"
            self._boxes[sid] = _Box(sb=sb, owner=owner, tenant=spec.tenant_id)
            return ok({"sid": sid, "spares": _idle_spares(p), "live": len(self._boxes)})
        except Exception as e:
            return err(e, where=self._where())

    def _box(self, sid: str) -> _Box:
        box = self._boxes.get(sid)
        if box is None:
            raise ProviderError(f"sandbox {sid} is gone from {self._where()} (destroyed, or "
                                "reaped when its owner's lease expired)")
        return box

    async def _destroy(self, sid: str, *, orphaned: bool = False) -> None:
        """Destroy a sandbox. Its process records stay for their owner's last poll, or go
        with it when the owner is gone (``orphaned``: nobody will poll them)."""
        box = self._boxes.pop(sid, None)
        if box is None:
            return
        try:
            await box.sb.destroy()
        finally:
            if orphaned:
                for pid in box.procs:
                    rec = self._procs.pop(pid, None)
                    for t in rec.tasks if rec is not None else ():
                        t.cancel()

    async def destroy(self, sid: str) -> Reply:
        try:
            await self._destroy(sid)
            return ok(None)
        except Exception as e:
            return err(e, where=self._where())

    async def exec(self, sid: str, argv: Sequence[str], opts: ExecOpts | None) -> Reply:
        try:
            r: RunResult = await self._box(sid).sb.exec(argv, opts)
            return ok(r)
        except Exception as e:
            return err(e, where=self._where())

    async def write_file(self, sid: str, path: str, data: bytes | str) -> Reply:
        try:
            await self._box(sid).sb.write_file(path, data)
            return ok(None)
        except Exception as e:
            return err(e, where=self._where())

    async def read_file(self, sid: str, path: str) -> Reply:
        try:
            return ok(await self._box(sid).sb.read_file(path))
        except Exception as e:
            return err(e, where=self._where())

    async def files(self, sid: str, op: str, path: str, flag: bool = False) -> Reply:
        """One of the node's sandbox's file operations (``flag``: make_dir's ``parents``,
        remove's ``recursive``); its OSError goes back as that OSError."""
        try:
            if op not in _FILE_OPS or not isinstance(path, str):
                raise ProviderError(f"no file operation {str(op)[:40]!r}")
            sb = self._box(sid).sb
            if op == "make_dir":
                return ok(await sb.make_dir(path, parents=bool(flag)))
            if op == "remove":
                await sb.remove(path, recursive=bool(flag))
                return ok(None)
            return ok(await getattr(sb, op)(path))
        except Exception as e:
            return err(e, where=self._where())

    async def lifecycle(self, sid: str, op: str, handle: SnapshotHandle | None = None) -> Reply:
        """snapshot / restore / pause / resume of the node's sandbox."""
        try:
            sb = self._box(sid).sb
            if op == "snapshot" and isinstance(sb, SupportsSnapshot):
                return ok(await sb.snapshot())
            if op == "restore" and isinstance(sb, SupportsRestore) and handle is not None:
                await sb.restore(handle)
                return ok(None)
            if op in ("pause", "resume") and isinstance(sb, SupportsPause):
                await (sb.pause() if op == "pause" else sb.resume())
                return ok(None)
            raise ProviderError(f"{op} is not offered on {self._where()}")
        except Exception as e:
            return err(e, where=self._where())

    async def preload(self, modules: Sequence[str], entries: Sequence[str]) -> Reply:
        try:
            p = self._provider()
            if not isinstance(p, SupportsWarmFork):
                return ok([*modules, *entries])
            return ok(await p.preload_python(modules, fork_entries=entries))
        except Exception as e:
            return err(e, where=self._where())

    # -- processes and streaming execs -----------------------------------------------------
    async def start(self, sid: str, argv: Sequence[str], opts: ProcessOpts | None,
                    entry: str | None = None) -> Reply:
        """Start a process (``entry``: a fork of that registered entry, ``argv`` its args);
        its output is buffered for :meth:`poll`. Returns its id."""
        try:
            box = self._box(sid)
            if entry is not None:
                if not isinstance(box.sb, SupportsForkEntry):
                    raise ConfigInvalidError("entry", f"no warm-fork on {self._where()}")
                h = await box.sb.start_python_fork(argv, opts, entry=entry)
            else:
                h = await box.sb.start_process(argv, opts)
            pid, rec = self._new_proc(sid, box)
            rec.handle = h
            loop = asyncio.get_running_loop()
            rec.tasks = [loop.create_task(self._pump(rec, h.stdout, 1)),
                         loop.create_task(self._pump(rec, h.stderr, 2)),
                         loop.create_task(self._wait(rec, h))]
            return ok(pid)
        except Exception as e:
            return err(e, where=self._where())

    async def exec_start(self, sid: str, argv: Sequence[str], opts: ExecOpts | None) -> Reply:
        """A streaming exec: output is buffered for :meth:`poll` as it comes, the result
        (or error) is the final poll's."""
        try:
            box = self._box(sid)
            sb = box.sb
            if not isinstance(sb, SupportsStreamingExec):
                raise ProviderError(f"streaming exec is not offered on {self._where()}")
            pid, rec = self._new_proc(sid, box)
            rec.out_eof = rec.err_eof = True  # output arrives through the sink

            def sink(fd: int, chunk: bytes) -> None:
                (rec.out if fd == 1 else rec.err).extend(chunk)
                rec.changed.set()

            async def run() -> None:
                try:
                    rec.final = ok(await sb.exec_streaming(argv, opts, on_output=sink))
                except Exception as e:
                    rec.final = err(e, where=self._where())
                rec.ended_at = time.monotonic()
                rec.changed.set()

            rec.tasks = [asyncio.get_running_loop().create_task(run())]
            return ok(pid)
        except Exception as e:
            return err(e, where=self._where())

    def _new_proc(self, sid: str, box: _Box) -> tuple[str, _Proc]:
        pid = uuid.uuid4().hex[:16]
        rec = _Proc(sid=sid)
        self._procs[pid] = rec
        box.procs.add(pid)
        return pid, rec

    @staticmethod
    async def _pump(rec: _Proc, it: Any, fd: int) -> None:
        buf = rec.out if fd == 1 else rec.err
        try:
            async for chunk in it:
                buf.extend(chunk)
                rec.changed.set()
        finally:
            if fd == 1:
                rec.out_eof = True
            else:
                rec.err_eof = True
            rec.changed.set()

    async def _wait(self, rec: _Proc, h: Any) -> None:
        try:
            rec.final = ok(await h.wait())
        except Exception as e:
            rec.final = err(e, where=self._where())
        rec.ended_at = time.monotonic()
        rec.changed.set()

    async def poll(self, pid: str, wait_s: float, linger_s: float = 0.003) -> Reply:
        """Output since the last poll, EOFs and, once the process ended and its output is
        drained, its final reply (``done``); waits up to ``wait_s`` for something new, then
        up to ``linger_s`` more for the end (a short run's output and end come in one
        reply: one round trip instead of several)."""
        rec = self._procs.get(pid)
        if rec is None:
            return err(ProviderError(f"process {pid} is gone from {self._where()}"),
                       where=self._where())
        if not (rec.out or rec.err or self._done(rec)):
            rec.changed.clear()
            try:
                await asyncio.wait_for(rec.changed.wait(), wait_s)
            except TimeoutError:
                pass
        loop = asyncio.get_running_loop()
        until = loop.time() + linger_s
        while not self._done(rec) and (left := until - loop.time()) > 0:
            rec.changed.clear()
            try:
                await asyncio.wait_for(rec.changed.wait(), left)
            except TimeoutError:
                break
        out, errb = bytes(rec.out[:POLL_MAX_BYTES]), bytes(rec.err[:POLL_MAX_BYTES])
        del rec.out[:POLL_MAX_BYTES]
        del rec.err[:POLL_MAX_BYTES]
        drained = not (rec.out or rec.err)
        done = drained and self._done(rec)
        pc = None
        if done:
            self._procs.pop(pid, None)
            box = self._boxes.get(rec.sid)
            if box is not None:
                box.procs.discard(pid)
                pc = _count(box.sb)
        return ok({"out": out, "err": errb, "out_eof": rec.out_eof and not rec.out,
                   "err_eof": rec.err_eof and not rec.err,
                   "final": rec.final if done else None, "pc": pc})

    async def count(self, sid: str) -> Reply:
        """``process-count`` of a sandbox: (whether it serves, its processes besides its
        agent), or None where the node's provider does not offer it."""
        try:
            return ok(_count(self._box(sid).sb))
        except Exception as e:
            return err(e, where=self._where())

    @staticmethod
    def _done(rec: _Proc) -> bool:
        return rec.final is not None and rec.out_eof and rec.err_eof

    async def write(self, pid: str, seq: int, data: bytes, close: bool) -> Reply:
        """Write ``data`` to the process's stdin (then close it, with ``close``), as the
        driver's ``seq``-th stdin operation: operations are applied in that order."""
        rec = self._procs.get(pid)
        if rec is None or rec.handle is None:
            return err(ProviderError(f"process {pid} is gone from {self._where()}"),
                       where=self._where())
        async with rec.turn:
            await rec.turn.wait_for(lambda: rec.next_seq >= seq)
        try:
            if data:
                await rec.handle.stdin.write(data)
            if close:
                await rec.handle.stdin.close()
            return ok(None)
        except Exception as e:
            return err(e, where=self._where())
        finally:
            async with rec.turn:
                rec.next_seq = max(rec.next_seq, seq + 1)
                rec.turn.notify_all()

    async def kill(self, pid: str) -> Reply:
        try:
            rec = self._procs.get(pid)
            if rec is not None and rec.handle is not None:
                await rec.handle.kill()
            return ok(None)
        except Exception as e:
            return err(e, where=self._where())

    async def shutdown(self) -> Reply:
        """Destroy every sandbox and close the provider (the actor may then be killed)."""
        for sid in list(self._boxes):
            try:
                await self._destroy(sid)
            except Exception:  # destroy the others
                pass
        if self._p is not None:
            await self._p.aclose()
            self._p = None
        if self._chan is not None:
            await self._chan.close()
            self._chan = None
        return ok(None)


def _node_ip() -> str:
    """This node's IP as Ray knows it (127.0.0.x on a local cluster)."""
    import ray  # type: ignore[import-untyped,unused-ignore]
    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call,unused-ignore]


def _ray_services() -> tuple[set[str], set[int]]:
    """(every node's address, Ray's ports): from the GCS's node table (blocking)."""
    import ray  # type: ignore[import-untyped,unused-ignore]
    addrs: set[str] = set()
    ports: set[int] = set(_RAY_PORTS)
    gcs = str(ray.get_runtime_context().gcs_address)  # type: ignore[no-untyped-call,unused-ignore]
    host, _, port = gcs.rpartition(":")
    addrs.add(host.strip("[]"))
    ports.add(int(port))
    for n in ray.nodes():  # type: ignore[no-untyped-call,unused-ignore]
        addr = n.get("NodeManagerAddress")
        if isinstance(addr, str) and addr:
            addrs.add(addr)  # dead ones too: a node may come back on its address
        for key, value in n.items():
            if key.endswith("Port") and isinstance(value, int) and 0 < value < 65536:
                ports.add(value)
    return addrs, ports


def _count(sb: Sandbox) -> tuple[bool, int] | None:
    if not isinstance(sb, SupportsProcessCount):
        return None
    return (sb.alive, sb.process_count())


def _idle_spares(p: SandboxProvider) -> int:
    """Idle warm spares of the node's provider (linux keeps them by shape in ``_spares``;
    read, never changed, for placement's preference)."""
    spares = getattr(p, "_spares", None)
    return sum(len(v) for v in spares.values()) if isinstance(spares, dict) else 0


_DOCTOR: dict[str, Any] = {}


def _doctor() -> dict[str, Any]:
    """``corral doctor``'s report for this host (probed once per actor)."""
    if not _DOCTOR:
        from corral.providers.linux.host import hostinfo
        info = hostinfo.probe()
        _DOCTOR.update({"host": info.to_dict(),
                        "providers": [r.to_dict() for r in hostinfo.providers_report(info)]})
    return _DOCTOR
