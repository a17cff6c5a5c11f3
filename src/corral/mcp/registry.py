"""Named sandboxes that outlive one tool call: made, found, reaped and destroyed here.

An MCP client works in a sandbox across calls by its name. Names live in a *scope*:
``(tenant, session)``, the tenant the caller authenticated as (``local`` over stdio) and
its session (a streamable HTTP session id, ``""`` for the sessionless protocol, or the
one client of a stdio server), so two tenants, or two sessions of one tenant, may use
the same name without meeting. A sandbox ends when
its session ends (:meth:`SandboxRegistry.end_scope`), when nobody used it for
``idle_timeout_s`` (the reaper), on ``sandbox_destroy``, or when the server stops
(:meth:`SandboxRegistry.aclose`): every path calls the contract's ``destroy``, which
releases everything.

Pure corral: no MCP import, so it is tested and reused without the extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from corral.core.contract import Sandbox
from corral.core.errors import ConfigInvalidError
from corral.core.spec import SandboxSpec
from corral.core.tasks import TaskSet

__all__ = ["NAME_PATTERN", "Entry", "SandboxRegistry", "Scope"]

#: what a sandbox name may be: a word a person or a model types
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

Create = Callable[[SandboxSpec], Awaitable[Sandbox]]


class Scope(NamedTuple):
    """Where a name lives: the caller's tenant and its session (``""``: none)."""

    tenant: str
    session: str


@dataclass(slots=True, eq=False)
class Entry:
    """One live named sandbox (mutable: its last use and calls in flight change)."""

    scope: Scope
    name: str
    sandbox: Sandbox
    created: float
    last_used: float
    busy: int = 0
    #: set once destroy began: new calls are refused
    ending: bool = field(default=False)
    #: background processes started in it (``process_start``), by id; they end with it
    processes: dict[str, Any] = field(default_factory=dict)


