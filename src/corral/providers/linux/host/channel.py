"""Host side of the sockets: framed requests to the zygote and to sandbox agents.

A :class:`Channel` speaks the frames of ``agent.py`` (one JSON line, then
``len`` raw bytes) over a non-blocking unix stream socket, with descriptors
passed as SCM_RIGHTS (a frame whose header says ``nfds`` takes that many of
the received descriptors). Requests carry an ``id``; replies resolve the
matching future; ``ev`` frames go to an event callback; the first frame
without either (the agent's ``ready`` or setup error) resolves ``hello``.

The far end runs inside a sandbox (an agent) or next to it (the fork
server), so every byte is read as hostile (see docs/security-model.md, "The
host channel"): a header longer than :data:`MAX_HEADER`, a header that is
not a JSON object, a ``len`` that is negative, not an integer or above what
the request waiting for it allows (:data:`MAX_FRAME` without a request
allowance: events and hellos carry no payload), descriptors where none are
expected, or more than a frame claims: each is a *protocol violation*. The
channel then closes at once (the sandbox is treated as crashed): pending
requests fail with ProviderError naming the violation, received descriptors
are closed, and ``on_violation`` runs (the sandbox kills its agent). Every
request has a deadline; a far end that does not answer in time is a
violation too. So nothing from inside can make the host spin, wait forever,
buffer without bound or hold its descriptors.

:class:`Zygote` starts and stops the fork server process.
"""

from __future__ import annotations

import array
import asyncio
import collections
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

from corral.core.errors import ProviderError
from corral.providers.linux import fdpass as _fdpass
from corral.providers.linux.host.process import settle
from corral.providers.linux.init.zygote import boot_argv
from corral.wire import agent as _wire, fork as _fork
from corral.wire.agent import MAX_FRAME, MAX_HEADER

__all__ = ["MAX_FRAME", "MAX_HEADER", "REQUEST_TIMEOUT_S", "Channel", "Frame", "Zygote"]

Frame = tuple[dict[str, Any], bytes, list[int]]
#: a request's default deadline: the far end answers control requests in milliseconds
REQUEST_TIMEOUT_S: Final = 30.0
#: ids of requests given up by their callers (cancelled) whose late replies are dropped
#: quietly, the most recent this many
CANCELLED_IDS: Final = 64


@dataclass(slots=True)
class _Pending:
    fut: asyncio.Future[Frame]
    max_reply: int   # payload bytes the reply may carry
    max_fds: int     # descriptors the reply may carry
    op: str


