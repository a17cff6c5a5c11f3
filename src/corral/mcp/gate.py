"""The door in front of the SDK's streamable HTTP app: bearer tokens, session caps and
the life of sessions, decided before the SDK reads a byte of a request's body.

Every HTTP request passes :class:`HttpGate` first:

1. **Authentication.** ``Authorization: Bearer <token>`` must be a tenant's
   (:class:`~corral.mcp.tenants.TenantTable`); otherwise the answer is ``401`` with
   ``WWW-Authenticate: Bearer`` and the SDK never sees the request (no session, no task,
   no body read). The tenant rides on in the ASGI scope (``corral.tenant``, and as the
   SDK's ``user``, so the SDK binds each session to the tenant that opened it: another
   tenant presenting its id gets 404).
2. **Session caps.** A request that may open a session (a ``POST`` without
   ``mcp-session-id`` under the handshake protocol) is refused with ``429`` when its
   tenant has ``max_sessions`` open, and ``503`` when the server has its
   ``max_sessions``, both with ``Retry-After``.
3. **Session lives.** A session that did nothing after its handshake (no request beyond
   ``initialize`` and ``notifications/initialized``) is closed after
   ``start_timeout_s``; any other after ``idle_timeout_s`` with no request in flight.
   Closing goes through the SDK's own ``DELETE`` (so it ends as a client's close
   would), then ``on_end(tenant, session_id)`` releases what the session held (its
   named sandboxes). A client's own ``DELETE`` ends the same way.

Raw ASGI, no starlette: it sits in front of any ASGI app.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from corral.core.tasks import TaskSet
from corral.mcp.tenants import McpTenant, TenantTable

__all__ = ["HttpGate", "TENANT_KEY", "tenant_of_scope"]

#: the ASGI scope key the gate stores the caller's tenant name under
TENANT_KEY = "corral.tenant"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def tenant_of_scope(scope: Any) -> str | None:
    """The tenant the gate authenticated for this request's ASGI scope, or None."""
    if isinstance(scope, MutableMapping):
        value = scope.get(TENANT_KEY)
        return value if isinstance(value, str) else None
    return None


@dataclass(slots=True, eq=False)
class _Session:
    tenant: str
    created: float
    last: float
    #: the headers a synthetic DELETE replays (Host: the SDK checks it on loopback)
    host: bytes
    in_flight: int = 0
    #: requests that carried the session's id
    requests: int = 0


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1")
            for k, v in scope.get("headers", ())}


async def _answer(send: Send, status: int, code: str, message: str,
                  extra: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *extra]})
    await send({"type": "http.response.body", "body": body})


