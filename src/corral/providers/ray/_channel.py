"""A direct data channel between a driver and a node actor: the hot path without Ray.

A Ray actor call costs about 2 ms here (and a snippet run takes two or three), so the
calls on a sandbox (exec, start / stdin / poll of a process, files, kill, count, ...) go
over a TCP connection of their own to the node actor; Ray stays for placement, memory
reservations, creating sandboxes, leases and seeing nodes die.

* The node actor listens on its node's IP only (never a wildcard address), port 0, with
  a random 32-byte secret made per actor; a driver gets ``(host, port, secret)`` once,
  through Ray.
* Every connection is authenticated both ways before anything else is read: the server
  sends a nonce, the client answers with its own nonce and an HMAC-SHA256 of both under
  the secret, the server checks it (``hmac.compare_digest``) and proves it holds the
  secret the same way. A peer that fails, or takes more than :data:`HANDSHAKE_S`, is
  cut off; at most :data:`MAX_UNAUTHENTICATED` connections wait in the handshake.
* Then frames: a 4-byte big-endian length and a pickle, at most :data:`MAX_FRAME` bytes
  (a longer header ends the connection before the body is read). A request is
  ``(id, method, args)``, a reply ``(id, Reply)`` (:mod:`._wire`: errors as data).
  Pickles are loaded by :class:`_Unpickler`, which builds only plain values, corral's
  dataclasses and enums and a few builtin containers: never a function or another
  class, even from a peer that passed the handshake. Sandbox output reaches the
  driver only inside such frames, and the node hands it out in bounded pieces
  (``NodeHost.poll``).
* A connection that breaks (the node actor died, or its node), or whose peer does not
  answer TCP within :data:`USER_TIMEOUT_MS`, fails every call in flight with
  :class:`ChannelBroken`; the provider turns that into the node-loss error.

Pure asyncio, no Ray import: both ends use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import hashlib
import hmac
import io
import os
import pickle
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from corral.core.errors import ProviderError
from corral.providers.ray._wire import Reply, err

__all__ = ["MAX_FRAME", "Channel", "ChannelBroken", "ChannelServer", "dumps", "loads"]

MAGIC = b"CRLCH1\n"
#: the largest frame either end reads or sends (a reply above it becomes an error reply)
MAX_FRAME = 64 * 1024 * 1024
#: the time a new connection has to finish the handshake
HANDSHAKE_S = 5.0
#: connections in the handshake at once; more are closed at once
MAX_UNAUTHENTICATED = 32
#: authenticated connections one node actor keeps at once
MAX_CONNECTIONS = 256
#: unacknowledged data older than this breaks the connection (TCP_USER_TIMEOUT)
USER_TIMEOUT_MS = 5000
_NONCE = 32
_HDR = struct.Struct("!I")
_BUILTINS = frozenset({"set", "frozenset", "bytearray", "complex", "slice", "range"})


class ChannelBroken(ConnectionError):
    """The connection to a node actor is gone (or could not be made): the node is lost."""


class _Unpickler(pickle.Unpickler):
    """Loads plain values (None, bools, numbers, str, bytes, tuples, lists, dicts) and
    only these globals: a few builtin containers, and corral's dataclasses and enums
    (the specs, options, results and handles the calls carry). Never a function, a
    module or any other class."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _BUILTINS:
            return super().find_class(module, name)
        if module.startswith("corral.") and "." not in name:
            obj = super().find_class(module, name)
            if isinstance(obj, type) and (dataclasses.is_dataclass(obj)
                                          or issubclass(obj, enum.Enum)):
                return obj
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed on a node channel")

    def persistent_load(self, pid: Any) -> Any:
        """An enum member (:class:`_Pickler` sends them by name: plain pickle would need
        ``getattr`` as a global)."""
        if not (isinstance(pid, tuple) and len(pid) == 4 and pid[0] == "enum"
                and all(isinstance(x, str) for x in pid[1:])):
            raise pickle.UnpicklingError("a malformed reference on a node channel")
        cls = self.find_class(pid[1], pid[2])
        if not issubclass(cls, enum.Enum) or pid[3] not in cls.__members__:
            raise pickle.UnpicklingError(f"{pid[1]}.{pid[2]}.{pid[3]} is not an enum member")
        return cls.__members__[pid[3]]


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, enum.Enum):
            cls = type(obj)
            return ("enum", cls.__module__, cls.__qualname__, obj.name)
        return None


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=5).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def _mac(secret: bytes, tag: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, tag + a + b, hashlib.sha256).digest()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = _HDR.unpack(await reader.readexactly(_HDR.size))
    if n > MAX_FRAME:
        raise ChannelBroken(f"a frame of {n} bytes (at most {MAX_FRAME})")
    return await reader.readexactly(n)