@final
class Channel:
    """Requests and events over one unix socket (asyncio, host side)."""

    def __init__(self, sock: socket.socket, *, what: str,
                 on_event: Callable[[dict[str, Any]], None] | None = None,
                 on_orphan_fds: Callable[[list[int]], None] | None = None,
                 on_violation: Callable[[str], None] | None = None,
                 accept_fds: bool = False) -> None:
        """``accept_fds``: whether the far end may send descriptors at all (the fork
        server's create replies do, and a sandbox agent's ``socket`` replies; each
        frame may carry only what the request it answers allows)."""
        self.what = what
        self._sock = sock
        sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._decoder = _wire.Decoder.host(self._allowance, accept_fds=accept_fds)
        self._fds: list[int] = []
        self._pending: dict[int, _Pending] = {}
        #: requests whose callers gave up (cancelled): a late reply to one is no violation
        #: (their allowances: a late read reply still carries its payload)
        self._cancelled: collections.OrderedDict[int, tuple[int, int]] = \
            collections.OrderedDict()
        self._next = 1
        self._on_event = on_event
        self._on_orphan_fds = on_orphan_fds or _close_all
        self.on_violation = on_violation
        #: why the channel closed, if the far end broke the protocol ("" otherwise)
        self.violation = ""
        self.hello: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._wlock = asyncio.Lock()
        self._loop.add_reader(sock.fileno(), self._on_readable)

    @property
    def is_closed(self) -> bool:
        return self.closed.done()

    def set_event_handler(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        self._on_event = on_event

    # -- receiving --------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            data, fds, truncated = _fdpass.recv_checked(self._sock)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds, truncated = b"", [], False
        self._fds.extend(fds)
        try:
            self._decoder.feed(data, len(fds), truncated)
            if not data:
                self.close()
                return
            while not self.closed.done() and (frame := self._decoder.next_frame()) is not None:
                fds, self._fds = self._fds[:frame.nfds], self._fds[frame.nfds:]
                self._dispatch(frame.header, frame.payload, fds)
        except _wire.Violation as e:
            self._violate(e.reason)
        except Exception as e:  # a handler choked on a well-formed frame: same thing
            self._violate(f"{type(e).__name__}: {e}")

    def _allowance(self, header: Mapping[str, Any]) -> tuple[int, int]:
        """(payload bytes, descriptors) a frame may carry: what the request it answers
        allows, nothing for any other frame."""
        rid = header.get("id")
        if type(rid) is not int:
            return MAX_FRAME, 0
        pending = self._pending.get(rid)
        if pending is not None:
            return pending.max_reply, pending.max_fds
        return self._cancelled.get(rid, (MAX_FRAME, 0))

    def _dispatch(self, header: dict[str, Any], payload: bytes, fds: list[int]) -> None:
        rid = header.get("id")
        if rid is not None:
            pending = self._pending.pop(rid, None) if type(rid) is int else None
            if pending is None:
                self._on_orphan_fds(fds)
                if type(rid) is int and rid in self._cancelled:
                    del self._cancelled[rid]  # its caller gave up: dropped quietly
                    return
                raise _wire.Violation(f"a reply to no request (id {str(rid)[:40]!r})")
            if pending.fut.done():  # its caller gave up (cancelled)
                self._on_orphan_fds(fds)
            else:
                pending.fut.set_result((header, payload, fds))
        elif "ev" in header:
            if self._on_event is not None:
                self._on_event(header)
        elif not self.hello.done():
            self.hello.set_result(header)
        else:
            raise _wire.Violation("an unexpected frame (neither reply nor event)")

    # -- requests -----------------------------------------------------------------------
    async def request(self, header: dict[str, Any], payload: bytes = b"",
                      fds: Sequence[int] = (), *, max_reply: int = 0, max_fds: int = 0,
                      timeout: float | None = REQUEST_TIMEOUT_S) -> Frame:
        """Send one request and wait for its reply frame.

        The reply may carry up to ``max_reply`` payload bytes and ``max_fds``
        descriptors. No reply within ``timeout`` seconds (None: no deadline, for a
        request whose wait is bounded elsewhere) closes the channel as a violation
        and raises ProviderError."""
        if self.is_closed:
            raise self._gone()
        rid = self._next
        self._next += 1
        h = dict(header, id=rid)
        fut: asyncio.Future[Frame] = self._loop.create_future()
        self._pending[rid] = _Pending(fut, max_reply, max_fds, str(header.get("op", "?")))
        try:
            async with asyncio.timeout(timeout):
                await self._send(_wire.encode(h, payload), fds)
                return await fut
        except TimeoutError:
            if self.is_closed:
                raise self._gone() from None
            self._violate(f"no answer to {h.get('op', 'a request')!r} within {timeout} s")
            raise self._gone() from None
        except asyncio.CancelledError:
            if not self.is_closed:  # a late reply to it is dropped, not a violation
                self._cancelled[rid] = (max_reply, max_fds)
                while len(self._cancelled) > CANCELLED_IDS:
                    self._cancelled.popitem(last=False)
            raise
        finally:
            self._pending.pop(rid, None)

    async def send_oneway(self, data: bytes) -> None:
        """Send raw frame bytes that expect no reply."""
        await self._send(data, ())

    async def _send(self, data: bytes, fds: Sequence[int]) -> None:
        async with self._wlock:
            view = memoryview(data)
            try:
                if fds:
                    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
                    while True:
                        try:
                            n = self._sock.sendmsg([view], anc)
                            break
                        except BlockingIOError:
                            await self._writable()
                    view = view[n:]
                if view:
                    await self._loop.sock_sendall(self._sock, view)
            except OSError as e:
                self.close()
                raise ProviderError(f"{self.what} is gone", e) from None

    async def _writable(self) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        fd = self._sock.fileno()
        self._loop.add_writer(fd, settle, fut)
        try:
            await fut
        finally:
            self._loop.remove_writer(fd)

    # -- closing ------------------------------------------------------------------------
    def _gone(self) -> ProviderError:
        if self.violation:
            return ProviderError(f"{self.what} broke the protocol and was treated as "
                                 f"crashed: {self.violation}")
        return ProviderError(f"{self.what} is gone")

    def violate(self, why: str) -> ProviderError:
        """The far end broke the protocol at the message layer (a well-framed reply that
        means nothing): close the channel as for a frame violation; returns the error
        for the caller to raise."""
        self._violate(why)
        return self._gone()

    def _violate(self, why: str) -> None:
        if self.closed.done():
            return
        self.violation = why
        self.close()
        if self.on_violation is not None:
            self.on_violation(why)

    def close(self) -> None:
        """Close the socket; every pending request fails with ProviderError. Idempotent."""
        if self.closed.done():
            return
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        err = self._gone()
        for p in self._pending.values():
            if not p.fut.done():
                p.fut.set_exception(err)
        self._pending.clear()
        self._cancelled.clear()
        self._decoder.reset()
        if not self.hello.done():
            self.hello.set_result({"error": str(err) if self.violation
                                   else f"{self.what} exited during setup"})
        self._on_orphan_fds(self._fds)
        self._fds = []
        self.closed.set_result(None)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def kill_pidfd(fds: list[int]) -> None:
    """SIGKILL the processes behind ``fds`` (pidfds) and close them."""
    for fd in fds:
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
    _close_all(fds)


@final
class Zygote:
    """The fork server process and its channel."""

    def __init__(self, import_root: str, seccomp_prog: bytes) -> None:
        host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                boot_argv(import_root, child_end.fileno()), pass_fds=[child_end.fileno()],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd="/",
                env={})  # every sandbox process is a fork of it: none of the host's env
        except OSError as e:
            host_end.close()
            raise ProviderError("cannot start the sandbox fork server", e) from None
        finally:
            child_end.close()
        self.channel = Channel(host_end, what="sandbox fork server", on_orphan_fds=kill_pidfd,
                               on_violation=lambda _why: self.proc.kill(), accept_fds=True)
        self._init = _fork.init_frame(seccomp_prog)

    async def start(self) -> None:
        await self.channel.send_oneway(self._init)

    @property
    def alive(self) -> bool:
        return not self.channel.is_closed and self.proc.poll() is None

    async def create(self, plan: Mapping[str, Any], cgroup_procs: list[str],
                     agent_fd: int) -> tuple[int, int]:
        """Build a sandbox; returns (host pid of its agent, pidfd). Raises ProviderError."""
        h, _p, fds = await self.channel.request(
            _fork.create_request(plan, cgroup_procs), fds=[agent_fd], max_fds=1)
        try:
            pid = _fork.decode_create_reply(h, len(fds))
        except _fork.CreateFailed as e:
            kill_pidfd(fds)
            raise ProviderError(f"sandbox launch failed: {e.reason}") from None
        return pid, fds[0]

    async def preload(self, modules: Sequence[str], entries: Sequence[str] = ()) -> list[str]:
        """Import ``modules`` into the fork server (shared by every later sandbox) and
        register the fork ``entries``; returns the names it could not load."""
        h, _p, _fds = await self.channel.request(
            _fork.preload_request(modules, entries), timeout=120)
        return _fork.decode_preload_reply(h, [*modules, *entries])

    def stop(self) -> None:
        """Close the socket (the zygote exits on EOF) and reap it."""
        self.channel.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
