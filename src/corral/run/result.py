"""What a bounded run ends with: the closed :class:`Outcome` set and :class:`RunResult`.

The outcome -> exit status table used by ``corral run`` lives here too, next to
:meth:`RunResult.check`, so the two cannot drift apart: for every outcome that
``check()`` turns into an error, the status is that error's ``exit_status``.
"""

from __future__ import annotations

import enum
import errno
import signal as _signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, final

from corral.core.errors import (
    ConfigInvalidError,
    CorralError,
    LimitsExceededError,
    ProviderError,
    SandboxCancelledError,
    SandboxTimeoutError,
)
from corral.core.spec import ResourceUsage

__all__ = [
    "OUTCOME_EXIT_STATUS",
    "Outcome",
    "OutputCallback",
    "OutputBuffer",
    "RunResult",
    "exit_outcome",
    "exit_status_of",
    "signal_name",
]


class Outcome(enum.StrEnum):
    """How a bounded run ended. Exactly one per run."""

    EXIT = "exit"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    OVERFLOW_STDOUT = "overflow-stdout"
    OVERFLOW_STDERR = "overflow-stderr"
    SPAWN_ERROR = "spawn-error"
    MEMORY_LIMIT = "memory-limit"
    CPU_LIMIT = "cpu-limit"
    PROCESSES_LIMIT = "processes-limit"
    DISK_LIMIT = "disk-limit"


#: ``corral run``'s exit status per outcome. ``exit`` is absent: the child's
#: own code is used (128 + N when signal N killed it). The others equal the
#: ``exit_status`` of the error ``RunResult.check()`` raises (see
#: :mod:`corral.core.errors`), except ``spawn-error``, which follows the shell's
#: "command cannot be run" convention (127).
OUTCOME_EXIT_STATUS: Final[Mapping[Outcome, int]] = {
    Outcome.TIMEOUT: SandboxTimeoutError.exit_status,          # 124
    Outcome.CANCELLED: SandboxCancelledError.exit_status,      # 130
    Outcome.OVERFLOW_STDOUT: LimitsExceededError.exit_status,  # 137
    Outcome.OVERFLOW_STDERR: LimitsExceededError.exit_status,  # 137
    Outcome.MEMORY_LIMIT: LimitsExceededError.exit_status,     # 137
    Outcome.CPU_LIMIT: LimitsExceededError.exit_status,        # 137
    Outcome.PROCESSES_LIMIT: LimitsExceededError.exit_status,  # 137 (strict runs only)
    Outcome.DISK_LIMIT: LimitsExceededError.exit_status,       # 137 (strict runs only)
    Outcome.SPAWN_ERROR: 127,
}

