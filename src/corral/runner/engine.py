"""The engine of one bounded run: spawn, watch, and finish exactly once.

All I/O is callbacks on the running asyncio loop (``add_reader`` on the pipes
and on a pidfd of the child); the only coroutine is :meth:`BoundedRun.wait`.
Every path (exit, timeout, cancel, overflow, asyncio cancellation, an error
in a callback) ends in :meth:`BoundedRun._finish`, which is synchronous and
idempotent: kill the tree (the supervisor kills and reaps it, see
:mod:`corral.runner.tree`), reap, drain, close every fd, cancel every timer,
remove the cancel callback, join the watcher thread (no-pidfd hosts only),
remove the owned cwd, then build the :class:`RunResult`.
"""

from __future__ import annotations

import asyncio
import os
import resource
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Final, final

from corral.core.cancel import call_on_cancel
from corral.core.result import Outcome, OutputBuffer, RunResult
from corral.core.spec import ResourceUsage
from corral.runner.options import RunOptions, build_env
from corral.runner.tree import (
    Supervised,
    kill_group,
    limited_argv,
    reap,
    remove_tree,
    spawn_process,
)

__all__ = ["CWD_PREFIX", "BoundedRun"]

#: prefix of the cwd the runner makes when none is given
CWD_PREFIX: Final = "corral-run-"
_CHUNK: Final = 65536
_USE_PIDFD = hasattr(os, "pidfd_open")
#: after asking the supervisor to kill the tree, how long to wait for it to
#: exit before finishing anyway (a stray stuck in uninterruptible sleep keeps
#: it reaping); the finish then gives it 5 s more, then SIGKILLs it
_KILL_WAIT_S: Final = 5.0


