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
import os
import queue
import select
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, final

from corral.providers.linux.host.channel import Channel
from corral.providers.linux.policy.plan import SandboxPlan

if TYPE_CHECKING:
    from corral.core.cancel import CancelToken

__all__ = ["Launched", "Reaper", "SparePool", "kill_and_remove", "only_init_left", "shape_key",
           "source_ids", "wait_exit"]

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
    #: a spare's bind sources as they were when it was built (:func:`source_ids`)
    sources: tuple[tuple[int, int] | None, ...] | None = None


@final
class SparePool:
    """The provider's idle spares, by plan shape (``SandboxPlan.shape``), and the
    tasks that build and end them. The pool owns those tasks: :meth:`drain` and
    :meth:`aclose` await every one, and none outlives :meth:`aclose`.

    ``build(plan)`` launches one sandbox of ``plan``'s shape with no limits applied
    (the provider's launch); ``size`` spares of the latest shape are kept built or
    building.
    """

    def __init__(self, size: int, build: Callable[[SandboxPlan], Awaitable[Launched]],
                 reaper: Reaper) -> None:
        self.size = size
        self._build = build
        self._reaper = reaper
        #: shape -> idle spares of it
        self.idle: dict[str, list[Launched]] = {}
        #: shape -> the task building a spare of it
        self.building: dict[str, asyncio.Task[Launched]] = {}
        self._chores: set[asyncio.Task[None]] = set()
        self.closed = False

    async def take(self, plan: SandboxPlan, cancel: CancelToken | None) -> Launched | None:
        """A spare of ``plan``'s shape with ``plan.cgroup_limits`` applied, or None
        (build cold); then start building the next one of this shape."""
        if self.size == 0 or self.closed:
            return None
        item = await self._claim(plan, cancel)
        self._refill(plan)
        return item

    async def _claim(self, plan: SandboxPlan, cancel: CancelToken | None) -> Launched | None:
        from corral.providers.linux.host.launch import race
        key = plan.shape
        while True:
            pool = self.idle.get(key)
            if pool:
                item = pool.pop()
            else:
                task = self.building.get(key)
                if task is None:
                    return None
                # sooner than a cold launch queued behind it in the zygote
                await race(asyncio.wait([task]), cancel)
                if task.cancelled() or task.exception() is not None:
                    return None
                continue  # the finished build put its spare into the pool
            if item.chan.is_closed:  # its agent died while idle
                await kill_launched(item, self._reaper)
                continue
            if item.sources is not None and item.sources != source_ids(plan):
                # a source was replaced while it idled (an environment removed and
                # built again, a bound dir made anew): it shows the old tree
                await kill_launched(item, self._reaper)
                continue
            try:
                if item.cg is not None:
                    # before anything of the caller runs
                    item.cg.apply(plan.cgroup_limits)
            except Exception:
                await kill_launched(item, self._reaper)
                return None  # the cold path reports what is wrong
            return item

    def _refill(self, plan: SandboxPlan) -> None:
        """Keep ``size`` spares of ``plan``'s shape built or building; end the others."""
        if self.closed:
            return
        key = plan.shape
        for other in [k for k in self.idle if k != key]:
            for item in self.idle.pop(other):
                self._chore(kill_launched(item, self._reaper))
        have = len(self.idle.get(key, ())) + (key in self.building)
        if have < self.size and key not in self.building:
            task = asyncio.get_running_loop().create_task(self._build_one(key, plan))
            task.add_done_callback(_retrieve)
            self.building[key] = task

    async def _build_one(self, key: str, plan: SandboxPlan) -> Launched:
        try:
            sources = source_ids(plan)  # before: a source replaced meanwhile never matches
            item = await self._build(plan)
            item.sources = sources
        finally:
            if self.building.get(key) is asyncio.current_task():
                del self.building[key]
        if self.closed:
            await kill_launched(item, self._reaper)
            raise RuntimeError("the spare pool is closed")
        self.idle.setdefault(key, []).append(item)
        if len(self.idle[key]) < self.size:
            self._refill(plan)
        return item

    def _chore(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)
        task.add_done_callback(_retrieve)

    def drop_idle(self) -> None:
        """End every idle spare (in tasks of the pool's; :meth:`drain` waits for them)."""
        for key in list(self.idle):
            for item in self.idle.pop(key):
                self._chore(kill_launched(item, self._reaper))

    async def drain(self) -> int:
        """Wait for every build and chore of the pool; how many spares are idle."""
        while self.building or self._chores:
            await asyncio.wait([*self.building.values(), *self._chores])
        return sum(len(v) for v in self.idle.values())

    async def aclose(self) -> None:
        """Build no more; wait for the builds under way, end every idle spare, wait
        for the chores. Idempotent."""
        self.closed = True
        if self.building:
            await asyncio.wait(list(self.building.values()))
        for key in list(self.idle):
            for item in self.idle.pop(key):
                await kill_launched(item, self._reaper)
        await self.drain()


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a background task's failure as seen (a failed build: the next create
    builds cold)."""
    if not task.cancelled():
        task.exception()


def source_ids(plan: SandboxPlan) -> tuple[tuple[int, int] | None, ...]:
    """The (device, inode) of each host path ``plan`` binds (None: gone). A spare is
    built with what its sources were then; the same paths can later name other trees
    (``corral env rm`` then a rebuild of the same environment: same digest, same path,
    a new directory), and a spare still bound to the old one must not be handed out."""
    out: list[tuple[int, int] | None] = []
    for step in plan.mounts:
        if step.kind in ("bind", "rootfs"):
            try:
                st = os.stat(step.source)
            except OSError:
                out.append(None)
            else:
                out.append((st.st_dev, st.st_ino))
    return tuple(out)


def shape_key(plan: SandboxPlan) -> str:
    """What a spare must match: the plan's wire form minus what a claim applies
    (``SandboxPlan.shape``, derived once when the plan is made)."""
    return plan.shape


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