class SandboxRegistry:
    """Named sandboxes per scope, bounded, reaped when idle.

    Args:
        idle_timeout_s: destroy a sandbox no call used for this long (a call in flight
            keeps it alive).
        max_per_scope / max_total: sandboxes alive at once in one scope / in all; one
            more is refused with ``ConfigInvalidError(field="max_sandboxes")`` before
            anything is made (destroy one first). :meth:`create` also takes the caller's
            tenant caps (sandboxes and memory over all its sessions).
    """

    def __init__(self, *, idle_timeout_s: float, max_per_scope: int, max_total: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.max_per_scope = max_per_scope
        self.max_total = max_total
        self._clock = clock
        self._entries: dict[tuple[Scope, str], Entry] = {}
        #: creations under way (their spec), counted against the caps before they exist
        self._pending: dict[Scope, list[SandboxSpec]] = {}
        #: the idle reaper (started by :meth:`start`) and the destroys under way (each
        #: shielded from its caller's cancellation): ended and awaited by :meth:`aclose`
        self._tasks = TaskSet()
        self._destroys = TaskSet()
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        #: (scope, name, why) of every sandbox ended, newest last (for tests and logs)
        self.ended: list[tuple[Scope, str, str]] = []

    # -- lookups ---------------------------------------------------------------------
    def names(self, scope: Scope) -> list[str]:
        """The names alive in ``scope``, sorted."""
        return sorted(n for (s, n), e in self._entries.items() if s == scope and not e.ending)

    def count(self, scope: Scope | None = None) -> int:
        """Sandboxes alive in ``scope`` (all scopes when None)."""
        return sum(1 for (s, _), e in self._entries.items()
                   if not e.ending and (scope is None or s == scope))

    def _specs(self, tenant: str) -> list[SandboxSpec]:
        """The specs of ``tenant``'s sandboxes, alive or being made (its sessions)."""
        live = [e.sandbox.spec for (s, _), e in self._entries.items()
                if s.tenant == tenant and not e.ending]
        return live + [sp for s, specs in self._pending.items() if s.tenant == tenant
                       for sp in specs]

    def tenant_count(self, tenant: str) -> int:
        """Sandboxes ``tenant`` holds (alive or being made) over all its sessions."""
        return len(self._specs(tenant))

    def tenant_memory_mb(self, tenant: str) -> int:
        """The sum of ``limits.mem_mb`` of ``tenant``'s sandboxes (alive or being made;
        a sandbox without one counts 0: the server always sets it)."""
        return sum(sp.limits.mem_mb or 0 for sp in self._specs(tenant))

    @staticmethod
    def check_name(name: object) -> str:
        """``name`` if it is a valid sandbox name, else ConfigInvalidError."""
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise ConfigInvalidError("name", "a sandbox name is 1-64 letters, digits, '_', "
                                     "'.' or '-', starting with a letter or digit")
        return name

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Start the idle reaper on the running loop (idempotent)."""
        if self._reaper is None and not self._closed:
            self._reaper = self._tasks.spawn(self._reap_loop())

    async def create(self, scope: Scope, name: str, spec: SandboxSpec, make: Create, *,
                     tenant_max: int | None = None,
                     tenant_memory_mb: int | None = None) -> Entry:
        """Make a sandbox with ``make(spec)`` and register it as ``name`` in ``scope``.

        ``tenant_max`` / ``tenant_memory_mb``: the most sandboxes, and the most memory
        (the sum of their ``limits.mem_mb``), the scope's tenant may hold over all its
        sessions.

        Raises:
            ConfigInvalidError: a bad or taken name (``field="name"``), or a cap reached
                (``field="max_sandboxes"`` / ``"max_memory_mb"``: destroy one first).
            whatever ``make`` raises (LevelNotSupportedError ...): nothing is registered.
        """
        self.check_name(name)
        if self._closed:
            raise ConfigInvalidError("name", "the server is shutting down")
        if (scope, name) in self._entries:
            raise ConfigInvalidError("name", f"a sandbox named {name!r} already exists in "
                                     "this session (destroy it first, or pick another name)")
        pending_here = self._pending.get(scope, [])
        if self.count(scope) + len(pending_here) >= self.max_per_scope:
            raise ConfigInvalidError("max_sandboxes", f"this session has {self.max_per_scope} "
                                     "sandboxes alive, the most it may; destroy one first")
        if tenant_max is not None and self.tenant_count(scope.tenant) >= tenant_max:
            raise ConfigInvalidError("max_sandboxes", f"tenant {scope.tenant!r} has "
                                     f"{tenant_max} sandboxes alive, the most it may; "
                                     "destroy one first")
        if tenant_memory_mb is not None:
            held, asked = self.tenant_memory_mb(scope.tenant), spec.limits.mem_mb or 0
            if held + asked > tenant_memory_mb:
                raise ConfigInvalidError("max_memory_mb", f"tenant {scope.tenant!r} holds "
                                         f"{held} MiB in sandboxes; {asked} MiB more passes "
                                         f"its {tenant_memory_mb} MiB")
        if self.count() + sum(len(v) for v in self._pending.values()) >= self.max_total:
            raise ConfigInvalidError("max_sandboxes", f"the server has {self.max_total} "
                                     "sandboxes alive, the most it may; try again later")
        pending_here = self._pending.setdefault(scope, [])
        pending_here.append(spec)
        try:
            sandbox = await make(spec)
        finally:
            pending_here.remove(spec)
            if not pending_here:
                self._pending.pop(scope, None)
        if self._closed or (scope, name) in self._entries:  # lost a race: undo
            await sandbox.destroy()
            raise ConfigInvalidError("name", f"a sandbox named {name!r} was made meanwhile, "
                                     "or the server is shutting down")
        now = self._clock()
        entry = Entry(scope=scope, name=name, sandbox=sandbox, created=now, last_used=now)
        self._entries[(scope, name)] = entry
        return entry

    @contextlib.asynccontextmanager
    async def use(self, scope: Scope, name: str) -> AsyncIterator[Sandbox]:
        """The sandbox ``name`` of ``scope`` for one call: kept from the reaper while the
        call runs, its idle clock restarted when it ends.

        Raises:
            ConfigInvalidError: no such sandbox in this scope (``field="name"``).
        """
        self.check_name(name)
        entry = self._entries.get((scope, name))
        if entry is None or entry.ending:
            raise ConfigInvalidError("name", f"no sandbox named {name!r} in this session "
                                     "(it was destroyed, reaped when idle, or never made)")
        entry.busy += 1
        entry.last_used = self._clock()
        try:
            yield entry.sandbox
        finally:
            entry.busy -= 1
            entry.last_used = self._clock()

    def processes(self, scope: Scope, name: str) -> dict[str, Any]:
        """The background processes of the sandbox ``name`` of ``scope`` (by id)."""
        entry = self._entries.get((scope, name))
        if entry is None or entry.ending:
            raise ConfigInvalidError("name", f"no sandbox named {name!r} in this session")
        return entry.processes

    async def destroy(self, scope: Scope, name: str, why: str = "destroyed") -> bool:
        """Destroy ``name`` in ``scope``; False when there was none."""
        entry = self._entries.get((scope, name))
        if entry is None or entry.ending:
            return False
        await self._end(entry, why)
        return True

    async def end_scope(self, scope: Scope, why: str = "session ended") -> int:
        """Destroy every sandbox of ``scope`` (its session ended); how many."""
        entries = [e for (s, _), e in self._entries.items() if s == scope and not e.ending]
        await asyncio.gather(*(self._end(e, why) for e in entries))
        return len(entries)

    async def reap(self) -> int:
        """Destroy the sandboxes idle for ``idle_timeout_s`` or more; how many."""
        now = self._clock()
        idle = [e for e in self._entries.values()
                if not e.ending and not e.busy and now - e.last_used >= self.idle_timeout_s]
        await asyncio.gather(*(self._end(e, "idle timeout") for e in idle))
        return len(idle)

    async def aclose(self) -> None:
        """Stop the reaper and destroy every sandbox (the server stops). Idempotent."""
        self._closed = True
        await self._tasks.aclose()  # the reaper (a destroy it started goes on, owned)
        self._reaper = None
        entries = [e for e in self._entries.values() if not e.ending]
        try:
            await asyncio.gather(*(self._end(e, "server stopped") for e in entries))
        finally:
            await self._destroys.drain()

    async def _end(self, entry: Entry, why: str) -> None:
        entry.ending = True
        try:
            # shielded: a cancelled caller (a client gone) must not leave half a sandbox
            await asyncio.shield(self._destroys.spawn(entry.sandbox.destroy()))
        finally:
            self._entries.pop((entry.scope, entry.name), None)
            self.ended.append((entry.scope, entry.name, why))
            del self.ended[:-1000]

    async def _reap_loop(self) -> None:
        period = max(0.05, min(self.idle_timeout_s / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            try:
                await self.reap()
            except Exception:  # a failed destroy must not stop the reaping
                continue

