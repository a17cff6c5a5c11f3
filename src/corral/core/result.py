"""How a run ended: one tagged value for every runner, provider and front door.

:class:`RunResult` is tagged by :class:`Outcome` (exactly one per run) and carries
what the run left behind: the exit status, the captured output (capped once, by
:class:`OutputBuffer`, where the bytes arrive), the usage, and for a limit the
cap and the figure observed against it. ``run_bounded`` and ``run_strict``
return it; ``Sandbox.exec`` returns it for a command that exited and raises the
contract's typed error for any other outcome, built by :meth:`RunResult.error`
and carrying the same value as ``err.result``; ``ProcessHandle.done`` resolves
to it. ``ExecResult`` and ``ExitStatus`` (seed 01's names) are this type.

The outcome -> exit status table used by ``corral run`` lives here too, next to
:meth:`RunResult.check`, so the two cannot drift apart: for every outcome that
``check()`` turns into an error, the status is that error's ``exit_status``.

This module is pure: no I/O imports.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, final

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
    "DEFAULT_MAX_STDERR_BYTES",
    "DEFAULT_MAX_STDOUT_BYTES",
    "OUTCOME_EXIT_STATUS",
    "ExecResult",
    "ExitStatus",
    "NetworkDenial",
    "Outcome",
    "OutputBuffer",
    "OutputCallback",
    "RunResult",
    "exit_status_of",
    "signal_name",
]


#: the output caps every runner and provider uses unless told otherwise
DEFAULT_MAX_STDOUT_BYTES: Final = 8 * 1024 * 1024
DEFAULT_MAX_STDERR_BYTES: Final = 1024 * 1024


class Outcome(enum.StrEnum):
    """How a run ended. Exactly one per run."""

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
    Outcome.PROCESSES_LIMIT: LimitsExceededError.exit_status,  # 137
    Outcome.DISK_LIMIT: LimitsExceededError.exit_status,       # 137
    Outcome.SPAWN_ERROR: 127,
}

#: the limit each limit outcome names in ``LimitsExceededError.limit``
LIMIT_OF: Final[Mapping[Outcome, str]] = {
    Outcome.OVERFLOW_STDOUT: "output", Outcome.OVERFLOW_STDERR: "output",
    Outcome.MEMORY_LIMIT: "memory", Outcome.CPU_LIMIT: "cpu",
    Outcome.PROCESSES_LIMIT: "processes", Outcome.DISK_LIMIT: "disk",
}

@final
@dataclass(frozen=True, slots=True)
class NetworkDenial:
    """One connection a sandbox's network policy refused: the host (name or address)
    and port asked for, ``kind`` (e.g. ``not-allowed``, ``non-public-address``,
    ``sni-mismatch``; see docs/network.md) and the reason in words."""

    host: str
    port: int
    kind: str
    reason: str


_MISSING_COMMAND_ERRNOS = frozenset(
    {errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.ENOEXEC, errno.ELOOP, errno.EISDIR})


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """How one run ended, and what it left. Everything the run held is released.

    Attributes:
        outcome: the tag: how it ended (see :class:`Outcome`; default ``exit``);
            the other fields say what is known for that outcome.
        exit_code: the raw status of the command whenever one was reaped, on
            every outcome, as ``subprocess`` gives it: negative = killed by
            that signal; ``None`` when nothing was reaped (``spawn-error``, a
            cancel before the start). :attr:`signal` names the signal.
        stdout / stderr: the captured output, raw bytes, at most the cap and
            exact to the byte. ``stdout_text`` / ``stderr_text`` decode them
            (UTF-8, replace).
        stdout_truncated / stderr_truncated: more was written than kept.
        duration_ms: wall time of the whole call.
        usage: CPU, wall and peak memory as the kernel accounts them (0 = not
            measured; see ``docs/runner.md`` for what is counted).
        limit_value: for a limit outcome and ``timeout``, the limit, in its unit:
            bytes for overflow, MiB for memory and disk, ms for cpu and timeout,
            a count for processes.
        observed: what was measured against that limit, in the same unit
            (``None`` when the kernel only said the limit was hit).
        detail: in words, why: the spawn error, or how the limit was seen.
        spawn_errno: the OS error number of a ``spawn-error``, when there was one.
        cwd: the working directory (absolute). ``cwd_owned``: the runner made
            it and has already removed it.
        node_heap_mb_applied: ``--max-old-space-size`` went into ``NODE_OPTIONS``.
        strays_killed: processes outside the child's process group (they had
            called ``setsid`` or ``setpgid``) that the runner found and killed.
        denials: connections the sandbox's network policy refused while the run
            went on (by any process of the sandbox), oldest first; empty where
            the policy is ``none`` (nothing is asked: nothing leaves).
        level: the isolation level the run had (``strict``, ``context-isolated``,
            ``none``), set by the front door that knew it (``run_strict``,
            ``run_bounded``, ``corral.sandbox``, ``corral serve``, MCP, the CLI);
            ``None`` from a provider's ``exec`` called directly (its sandbox's
            ``spec.level`` says it).
    """

    outcome: Outcome = Outcome.EXIT
    exit_code: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0
    usage: ResourceUsage = field(default_factory=ResourceUsage)
    limit_value: int | None = None
    observed: int | None = None
    detail: str = ""
    spawn_errno: int | None = None
    cwd: str = ""
    cwd_owned: bool = False
    node_heap_mb_applied: bool = False
    strays_killed: int = 0
    denials: tuple[NetworkDenial, ...] = ()
    level: str | None = None

    def at_level(self, level: object) -> RunResult:
        """This result with ``level`` set (a ``Level`` or its name), unless it has one."""
        if self.level is not None or level is None:
            return self
        import dataclasses
        return dataclasses.replace(self, level=str(getattr(level, "value", level)))

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    @property
    def signal(self) -> str | None:
        """The name (``"SIGKILL"``) of the signal that killed the command, if one did."""
        if self.exit_code is None or self.exit_code >= 0:
            return None
        return signal_name(-self.exit_code)

    @property
    def ok(self) -> bool:
        """The command exited by itself with code 0."""
        return self.outcome is Outcome.EXIT and self.exit_code == 0

    def error(self) -> CorralError | None:
        """The error :meth:`check` would raise (``err.result`` is self), or ``None``
        for ``exit``."""
        err = self._error()
        if err is not None:
            err.result = self
        return err

    def _error(self) -> CorralError | None:
        o = self.outcome
        limit = self.limit_value or 0
        if o is Outcome.EXIT:
            return None
        if o is Outcome.TIMEOUT:
            return SandboxTimeoutError(
                f"run timed out after {limit} ms and was killed", timeout_ms=limit,
                stdout=self.stdout, stderr=self.stderr)
        if o is Outcome.CANCELLED:
            return SandboxCancelledError("run cancelled")
        if o is Outcome.SPAWN_ERROR:
            if self.spawn_errno in _MISSING_COMMAND_ERRNOS:
                return ConfigInvalidError("command", self.detail)
            return ProviderError(f"spawn failed: {self.detail}")
        detail = self.detail
        if o in (Outcome.MEMORY_LIMIT, Outcome.CPU_LIMIT) and self.exit_code is not None:
            how = f"killed by {self.signal}" if self.signal else f"exit {self.exit_code}"
            detail = f"{detail}; {how}" if detail else how
        elif o in (Outcome.OVERFLOW_STDOUT, Outcome.OVERFLOW_STDERR) and not detail:
            detail = ("stdout" if o is Outcome.OVERFLOW_STDOUT else "stderr") + " cap exceeded"
        return LimitsExceededError(LIMIT_OF[o], limit, self.observed or 0,  # type: ignore[arg-type]
                                   detail=detail)

    def check(self) -> RunResult:
        """Return self if the outcome is ``exit``, else raise the matching error.

        A non-zero exit code is the command's answer, not an error: ``check()``
        does not raise for it (test ``ok`` or ``exit_code``). Mapping:
        timeout -> SandboxTimeoutError (with the partial output), cancelled ->
        SandboxCancelledError, overflow-* -> LimitsExceededError("output"),
        memory / cpu / processes / disk -> LimitsExceededError of that limit,
        spawn-error -> ConfigInvalidError("command") when the command or cwd is
        missing or not executable, else ProviderError. The error's ``result``
        is this value.
        """
        err = self.error()
        if err is not None:
            raise err
        return self

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (the ``--json`` output of ``corral run``).

        Each stream is given losslessly with its encoding: ``"stdout"`` is the
        text and ``"stdout_encoding"`` is ``"utf-8"`` when the bytes are valid
        UTF-8; otherwise ``"stdout"`` is ``None``, ``"stdout_b64"`` holds the
        bytes in base64 and ``"stdout_encoding"`` is ``"base64"`` (likewise for
        stderr). A cap can cut a character in two, so truncated output may be
        base64 too.
        """
        doc: dict[str, Any] = {"outcome": str(self.outcome), "exit_code": self.exit_code,
                               "signal": self.signal}
        for name, data in (("stdout", self.stdout), ("stderr", self.stderr)):
            doc.update(_stream_fields(name, data))
        doc.update({
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "duration_ms": self.duration_ms,
            "usage": {"cpu_ms": self.usage.cpu_ms, "wall_ms": self.usage.wall_ms,
                      "peak_mem_mb": self.usage.peak_mem_mb},
            "limit_value": self.limit_value, "observed": self.observed, "detail": self.detail,
            "cwd": self.cwd, "cwd_owned": self.cwd_owned,
            "node_heap_mb_applied": self.node_heap_mb_applied,
            "strays_killed": self.strays_killed,
            "denials": [{"host": d.host, "port": d.port, "kind": d.kind, "reason": d.reason}
                        for d in self.denials],
        })
        if self.level is not None:
            doc["level"] = self.level
        return doc


