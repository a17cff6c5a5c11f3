"""The service's state: each tenant's live sandboxes, started processes and caps.

A tenant only ever reaches its own table: every lookup is by (tenant, id), so another
tenant's sandbox id is simply unknown (404), never "forbidden" (which would say it
exists). Caps are taken before the work starts and given back in a ``finally`` (a
cancelled request frees its slot at once); a refusal is ``LimitsExceededError``
(HTTP 422, the error table's status), whose ``detail`` names the tenant cap.

Standard library only (no starlette), so it is tested on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

from corral.core.contract import ProcessHandle, Sandbox
from corral.core.errors import LimitsExceededError
from corral.core.result import RunResult
from corral.core.tasks import settle
from corral.serve.config import TenantConfig
from corral.serve.tenancy import Lifetime

__all__ = ["CapName", "ProcessEntry", "SandboxEntry", "TenantState", "new_id"]

CapName = Literal["sandboxes", "runs", "memory", "processes"]
#: ids of sandboxes destroyed (or asked to be) kept per tenant, so a create that lands
#: after its own cancellation's DELETE is rolled back
_TOMBSTONES: Final = 1024


def new_id(prefix: str) -> str:
    """An unguessable id (128 bits)."""
    return f"{prefix}-{secrets.token_hex(16)}"


@dataclass(eq=False, slots=True)
class ProcessEntry:
    """A process started in a sandbox: its handle, and its output pumped into one queue
    of ``(fd, chunk)`` (``None`` once both streams ended). The queue is bounded, so a
    client that does not read holds the process back (pipe back-pressure)."""

    id: str
    handle: ProcessHandle
    output: asyncio.Queue[tuple[int, bytes] | None] = field(
        default_factory=lambda: asyncio.Queue(maxsize=256))
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    reading: bool = False
    result: RunResult | None = None
    #: how it ended was handed to the client (the end of its output stream, or a wait):
    #: the entry may be forgotten (see SandboxEntry.prune)
    delivered: bool = False

    def start_pumps(self) -> None:
        open_streams = [2]

        async def pump(fd: int, it: AsyncIterator[bytes]) -> None:
            try:
                async for chunk in it:
                    await self.output.put((fd, bytes(chunk)))
            except Exception:
                pass
            finally:
                open_streams[0] -= 1
                if open_streams[0] == 0:
                    await self.output.put(None)

        # owned by this entry: close() ends them (the service closes every entry of a
        # sandbox it destroys); an entry is forgotten only once they ended (prune)
        self.pumps = [asyncio.ensure_future(pump(1, self.handle.stdout)),
                      asyncio.ensure_future(pump(2, self.handle.stderr))]

    async def close(self) -> None:
        """Kill the process, stop the pumps and end the output queue (a reader still
        streaming sees the end at once; output not yet read is dropped)."""
        with contextlib.suppress(Exception):
            await self.handle.kill()
        await settle(self.pumps)
        while True:
            try:
                self.output.put_nowait(None)
                return
            except asyncio.QueueFull:
                self.output.get_nowait()


@dataclass(eq=False, slots=True)
class SandboxEntry:
    """One live sandbox of a tenant."""

    id: str
    sandbox: Sandbox
    level: str
    provider: str
    mem_mb: int
    created: float = field(default_factory=time.time)
    processes: dict[str, ProcessEntry] = field(default_factory=dict)
    #: how long it may live (None: until destroyed; a service always sets one)
    lifetime: Lifetime | None = None
    #: when a request last touched it (epoch s), and requests on it being answered
    last_used: float = field(default_factory=time.time)
    busy: int = 0
    #: set while the sandbox runs, cleared while it is paused (an exec waits on it, within
    #: its own timeout: a paused sandbox's command cannot start)
    running: asyncio.Event = field(default_factory=lambda: _set(asyncio.Event()))

    def touch(self) -> None:
        self.last_used = time.time()

    @contextlib.contextmanager
    def in_use(self) -> Any:
        """A request working on this sandbox: it does not go idle meanwhile."""
        self.busy += 1
        self.touch()
        try:
            yield
        finally:
            self.busy -= 1
            self.touch()

    def ends_at(self) -> float | None:
        """When it ends (epoch s) if nothing touches it again; None: no lifetime."""
        if self.lifetime is None:
            return None
        return self.lifetime.ends_at(self.created, self.last_used)

    def expired(self, now: float) -> bool:
        """Past its maximum lifetime, or idle (no request on it, no output being read)
        for its idle timeout."""
        life = self.lifetime
        if life is None:
            return False
        if now >= self.created + life.max_lifetime_s:
            return True
        working = self.busy > 0 or any(p.reading for p in self.processes.values())
        return not working and now >= self.last_used + life.idle_timeout_s

    def prune(self) -> None:
        """Forget processes whose end the client has seen (their pumps are done), so a
        long-lived sandbox does not keep an entry per process it ever ran."""
        for pid, p in list(self.processes.items()):
            if p.delivered and all(t.done() for t in p.pumps):
                del self.processes[pid]

    def info(self) -> dict[str, Any]:
        doc = {"id": self.id, "level": self.level, "provider": self.provider,
               "mem_mb": self.mem_mb, "created": self.created,
               "processes": sorted(self.processes)}
        end = self.ends_at()
        if self.lifetime is not None and end is not None:
            doc.update(ends_at=_rfc3339(end), ends_at_s=round(end, 3),
                       idle_timeout_s=self.lifetime.idle_timeout_s,
                       max_lifetime_s=self.lifetime.max_lifetime_s)
        return doc


def _set(ev: asyncio.Event) -> asyncio.Event:
    ev.set()
    return ev


def _rfc3339(t: float) -> str:
    """An epoch second as RFC 3339 in UTC, to the millisecond."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