class HttpGate:
    """ASGI middleware: authenticate, cap sessions, end idle ones (see the module)."""

    def __init__(self, app: App, *, tenants: TenantTable, path: str, max_sessions: int,
                 start_timeout_s: float, idle_timeout_s: float,
                 on_end: Callable[[str, str], Awaitable[object]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app, self.tenants, self.path = app, tenants, path.rstrip("/") or "/"
        self.max_sessions = max_sessions
        self.start_timeout_s, self.idle_timeout_s = start_timeout_s, idle_timeout_s
        self._on_end, self._clock = on_end, clock
        self.sessions: dict[str, _Session] = {}
        #: session-opening requests under way, per tenant
        self._opening: dict[str, int] = {}
        #: the expiry reaper (started by the first request) and the releases of ended
        #: sessions (shielded from their request's cancellation): ended and awaited at
        #: the lifespan's shutdown (:meth:`aclose`)
        self._tasks = TaskSet()
        self._releases = TaskSet()
        self._reaper: asyncio.Task[None] | None = None
        self._users: dict[str, Any] = {}
        #: requests refused: {"unauthorized": n, "sessions-tenant": n, "sessions-server": n}
        self.refused: dict[str, int] = {}

    # -- counts ----------------------------------------------------------------------
    def open_sessions(self, tenant: str | None = None) -> int:
        """Sessions open (and being opened) for ``tenant``, or in all when None."""
        if tenant is None:
            return len(self.sessions) + sum(self._opening.values())
        return (sum(1 for s in self.sessions.values() if s.tenant == tenant)
                + self._opening.get(tenant, 0))

    def _user(self, tenant: McpTenant) -> Any:
        """The SDK's ``AuthenticatedUser`` for ``tenant`` (its sessions are bound to it)."""
        user = self._users.get(tenant.name)
        if user is None:
            from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
            from mcp.server.auth.provider import AccessToken
            user = self._users[tenant.name] = AuthenticatedUser(AccessToken(
                token=f"tenant:{tenant.name}", client_id=tenant.name, scopes=[]))
        return user

    # -- ASGI ------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), send)
            return
        if kind != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        tenant = self.tenants.find(headers.get("authorization"))
        if tenant is None:
            self.refused["unauthorized"] = self.refused.get("unauthorized", 0) + 1
            await _answer(send, 401, "unauthorized", "a bearer token of a tenant of this "
                          "server is needed (Authorization: Bearer <token>)",
                          [(b"www-authenticate", b'Bearer realm="corral-mcp"')])
            return
        if self._reaper is None:
            self._reaper = self._tasks.spawn(self._reap_loop())
        scope = {**scope, TENANT_KEY: tenant.name, "user": self._user(tenant)}
        sid = headers.get("mcp-session-id")
        if sid:
            await self._in_session(sid, tenant, scope, receive, send)
        elif scope.get("method") == "POST" and self._may_open(headers):
            await self._opening_request(tenant, scope, headers, receive, send)
        else:
            await self.app(scope, receive, send)

    @staticmethod
    def _may_open(headers: dict[str, str]) -> bool:
        """Whether a POST without a session id goes the handshake way (and may open a
        session): no protocol version header, or a handshake-era one."""
        from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
        pv = headers.get("mcp-protocol-version")
        return pv is None or pv in HANDSHAKE_PROTOCOL_VERSIONS

    async def _opening_request(self, tenant: McpTenant, scope: Scope,
                               headers: dict[str, str], receive: Receive,
                               send: Send) -> None:
        if self.open_sessions(tenant.name) >= tenant.max_sessions:
            self.refused["sessions-tenant"] = self.refused.get("sessions-tenant", 0) + 1
            await _answer(send, 429, "max_sessions", f"tenant {tenant.name!r} has "
                          f"{tenant.max_sessions} MCP sessions open, the most it may; close "
                          "one (DELETE) or wait for an idle one to expire",
                          [(b"retry-after", b"5")])
            return
        if self.open_sessions() >= self.max_sessions:
            self.refused["sessions-server"] = self.refused.get("sessions-server", 0) + 1
            await _answer(send, 503, "max_sessions", f"the server has {self.max_sessions} "
                          "MCP sessions open, the most it may; try again later",
                          [(b"retry-after", b"5")])
            return
        self._opening[tenant.name] = self._opening.get(tenant.name, 0) + 1
        made: list[_Session] = []
        host = headers.get("host", "127.0.0.1").encode("latin-1")

        async def watch(message: MutableMapping[str, Any]) -> None:
            if message.get("type") == "http.response.start" and not made:
                for k, v in message.get("headers", ()):
                    if k.lower() == b"mcp-session-id":
                        now = self._clock()
                        entry = _Session(tenant=tenant.name, created=now, last=now,
                                         host=host, in_flight=1)
                        self.sessions[v.decode("latin-1")] = entry
                        made.append(entry)
                        self._opening[tenant.name] -= 1
                        break
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if made:
                made[0].in_flight -= 1
                made[0].last = self._clock()
            else:
                self._opening[tenant.name] -= 1
            if not self._opening.get(tenant.name):
                self._opening.pop(tenant.name, None)

    async def _in_session(self, sid: str, tenant: McpTenant, scope: Scope, receive: Receive,
                          send: Send) -> None:
        entry = self.sessions.get(sid)
        if entry is None or entry.tenant != tenant.name:
            await self.app(scope, receive, send)  # not ours to count: the SDK answers
            return
        status: list[int] = []

        async def watch(message: MutableMapping[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        entry.in_flight += 1
        entry.requests += 1
        entry.last = self._clock()
        try:
            await self.app(scope, receive, watch)
        finally:
            entry.in_flight -= 1
            entry.last = self._clock()
        ended = (scope.get("method") == "DELETE" and status and 200 <= status[0] < 300) \
            or (status and status[0] == 404)
        if ended:
            await self._forget(sid, "closed")

    async def _forget(self, sid: str, why: str) -> None:
        entry = self.sessions.pop(sid, None)
        if entry is not None:
            with contextlib.suppress(Exception):  # releasing is best effort per session
                await asyncio.shield(self._releases.spawn(self._release(entry.tenant, sid)))

    async def _release(self, tenant: str, sid: str) -> None:
        await self._on_end(tenant, sid)

    # -- the reaper ------------------------------------------------------------------
    def _due(self, now: float) -> list[str]:
        due = []
        for sid, s in self.sessions.items():
            if s.in_flight:
                continue
            limit = self.start_timeout_s if s.requests <= 1 else self.idle_timeout_s
            if now - s.last >= limit:
                due.append(sid)
        return due

    async def close_session(self, sid: str) -> None:
        """End session ``sid`` as its client's ``DELETE`` would (through the SDK), then
        release what it held."""
        entry = self.sessions.get(sid)
        if entry is None:
            return
        scope: Scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "DELETE", "scheme": "http", "path": self.path,
            "raw_path": self.path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"host", entry.host), (b"mcp-session-id", sid.encode("latin-1"))],
            "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
            TENANT_KEY: entry.tenant, "user": self._users.get(entry.tenant)}
        sent = False

        async def receive() -> MutableMapping[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # never: the app reads no more
            raise AssertionError

        async def discard(_: MutableMapping[str, Any]) -> None:
            return None

        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.app(scope, receive, discard), 10)
        await self._forget(sid, "expired")

    async def reap(self) -> int:
        """Close the sessions past their expiry now; how many."""
        due = self._due(self._clock())
        for sid in due:
            await self.close_session(sid)
        return len(due)

    async def _reap_loop(self) -> None:
        period = max(0.05, min(self.start_timeout_s / 4, self.idle_timeout_s / 4, 1.0))
        while True:
            await asyncio.sleep(period)
            with contextlib.suppress(Exception):
                await self.reap()

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> MutableMapping[str, Any]:
            message = await receive()
            if message.get("type") == "lifespan.shutdown":
                await self.aclose()
            return message
        return wrapped

    async def aclose(self) -> None:
        """Stop the reaper and wait for the releases under way (the lifespan's shutdown
        does this; a new request starts the reaper again)."""
        await self._tasks.aclose()
        self._reaper = None
        await self._releases.drain()