_MISSING_COMMAND_ERRNOS = frozenset(
    {errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.ENOEXEC, errno.ELOOP, errno.EISDIR})


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """The result of one bounded run. Everything the run held is released.

    Attributes:
        outcome: how it ended (see :class:`Outcome`).
        exit_code: the child's exit code; only on ``exit`` when it exited.
        signal: the signal name (``"SIGSEGV"``) that killed the child; only
            on ``exit``.
        returncode: the raw status whenever a child was reaped, on every
            outcome (negative = killed by that signal, as in ``subprocess``).
        stdout_bytes / stderr_bytes: captured output, at most the cap, exact
            to the byte. ``stdout`` / ``stderr`` decode them (UTF-8, replace).
        stdout_truncated / stderr_truncated: more was written than kept.
        duration_ms: wall time of the whole call.
        usage: CPU, wall and peak memory of the child as the kernel accounts
            it at reaping (see ``docs/runner.md`` for what is counted).
        cwd: the working directory (absolute). ``cwd_owned``: the runner made
            it and has already removed it.
        node_heap_mb_applied: ``--max-old-space-size`` went into ``NODE_OPTIONS``.
        error_message: non-empty only on ``spawn-error``; ``spawn_errno`` the
            OS error number when there was one.
        limit_value: the limit that was hit, in its unit: bytes for overflow,
            MiB for ``memory-limit``, ms for ``cpu-limit`` and ``timeout``.
        strays_killed: processes outside the child's process group (they had
            called ``setsid`` or ``setpgid``) that the runner found and killed.
    """

    outcome: Outcome
    exit_code: int | None = None
    signal: str | None = None
    returncode: int | None = None
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0
    usage: ResourceUsage = field(default_factory=ResourceUsage)
    cwd: str = ""
    cwd_owned: bool = False
    node_heap_mb_applied: bool = False
    error_message: str = ""
    spawn_errno: int | None = None
    limit_value: int | None = None
    strays_killed: int = 0

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """The child exited by itself with code 0."""
        return self.outcome is Outcome.EXIT and self.exit_code == 0

    def error(self) -> CorralError | None:
        """The error :meth:`check` would raise, or ``None`` for ``exit``."""
        o = self.outcome
        limit = self.limit_value or 0
        if o is Outcome.EXIT:
            return None
        if o is Outcome.TIMEOUT:
            return SandboxTimeoutError(
                f"run timed out after {limit} ms", timeout_ms=limit,
                stdout=self.stdout_bytes, stderr=self.stderr_bytes)
        if o is Outcome.CANCELLED:
            return SandboxCancelledError("run cancelled")
        if o in (Outcome.OVERFLOW_STDOUT, Outcome.OVERFLOW_STDERR):
            stream = "stdout" if o is Outcome.OVERFLOW_STDOUT else "stderr"
            return LimitsExceededError("output", limit, detail=f"{stream} cap exceeded")
        if o is Outcome.MEMORY_LIMIT:
            return LimitsExceededError("memory", limit, self.usage.peak_mem_mb,
                                       detail=f"child killed by {self.returncode_name()}")
        if o is Outcome.CPU_LIMIT:
            return LimitsExceededError("cpu", limit, self.usage.cpu_ms,
                                       detail=f"child killed by {self.returncode_name()}")
        if o is Outcome.PROCESSES_LIMIT:
            return LimitsExceededError("processes", limit, detail="a fork hit the process limit")
        if o is Outcome.DISK_LIMIT:
            return LimitsExceededError("disk", limit, detail="the writable area is full")
        if self.spawn_errno in _MISSING_COMMAND_ERRNOS:
            return ConfigInvalidError("command", self.error_message)
        return ProviderError(f"spawn failed: {self.error_message}")

    def check(self) -> RunResult:
        """Return self if the outcome is ``exit``, else raise the matching error.

        A non-zero exit code is the child's answer, not an error: ``check()``
        does not raise for it (test ``ok`` or ``exit_code``). Mapping:
        timeout -> SandboxTimeoutError (with the partial output),
        cancelled -> SandboxCancelledError, overflow-* -> LimitsExceededError
        ("output"), memory-limit / cpu-limit -> LimitsExceededError("memory" /
        "cpu"), spawn-error -> ConfigInvalidError("command") when the command
        or cwd is missing or not executable, else ProviderError.
        """
        err = self.error()
        if err is not None:
            raise err
        return self

    def returncode_name(self) -> str:
        if self.returncode is None:
            return "nothing"
        if self.returncode < 0:
            return signal_name(-self.returncode)
        return f"exit {self.returncode}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (the ``--json`` output of ``corral run``)."""
        return {
            "outcome": str(self.outcome), "exit_code": self.exit_code, "signal": self.signal,
            "returncode": self.returncode, "stdout": self.stdout, "stderr": self.stderr,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "duration_ms": self.duration_ms,
            "usage": {"cpu_ms": self.usage.cpu_ms, "wall_ms": self.usage.wall_ms,
                      "peak_mem_mb": self.usage.peak_mem_mb},
            "cwd": self.cwd, "cwd_owned": self.cwd_owned,
            "node_heap_mb_applied": self.node_heap_mb_applied,
            "error_message": self.error_message, "limit_value": self.limit_value,
            "strays_killed": self.strays_killed,
        }


def signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


_MEMORY_SIGNALS: Final = frozenset({_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGABRT})


def exit_outcome(rc: int | None, cpu_ms_used: int, *, cpu_ms: int | None,
                 mem_mb: int | None) -> Outcome:
    """``exit``, or the rlimit outcome the child's death points to (docs/runner.md).

    cpu-limit: ``cpu_ms`` was set and the child died of SIGXCPU (the soft
    RLIMIT_CPU), or of a SIGKILL the runner did not send after using at least
    ``cpu_ms`` (the hard one). memory-limit: ``mem_mb`` was set and the child
    died of SIGSEGV, SIGBUS or SIGABRT (what an unchecked or fatal allocation
    failure under RLIMIT_AS looks like). Anything else is ``exit``.
    """
    if rc is None or rc >= 0:
        return Outcome.EXIT
    sig = -rc
    if cpu_ms is not None and (sig == _signal.SIGXCPU or (
            sig == _signal.SIGKILL and cpu_ms_used >= cpu_ms)):
        return Outcome.CPU_LIMIT
    if mem_mb is not None and sig in _MEMORY_SIGNALS:
        return Outcome.MEMORY_LIMIT
    return Outcome.EXIT


OutputCallback = Callable[[bytes], object]


class OutputBuffer:
    """One stream's capture: keeps at most ``cap`` bytes, counts all of them."""

    __slots__ = ("cap", "chunks", "keep", "on_chunk", "total", "truncated")

    def __init__(self, cap: int, on_chunk: OutputCallback | None, keep: bool) -> None:
        self.cap = cap
        self.on_chunk = on_chunk
        self.keep = keep
        self.chunks: list[bytes] = []
        self.total = 0
        self.truncated = False

    def feed(self, data: bytes) -> bool:
        """Take ``data``; True the first time the cap is passed."""
        room = self.cap - self.total
        self.total += len(data)
        if room > 0:
            kept = data if len(data) <= room else data[:room]
            if self.keep:
                self.chunks.append(kept)
            if self.on_chunk is not None:
                self.on_chunk(kept)
        if self.total > self.cap and not self.truncated:
            self.truncated = True
            return True
        return False



def exit_status_of(result: RunResult) -> int:
    """The exit status ``corral run`` uses for ``result`` (one table: above)."""
    if result.outcome is Outcome.EXIT:
        rc = result.returncode or 0
        return 128 - rc if rc < 0 else rc
    return OUTCOME_EXIT_STATUS[result.outcome]
