"""Host side of one command: its pipes, output readers and the ProcessHandle.

The command's stdio are plain pipes made in the host; their far ends went
into the sandbox with the ``spawn`` request, so output is read here straight
from the kernel, with caps counted as it arrives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar, final

from corral.core.contract import ProcessHandle, ProcessStdin
from corral.core.errors import ProviderError
from corral.core.result import NetworkDenial, Outcome, RunResult
from corral.core.spec import ResourceUsage

__all__ = ["OOM_RECHECKS", "OOM_RECHECK_S", "ExitInfo", "LinuxProcess", "PipeReader", "Run",
           "StdinPipe", "look_again"]

T = TypeVar("T")

#: a SIGKILLed process's limit is looked for again this many times, this far apart
OOM_RECHECKS = 5
OOM_RECHECK_S = 0.02


async def look_again(look: Callable[[], T | None]) -> T | None:
    """After a SIGKILL nobody on the host sent: the kernel counts an OOM kill just after
    it sends the signal, so the exit can be seen first. Call ``look`` (which limit ended
    the command, None for none) again, briefly, until it names one; None if it never
    does, or once it cannot read (OSError, ValueError: the sandbox is gone)."""
    for _ in range(OOM_RECHECKS):
        await asyncio.sleep(OOM_RECHECK_S)
        try:
            hit = look()
        except (OSError, ValueError):
            return None
        if hit is not None:
            return hit
    return None

_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitInfo:
    code: int
    cpu_ms: int = 0
    maxrss_kb: int = 0
    #: free bytes of the sandbox's writable area when it exited (-1: unknown)
    disk_free: int = -1


@final
class Run:
    """A spawned command as the host tracks it: pid (inside the sandbox) and exit."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exit: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()
        #: why the host killed it ("timeout", "output", "cpu", "kill"), if it did
        self.killed_for = ""


@final
class PipeReader:
    """Reads a non-blocking pipe into ``sink`` until EOF (or :meth:`stop`)."""

    def __init__(self, fd: int, sink: Callable[[bytes], None]) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        self.eof: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._sink(data)
        else:
            self.stop()

    def stop(self) -> None:
        if self.eof.done():
            return
        self._loop.remove_reader(self.fd)
        os.close(self.fd)
        self.eof.set_result(None)