class TenantState:
    """One tenant's live objects and the counters its caps are checked against."""

    def __init__(self, config: TenantConfig) -> None:
        self.config = config
        self.name = config.name
        #: the tenant's ceiling as /v1/info shows it (the policy is frozen: made once)
        self.ceiling: dict[str, Any] = config.policy.describe()
        self.sandboxes: dict[str, SandboxEntry] = {}
        #: sandboxes being created or held by a /v1/runs run (not in ``sandboxes``)
        self.pending_sandboxes = 0
        self.pending_mem_mb = 0
        self.runs = 0
        self.tombstones: OrderedDict[str, float] = OrderedDict()
        #: digests of the snapshot handles this tenant's sandboxes made
        self.handles: set[str] = set()

    @property
    def sandbox_count(self) -> int:
        return len(self.sandboxes) + self.pending_sandboxes

    @property
    def mem_mb(self) -> int:
        return sum(e.mem_mb for e in self.sandboxes.values()) + self.pending_mem_mb

    def _refuse(self, cap: CapName, limit: int, observed: int) -> LimitsExceededError:
        kind: Literal["memory", "processes"] = "memory" if cap == "memory" else "processes"
        err = LimitsExceededError(kind, limit, observed,
                                  detail=f"tenant {self.name!r}: cap max_{cap}"
                                  f"{'_mb' if cap == 'memory' else ''} reached")
        err.cap = cap  # type: ignore[attr-defined]
        return err

    @contextlib.contextmanager
    def sandbox_slot(self, mem_mb: int) -> Any:
        """Reserve room for one more sandbox of ``mem_mb`` while the block runs (a create,
        or the sandbox of a run); refuses with LimitsExceededError when a cap is full."""
        if self.sandbox_count + 1 > self.config.max_sandboxes:
            raise self._refuse("sandboxes", self.config.max_sandboxes, self.sandbox_count + 1)
        if self.mem_mb + mem_mb > self.config.max_memory_mb:
            raise self._refuse("memory", self.config.max_memory_mb, self.mem_mb + mem_mb)
        self.pending_sandboxes += 1
        self.pending_mem_mb += mem_mb
        try:
            yield
        finally:
            self.pending_sandboxes -= 1
            self.pending_mem_mb -= mem_mb

    @contextlib.contextmanager
    def run_slot(self) -> Any:
        """Count one run in flight while the block runs; refuses at ``max_runs``."""
        if self.runs + 1 > self.config.max_runs:
            raise self._refuse("runs", self.config.max_runs, self.runs + 1)
        self.runs += 1
        try:
            yield
        finally:
            self.runs -= 1

    def check_processes(self, entry: SandboxEntry) -> None:
        """Refuse one more started process in ``entry`` at ``max_processes``."""
        live = sum(1 for p in entry.processes.values() if not p.delivered)
        if live + 1 > self.config.max_processes:
            raise self._refuse("processes", self.config.max_processes, live + 1)

    def bury(self, sandbox_id: str) -> None:
        """Remember that ``sandbox_id`` was destroyed (or its destroy was asked for)."""
        self.tombstones[sandbox_id] = time.monotonic()
        self.tombstones.move_to_end(sandbox_id)
        while len(self.tombstones) > _TOMBSTONES:
            self.tombstones.popitem(last=False)
