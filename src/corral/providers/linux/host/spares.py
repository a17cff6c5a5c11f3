"""Off the caller's path: pre-warmed spare sandboxes and the cgroup reaper.

**Pre-warmed spare.** A spare is a sandbox built exactly like a cold one
(same zygote launch, same containment checklist, same cgroup placement
before the cgroup namespace is made) *before* anyone asks for it, for the
plan shape of the provider's latest ``create``. It has its own fresh
namespaces, cgroup and agent, has run no command and knows no tenant. A
``create`` whose plan has the same shape claims it: the spec's cgroup limits
are written into its (still empty of commands) cgroup first, then it is
handed out. A spare is used once, by one sandbox, and never returns to the
pool. What differs per spec and is not part of the shape (cgroup limits,
the per-command CPU rlimit) is applied at claim time; everything else that
shapes the sandbox (mounts, disk size, id maps, rlimits, hostname) is the
shape key, so a spec of another shape gets a cold build.

Why: on cgroup v1 (and v2 without ``favordynmods``) the first move of a
process into a cgroup after an idle spell waits for an RCU grace period
(9-19 ms measured here), more than the rest of a launch together.

**Reaper.** :meth:`LinuxSandbox.destroy` returns once no process of the
sandbox can run again (see its docstring); waiting for the init's exit and
removing the then empty cgroup directories happens here, on one
provider-owned thread, and ``aclose`` waits for it.

Measured on the project VM (cgroup v1, 2 cores; /tmp/perf scratch scripts,
median of 20-30): cold create 19-21 ms before this work, ~11-12 ms after
(the init joins its cgroup while a helper builds its file system); create
with a spare 0.2-0.5 ms; destroy 3.4-3.8 ms before, 0.1-0.2 ms after.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import select
import signal
import threading
from dataclasses import dataclass
from typing import Any, Final, final

from corral.providers.linux.host.channel import Channel
from corral.providers.linux.policy.plan import SandboxPlan

__all__ = ["Launched", "Reaper", "kill_and_remove", "only_init_left", "shape_key", "wait_exit"]

#: how long destroy waits for the pid-namespace init to be gone before it falls back
#: to killing the cgroup synchronously
EXIT_WAIT_S: Final = 5.0


@dataclass(slots=True, kw_only=True)
class Launched:
    """A built sandbox before a LinuxSandbox wraps it."""

    sid: str
    chan: Channel
    pidfd: int
    cg: Any


def shape_key(plan: SandboxPlan) -> str:
    """What a spare must match: the plan's wire form minus what a claim applies."""
    wire = plan.to_wire()
    wire.pop("cpu_rlimit_s", None)
    return json.dumps(wire, sort_keys=True, separators=(",", ":"))


async def wait_exit(pidfd: int, timeout: float = EXIT_WAIT_S) -> bool:
    """Wait until the process behind ``pidfd`` has exited; False on timeout.

    For a pid-namespace init this means every process of the namespace is
    gone: the kernel kills and reaps them all before the init itself exits.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(pidfd, ready)
    try:
        await asyncio.wait_for(fut, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)


async def kill_launched(item: Launched, reaper: Reaper) -> None:
    """End a sandbox that was never handed out (a spare, or a rollback)."""
    item.chan.close()
    gone = False
    if item.pidfd >= 0:
        try:
            signal.pidfd_send_signal(item.pidfd, signal.SIGKILL)
        except OSError:
            pass
        gone = await wait_exit(item.pidfd)
        os.close(item.pidfd)
        item.pidfd = -1
    if item.cg is not None:
        if gone:
            reaper.submit(item.cg)
        else:
            await asyncio.to_thread(kill_and_remove, item.cg)


def only_init_left(cg: Any) -> bool:
    """Whether the sandbox's cgroup holds one task only (its killed init); False if unknown.

    The pids controller counts a task from the start of its fork until it is
    reaped, so 1 means no other process exists and none is being forked.
    """
    d = cg.dirs.get("unified") or cg.dirs.get("pids")
    if d is None:
        return False
    try:
        with open(os.path.join(d, "pids.current"), "rb") as f:
            return int(f.read()) <= 1
    except (OSError, ValueError):
        return False


def kill_and_remove(cg: Any) -> None:
    try:
        cg.kill_all()
    finally:
        cg.remove()


@final
class Reaper:
    """Removes destroyed sandboxes' cgroups on one thread, started on first use and
    kept until :meth:`stop` (starting a thread per destroy would cost ~1 ms)."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: removal failures (cgroup name, message), for diagnostics
        self.errors: list[tuple[str, str]] = []

    def _put(self, job: Any) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="corral-reaper",
                                                daemon=True)
                self._thread.start()
        self._q.put(job)

    def submit(self, cg: Any, pidfd: int = -1) -> None:
        """Remove ``cg`` (killing what is left in it); first, if given, wait for the
        process behind ``pidfd`` to exit and close the pidfd."""
        self._put((cg, pidfd))

    def _run(self) -> None:
        while (job := self._q.get()) is not None:
            if isinstance(job[0], asyncio.AbstractEventLoop):  # a drain() marker
                loop, fut = job
                loop.call_soon_threadsafe(_settle, fut)
                continue
            cg, pidfd = job
            try:
                if pidfd >= 0:
                    try:
                        select.select([pidfd], [], [], EXIT_WAIT_S)
                    finally:
                        os.close(pidfd)
                if cg is not None:
                    kill_and_remove(cg)
            except Exception as e:  # reported, and reaped as an orphan at the next start
                self.errors.append((str(getattr(cg, "name", cg)), str(e)))

    async def drain(self) -> None:
        """Wait until everything submitted so far is done (the thread stays)."""
        if self._thread is None:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._put((loop, fut))
        await fut

    async def stop(self) -> None:
        """Drain, then end the thread."""
        await self.drain()
        with self._lock:
            t, self._thread = self._thread, None
        if t is not None:
            self._q.put(None)
            await asyncio.to_thread(t.join)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
