"""Child processes for the in-process provider: own process group, pumped pipes, group kill."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from corral.core.contract import ProcessHandle, ProcessStdin
from corral.core.errors import ProviderError
from corral.core.result import Outcome, OutputBuffer, RunResult
from corral.core.spec import ResourceUsage, check_argv

__all__ = ["Child", "InProcessHandle", "spawn"]

_CHUNK = 1 << 16


class _Pipe:
    """Reads one pipe to EOF in the background, so the child never blocks on it.

    Chunks go to a queue (for streaming) or an :class:`OutputBuffer` (for exec,
    capped: passing the cap calls ``on_over`` once), and the pipe always reaches
    EOF once the process group is dead, which lets asyncio close the transport.
    """

    def __init__(self, reader: asyncio.StreamReader, *, buf: OutputBuffer | None,
                 on_over: Callable[[], None]) -> None:
        self.buf = buf
        self._on_over = on_over
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.task = asyncio.ensure_future(self._pump(reader))

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        try:
            while chunk := await reader.read(_CHUNK):
                if self.buf is None:
                    self._queue.put_nowait(chunk)
                elif self.buf.feed(chunk):
                    self._on_over()
        finally:
            self._queue.put_nowait(b"")

    def value(self) -> bytes:
        return self.buf.value() if self.buf is not None else b""

    async def chunks(self) -> AsyncIterator[bytes]:
        while chunk := await self._queue.get():
            yield chunk
        self._queue.put_nowait(b"")  # later iterations end at once too


class Child:
    """One spawned command: the leader of its own process group."""

    def __init__(self, proc: asyncio.subprocess.Process, *,
                 caps: tuple[int, int] | None) -> None:
        self.proc = proc
        self.pgid = proc.pid
        self.started = time.monotonic()
        assert proc.stdout is not None and proc.stderr is not None
        #: the stream that passed its cap first (1 or 2; the group was killed), or 0
        self.over = 0
        self.out = _Pipe(proc.stdout, buf=OutputBuffer(caps[0]) if caps else None,
                         on_over=lambda: self._overflow(1))
        self.err = _Pipe(proc.stderr, buf=OutputBuffer(caps[1]) if caps else None,
                         on_over=lambda: self._overflow(2))
        self._killed_group = False

    def _overflow(self, fd: int) -> None:
        if not self.over:
            self.over = fd
            self.kill_group()

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
                caps: tuple[int, int] | None) -> Child:
    """Start ``argv`` in a new session (so its own process group); ``caps``: keep
    the output up to these caps (exec), else stream it (a started process)."""
    args = check_argv(argv)
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, cwd=cwd, env=dict(env), start_new_session=True,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        raise ProviderError(f"cannot start {args[0]!r}: {e.strerror}", e) from None
    return Child(proc, caps=caps)


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
        self._timeout_ms = timeout_ms
        self._timed_out = False
        if timeout_ms is not None:
            self._timer = asyncio.get_running_loop().call_later(
                timeout_ms / 1000, self._on_timeout)
        self._waiter = asyncio.ensure_future(self._wait())

    def _on_timeout(self) -> None:
        self._timed_out = True
        self.child.kill_group()

    async def _wait(self) -> RunResult:
        code = await self.child.wait()
        if self._timer is not None:
            self._timer.cancel()
        if self._timed_out:
            return RunResult(outcome=Outcome.TIMEOUT, exit_code=code, usage=self.child.usage(),
                             limit_value=self._timeout_ms)
        return RunResult(outcome=Outcome.EXIT, exit_code=code, usage=self.child.usage())

    async def wait(self) -> RunResult:
        return await asyncio.shield(self._waiter)

    async def kill(self) -> None:
        self.child.kill_group()
        await asyncio.shield(self._waiter)
