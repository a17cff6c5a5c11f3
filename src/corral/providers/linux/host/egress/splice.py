"""The splice engine: a decided tunnel's bytes moved by splice(2), never entering Python.

Once a tunnel is decided (and its ClientHello checked), the client's socket is taken
out of its asyncio transport (:func:`detach`) and each direction becomes a
:class:`Splicer`: event-loop callbacks (no coroutine per wakeup) that splice socket
to pipe to socket, or recv/send through one buffer where the kernel refuses splice.
A :class:`Tunnel` ties the two directions together with one idle clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
from dataclasses import dataclass
from typing import Final, final

from corral.providers.linux.host.egress.limits import CHUNK

__all__ = ["SockReader", "Splicer", "Tunnel", "detach", "send_all", "shutdown", "wait_io"]

#: the pipe between two spliced sockets (the system's default maximum for unprivileged)
PIPE_SIZE: Final = 1 << 20
#: the send buffer of a unix-socket client of a tunnel (the kernel doubles it)
UNIX_SNDBUF: Final = 1 << 20
F_SETPIPE_SZ: Final = getattr(fcntl, "F_SETPIPE_SZ", 1031)
SPLICE_FLAGS: Final = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)


async def wait_io(sock: socket.socket, write: bool, last: list[float], idle: float) -> None:
    """Wait until ``sock`` is readable (writable); TimeoutError once neither direction
    of the tunnel (``last``: its latest progress) has moved for ``idle`` seconds."""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    while True:
        fut: asyncio.Future[None] = loop.create_future()

        def ready(f: asyncio.Future[None] = fut) -> None:
            if not f.done():
                f.set_result(None)

        if write:
            loop.add_writer(fd, ready)
        else:
            loop.add_reader(fd, ready)
        handle = loop.call_at(last[0] + idle, ready)
        try:
            await fut
        finally:
            handle.cancel()
            if write:
                loop.remove_writer(fd)
            else:
                loop.remove_reader(fd)
        if loop.time() - last[0] < idle:
            return
        raise TimeoutError


async def send_all(sock: socket.socket, data: bytes | memoryview, last: list[float],
                   idle: float) -> None:
    """Send all of ``data`` on the non-blocking ``sock`` (see :func:`wait_io`)."""
    view = memoryview(data)
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            await wait_io(sock, True, last, idle)
            continue
        view = view[n:]
        last[0] = asyncio.get_running_loop().time()


async def shutdown(writer: asyncio.StreamWriter, timeout: float) -> None:
    """Close ``writer`` after what it buffered is sent, waiting at most ``timeout``
    (a peer that does not read); then (or on any error) drop the connection."""
    try:
        if not writer.transport.is_closing():
            writer.close()
        async with asyncio.timeout(min(timeout, 30.0)):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        pass
    finally:
        writer.transport.abort()


async def detach(reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> tuple[socket.socket, bytes]:
    """Take the client's socket out of its asyncio transport: what the writer buffered is
    sent first, the bytes the reader buffered are returned; the transport is dropped and
    the caller owns the returned socket (a dup of the transport's)."""
    transport = writer.transport
    if transport.get_write_buffer_size():
        transport.set_write_buffer_limits(high=0)     # drain() now waits until all is sent
        await writer.drain()
    tsock = transport.get_extra_info("socket")
    sock = socket.socket(fileno=os.dup(tsock.fileno()))
    try:
        sock.setblocking(False)
        if sock.family == socket.AF_UNIX:
            # a unix socket's send buffer (208 KiB by default) bounds what is in flight
            # to the client; TCP sockets tune theirs (up to tcp_wmem's maximum)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SNDBUF)
        # StreamReader keeps what it read ahead in its (private) buffer (a KeyError here,
        # not lost bytes, if that ever changes); no await between taking it and dropping
        # the transport, so nothing more can arrive in between
        buffered = bytes(reader.__dict__["_buffer"])
    except BaseException:
        sock.close()
        raise
    transport.abort()
    return sock, buffered


#: splice(2) calls one wakeup of a direction makes at most before it lets the event
#: loop run other callbacks (other tunnels, the proxy's handshakes)
MOVES_PER_WAKEUP: Final = 4


@final
class Tunnel:
    """The two :class:`Splicer` directions of one tunnel: their shared idle clock (one
    timer per tunnel, re-armed from the latest progress, not one per wait) and ``done``,
    a future that ends when both directions reached EOF (result), when either failed
    (its exception) or when the tunnel was idle for ``idle`` seconds (TimeoutError)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, idle: float) -> None:
        self.loop = loop
        self.idle = idle
        #: the loop time of the latest byte moved either way (a list: shared with
        #: :func:`wait_io` and :func:`send_all`)
        self.last = [loop.time()]
        self.done: asyncio.Future[None] = loop.create_future()
        self._dirs: list[Splicer] = []
        self._started = 0
        self._timer: asyncio.TimerHandle | None = loop.call_at(self.last[0] + idle,
                                                               self._check_idle)

    def start(self, direction: Splicer | None) -> None:
        """Start one direction (None: one that is done before it started)."""
        self._started += 1
        if direction is not None:
            self._dirs.append(direction)
            direction.start()
        else:
            self.finished()

    def _check_idle(self) -> None:
        self._timer = None
        if self.done.done():
            return
        if self.loop.time() - self.last[0] >= self.idle:
            self.fail(TimeoutError("tunnel idle"))
        else:
            self._timer = self.loop.call_at(self.last[0] + self.idle, self._check_idle)

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        for d in self._dirs:
            d.stop()

    def finished(self) -> None:
        """A direction reached EOF (and half-closed its destination)."""
        if self._started == 2 and all(d.eof for d in self._dirs) and not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        """Stop both directions: no callback of this tunnel runs afterwards, its pipes are
        closed; the sockets are the caller's."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for d in self._dirs:
            d.stop()
        if not self.done.done():
            self.done.cancel()
        elif not self.done.cancelled():
            self.done.exception()           # retrieved


@final
class Splicer:
    """One direction of a tunnel, ``src`` to ``dst`` until EOF, then ``dst`` half-closed:
    splice(2) through a pipe of its own (the bytes never enter this process), or
    recv_into/send through one buffer if the kernel refuses splice for these sockets.

    Driven by event-loop callbacks, not a coroutine: a reader callback on ``src`` stays
    registered while the direction waits for input (no add/remove per chunk), a writer
    callback on ``dst`` only while the destination is full; each wakeup moves at most
    :data:`MOVES_PER_WAKEUP` chunks, then yields to the loop."""

    def __init__(self, tunnel: Tunnel, src: socket.socket, dst: socket.socket) -> None:
        self._t = tunnel
        self._loop = tunnel.loop
        self._src, self._dst = src, dst
        self._sfd, self._dfd = src.fileno(), dst.fileno()
        self._pipe: tuple[int, int] | None = None
        self._buf: memoryview | None = None
        self._pending = 0                     # bytes in the pipe (or buffer) not yet sent
        self._off = 0                         # (buffer mode) where the unsent bytes start
        self._moves = 0
        self._reading = False
        self._writing = False
        self._soon: asyncio.Handle | None = None
        self.eof = False
        self.stopped = False

    def start(self) -> None:
        try:
            rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self._buf = memoryview(bytearray(CHUNK))
        else:
            self._pipe = (rfd, wfd)
            with contextlib.suppress(OSError):
                fcntl.fcntl(wfd, F_SETPIPE_SZ, PIPE_SIZE)
        self._run()

    def stop(self) -> None:
        """Unregister every callback and close the pipe (idempotent)."""
        if self.stopped:
            return
        self.stopped = True
        self._watch(read=False, write=False)
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    def _watch(self, *, read: bool, write: bool) -> None:
        if read != self._reading:
            if read:
                self._loop.add_reader(self._sfd, self._run)
            else:
                self._loop.remove_reader(self._sfd)
            self._reading = read
        if write != self._writing:
            if write:
                self._loop.add_writer(self._dfd, self._run)
            else:
                self._loop.remove_writer(self._dfd)
            self._writing = write

    def _run(self) -> None:
        self._soon = None
        if self.stopped:
            return
        try:
            if self._pipe is not None:
                self._splice()
            else:
                self._plain()
        except OSError as e:
            self._t.fail(e)
        except Exception as e:               # a bug: end the tunnel, never the loop
            self._t.fail(e)

    def _splice(self) -> None:
        assert self._pipe is not None
        rfd, wfd = self._pipe
        for _ in range(MOVES_PER_WAKEUP):
            if not self._pending:
                n = self._splice_once(self._sfd, wfd, PIPE_SIZE, reading=True)
                if n is None:
                    return
                if not n:
                    self._end()
                    return
                self._pending = n
            n = self._splice_once(rfd, self._dfd, self._pending, reading=False)
            if n is None:
                return
            self._pending -= n
            self._t.last[0] = self._loop.time()
            self._moves += 1
        self._again()

    def _splice_once(self, src: int, dst: int, n: int, *, reading: bool) -> int | None:
        """One splice(2) of at most ``n`` bytes (socket to pipe when ``reading``, pipe to
        socket else); None when it would block (the wait is armed) or splice is refused
        for these sockets before anything moved (the tunnel goes on with recv/send)."""
        try:
            return os.splice(src, dst, n, flags=SPLICE_FLAGS)
        except BlockingIOError:
            self._watch(read=reading, write=not reading)
            return None
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.ENOSYS) and self._moves == 0:
                self._to_plain()
                return None
            raise

    def _to_plain(self) -> None:
        """splice refused for these sockets: what the pipe holds moves to the buffer,
        then recv/send."""
        assert self._pipe is not None
        rfd, _wfd = self._pipe
        data = b""
        while len(data) < self._pending:
            data += os.read(rfd, self._pending - len(data))
        for fd in self._pipe:
            os.close(fd)
        self._pipe = None
        buf = bytearray(max(CHUNK, len(data)))
        buf[:len(data)] = data
        self._buf = memoryview(buf)
        self._pending, self._off = len(data), 0
        self._plain()

    def _plain(self) -> None:
        assert self._buf is not None
        buf = self._buf
        for _ in range(MOVES_PER_WAKEUP):
            if not self._pending:
                try:
                    n = self._src.recv_into(buf)
                except BlockingIOError:
                    self._watch(read=True, write=False)
                    return
                if not n:
                    self._end()
                    return
                self._pending, self._off = n, 0
            try:
                n = self._dst.send(buf[self._off:self._off + self._pending])
            except BlockingIOError:
                self._watch(read=False, write=True)
                return
            self._pending -= n
            self._off += n
            self._t.last[0] = self._loop.time()
            self._moves += 1
        self._again()

    def _again(self) -> None:
        """Budget used with bytes still flowing: run again after the loop's other ready
        callbacks (the reader stays registered; a duplicate wakeup is harmless)."""
        if self._soon is None:
            self._soon = self._loop.call_soon(self._run)

    def _end(self) -> None:
        self._watch(read=False, write=False)
        self._dst.shutdown(socket.SHUT_WR)
        self.eof = True
        self.stop()
        self._t.finished()


@dataclass(slots=True)
class SockReader:
    """``readexactly`` on a non-blocking socket, starting with bytes already read."""

    sock: socket.socket
    buf: bytes

    async def readexactly(self, n: int) -> bytes:
        loop = asyncio.get_running_loop()
        while len(self.buf) < n:
            more = await loop.sock_recv(self.sock, max(n - len(self.buf), CHUNK))
            if not more:
                raise asyncio.IncompleteReadError(self.buf, n)
            self.buf += more
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def take(self) -> bytes:
        """The bytes read ahead and not returned yet."""
        out, self.buf = self.buf, b""
        return out


