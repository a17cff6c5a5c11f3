"""Bounded process runner: one subprocess, one bounded run, one pinned outcome.

:func:`run_bounded` (sync) and :func:`run_bounded_async` run an absolute
``command`` with ``args`` (no shell) under a wall-clock timeout, output caps,
an environment allowlist and optional rlimits, and return a frozen
:class:`RunResult` whose ``outcome`` is one of :class:`Outcome`. Whatever
ends the run, the child's whole process tree is killed, the child reaped, its
pipes closed and an owned cwd removed before the call returns. On Linux the
tree is held by a supervisor process (a child subreaper that dies with the
caller, see :mod:`corral.runner.tree`): daemons that left the process group are
killed too, and a SIGKILL of the calling process still ends the tree.

Cancellation:

* ``cancel=CancelToken()`` (sync and async callers, any thread): the run gets
  the shutdown signal, then SIGKILL after the grace period; the result's
  outcome is ``cancelled``.
* asyncio task cancellation (async callers): the tree is SIGKILLed and reaped
  at once, then ``CancelledError`` propagates; there is no result. For the
  sync call, a KeyboardInterrupt in the main thread does the same.

See ``docs/runner.md`` for what is and is not enforced.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from corral.core.cancel import CancelToken
from corral.core.result import OUTCOME_EXIT_STATUS, Outcome, RunResult, exit_status_of
from corral.core.sync import sync_twin
from corral.runner.engine import CWD_PREFIX, BoundedRun
from corral.runner.options import (
    DEFAULT_GRACE_PERIOD_MS,
    DEFAULT_MAX_STDERR_BYTES,
    DEFAULT_MAX_STDOUT_BYTES,
    OutputCallback,
    make_options,
)
from corral.runner.tree import Spawner, spawn_process

if TYPE_CHECKING:
    import os

__all__ = [
    "CWD_PREFIX",
    "DEFAULT_GRACE_PERIOD_MS",
    "DEFAULT_MAX_STDERR_BYTES",
    "DEFAULT_MAX_STDOUT_BYTES",
    "OUTCOME_EXIT_STATUS",
    "Outcome",
    "RunResult",
    "Spawner",
    "exit_status_of",
    "run_bounded",
    "run_bounded_async",
    "spawn_process",
]


async def run_bounded_async(
    command: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    timeout_ms: int,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    shutdown_signal: int | str = signal.SIGTERM,
    grace_period_ms: int | None = None,
    stdin: bytes | str | None = None,
    max_stdout_bytes: int = DEFAULT_MAX_STDOUT_BYTES,
    max_stderr_bytes: int = DEFAULT_MAX_STDERR_BYTES,
    node_heap_mb: int | None = None,
    mem_mb: int | None = None,
    cpu_ms: int | None = None,
    cancel: CancelToken | None = None,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    spawner: Spawner = spawn_process,
) -> RunResult:
    """Run ``command args`` once, bounded; return how it ended.

    Args:
        command: absolute path of the executable (relative -> ConfigInvalidError).
        args: arguments, passed verbatim.
        timeout_ms: wall-clock limit (required, > 0). Outcome ``timeout``.
        cwd: absolute working directory; default: a fresh private temp dir
            (prefix ``corral-run-``) removed when the run ends.
        env: the child's environment, an allowlist; the host's is never merged
            (PATH, HOME, TMPDIR bootstrap: see ``docs/runner.md``).
        shutdown_signal: sent to the process group at timeout / token cancel.
        grace_period_ms: wait after the shutdown signal before SIGKILL; must
            be < ``timeout_ms``; default 2000, or half the timeout if less.
        stdin: written to the child then closed (concurrently with reading
            its output); ``None``: closed at once.
        max_stdout_bytes / max_stderr_bytes: caps (8 MiB / 1 MiB). Passing
            one kills the tree; outcome ``overflow-stdout`` / ``overflow-stderr``.
        node_heap_mb: ``--max-old-space-size`` in ``NODE_OPTIONS``, only if
            the command's basename is ``node``/``nodejs``
            (``node_heap_mb_applied`` says whether it was).
        mem_mb / cpu_ms: RLIMIT_AS / RLIMIT_CPU for the child (each process
            of the tree gets its own copy; see the docs). Outcomes
            ``memory-limit`` / ``cpu-limit``.
        cancel: a :class:`CancelToken`; firing it ends the run ``cancelled``.
        on_stdout / on_stderr: called on the loop with each chunk as it
            arrives (only the bytes within the cap). If one raises, the run
            is killed and the exception re-raised here.
        spawner: the test seam (see :class:`Spawner`); an ``OSError`` from it
            gives outcome ``spawn-error``.

    Raises:
        ConfigInvalidError: an option is invalid (nothing was started).
    """
    opts = make_options(
        command, args, timeout_ms=timeout_ms, cwd=cwd, env=env,
        shutdown_signal=shutdown_signal, grace_period_ms=grace_period_ms, stdin=stdin,
        max_stdout_bytes=max_stdout_bytes, max_stderr_bytes=max_stderr_bytes,
        node_heap_mb=node_heap_mb, mem_mb=mem_mb, cpu_ms=cpu_ms, cancel=cancel,
        on_stdout=on_stdout, on_stderr=on_stderr, spawner=spawner)
    run = BoundedRun(opts)
    run.start()
    # the level a bounded run has: a process tree with limits, no boundary (docs/levels)
    return (await run.wait()).at_level("context-isolated")


#: the synchronous twin (same options): its own short-lived event loop, so it works in
#: any thread; called where a loop is running, it runs in a helper thread and blocks
#: that loop until done. Callbacks run in the loop's thread.
run_bounded = sync_twin(run_bounded_async, name="run_bounded")

