"""Child processes for the in-process provider: own process group, pumped pipes, group kill."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Mapping, Sequence

from corral.core.contract import ProcessHandle, ProcessStdin
from corral.core.errors import ConfigInvalidError, ProviderError
from corral.core.spec import ExitStatus, ResourceUsage

__all__ = ["Child", "InProcessHandle", "spawn"]

_CHUNK = 1 << 16


def _check_argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, str | bytes) or not argv:
        raise ConfigInvalidError("argv", "must be a non-empty sequence of strings")
    out = list(argv)
    for i, a in enumerate(out):
        if not isinstance(a, str) or "\0" in a:
            raise ConfigInvalidError(f"argv[{i}]", "must be a string without NUL")
    if not out[0]:
        raise ConfigInvalidError("argv[0]", "must name a command, not be empty")
    return out


class _Pipe:
    """Reads one pipe to EOF in the background, so the child never blocks on it.

    Chunks go to a queue (for streaming) or a buffer (for exec), and the pipe
    always reaches EOF once the process group is dead, which lets asyncio
    close the transport.
    """

    def __init__(self, reader: asyncio.StreamReader, *, keep: bool) -> None:
        self.buf = bytearray()
        self._keep = keep
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.task = asyncio.ensure_future(self._pump(reader))

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        try:
            while chunk := await reader.read(_CHUNK):
                if self._keep:
                    self.buf += chunk
                else:
                    self._queue.put_nowait(chunk)
        finally:
            self._queue.put_nowait(b"")

    async def chunks(self) -> AsyncIterator[bytes]:
        while chunk := await self._queue.get():
            yield chunk
        self._queue.put_nowait(b"")  # later iterations end at once too


class Child:
    """One spawned command: the leader of its own process group."""

    def __init__(self, proc: asyncio.subprocess.Process, *, keep: bool) -> None:
        self.proc = proc
        self.pgid = proc.pid
        self.started = time.monotonic()
        assert proc.stdout is not None and proc.stderr is not None
        self.out = _Pipe(proc.stdout, keep=keep)
        self.err = _Pipe(proc.stderr, keep=keep)
        self._killed_group = False

    def kill_group(self) -> None:
        """SIGKILL the whole process group (the leader and what it started)."""
        if self._killed_group:
            return
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.returncode is not None:
            # the leader is reaped: its pgid may only be reused once the group is
            # empty, and we just emptied it, so never signal it again
            self._killed_group = True

    async def wait(self) -> int:
        """Wait for the leader, then end whatever it left in its group."""
        code = await self.proc.wait()
        self.kill_group()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        return code

    async def finish_pipes(self, seconds: float = 5.0) -> None:
        done, _ = await asyncio.wait([self.out.task, self.err.task], timeout=seconds)
        if len(done) < 2:
            raise ProviderError("output pipes still open after the process group was killed "
                                "(a process left its group?)")

    def usage(self) -> ResourceUsage:
        return ResourceUsage(wall_ms=int((time.monotonic() - self.started) * 1000))


async def spawn(argv: Sequence[str], *, cwd: str, env: Mapping[str, str], stdin: bool,
                keep: bool) -> Child:
    """Start ``argv`` in a new session (so its own process group)."""
    args = _check_argv(argv)
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, cwd=cwd, env=dict(env), start_new_session=True,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        raise ProviderError(f"cannot start {args[0]!r}: {e.strerror}", e) from None
    return Child(proc, keep=keep)


class _Stdin(ProcessStdin):
    def __init__(self, child: Child) -> None:
        self._w = child.proc.stdin
        self._closed = self._w is None

    async def write(self, data: bytes) -> None:
        if self._w is None or self._closed:
            raise ProviderError("stdin is closed")
        try:
            self._w.write(bytes(data))
            await self._w.drain()
        except (BrokenPipeError, ConnectionResetError) as e:
            raise ProviderError("the process closed its stdin", e) from None

    async def close(self) -> None:
        if self._closed or self._w is None:
            return
        self._closed = True
        self._w.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await self._w.wait_closed()


class InProcessHandle(ProcessHandle):
    """A process started by ``InProcessSandbox.start_process``."""

    def __init__(self, child: Child, timeout_ms: int | None) -> None:
        self.child = child
        self.stdin = _Stdin(child)
        self.stdout = child.out.chunks()
        self.stderr = child.err.chunks()
        self._timer: asyncio.TimerHandle | None = None
        if timeout_ms is not None:
            self._timer = asyncio.get_running_loop().call_later(
                timeout_ms / 1000, child.kill_group)
        self._waiter = asyncio.ensure_future(self._wait())

    async def _wait(self) -> ExitStatus:
        code = await self.child.wait()
        if self._timer is not None:
            self._timer.cancel()
        return ExitStatus(exit_code=code, usage=self.child.usage())

    async def wait(self) -> ExitStatus:
        return await asyncio.shield(self._waiter)

    async def kill(self) -> None:
        self.child.kill_group()
        await asyncio.shield(self._waiter)
