"""The server's edge: connections and request bodies, bounded before any tenant is known.

uvicorn reads a request head for as long as the peer takes and counts every connection in
one pool that it checks before the app (and so auth) ever runs: 1005 sockets holding half a
head, no token, were enough to answer every tenant 503. This module puts corral's own
bounds under it, without giving up uvloop and httptools (the protocol classes are
uvicorn's, subclassed; nothing is added per byte read):

* **Head deadline.** A connection must send a complete request head within
  ``head_timeout_s`` of its opening, or of the end of the previous answer on it; else it is
  answered 408 and closed.
* **Two connection pools.** A connection counts as *unauthenticated* until a request on it
  has passed auth (the app calls :func:`mark_authenticated`). Those have their own small
  budget (``max_unauthenticated_connections``): at the budget a new connection evicts the
  oldest unauthenticated one (one between requests or still sending its head first), so a
  flood of token-less sockets churns among itself and cannot keep a tenant from connecting.
  Authenticated connections are bounded by ``max_connections``; past it a request that
  passed auth is answered 503 and its connection closed.
* **Body budget.** :class:`BodyBudget`: the request-body bytes held at once, per tenant and
  in all (the app reserves a body's bytes before reading it, and gives them back when the
  request ends).
* **Unread bodies close the connection.** :func:`close_unread_bodies`: an answer sent
  before the request's body was read to its end says ``connection: close`` (uvicorn would
  otherwise go on reading, and discarding, the rest of it to reach the next request).

Imports uvicorn only inside :func:`edge_protocol` (the CLI never imports it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

__all__ = ["BodyBudget", "Edge", "close_unread_bodies", "edge_protocol", "mark_authenticated"]

#: the key of the request scope that holds the connection (set by the protocol below)
SCOPE_KEY: Final = "corral.edge"
_408_BODY: Final = (b'{"error":{"code":"request-timeout","message":"no complete request head '
                   b'in time (head_timeout_s)"}}')
_408: Final = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
               b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
               % (len(_408_BODY), _408_BODY))
_431_BODY: Final = (b'{"error":{"code":"head-too-large","message":"the request head is larger '
                    b'than max_head_bytes"}}')
_431: Final = (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
               b"content-type: application/json\r\nconnection: close\r\n"
               b"content-length: %d\r\n\r\n%s" % (len(_431_BODY), _431_BODY))


class Edge:
    """The server's connections: which are authenticated, which are not, and the
    counters ``/metrics`` shows. One per server, used on its event loop only."""

    def __init__(self, *, head_timeout_s: float, max_unauthenticated: int,
                 max_authenticated: int, max_head_bytes: int = 65536) -> None:
        self.head_timeout_s = head_timeout_s
        self.max_head_bytes = max_head_bytes
        self.max_unauthenticated = max_unauthenticated
        self.max_authenticated = max_authenticated
        #: unauthenticated connections, oldest first (dicts keep insertion order)
        self.unauthenticated: dict[Any, None] = {}
        #: connections a head is awaited on -> the loop time it must be whole by. One
        #: timer sweeps them (a tick of at most a second), not a timer per request
        self.waiting: dict[Any, float] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._tick = min(1.0, head_timeout_s / 4)
        self.authenticated: set[Any] = set()
        self.evicted = 0
        self.head_timeouts = 0
        self.heads_too_large = 0
        self.refused = 0

    def admit(self, conn: Any) -> None:
        """A new connection: room is made for it in the unauthenticated pool by closing
        the oldest one that is not answering a request (or, when every one is, the oldest
        of all: they are on public routes or on their way to a 401)."""
        if len(self.unauthenticated) >= self.max_unauthenticated:
            victim = next((c for c in self.unauthenticated if c.corral_idle()), None)
            if victim is None:
                victim = next(iter(self.unauthenticated))
            self.unauthenticated.pop(victim, None)
            self.evicted += 1
            victim.corral_close(None)
        self.unauthenticated[conn] = None

    def authenticate(self, conn: Any) -> bool:
        """A request on ``conn`` passed auth: move it to the authenticated pool. False when
        that pool is full (the request is answered 503 and the connection closed)."""
        if conn in self.authenticated:
            return True
        if len(self.authenticated) >= self.max_authenticated:
            self.refused += 1
            return False
        self.unauthenticated.pop(conn, None)
        self.authenticated.add(conn)
        return True

    def forget(self, conn: Any) -> None:
        self.unauthenticated.pop(conn, None)
        self.authenticated.discard(conn)
        self.waiting.pop(conn, None)

    def await_head(self, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
        """A head is awaited on ``conn`` from now: it has ``head_timeout_s``."""
        self.waiting[conn] = loop.time() + self.head_timeout_s
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._tick, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        late = [c for c, deadline in self.waiting.items() if deadline <= now]
        for conn in late:
            del self.waiting[conn]
            conn.corral_head_timeout()
        self._sweeper = loop.call_later(self._tick, self._sweep, loop) if self.waiting \
            else None

    def figures(self) -> dict[str, int]:
        return {"unauthenticated": len(self.unauthenticated),
                "authenticated": len(self.authenticated), "evicted": self.evicted,
                "head_timeouts": self.head_timeouts, "heads_too_large": self.heads_too_large,
                "refused": self.refused}


def mark_authenticated(scope: MutableMapping[str, Any]) -> bool:
    """Called by the app when a request passed auth: its connection moves to the
    authenticated pool. False when that pool is full. True when the request did not come
    through :func:`edge_protocol` (an app driven in-process, by tests)."""
    conn = scope.get(SCOPE_KEY)
    if conn is None:
        return True
    return bool(conn.corral_authenticated())


def edge_protocol(edge: Edge, http: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (httptools when installed, else h11, as uvicorn's
    "auto" picks) with the head deadline and the two pools of ``edge``. Pass it as
    ``uvicorn.Config(http=...)``."""
    base: type[Any]
    use_httptools = http == "httptools"
    if http == "auto":
        from importlib.util import find_spec
        use_httptools = find_spec("httptools") is not None
    if use_httptools:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        base = HttpToolsProtocol
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol
        base = H11Protocol

    class EdgeProtocol(base):  # type: ignore[misc]
        corral_closed = False
        #: bytes of the head being read so far (while a head is awaited), else -1
        corral_head_bytes = -1

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            edge.admit(self)
            self.corral_arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self.corral_closed = True
            edge.forget(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.corral_head_bytes < 0:  # a request is being answered: uvicorn's
                super().data_received(data)
                return
            # a head is awaited: bounded in size (httptools keeps every header line it
            # parses: 64 MiB of short lines in 10 s took a server to 1.9 GiB). One read
            # is at most the transport's buffer (256 KiB), so the bound holds to that
            self.corral_head_bytes += len(data)
            super().data_received(data)
            if self.corral_head_bytes > edge.max_head_bytes:
                edge.heads_too_large += 1
                self.corral_close(_431)

        # -- the head deadline ----------------------------------------------------------
        def corral_arm(self) -> None:
            self.corral_head_bytes = 0
            if not self.corral_closed:
                edge.await_head(self, self.loop)

        def corral_disarm(self) -> None:
            edge.waiting.pop(self, None)

        def corral_head_timeout(self) -> None:
            if self.corral_idle():  # 408 to a head begun; a silent one is just closed
                edge.head_timeouts += 1
                self.corral_close(_408 if self.corral_head_bytes > 0 else None)

        def corral_head_done(self) -> None:
            """A request head is complete: no head deadline while it is answered; the
            scope carries the connection (the app marks it authenticated)."""
            self.corral_disarm()
            self.corral_head_bytes = -1
            cycle = self.cycle
            if cycle is not None:
                cycle.scope[SCOPE_KEY] = self

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.corral_idle() and not self.transport.is_closing():
                self.corral_arm()  # the next head has its own deadline

        # -- the pools ------------------------------------------------------------------
        def corral_idle(self) -> bool:
            """No request being answered: sending a head, or between requests."""
            return self.cycle is None or bool(self.cycle.response_complete)

        def corral_authenticated(self) -> bool:
            return edge.authenticate(self)

        def corral_close(self, answer: bytes | None) -> None:
            self.corral_disarm()
            if self.transport.is_closing():
                return
            if answer is not None and self.corral_idle():
                self.transport.write(answer)
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.keep_alive = False
            self.transport.close()

    if use_httptools:
        class HttpTools(EdgeProtocol):
            def on_headers_complete(self) -> None:
                super().on_headers_complete()
                self.corral_head_done()

        return HttpTools

    class H11(EdgeProtocol):
        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            if self.cycle is not before:
                self.corral_head_done()

    return H11


class BodyBudget:
    """Request-body bytes held at once: at most ``per_tenant`` for one tenant and
    ``total`` for all. :meth:`take` reserves (or says which bound is full)."""

    def __init__(self, per_tenant: int, total: int) -> None:
        self.per_tenant, self.total = per_tenant, total
        self.held: dict[str, int] = {}
        self.held_total = 0

    def take(self, tenant: str, n: int) -> str | None:
        """Reserve ``n`` more bytes for ``tenant``; None when done, else which bound is
        full ("tenant" or "total") and nothing is reserved."""
        mine = self.held.get(tenant, 0)
        if mine + n > self.per_tenant:
            return "tenant"
        if self.held_total + n > self.total:
            return "total"
        self.held[tenant] = mine + n
        self.held_total += n
        return None

    def give(self, tenant: str, n: int) -> None:
        if n <= 0:
            return
        left = self.held.get(tenant, 0) - n
        if left > 0:
            self.held[tenant] = left
        else:
            self.held.pop(tenant, None)
        self.held_total -= n


ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]],
                    Callable[[Any], Awaitable[None]]], Awaitable[None]]


def _has_body(scope: MutableMapping[str, Any]) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False


def close_unread_bodies(app: Any) -> ASGIApp:
    """Wrap an ASGI app: an answer started before the request's body was read to its end
    carries ``connection: close``, so the server stops reading that connection (rather
    than reading the rest of the body to reach the next request). Requests without a body
    go straight through."""

    async def wrapped(scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                      send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await app(scope, receive, send)
            return
        read = [False]

        async def rcv() -> Any:
            msg = await receive()
            if msg["type"] != "http.request" or not msg.get("more_body", False):
                read[0] = True
            return msg

        async def snd(msg: Any) -> None:
            if msg["type"] == "http.response.start" and not read[0]:
                msg = {**msg, "headers": [*msg.get("headers", ()), (b"connection", b"close")]}
            await send(msg)

        await app(scope, rcv, snd)

    return wrapped
