"""Host side of the sockets: framed requests to the zygote and to sandbox agents.

A :class:`Channel` speaks the frames of ``agent.py`` (one JSON line, then
``len`` raw bytes) over a non-blocking unix stream socket, with descriptors
passed as SCM_RIGHTS (a frame whose header says ``nfds`` takes that many of
the received descriptors). Requests carry an ``id``; replies resolve the
matching future; ``ev`` frames go to an event callback; the first frame
without either (the agent's ``ready`` or setup error) resolves ``hello``.

:class:`Zygote` starts and stops the fork server process.
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Sequence
from typing import Any, Final, final

from ...errors import ProviderError
from . import _fdpass
from .process import settle
from .zygote import boot_argv

__all__ = ["Channel", "Frame", "Zygote"]

Frame = tuple[dict[str, Any], bytes, list[int]]
_MAX_FDS: Final = 4


@final
class Channel:
    """Requests and events over one unix socket (asyncio, host side)."""

    def __init__(self, sock: socket.socket, *, what: str,
                 on_event: Callable[[dict[str, Any]], None] | None = None,
                 on_orphan_fds: Callable[[list[int]], None] | None = None) -> None:
        self.what = what
        self._sock = sock
        sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self._fds: list[int] = []
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._next = 1
        self._on_event = on_event
        self._on_orphan_fds = on_orphan_fds or _close_all
        self.hello: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._wlock = asyncio.Lock()
        self._loop.add_reader(sock.fileno(), self._on_readable)

    @property
    def is_closed(self) -> bool:
        return self.closed.done()

    def _on_readable(self) -> None:
        try:
            data, fds = _fdpass.recv(self._sock, max_fds=_MAX_FDS)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        self._fds.extend(fds)
        if not data:
            self.close()
            return
        self._buf += data
        self._parse()

    def _parse(self) -> None:
        while (nl := self._buf.find(b"\n")) >= 0:
            header = json.loads(bytes(self._buf[:nl]))
            n = int(header.get("len", 0))
            if len(self._buf) < nl + 1 + n:
                return
            payload = bytes(self._buf[nl + 1: nl + 1 + n])
            del self._buf[: nl + 1 + n]
            k = int(header.get("nfds", 0))
            fds, self._fds = self._fds[:k], self._fds[k:]
            self._dispatch(header, payload, fds)

    def _dispatch(self, header: dict[str, Any], payload: bytes, fds: list[int]) -> None:
        rid = header.get("id")
        if rid is not None:
            fut = self._pending.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result((header, payload, fds))
            elif fds:
                self._on_orphan_fds(fds)
        elif "ev" in header:
            if self._on_event is not None:
                self._on_event(header)
        elif not self.hello.done():
            self.hello.set_result(header)

    async def request(self, header: dict[str, Any], payload: bytes = b"",
                      fds: Sequence[int] = ()) -> Frame:
        """Send one request and wait for its reply frame."""
        if self.is_closed:
            raise ProviderError(f"{self.what} is gone")
        rid = self._next
        self._next += 1
        h = dict(header, id=rid)
        if payload:
            h["len"] = len(payload)
        fut: asyncio.Future[Frame] = self._loop.create_future()
        self._pending[rid] = fut
        try:
            await self._send(json.dumps(h, separators=(",", ":")).encode() + b"\n" + payload,
                             fds)
            return await fut
        finally:
            self._pending.pop(rid, None)

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

    def close(self) -> None:
        """Close the socket; every pending request fails with ProviderError. Idempotent."""
        if self.closed.done():
            return
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        err = ProviderError(f"{self.what} is gone")
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        if not self.hello.done():
            self.hello.set_result({"error": f"{self.what} exited during setup"})
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
        import base64
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
        self.channel = Channel(host_end, what="sandbox fork server", on_orphan_fds=kill_pidfd)
        self._init = (json.dumps({"op": "init", "seccomp": base64.b64encode(seccomp_prog)
                                  .decode()}) + "\n").encode()

    async def start(self) -> None:
        await self.channel._send(self._init, ())

    @property
    def alive(self) -> bool:
        return not self.channel.is_closed and self.proc.poll() is None

    async def create(self, plan: dict[str, Any], cgroup_procs: list[str],
                     agent_fd: int) -> tuple[int, int]:
        """Build a sandbox; returns (host pid of its agent, pidfd). Raises ProviderError."""
        h, _p, fds = await self.channel.request(
            {"op": "create", "plan": plan, "cgroup_procs": cgroup_procs}, fds=[agent_fd])
        if not h.get("ok") or len(fds) != 1:
            kill_pidfd(fds)
            raise ProviderError(f"sandbox launch failed: {h.get('error', 'no pidfd')}")
        return int(h["pid"]), fds[0]

    async def preload(self, modules: Sequence[str]) -> list[str]:
        """Import ``modules`` into the fork server (shared by every later sandbox);
        returns the names it could not import."""
        h, _p, fds = await self.channel.request({"op": "preload", "modules": list(modules)})
        _close_all(fds)
        return [str(m) for m in h.get("missing", ())]

    def stop(self) -> None:
        """Close the socket (the zygote exits on EOF) and reap it."""
        self.channel.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
