"""The node actor's data channel (``_channel``) on loopback, without Ray: calls, the
mutual handshake, the frame cap, the restricted unpickler, and a broken connection
failing the calls in flight with ChannelBroken."""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import time
from typing import Any

import pytest

from corral.core.result import RunResult
from corral.core.spec import ExecOpts, Level
from corral.providers.ray import _channel, _wire
from corral.providers.ray._channel import Channel, ChannelBroken, ChannelServer, dumps, loads
from corral.providers.ray.node import NodeHost

HOST = "127.0.0.1"


async def _echo(method: str, args: tuple[Any, ...]) -> _wire.Reply:
    if method == "sleep":
        await asyncio.sleep(float(args[0]))
    if method == "big":
        return _wire.ok(b"x" * int(args[0]))
    return _wire.ok((method, args))


def test_calls_round_trip_values_and_corral_types() -> None:
    async def go() -> None:
        srv = ChannelServer(_echo, where="test")
        host, port = await srv.start(HOST)
        ch = Channel(host, port, srv.secret, name="node test")
        try:
            opts = ExecOpts(env={"A": "b"}, timeout_ms=5)
            r = RunResult(exit_code=0, stdout=b"hi\n")
            got = _wire.unwrap(await ch.call("m", [b"x"], opts, Level.STRICT, r, {1}))
            assert got == ("m", ([b"x"], opts, Level.STRICT, r, {1}))
            # calls are multiplexed: a slow one does not hold up a quick one
            slow = asyncio.ensure_future(ch.call("sleep", 0.5))
            t0 = time.monotonic()
            assert _wire.unwrap(await ch.call("quick"))[0] == "quick"
            assert time.monotonic() - t0 < 0.4
            await slow
            # a reply over the frame cap becomes an error reply; the channel stays up
            _channel.MAX_FRAME, old = 1 << 16, _channel.MAX_FRAME
            try:
                with pytest.raises(Exception, match="over the channel"):
                    _wire.unwrap(await ch.call("big", 1 << 17))
                assert ch.broken is None
            finally:
                _channel.MAX_FRAME = old
        finally:
            ch.close()
            await srv.close()
    asyncio.run(go())


def test_a_wrong_secret_is_refused_both_ways() -> None:
    async def go() -> None:
        srv = ChannelServer(_echo, where="test")
        host, port = await srv.start(HOST)
        bad = Channel(host, port, os.urandom(32), name="node test")
        with pytest.raises(ChannelBroken):
            await bad.call("m")
        await asyncio.sleep(0.05)
        assert srv.refused == 1
        # a server without the secret cannot pass for the node: the client refuses it
        impostor = ChannelServer(_echo, where="impostor")
        h2, p2 = await impostor.start(HOST)
        ch = Channel(h2, p2, srv.secret, name="node test")
        with pytest.raises(ChannelBroken):
            await ch.call("m")
        await srv.close()
        await impostor.close()
    asyncio.run(go())


def test_a_silent_or_garbage_peer_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_channel, "HANDSHAKE_S", 0.3)

    async def go() -> None:
        srv = ChannelServer(_echo, where="test")
        host, port = await srv.start(HOST)
        r, w = await asyncio.open_connection(host, port)
        await r.readexactly(len(_channel.MAGIC) + 32)  # the server's hello, then silence
        assert await asyncio.wait_for(r.read(), 2.0) == b""  # closed by the server
        w.close()
        r, w = await asyncio.open_connection(host, port)
        w.write(b"GET / HTTP/1.0\r\n" + b"\0" * 200)
        await w.drain()
        await asyncio.wait_for(r.read(), 2.0)  # returns at the server's close
        w.close()
        await asyncio.sleep(0.05)
        assert srv.refused == 2
        await srv.close()
    asyncio.run(go())


def test_an_oversized_frame_or_a_dropped_connection_breaks_the_channel() -> None:
    """A frame header over the cap ends the connection before its body is read; the
    calls in flight fail with ChannelBroken at once, and so does every later call."""
    async def go() -> None:
        holder: dict[str, Any] = {}

        async def handler(method: str, args: tuple[Any, ...]) -> _wire.Reply:
            if method == "lie":  # write a header claiming more than the cap
                w = next(iter(holder["srv"]._conns))
                w.write(struct.pack("!I", _channel.MAX_FRAME + 1))
                await asyncio.sleep(10)
            if method == "drop":
                for w in list(holder["srv"]._conns):
                    w.transport.abort()
                await asyncio.sleep(10)
            return _wire.ok(None)

        for how in ("lie", "drop"):
            srv = ChannelServer(handler, where="test")
            holder["srv"] = srv
            host, port = await srv.start(HOST)
            ch = Channel(host, port, srv.secret, name="node test")
            assert _wire.unwrap(await ch.call("ping")) is None
            t0 = time.monotonic()
            with pytest.raises(ChannelBroken):
                await asyncio.wait_for(ch.call(how), 5.0)
            assert time.monotonic() - t0 < 1.0
            with pytest.raises(ChannelBroken):
                await ch.call("ping")
            await srv.close()
    asyncio.run(go())


def test_the_unpickler_builds_no_functions_or_foreign_classes() -> None:
    for evil in (pickle.dumps(os.system), pickle.dumps(getattr),
                 pickle.dumps(Level.STRICT),  # plain pickle: builtins.getattr
                 pickle.dumps(NodeHost)):  # a corral class, but not a dataclass or enum
        with pytest.raises(pickle.UnpicklingError):
            loads(evil)
    assert loads(dumps([Level.STRICT, b"x"])) == [Level.STRICT, b"x"]


def test_the_node_serves_only_its_channel_methods() -> None:
    async def go() -> None:
        host = NodeHost("n" * 32)
        for method in ("shutdown", "release", "_destroy", "__init__", "info"):
            with pytest.raises(Exception, match="not served on the channel"):
                _wire.unwrap(await host._serve_call(method, ()))
        with pytest.raises(Exception, match="is gone"):
            _wire.unwrap(await host._serve_call("exec", ("nope", ["true"], None)))
    asyncio.run(go())


def test_a_poll_hands_out_output_in_bounded_pieces() -> None:
    """A process that wrote more than POLL_MAX_BYTES gets it over several polls; its
    EOF and end come with the last piece only."""
    from corral.providers.ray import node as node_mod

    async def go() -> None:
        host = NodeHost("n" * 32)
        rec = node_mod._Proc(sid="s")
        cap = node_mod.POLL_MAX_BYTES
        rec.out += b"a" * (2 * cap + 5)
        rec.err += b"e" * 3
        rec.out_eof = rec.err_eof = True
        rec.final = _wire.ok(RunResult(exit_code=0))
        host._procs["p"] = rec
        got = []
        while True:
            r = _wire.unwrap(await host.poll("p", 0.0, 0.0))
            got.append(r)
            if r["final"] is not None:
                break
        assert [len(r["out"]) for r in got] == [cap, cap, 5]
        assert [r["out_eof"] for r in got] == [False, False, True]
        assert got[0]["err"] == b"eee" and got[0]["err_eof"]
        assert "p" not in host._procs
    asyncio.run(go())
