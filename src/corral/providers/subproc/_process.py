"""``start_process`` for the subproc provider: a bounded run with streamed output."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import final

from corral.core.contract import ProcessHandle, ProcessStdin
from corral.core.errors import ProviderError
from corral.core.result import RunResult
from corral.runner.engine import BoundedRun

__all__ = ["ChunkQueue", "SubprocProcess"]


@final
class ChunkQueue:
    """Chunks handed over by a run's callback, read as an async iterator until EOF."""

    def __init__(self) -> None:
        self._q: asyncio.Queue[bytes] = asyncio.Queue()
        self._ended = False

    def put(self, chunk: bytes) -> None:
        if chunk:
            self._q.put_nowait(chunk)

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._q.put_nowait(b"")

    async def chunks(self) -> AsyncIterator[bytes]:
        while chunk := await self._q.get():
            yield chunk
        self._q.put_nowait(b"")  # later readers end at once too


@final
class _Stdin(ProcessStdin):
    def __init__(self, run: BoundedRun, open_: bool) -> None:
        self._run = run
        self._open = open_

    async def write(self, data: bytes) -> None:
        if not self._open:
            raise ProviderError("stdin is closed (or was not asked for: ProcessOpts.stdin)")
        try:
            await self._run.write_stdin(bytes(data))
        except OSError as e:
            raise ProviderError(f"cannot write to the process's stdin: {e}", e) from e

    async def close(self) -> None:
        self._open = False
        self._run.close_stdin()


@final
class SubprocProcess(ProcessHandle):
    """A started process: its run is driven by a task of its own until it ends.

    The process is bounded like any run: its timeout (``ProcessOpts.timeout_ms``
    or the provider's ``process_timeout_ms``) and output caps apply, and when
    it ends, by itself or by :meth:`kill`, its whole tree is killed.
    """

    def __init__(self, run: BoundedRun, out: ChunkQueue, err: ChunkQueue, *,
                 stdin_open: bool) -> None:
        self._run = run
        self.stdin = _Stdin(run, stdin_open)
        self.stdout = out.chunks()
        self.stderr = err.chunks()
        self._task = asyncio.ensure_future(run.wait())

        def ended(_: object) -> None:
            out.end()
            err.end()

        self._task.add_done_callback(ended)

    @property
    def pid(self) -> int:
        return self._run.pid

    @property
    def done(self) -> bool:
        return self._task.done()

    async def wait(self) -> RunResult:
        """How the run ended: the bounded run's own result (its outcome says
        ``timeout`` or an overflow when the run was stopped for one)."""
        return await asyncio.shield(self._task)

    async def kill(self) -> None:
        self._run.kill()
        await asyncio.shield(self._task)