@final
class BoundedRun:
    """One child under its limits. Make it, :meth:`start` it, await :meth:`wait`.

    ``keep_output=False`` streams output to the callbacks only (the result's
    bytes stay empty); the caps still count every byte. ``stdin_pipe=True``
    leaves stdin open for :meth:`write_stdin` / :meth:`close_stdin`.
    """

    def __init__(self, opts: RunOptions, *, keep_output: bool = True,
                 stdin_pipe: bool = False) -> None:
        self._o = opts
        self._loop = asyncio.get_running_loop()
        self._t0 = time.monotonic()
        self._t_spawn = self._t0
        self._stdin_pipe = stdin_pipe
        self._out = OutputBuffer(opts.max_stdout_bytes, opts.on_stdout, keep_output)
        self._err = OutputBuffer(opts.max_stderr_bytes, opts.on_stderr, keep_output)
        self._outcome: Outcome | None = None
        self._overflow: Outcome | None = None
        self._failure: BaseException | None = None
        self._exited = asyncio.Event()
        self._done = asyncio.Event()
        self._stdin_ready: asyncio.Future[None] | None = None
        self._pid = 0  # the command
        self._reap_pid = 0  # our direct child: the supervisor, or the command itself
        self._sup: Supervised | None = None
        self._closing = False
        self._kill_sent = False
        self._fds: dict[str, int] = {}
        self._stdin_view: memoryview | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._unhook: Callable[[], None] | None = None
        self._watcher: threading.Thread | None = None
        self._host_peak_kib = 0
        self._cwd = opts.cwd or ""
        self._cwd_owned = False
        self._heap_applied = False
        self._spawn_error: OSError | subprocess.SubprocessError | None = None
        self._result: RunResult | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def result(self) -> RunResult | None:
        return self._result

    # ---- start ---------------------------------------------------------

    def start(self) -> None:
        """Spawn the child and hook it to the loop. Never raises for a spawn failure."""
        o = self._o
        if o.cancel is not None and o.cancel.cancelled:
            self._outcome = Outcome.CANCELLED
            self._finish()
            return
        try:
            self._spawn()
        except BaseException:
            self._finish()
            raise
        if self._pid == 0:
            self._finish()
            return
        loop = self._loop
        self._timers.append(loop.call_later(o.timeout_ms / 1000, self._graceful, Outcome.TIMEOUT))
        if o.cancel is not None:
            self._unhook = call_on_cancel(o.cancel, loop,
                                          lambda: self._graceful(Outcome.CANCELLED))

    def _spawn(self) -> None:
        o = self._o
        if not self._cwd:
            self._cwd = tempfile.mkdtemp(prefix=CWD_PREFIX)
            self._cwd_owned = True
        env, self._heap_applied = build_env(o, cwd=self._cwd, cwd_owned=self._cwd_owned)
        argv = [o.command, *o.args]
        if o.mem_mb is not None or o.cpu_ms is not None:
            if not os.access(o.command, os.X_OK) or os.path.isdir(o.command):
                self._spawn_error = FileNotFoundError(2, "not an executable file", o.command)
                return
            argv = limited_argv(argv, mem_mb=o.mem_mb, cpu_ms=o.cpu_ms)
        child: list[int] = []
        try:
            for name in ("in", "out", "err"):
                r, w = os.pipe()
                if name == "in":
                    self._fds[name] = w
                    child.append(r)
                else:
                    self._fds[name] = r
                    child.append(w)
            self._host_peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self._t_spawn = time.monotonic()
            try:
                if o.spawner is spawn_process:  # the default: it may clean up after us
                    started = spawn_process(argv, cwd=self._cwd, env=env, stdin=child[0],
                                            stdout=child[1], stderr=child[2],
                                            remove_cwd=self._cwd_owned)
                else:
                    started = o.spawner(argv, cwd=self._cwd, env=env, stdin=child[0],
                                        stdout=child[1], stderr=child[2])
            except (OSError, subprocess.SubprocessError) as e:
                self._spawn_error = e
                return
            if isinstance(started, Supervised):
                self._sup = started
                self._pid, self._reap_pid = started.command_pid, started.pid
            else:
                self._pid = self._reap_pid = started
        finally:
            for fd in child:
                os.close(fd)
        loop = self._loop
        for name in ("out", "err"):
            os.set_blocking(self._fds[name], False)
            loop.add_reader(self._fds[name], self._on_readable, name)
        os.set_blocking(self._fds["in"], False)
        if o.stdin and not self._stdin_pipe:
            self._stdin_view = memoryview(o.stdin)
            loop.add_writer(self._fds["in"], self._on_writable)
        elif not self._stdin_pipe:
            self._close_fd("in")
        if _USE_PIDFD:
            self._fds["pid"] = (os.dup(self._sup.pidfd) if self._sup is not None
                                and self._sup.pidfd >= 0 else os.pidfd_open(self._reap_pid))
            loop.add_reader(self._fds["pid"], self._on_exit)
        else:
            self._watcher = threading.Thread(target=self._watch, name="corral-run-watch",
                                             daemon=True)
            self._watcher.start()

    # ---- loop callbacks -----------------------------------------------

    def _watch(self) -> None:  # no-pidfd hosts: wait for exit without reaping
        try:
            if self._sup is not None and self._sup.pidfd >= 0:  # the spawn helper's child
                select.select([self._sup.pidfd], [], [])
            else:
                os.waitid(os.P_PID, self._reap_pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        try:
            self._loop.call_soon_threadsafe(self._on_exit)
        except RuntimeError:  # loop closed: the run already finished
            pass

    def _on_exit(self) -> None:
        fd = self._fds.get("pid")
        if fd is not None:
            self._loop.remove_reader(fd)
        self._exited.set()

    def _on_readable(self, name: str) -> None:
        fd = self._fds.get(name)
        if fd is None:
            return
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_fd(name)
            return
        self._take(name, data)

    def _take(self, name: str, data: bytes) -> None:
        cap = self._out if name == "out" else self._err
        try:
            passed = cap.feed(data)
        except Exception as e:  # a user callback failed: stop the run, re-raise from wait()
            if self._failure is None:
                self._failure = e
                self._hard_kill(Outcome.CANCELLED)
            return
        if passed and self._overflow is None:
            self._overflow = Outcome.OVERFLOW_STDOUT if name == "out" else Outcome.OVERFLOW_STDERR
            self._hard_kill(self._overflow)

    def _on_writable(self) -> None:
        view, fd = self._stdin_view, self._fds.get("in")
        if view is None or fd is None:
            return
        try:
            n = os.write(fd, view[:_CHUNK])
        except BlockingIOError:
            return
        except OSError:  # EPIPE: the child closed its stdin; the rest is dropped
            n = len(view)
        self._stdin_view = view = view[n:]
        if not view:
            self._stdin_view = None
            self._close_fd("in")

    def _graceful(self, outcome: Outcome) -> None:
        """Timeout / cancel token: shutdown signal to the group, SIGKILL after the grace."""
        if self._outcome is not None or self._result is not None or self._exited.is_set():
            return
        self._outcome = outcome
        if self._o.shutdown_signal == signal.SIGKILL or self._o.grace_period_ms == 0:
            self._signal(signal.SIGKILL)
            return
        self._signal(self._o.shutdown_signal)
        self._timers.append(self._loop.call_later(
            self._o.grace_period_ms / 1000, self._signal, signal.SIGKILL))

    def _hard_kill(self, outcome: Outcome) -> None:
        if self._outcome is None and not self._exited.is_set():
            self._outcome = outcome
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        """``sig`` to the command's group; SIGKILL: the whole tree (through the supervisor)."""
        if not self._pid or self._closing:
            return
        if self._sup is not None:
            if not self._exited.is_set():  # once it exited, its tree is gone
                self._sup.send(sig)
                if sig == signal.SIGKILL and not self._kill_sent:
                    self._kill_sent = True
                    self._timers.append(self._loop.call_later(_KILL_WAIT_S, self._on_exit))
        else:
            kill_group(self._pid, sig)

    def kill(self) -> None:
        """SIGKILL the tree now (outcome ``cancelled`` unless already decided)."""
        if self._result is None:
            self._hard_kill(Outcome.CANCELLED)

    def cancel(self) -> None:
        """Like a cancel token firing: shutdown signal, grace, SIGKILL; ``cancelled``."""
        self._graceful(Outcome.CANCELLED)

    # ---- interactive stdin (stdin_pipe=True) ---------------------------

    async def write_stdin(self, data: bytes) -> None:
        """Write all of ``data``; BrokenPipeError if stdin is closed or the child is gone."""
        view = memoryview(data)
        while view:
            fd = self._fds.get("in")
            if fd is None:
                raise BrokenPipeError("stdin is closed")
            try:
                view = view[os.write(fd, view[:_CHUNK]):]
                continue
            except BlockingIOError:
                pass
            fut = self._stdin_ready = self._loop.create_future()
            self._loop.add_writer(fd, _settle, fut)
            try:
                await fut
            finally:
                if self._fds.get("in") == fd:
                    self._loop.remove_writer(fd)
                self._stdin_ready = None

    def close_stdin(self) -> None:
        self._close_fd("in")

    # ---- the one finish path --------------------------------------------

    async def wait(self) -> RunResult:
        """Drive the run to its end and return the result (idempotent)."""
        if self._result is None:
            try:
                await self._exited.wait()
            except asyncio.CancelledError:
                if self._outcome is None:
                    self._outcome = Outcome.CANCELLED
                self._finish()
                raise
            self._finish()
        if self._failure is not None:
            raise self._failure
        assert self._result is not None
        return self._result

    async def wait_finished(self) -> None:
        """Wait until another task's :meth:`wait` has finished the run (no result)."""
        await self._done.wait()

    def _close_fd(self, name: str) -> None:
        fd = self._fds.pop(name, None)
        if fd is None:
            return
        if name == "in":
            self._loop.remove_writer(fd)
            if self._stdin_ready is not None and not self._stdin_ready.done():
                self._stdin_ready.set_exception(BrokenPipeError("stdin is closed"))
        else:
            self._loop.remove_reader(fd)
        os.close(fd)

    def _drain(self) -> None:
        for name in ("out", "err"):
            while (fd := self._fds.get(name)) is not None:
                try:
                    data = os.read(fd, _CHUNK)
                except BlockingIOError:  # a stray we could not kill holds the pipe
                    break
                except OSError:
                    data = b""
                if not data:
                    break
                self._take(name, data)
            self._close_fd(name)

    def _finish(self) -> None:
        if self._result is not None:
            return
        self._closing = True
        rc: int | None = None
        cpu_s, maxrss_kib, strays, floor_kib = 0.0, 0, 0, self._host_peak_kib
        try:
            if self._sup is not None:  # it kills what is left, reaps it, reports
                report = self._sup.finish()
                rc, cpu_s, maxrss_kib = report.returncode, report.cpu_s, report.maxrss_kib
                strays = report.strays
                floor_kib = report.floor_kib or floor_kib
                self._drain()
            elif self._pid:  # a spawner's bare pid: its process group only
                kill_group(self._pid)
                rc, cpu_s, maxrss_kib = reap(self._pid)
                self._drain()
        finally:
            t_end = time.monotonic()
            for t in self._timers:
                t.cancel()
            self._timers.clear()
            if self._unhook is not None:
                self._unhook()
            for name in list(self._fds):
                self._close_fd(name)
            if self._watcher is not None:
                self._watcher.join()
            if self._cwd_owned:
                remove_tree(self._cwd)
            self._exited.set()
            self._done.set()
        # Linux copies the spawning process's RSS high-water mark into the command's
        # at exec, so a peak not above that floor says nothing: 0 (not measured). The
        # supervisor reports its floor: small when the spawn helper forked it (a fresh
        # small process), this process's own RSS when it was forked from here.
        peak_kib = maxrss_kib if maxrss_kib > floor_kib else 0
        usage = ResourceUsage(cpu_ms=round(cpu_s * 1000), wall_ms=round(
            (t_end - self._t_spawn) * 1000) if self._pid else 0,
            peak_mem_mb=-(-peak_kib // 1024))
        self._result = self._build(rc, usage, strays, t_end)

    def _build(self, rc: int | None, usage: ResourceUsage, strays: int,
               t_end: float) -> RunResult:
        o = self._o
        outcome = self._outcome or self._overflow
        error, errno_ = "", None
        if self._spawn_error is not None:
            outcome = Outcome.SPAWN_ERROR
            e = self._spawn_error
            errno_ = getattr(e, "errno", None)
            error = f"{type(e).__name__}: {e}"
        elif outcome is None:
            outcome = exit_outcome(rc, usage.cpu_ms, cpu_ms=o.cpu_ms, mem_mb=o.mem_mb,
                                   stderr=self._err.value())
        limit = {Outcome.TIMEOUT: o.timeout_ms, Outcome.OVERFLOW_STDOUT: o.max_stdout_bytes,
                 Outcome.OVERFLOW_STDERR: o.max_stderr_bytes, Outcome.MEMORY_LIMIT: o.mem_mb,
                 Outcome.CPU_LIMIT: o.cpu_ms}.get(outcome)
        observed = {Outcome.OVERFLOW_STDOUT: self._out.total,
                    Outcome.OVERFLOW_STDERR: self._err.total,
                    Outcome.MEMORY_LIMIT: usage.peak_mem_mb or None,
                    Outcome.CPU_LIMIT: usage.cpu_ms or None}.get(outcome)
        return RunResult(
            outcome=outcome, exit_code=rc,
            stdout=self._out.value(), stderr=self._err.value(),
            stdout_truncated=self._out.truncated, stderr_truncated=self._err.truncated,
            duration_ms=round((t_end - self._t0) * 1000, 3), usage=usage, cwd=self._cwd,
            cwd_owned=self._cwd_owned, node_heap_mb_applied=self._heap_applied,
            detail=error, spawn_errno=errno_, limit_value=limit, observed=observed,
            strays_killed=strays)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


_MEMORY_SIGNALS: Final = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT})
#: the dynamic loader's exit status when it cannot load a program's libraries
LOADER_EXIT: Final = 127
#: what glibc's loader writes when an mmap of a library failed for want of address
#: space ("failed to map segment from shared object"; the ENOMEM wording of the
#: other steps), after "error while loading shared libraries: NAME: "
_LOADER_MEMORY_WORDS: Final = (b"failed to map segment from shared object",
                               b"cannot allocate memory", b"Cannot allocate memory")


def loader_out_of_memory(rc: int | None, stderr: bytes) -> bool:
    """True when ``rc``/``stderr`` say the dynamic loader gave up for want of memory
    before the program ran: exit 127 and its own error as stderr's first line.

    A program built on a shared library (a CPython built with ``--enable-shared``,
    as pyenv's are) has its loader map that library before ``main``; under a tight
    RLIMIT_AS that mmap fails and the loader exits 127 instead of the child dying of
    a signal.
    """
    if rc != LOADER_EXIT:
        return False
    first = stderr.split(b"\n", 1)[0]
    return b"error while loading shared libraries: " in first and any(
        w in first for w in _LOADER_MEMORY_WORDS)


def exit_outcome(rc: int | None, cpu_ms_used: int, *, cpu_ms: int | None,
                 mem_mb: int | None, stderr: bytes = b"") -> Outcome:
    """``exit``, or the rlimit outcome the child's death points to (docs/runner.md).

    cpu-limit: ``cpu_ms`` was set and the child died of SIGXCPU (the soft
    RLIMIT_CPU), or of a SIGKILL the runner did not send after using at least
    ``cpu_ms`` (the hard one). memory-limit: ``mem_mb`` was set and the child
    died of SIGSEGV, SIGBUS or SIGABRT (what an unchecked or fatal allocation
    failure under RLIMIT_AS looks like), or its dynamic loader could not map a
    library and exited 127 saying so (:func:`loader_out_of_memory`). Anything else
    is ``exit``.
    """
    if mem_mb is not None and loader_out_of_memory(rc, stderr):
        return Outcome.MEMORY_LIMIT
    if rc is None or rc >= 0:
        return Outcome.EXIT
    sig = -rc
    if cpu_ms is not None and (sig == signal.SIGXCPU or (
            sig == signal.SIGKILL and cpu_ms_used >= cpu_ms)):
        return Outcome.CPU_LIMIT
    if mem_mb is not None and sig in _MEMORY_SIGNALS:
        return Outcome.MEMORY_LIMIT
    return Outcome.EXIT
