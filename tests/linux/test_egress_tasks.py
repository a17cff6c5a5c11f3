"""Every task of the network code has an owner that awaits it (issue 25, item 4).

The proxy's connections and lookups, and a sandbox's preview connections, are tasks of a
task group held open by their owner (``egress/tasks.py``), never of
``asyncio.start_server``: closing the owner cancels them and waits for each. Each test
runs on a fresh loop whose exception handler fails the test on any call (``run``): on
CPython 3.11.7 and 3.12.1 a cancelled task the server owned made it log "Exception in
callback", so these also pass or fail per interpreter (scripts/test-tiers.sh runs them
on each).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import pytest
from test_egress import LOOP, echo_server, http_connect, proxy, run

from corral.core.spec import NetworkPolicy
from corral.providers.linux.host.egress import EgressPolicy
from corral.providers.linux.host.egress.tasks import TaskOwner
from corral.providers.linux.host.netrelay import SandboxNetwork


def _others() -> set[asyncio.Task[object]]:
    """The loop's tasks other than the test's own."""
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


def test_the_owner_awaits_every_task_and_keeps_going_past_a_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    async def t() -> None:
        owner = TaskOwner("test")
        never_run = asyncio.sleep(1)
        assert owner.spawn(never_run) is None              # not open yet: closed, unrun
        await owner.open()
        ended: list[str] = []

        async def sleeper(name: str) -> str:
            try:
                await asyncio.sleep(60)
            finally:
                ended.append(name)
            return name

        async def boom() -> None:
            raise ValueError("a bug in one task")

        tasks = [owner.spawn(sleeper(f"s{i}")) for i in range(3)]
        failing = owner.spawn(boom())
        assert failing is not None and await failing is None   # logged, not raised
        assert owner.errors == 1 and len(owner) == 3           # the others run on
        await owner.aclose()
        assert sorted(ended) == ["s0", "s1", "s2"]
        assert all(t is not None and t.cancelled() for t in tasks)
        assert _others() == set()                              # the runner too
        assert owner.spawn(asyncio.sleep(1)) is None           # closed: closed, unrun
        await owner.aclose()                                   # idempotent
    caplog.set_level(logging.ERROR, logger="corral.providers.linux.host.egress.tasks")
    run(t)
    assert "a bug in one task" in caplog.text


def test_closing_the_proxy_ends_every_connection_task() -> None:
    """Connections in each state (a tunnel spliced, a head half sent, a SOCKS greeting
    only, a lookup that never answers) when the proxy closes: all end, none is left
    pending, and the loop reports nothing."""
    async def t() -> None:
        async with echo_server() as (port, _conns):
            async with proxy(EgressPolicy.allowlist("api.example.test", "slow.test", LOOP),
                             header_timeout_s=30) as (p, path, _resolver):
                stuck = asyncio.Event()

                async def slow(host: str, port: int) -> list[str]:
                    if host == "slow.test":
                        await stuck.wait()                     # never set
                    return ["127.0.0.1"]

                p._resolver = slow
                head, r1, w1 = await http_connect(path, f"api.example.test:{port}")
                assert head.startswith(b"HTTP/1.1 200")
                w1.write(b"x")
                assert await r1.readexactly(1) == b"x"         # spliced
                r2, w2 = await asyncio.open_unix_connection(path)
                w2.write(b"CONNECT api.example.test:1 HTTP/1.1\r\n")   # half a head
                r3, w3 = await asyncio.open_unix_connection(path)
                w3.write(b"\x05\x01\x00")                      # SOCKS greeting only
                assert await r3.readexactly(2) == b"\x05\x00"
                r4, w4 = await asyncio.open_unix_connection(path)
                w4.write(b"CONNECT slow.test:80 HTTP/1.1\r\n\r\n")    # lookup hangs
                for _ in range(50):
                    if len(p._owner) >= 5:                     # 4 connections, 1 lookup
                        break
                    await asyncio.sleep(0.01)
                assert len(p._owner) >= 5
                await p.aclose()
                assert len(p._owner) == 0
                for r in (r1, r2, r3, r4):
                    with contextlib.suppress(ConnectionError):
                        assert await r.read() == b""           # closed, nothing more
                for w in (w1, w2, w3, w4):
                    w.close()
            assert _others() == set()
    run(t)


def test_closing_a_sandbox_network_ends_its_preview_connections() -> None:
    """Preview URLs: connections waiting for their token and connections being forwarded
    are tasks of the network's group; unexpose ends its port's, aclose the rest."""
    async def t() -> None:
        inner = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        inner.bind(("127.0.0.1", 0))
        inner.listen(8)
        inner.setblocking(False)
        target = inner.getsockname()[1]

        async def new_socket() -> int:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM).detach()

        net = SandboxNetwork(NetworkPolicy(), new_socket)
        try:
            url = await net.expose(target)
            other = await net.expose(target + 1 if target < 65535 else target - 1)
            host, port = str(url).split("//")[1].rstrip("/").split(":")
            waiting = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
            r, w = await asyncio.open_connection(host, int(port))
            w.write(f"CORRAL-PREVIEW-TOKEN {url.token}\r\nhello".encode())
            loop = asyncio.get_running_loop()
            conn, _addr = await loop.sock_accept(inner)        # forwarded inside
            assert await loop.sock_recv(conn, 5) == b"hello"
            ohost, oport = str(other).split("//")[1].rstrip("/").split(":")
            other_conn = await asyncio.open_connection(ohost, int(oport))
            for _ in range(50):
                if len(net._owner) >= 5:
                    break
                await asyncio.sleep(0.01)
            assert len(net._owner) == 5
            await net.unexpose(target)
            assert len(net._owner) == 1                        # the other URL's
            with contextlib.suppress(ConnectionError):
                assert await r.read() == b""
            await net.aclose()
            assert len(net._owner) == 0
            with contextlib.suppress(ConnectionError):
                assert await other_conn[0].read() == b""
            conn.close()
            for _r, ww in (*waiting, (r, w), other_conn):
                ww.close()
        finally:
            await net.aclose()
            inner.close()
        assert _others() == set()
    run(t)