@final
class StdinPipe(ProcessStdin):
    """The host end of a command's stdin pipe (``fd`` -1: the command has no stdin)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        if fd >= 0:
            os.set_blocking(fd, False)
        self._lock = asyncio.Lock()

    async def write(self, data: bytes) -> None:
        async with self._lock:
            if self._fd < 0:
                raise ProviderError("stdin is closed (or was not requested)")
            loop = asyncio.get_running_loop()
            view = memoryview(bytes(data))
            while view:
                try:
                    n = os.write(self._fd, view)
                    view = view[n:]
                except BlockingIOError:
                    fut: asyncio.Future[None] = loop.create_future()
                    loop.add_writer(self._fd, settle, fut)
                    try:
                        await fut
                    finally:
                        loop.remove_writer(self._fd)
                except OSError as e:  # EPIPE: the command closed its stdin or exited
                    raise ProviderError("the process closed its stdin", e) from None

    async def close(self) -> None:
        self.close_now()

    def close_now(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def settle(fut: asyncio.Future[None]) -> None:
    """Resolve ``fut`` with None unless it is already done (a reader/writer callback)."""
    if not fut.done():
        fut.set_result(None)


async def _iterate(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    while True:
        chunk = await queue.get()
        if chunk is None:
            return
        yield chunk


def _end_of(q: asyncio.Queue[bytes | None]) -> Callable[[object], None]:
    return lambda _f: q.put_nowait(None)


def usage_of(info: ExitInfo, wall_ms: int) -> ResourceUsage:
    return ResourceUsage(cpu_ms=info.cpu_ms, wall_ms=wall_ms,
                         peak_mem_mb=-(-info.maxrss_kb // 1024))


@final
class LinuxProcess(ProcessHandle):
    """A process started in a LinuxSandbox, streaming its output."""

    stdin: StdinPipe

    def __init__(self, run: Run, stdin: StdinPipe, out_fd: int, err_fd: int,
                 kill: Callable[[Run, str], Awaitable[None]], started: float,
                 timeout_ms: int | None,
                 denials: Callable[[], tuple[NetworkDenial, ...]] | None = None,
                 limit_hit: Callable[[ExitInfo], tuple[Outcome, int, int | None, str] | None]
                 | None = None) -> None:
        """``denials``: the network refusals since the start (read when it exits: the
        result's ``denials``). ``limit_hit``: which limit ended it, if one did (the
        sandbox's rules for exec), read once when it exits."""
        self._run = run
        self._limit_hit = limit_hit
        self._hit: tuple[Outcome, int, int | None, str] | None = None
        self._denials = denials
        self._seen_denials: tuple[NetworkDenial, ...] = ()
        self._kill = kill
        self._started = started
        self.stdin = stdin
        self._queues: list[asyncio.Queue[bytes | None]] = [asyncio.Queue(), asyncio.Queue()]
        self._readers = [PipeReader(fd, q.put_nowait) for fd, q in zip(
            (out_fd, err_fd), self._queues, strict=True)]
        for r, q in zip(self._readers, self._queues, strict=True):
            r.eof.add_done_callback(_end_of(q))
        self.stdout = _iterate(self._queues[0])
        self.stderr = _iterate(self._queues[1])
        self._timer: asyncio.TimerHandle | None = None
        self._killer: asyncio.Future[None] | None = None
        if timeout_ms is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(timeout_ms / 1000, self._on_timeout)
        run.exit.add_done_callback(self._on_exit)

    def _on_timeout(self) -> None:
        if not self._run.exit.done():
            self._killer = asyncio.ensure_future(self._kill(self._run, "timeout"))

    def _on_exit(self, f: asyncio.Future[ExitInfo]) -> None:
        if self._denials is not None:
            self._seen_denials = self._denials()
        if (self._limit_hit is not None and self._run.killed_for != "timeout"
                and not f.cancelled() and f.exception() is None):
            try:  # the cgroup's counters, now (a sandbox destroyed meanwhile: none)
                self._hit = self._limit_hit(f.result())
            except (OSError, ValueError):
                self._hit = None
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        # output a lingering grandchild still holds is cut off shortly after the exit
        loop.call_later(0.2, self.stop_readers)

    def stop_readers(self) -> None:
        for r in self._readers:
            r.stop()
        self.stdin.close_now()

    async def wait(self) -> RunResult:
        info = await asyncio.shield(self._run.exit)
        if self._killer is not None:  # the timeout's kill, started from a timer
            await asyncio.wait([self._killer])
            if not self._killer.cancelled():
                self._killer.exception()  # seen: the exit above is what counts
        if (self._hit is None and self._limit_hit is not None and not self._run.killed_for
                and info.code == -signal.SIGKILL):
            limit_hit = self._limit_hit
            self._hit = await look_again(lambda: limit_hit(info))
        wall = int((asyncio.get_running_loop().time() - self._started) * 1000)
        usage = usage_of(info, wall)
        if self._hit is not None:
            outcome, limit, observed, detail = self._hit
            if outcome is Outcome.MEMORY_LIMIT and observed:
                usage = dataclasses.replace(usage, peak_mem_mb=max(usage.peak_mem_mb, observed))
            return RunResult(outcome=outcome, exit_code=info.code, usage=usage,
                             duration_ms=float(wall), limit_value=limit, observed=observed,
                             detail=detail, denials=self._seen_denials)
        outcome = Outcome.TIMEOUT if self._run.killed_for == "timeout" else Outcome.EXIT
        return RunResult(outcome=outcome, exit_code=info.code, usage=usage,
                         duration_ms=float(wall), denials=self._seen_denials)

    async def kill(self) -> None:
        if not self._run.exit.done():
            await self._kill(self._run, "kill")
