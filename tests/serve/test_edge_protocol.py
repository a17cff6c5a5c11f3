"""The edge's protocol classes on their own (issue 23.4): uvicorn's h11 and httptools
protocols, each with the head deadline, the head size bound and the unauthenticated
budget, served in this process on 127.0.0.1 with a minimal ASGI app."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from corral.serve.edge import Edge, close_unread_bodies, edge_protocol, mark_authenticated

uvicorn = pytest.importorskip("uvicorn")


async def _app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if any(name == b"authorization" for name, _ in scope["headers"]):
        assert mark_authenticated(scope)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _scenario(kind: str) -> None:
    edge = Edge(head_timeout_s=1.0, max_unauthenticated=4, max_authenticated=10,
                max_head_bytes=4096)
    cfg = uvicorn.Config(close_unread_bodies(_app), http=edge_protocol(edge, kind), ws="none",
                         log_config=None, lifespan="on", loop="asyncio")
    srv = uvicorn.Server(cfg)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(100)
    port = sock.getsockname()[1]
    task = asyncio.ensure_future(srv.serve(sockets=[sock]))
    conns: list[asyncio.StreamWriter] = []
    try:
        while not srv.started:
            await asyncio.sleep(0.01)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        conns.append(w)
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n")
        assert (await r.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
        halves = []
        for _ in range(10):  # token-less half heads: 4 kept, 6 evicted
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            conns.append(w2)
            w2.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
            halves.append(r2)
        await asyncio.sleep(0.2)
        f = edge.figures()
        assert (f["unauthenticated"], f["authenticated"], f["evicted"]) == (4, 1, 6), f
        assert await asyncio.wait_for(halves[0].read(), 5) == b""  # evicted: closed
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # the authenticated one still works
        assert (await r.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
        late = await asyncio.wait_for(halves[-1].read(), 5)  # the head deadline
        assert late.startswith(b"HTTP/1.1 408 "), late
        r3, w3 = await asyncio.open_connection("127.0.0.1", port)
        conns.append(w3)
        w3.write(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"a: b\r\n" * 2000)
        big = await asyncio.wait_for(r3.read(), 5)
        assert big.startswith(b"HTTP/1.1 431 "), big[:60]
    finally:
        for c in conns:
            c.close()
        srv.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


@pytest.mark.parametrize("kind", ["h11", "httptools"])
def test_both_protocols_bound_heads_and_unauthenticated_connections(kind: str) -> None:
    if kind == "httptools":
        pytest.importorskip("httptools")
    asyncio.run(_scenario(kind))


class _FakeConn:
    def __init__(self, idle: bool = True) -> None:
        self.idle, self.closed = idle, False

    def corral_idle(self) -> bool:
        return self.idle

    def corral_close(self, answer: bytes | None) -> None:
        self.closed = True


def test_the_pools_evict_idle_unauthenticated_first_and_cap_authenticated() -> None:
    edge = Edge(head_timeout_s=1, max_unauthenticated=2, max_authenticated=1)
    busy, idle, new = _FakeConn(idle=False), _FakeConn(), _FakeConn()
    edge.admit(busy)
    edge.admit(idle)
    edge.admit(new)  # at the budget: the oldest idle one goes, not the busy older one
    assert (busy.closed, idle.closed, new.closed) == (False, True, False)
    assert edge.authenticate(new)
    assert edge.authenticate(new)  # again on the same connection: still one
    assert not edge.authenticate(busy)  # the authenticated pool (1) is full
    assert edge.figures()["refused"] == 1
    edge.forget(new)
    assert edge.authenticate(busy)
    last = _FakeConn()
    edge.admit(_FakeConn(idle=False))
    edge.admit(_FakeConn(idle=False))
    edge.admit(last)  # every one busy: the oldest of all goes
    assert edge.figures()["unauthenticated"] == 2 and edge.figures()["evicted"] == 2