def _tune(sock: socket.socket | None) -> None:
    """No Nagle delay; a silent peer breaks the connection within seconds."""
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 2)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)


Handler = Callable[[str, tuple[Any, ...]], Awaitable[Reply]]

#: pending output above which a sender writes at once and waits for the socket to drain
_FLUSH_AT = 256 * 1024


class _Sender:
    """Frames to one connection, gathered until the loop's next turn and written in one
    send (a process's first poll and its stdin go in one segment: fewer system calls and
    wake-ups at both ends). Past :data:`_FLUSH_AT` pending bytes it writes at once and
    the caller waits for the socket to drain (back-pressure)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._w = writer
        self._buf: list[bytes] = []
        self._size = 0
        self._soon: asyncio.Handle | None = None

    async def send(self, payload: bytes) -> None:
        self._buf += (_HDR.pack(len(payload)), payload)
        self._size += _HDR.size + len(payload)
        if self._size < _FLUSH_AT:
            if self._soon is None:
                self._soon = asyncio.get_running_loop().call_soon(self.flush)
            return
        self.flush()
        await self._w.drain()

    def flush(self) -> None:
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        buf, self._buf, self._size = self._buf, [], 0
        if buf and not self._w.is_closing():
            self._w.writelines(buf)


class ChannelServer:
    """The node actor's listener (see the module doc). ``handler(method, args)`` serves an
    authenticated request; it must return a Reply, never raise."""

    def __init__(self, handler: Handler, *, where: str) -> None:
        self._handler = handler
        self._where = where
        self.secret = os.urandom(32)
        self._server: asyncio.Server | None = None
        self._pending = 0
        self._conns: set[asyncio.StreamWriter] = set()
        self.address: tuple[str, int] | None = None
        #: connections refused (bad or slow handshake, too many): for tests and doctor
        self.refused = 0

    async def start(self, host: str) -> tuple[str, int]:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, host=host, port=0,
                                                      limit=1 << 16)
            port = self._server.sockets[0].getsockname()[1]
            self.address = (host, int(port))
        assert self.address is not None
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.close()
            self._server = None

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> bool:
        nonce_s = os.urandom(_NONCE)
        writer.write(MAGIC + nonce_s)
        await writer.drain()
        got = await reader.readexactly(len(MAGIC) + 2 * _NONCE)
        if got[:len(MAGIC)] != MAGIC:
            return False
        nonce_c = got[len(MAGIC):len(MAGIC) + _NONCE]
        mac_c = got[len(MAGIC) + _NONCE:]
        if not hmac.compare_digest(mac_c, _mac(self.secret, b"client", nonce_s, nonce_c)):
            return False
        writer.write(_mac(self.secret, b"server", nonce_c, nonce_s))
        await writer.drain()
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _tune(writer.get_extra_info("socket"))
        if self._pending >= MAX_UNAUTHENTICATED or len(self._conns) >= MAX_CONNECTIONS:
            self.refused += 1
            writer.close()
            return
        self._pending += 1
        try:
            good = await asyncio.wait_for(self._handshake(reader, writer), HANDSHAKE_S)
        except (Exception, asyncio.CancelledError):
            good = False
        finally:
            self._pending -= 1
        if not good:
            self.refused += 1
            writer.close()
            return
        self._conns.add(writer)
        sender = _Sender(writer)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    rid, method, args = loads(await _read_frame(reader))
                except (asyncio.IncompleteReadError, ConnectionError, OSError):
                    return
                except Exception:  # a malformed request: end this connection
                    return
                t = asyncio.ensure_future(self._one(sender, rid, str(method), tuple(args)))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        finally:
            self._conns.discard(writer)
            for t in tasks:
                t.cancel()
            writer.close()

    async def _one(self, sender: _Sender, rid: Any, method: str,
                   args: tuple[Any, ...]) -> None:
        if method == "ping":
            reply: Reply = ("ok", None)
        else:
            reply = await self._handler(method, args)
        try:
            payload = dumps((rid, reply))
        except Exception as e:
            payload = dumps((rid, err(e, where=self._where)))
        if len(payload) > MAX_FRAME:
            payload = dumps((rid, err(ValueError(
                f"a reply of {len(payload)} bytes is over the channel's {MAX_FRAME}"),
                where=self._where)))
        with contextlib.suppress(ConnectionError, OSError):
            await sender.send(payload)


class Channel:
    """The driver's end: one connection (per event loop) to one node actor, shared by
    every call to that node; calls are multiplexed by id. Once broken it stays broken
    (the node is treated as lost; a node attached again gets a new Channel)."""

    def __init__(self, host: str, port: int, secret: bytes, *, name: str) -> None:
        self.host, self.port, self.name = host, port, name
        self._secret = secret
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._sender: _Sender | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._calls: dict[int, asyncio.Future[Reply]] = {}
        self._next = 0
        self.broken: ChannelBroken | None = None

    async def _connect(self) -> None:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=1 << 16), HANDSHAKE_S)
        except (OSError, TimeoutError) as e:
            raise ChannelBroken(f"cannot connect to {self.name} at {self.host}:{self.port}: "
                                f"{type(e).__name__}: {e}") from None
        _tune(writer.get_extra_info("socket"))
        try:
            async with asyncio.timeout(HANDSHAKE_S):
                hello = await reader.readexactly(len(MAGIC) + _NONCE)
                if hello[:len(MAGIC)] != MAGIC:
                    raise ChannelBroken("not a corral node channel")
                nonce_s = hello[len(MAGIC):]
                nonce_c = os.urandom(_NONCE)
                writer.write(MAGIC + nonce_c + _mac(self._secret, b"client", nonce_s, nonce_c))
                await writer.drain()
                mac_s = await reader.readexactly(32)
                if not hmac.compare_digest(mac_s, _mac(self._secret, b"server", nonce_c,
                                                       nonce_s)):
                    raise ChannelBroken("the node did not prove it holds the channel's secret")
        except ChannelBroken as e:
            writer.close()
            raise ChannelBroken(f"{self.name}: {e}") from None
        except (OSError, EOFError, TimeoutError) as e:
            writer.close()
            raise ChannelBroken(f"{self.name}: the handshake failed: "
                                f"{type(e).__name__}: {e}") from None
        self._writer = writer
        self._sender = _Sender(writer)
        self._reader_task = asyncio.ensure_future(self._read(reader))

    async def _ensure(self) -> _Sender:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop: a new connection for it
            self._loop, self._writer, self._sender, self._connecting = loop, None, None, None
            self._calls = {}
        if self.broken is not None:
            raise self.broken
        if self._writer is None:
            if self._connecting is None:
                self._connecting = asyncio.ensure_future(self._connect())
            try:
                await asyncio.shield(self._connecting)
            except ChannelBroken as e:
                self.break_(str(e))
                raise self.broken or e from None
        assert self._sender is not None
        return self._sender

    async def _read(self, reader: asyncio.StreamReader) -> None:
        why = "the connection closed"
        try:
            while True:
                rid, reply = loads(await _read_frame(reader))
                fut = self._calls.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except asyncio.CancelledError:
            why = "the connection was closed"
        except asyncio.IncompleteReadError:
            why = "the node actor closed the connection"
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
        self.break_(why)

    def break_(self, why: str) -> None:
        """Mark the channel broken: every call in flight and every later one fails."""
        if self.broken is None:
            self.broken = ChannelBroken(f"the channel to {self.name} broke: {why}")
        calls, self._calls = self._calls, {}
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(self.broken)
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()

    async def call(self, method: str, *args: Any) -> Reply:
        """Send one request and wait for its reply (a Reply: errors as data)."""
        sender = await self._ensure()
        payload = dumps((self._next, method, args))
        if len(payload) > MAX_FRAME:
            raise ProviderError(f"a request of {len(payload)} bytes is over the channel's "
                                f"{MAX_FRAME}")
        rid, self._next = self._next, self._next + 1
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._calls[rid] = fut
        try:
            await sender.send(payload)
        except (ConnectionError, OSError) as e:
            self.break_(f"{type(e).__name__}: {e}")
        try:
            return await fut
        finally:
            self._calls.pop(rid, None)

    def close(self) -> None:
        """Close the connection for good (its provider closed)."""
        self.break_("it was closed")
        if self._reader_task is not None:
            self._reader_task.cancel()
