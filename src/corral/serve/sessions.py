"""Sessions through ``corral serve`` (docs/sessions.md): a tenant's live interpreters.

A session's sandbox is made by :meth:`Service.create`, so it counts against the tenant's
caps and ceiling as any sandbox does (``max_sandboxes``, ``max_memory_mb``, its limits
and lifetimes), is listed with them, and shares their id: a session is the sandbox of
that id holding an interpreter. On top of that a tenant has ``max_sessions`` (default 4)
sessions alive at once, and a cell holds one of its ``max_runs`` slots while it runs.

A session that ended (a memory kill, an interrupt ignored, idle, past its lifetime) is
taken out at once and its sandbox destroyed; the request that saw it gets the error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

from corral.core.errors import (
    CorralError,
    LimitsExceededError,
    SandboxTimeoutError,
    SessionEndedError,
)
from corral.core.spec import Level, SandboxLimits, SandboxSpec
from corral.core.tasks import settle
from corral.serve import models as m, tenancy
from corral.serve.service import ApiError, Event, Service
from corral.serve.state import TenantState
from corral.sessions.result import CellResult, DisplayItem
from corral.sessions.session import AsyncSession

__all__ = ["DEFAULT_MAX_SESSIONS", "CellRequest", "SessionCreateRequest", "SessionTable",
           "close_all", "table"]

#: sessions alive at once per tenant, unless its config says ``max_sessions``
DEFAULT_MAX_SESSIONS: Final = 4
_ATTR: Final = "_corral_session_table"


class SessionCreateRequest(m._In):
    """A new session: its sandbox's limits and network (within the tenant's ceiling),
    the environment to run in, a cell's default timeout and the session's lifetimes."""

    limits: m.Limits | None = None
    network: m.Network | None = None
    environment: str | None = None
    cell_timeout_s: float | None = None
    idle_timeout_s: float | None = None
    max_lifetime_s: float | None = None


class CellRequest(m._In):
    """One cell: its code, its timeout (default the session's), and whether to stream."""

    code: str
    timeout_s: float | None = None
    stream: bool = False


class SessionTable:
    """The live sessions of a service, by tenant and id."""

    def __init__(self, service: Service) -> None:
        self.s = service
        self.by_tenant: dict[str, dict[str, AsyncSession]] = {}
        self.pending: dict[str, int] = {}
        #: more environment variables for every session's interpreter (none by default:
        #: packages come from the session's ``environment``, which the tenant's
        #: ``environments`` must list, as for a sandbox)
        self.env: dict[str, str] = {}
        #: the interpreter inside the sandboxes (default: the server's own)
        self.python: str | None = None

    def _of(self, tenant: TenantState) -> dict[str, AsyncSession]:
        return self.by_tenant.setdefault(tenant.name, {})

    def _max(self, tenant: TenantState) -> int:
        return tenant.config.max_sessions

    async def _prune(self, tenant: TenantState) -> None:
        for sid, sess in list(self._of(tenant).items()):
            if not sess.alive or sid not in tenant.sandboxes:
                await self._drop(tenant, sid)

    async def _drop(self, tenant: TenantState, sid: str) -> None:
        sess = self._of(tenant).pop(sid, None)
        if sess is not None:
            await sess.close()
        await self.s.destroy(tenant, sid)

    def get(self, tenant: TenantState, sid: str) -> AsyncSession:
        sess = self._of(tenant).get(sid)
        if sess is None:
            raise ApiError("not-found", "no such session", what="session")
        return sess

    async def create(self, tenant: TenantState, body: SessionCreateRequest
                     ) -> tuple[str, AsyncSession]:
        await self._prune(tenant)
        live = len(self._of(tenant)) + self.pending.get(tenant.name, 0)
        cap = self._max(tenant)
        if live + 1 > cap:
            err = LimitsExceededError("processes", cap, live + 1,
                                      detail=f"tenant {tenant.name!r}: cap max_sessions reached")
            err.cap = "sessions"  # type: ignore[attr-defined]
            self.s.metrics.inc("corral_refused_total", cap="sessions")
            raise err
        policy = tenant.config.policy
        asked = body.cell_timeout_s
        cell_ms = tenancy.admit_timeout(policy, None if asked is None
                                        else max(1, int(asked * 1000)))
        spec = SandboxSpec(
            tenant_id=tenant.name, level=Level.STRICT,
            limits=body.limits.to_core() if body.limits else SandboxLimits(),
            network=body.network.to_core() if body.network else m.Network().to_core(),
            environment=body.environment)
        self.pending[tenant.name] = self.pending.get(tenant.name, 0) + 1
        try:
            entry = await self.s.create(tenant, spec, idle_timeout_s=body.idle_timeout_s,
                                        max_lifetime_s=body.max_lifetime_s)
            life = entry.lifetime
            try:
                sess = await AsyncSession.attach(
                    entry.sandbox, cell_timeout_s=cell_ms / 1000,
                    idle_timeout_s=life.idle_timeout_s if life else 900.0,
                    max_lifetime_s=life.max_lifetime_s if life else 4 * 3600.0,
                    env=self.env, python=self.python)
            except BaseException:
                await self.s.shielded(self.s.destroy(tenant, entry.id))
                raise
            self._of(tenant)[entry.id] = sess
        finally:
            self.pending[tenant.name] -= 1
        self.s.log.event("session-created", tenant=tenant.name, id=entry.id)
        return entry.id, sess

    def describe(self, sid: str, sess: AsyncSession) -> dict[str, Any]:
        return {"id": sid, "alive": sess.alive, "cells": sess.cells, "python": sess.python,
                "level": "strict", "cell_timeout_s": sess.cell_timeout_s,
                "idle_timeout_s": sess.idle_timeout_s, "max_lifetime_s": sess.max_lifetime_s}

    async def list(self, tenant: TenantState) -> list[dict[str, Any]]:
        await self._prune(tenant)
        return [self.describe(sid, s) for sid, s in self._of(tenant).items()]

    async def close(self, tenant: TenantState, sid: str) -> None:
        self.get(tenant, sid)
        await self._drop(tenant, sid)

    def _timeout(self, tenant: TenantState, timeout_s: float | None) -> float | None:
        if timeout_s is None:
            return None
        ms = tenancy.admit_timeout(tenant.config.policy, max(1, int(timeout_s * 1000)))
        return ms / 1000

    async def run(self, tenant: TenantState, sid: str, body: CellRequest,
                  sink: asyncio.Queue[Event] | None = None) -> CellResult:
        """Run a cell (holding a run slot); an error that ended the session takes it out."""
        sess = self.get(tenant, sid)
        entry = self.s.entry(tenant, sid, touch=True)
        timeout = self._timeout(tenant, body.timeout_s)
        put = sink.put_nowait if sink is not None else None
        with self.s.run_slot(tenant), entry.in_use():
            try:
                return await sess.run(
                    body.code, timeout_s=timeout,
                    on_stdout=None if put is None else lambda t: put(
                        {"event": "stdout", "text": t}),
                    on_stderr=None if put is None else lambda t: put(
                        {"event": "stderr", "text": t}),
                    on_display=None if put is None else lambda d: put(_display_event(d)))
            except (LimitsExceededError, SandboxTimeoutError, SessionEndedError):
                self.s.log.event("session-ended", tenant=tenant.name, id=sid)
                await self.s.shielded(self._drop(tenant, sid))
                raise

    def stream(self, tenant: TenantState, sid: str, body: CellRequest
               ) -> AsyncIterator[Event]:
        """A cell's events: ``stdout``/``stderr`` text and ``display`` bundles as they
        come, then ``cell`` (the whole result; its last expression is in it) or
        ``error`` (the session ended)."""
        self.get(tenant, sid)  # 404 before the stream starts
        queue: asyncio.Queue[Event] = asyncio.Queue()

        async def events() -> AsyncIterator[Event]:
            task = self.s.tasks.spawn(self.run(tenant, sid, body, queue))  # the service's
            task.add_done_callback(lambda _: queue.put_nowait({"event": "_end"}))
            try:
                while True:
                    ev = await queue.get()
                    if ev.get("event") == "_end":
                        break
                    yield ev
                result = await task  # raises the error that ended the session
                yield {"event": "cell", "cell": result.to_json()}
            finally:
                await settle([task])

        return events()


def _display_event(item: DisplayItem) -> Event:
    return {"event": item.kind, "data": dict(item.data)}


def table(service: Service) -> SessionTable:
    """The service's session table (made on first use)."""
    t = getattr(service, _ATTR, None)
    if t is None:
        t = SessionTable(service)
        setattr(service, _ATTR, t)
    return t


async def close_all(service: Service) -> None:
    """Close every session of ``service`` (before it drains its sandboxes)."""
    t = getattr(service, _ATTR, None)
    if t is None:
        return
    for sessions in t.by_tenant.values():
        for sess in list(sessions.values()):
            with contextlib.suppress(Exception):
                await sess.close()
        sessions.clear()


def error_event(err: CorralError) -> Event:
    return {"event": "error", "status": err.http_status, "error": err.to_dict()}