def _stream_fields(name: str, data: bytes) -> dict[str, Any]:
    """One stream for :meth:`RunResult.to_dict`: UTF-8 text, or base64 when it is not."""
    try:
        return {name: data.decode("utf-8"), f"{name}_encoding": "utf-8"}
    except UnicodeDecodeError:
        import base64  # only for output that is not UTF-8
        return {name: None, f"{name}_b64": base64.b64encode(data).decode("ascii"),
                f"{name}_encoding": "base64"}


#: seed 01's name for what ``Sandbox.exec`` returns: a :class:`RunResult` (outcome ``exit``)
ExecResult: TypeAlias = RunResult
#: seed 01's name for how a started process ended (``ProcessHandle.done``): a :class:`RunResult`
ExitStatus: TypeAlias = RunResult


#: Linux's signal names (the same numbers on x86-64 and arm64), so this module needs
#: no ``signal`` import
_SIGNAL_NAMES: Final = (
    "", "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE",
    "SIGKILL", "SIGUSR1", "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM", "SIGSTKFLT",
    "SIGCHLD", "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG", "SIGXCPU",
    "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO", "SIGPWR", "SIGSYS",
)


def signal_name(signum: int) -> str:
    """``"SIGKILL"`` for 9; ``"SIG40"`` for a number without a name (real-time ones)."""
    if 0 < signum < len(_SIGNAL_NAMES):
        return _SIGNAL_NAMES[signum]
    return f"SIG{signum}"


def exit_status_of(result: RunResult) -> int:
    """The exit status ``corral run`` uses for ``result`` (one table: above)."""
    if result.outcome is Outcome.EXIT:
        rc = result.exit_code or 0
        return 128 - rc if rc < 0 else rc
    return OUTCOME_EXIT_STATUS[result.outcome]


OutputCallback = Callable[[bytes], object]


class OutputBuffer:
    """One stream's capture, the one place output is capped: keeps at most ``cap``
    bytes, counts all of them, and passes what it keeps to ``on_chunk``."""

    __slots__ = ("cap", "chunks", "keep", "on_chunk", "total", "truncated")

    def __init__(self, cap: int, on_chunk: OutputCallback | None = None,
                 keep: bool = True) -> None:
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

    def value(self) -> bytes:
        """What was kept, joined."""
        return b"".join(self.chunks)
