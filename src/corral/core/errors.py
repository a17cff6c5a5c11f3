"""The closed set of corral errors.

Every error corral raises on purpose is a :class:`CorralError`; each subclass
carries one stable kebab-case :class:`ErrorCode` (the same strings as seed 01's
``SandboxErrorCode``), an exit status for the CLI and an HTTP status for a
service. The set is closed: no provider adds codes; anything else is
``provider-error`` with the foreign error chained as ``__cause__``.

::

    CorralError
    ├── LevelNotSupportedError      level-not-supported
    ├── LimitsExceededError         limits-exceeded
    ├── SandboxTimeoutError         timeout          (also builtins.TimeoutError)
    ├── SandboxCancelledError       cancelled
    ├── CreateCancelledError        create-cancelled
    ├── UnhandledWorkerError        unhandled-worker
    ├── ConfigInvalidError          config-invalid   (also ValueError)
    ├── OrphanedError               orphaned
    ├── SnapshotNotSupportedError   snapshot-not-supported
    ├── RestoreNotSupportedError    restore-not-supported
    ├── PauseNotSupportedError      pause-not-supported
    ├── InvalidSnapshotHandleError  invalid-snapshot-handle
    └── ProviderError               provider-error

Bugs and asyncio cancellation are deliberately outside this tree.

The one error codec of every wire (the sandbox agent, ``corral serve`` and the
remote provider, Ray's node actors): :meth:`CorralError.to_dict` one way,
:func:`error_from_dict` / :func:`error_from_json` the other. The decoder takes
bytes from a far end it does not trust: a code outside the closed set, a
document that is not an object, facts of the wrong type or size never build
anything but a class of this module (an unknown code is :class:`ProviderError`
naming it; a wrong-typed fact takes its neutral value; text is cut at
:data:`MAX_ERROR_TEXT` characters).

This module is pure: no I/O imports.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, final

if TYPE_CHECKING:
    from corral.core.result import RunResult

__all__ = [
    "ConfigInvalidError",
    "CorralError",
    "CreateCancelledError",
    "ERROR_CLASSES",
    "ErrorCode",
    "InvalidSnapshotHandleError",
    "LevelNotSupportedError",
    "LimitKind",
    "LimitsExceededError",
    "OrphanedError",
    "PauseNotSupportedError",
    "ProviderError",
    "SessionEndedError",
    "RestoreNotSupportedError",
    "SandboxCancelledError",
    "SandboxTimeoutError",
    "SnapshotNotSupportedError",
    "UnhandledWorkerError",
    "error_from_code",
    "error_from_dict",
    "error_from_json",
]


class ErrorCode(enum.StrEnum):
    """Stable error codes, spelled as on the wire and in the docs."""

    LEVEL_NOT_SUPPORTED = "level-not-supported"
    LIMITS_EXCEEDED = "limits-exceeded"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    CREATE_CANCELLED = "create-cancelled"
    UNHANDLED_WORKER = "unhandled-worker"
    CONFIG_INVALID = "config-invalid"
    ORPHANED = "orphaned"
    SNAPSHOT_NOT_SUPPORTED = "snapshot-not-supported"
    RESTORE_NOT_SUPPORTED = "restore-not-supported"
    PAUSE_NOT_SUPPORTED = "pause-not-supported"
    INVALID_SNAPSHOT_HANDLE = "invalid-snapshot-handle"
    PROVIDER_ERROR = "provider-error"
    SESSION_ENDED = "session-ended"


#: longest text (a message, a reason, a detail) the decoder keeps from a far end
MAX_ERROR_TEXT = 4000
#: longest encoded error :func:`error_from_json` parses
MAX_ERROR_JSON = 256 * 1024

LimitKind = Literal["memory", "cpu", "disk", "processes", "output", "snapshot-bytes", "snapshots"]


class CorralError(Exception):
    """Root of every error corral raises on purpose.

    Attributes:
        code: the stable kebab-case code of the class.
        exit_status: what ``corral`` exits with when this error ends a command.
        http_status: the status a service maps this error to.
        message: the human message (also ``str(err)``).
        result: for an error that ended a run (timeout, cancelled, a limit), the
            :class:`~corral.core.result.RunResult` saying how, with the output and
            usage captured up to then (:meth:`RunResult.error` builds the error);
            ``None`` otherwise.
    """

    code: ClassVar[ErrorCode]
    exit_status: ClassVar[int]
    http_status: ClassVar[int]
    result: RunResult | None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.result = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe description: code, message and the class's own facts."""
        out: dict[str, Any] = {"code": str(self.code), "message": self.message}
        out.update(self._facts())
        return out

    def _facts(self) -> Mapping[str, Any]:
        return {}


@final
class LevelNotSupportedError(CorralError):
    """The provider cannot give the requested isolation here: the level itself, or a
    limit or network policy of the spec it has no mechanism to enforce.

    ``field`` says which part of the spec is refused (``level``, ``limits.mem_mb``,
    ``network`` ...); ``missing`` names what is absent (a namespace, seccomp, a
    cgroup controller, a per-sandbox memory limit ...), so the user knows what to
    change. The contract's refusal table (:mod:`corral.core.contract`) says when
    this error is raised rather than :class:`ConfigInvalidError`.
    """

    code = ErrorCode.LEVEL_NOT_SUPPORTED
    exit_status = 69
    http_status = 501

    def __init__(
        self,
        requested: str,
        supported: tuple[str, ...] | list[str] | frozenset[str] = (),
        detail: str = "",
        *,
        missing: str = "",
        field: str = "level",
    ) -> None:
        self.requested = requested
        self.supported = tuple(sorted(supported))
        self.detail = detail
        self.missing = missing
        self.field = field
        supported_s = ", ".join(self.supported) or "none"
        if field == "level":
            msg = f"level {requested!r} not supported (supported: {supported_s})"
        else:
            msg = f"{field} cannot be enforced at level {requested!r} here"
        if missing:
            msg += f"; missing: {missing}"
        if detail:
            msg += f"; {detail}"
        super().__init__(msg)

    def _facts(self) -> Mapping[str, Any]:
        return {"requested": self.requested, "supported": list(self.supported),
                "field": self.field, "missing": self.missing, "detail": self.detail}


@final
class LimitsExceededError(CorralError):
    """A run hit one of its limits and was stopped.

    ``limit`` says which (memory, cpu, disk, processes, output; for a snapshot
    store past its bounds ``snapshot-bytes`` or ``snapshots``); ``limit_value``
    is the configured cap and ``observed`` what was measured (0 when the kernel
    only told us the cap was hit), both in the limit's unit (MiB, ms, count,
    bytes). ``unit`` spells that unit.
    """

    code = ErrorCode.LIMITS_EXCEEDED
    exit_status = 137
    http_status = 422

    _UNITS: ClassVar[dict[str, str]] = {
        "memory": "MiB", "cpu": "ms", "disk": "MiB", "processes": "processes", "output": "bytes",
        "snapshot-bytes": "bytes", "snapshots": "snapshots",
    }

    def __init__(self, limit: LimitKind, limit_value: int, observed: int = 0,
                 detail: str = "") -> None:
        self.limit = limit
        self.limit_value = limit_value
        self.observed = observed
        self.unit = self._UNITS[limit]
        self.detail = detail
        msg = f"{limit} limit exceeded (limit {limit_value} {self.unit}"
        msg += f", observed {observed} {self.unit})" if observed else ")"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)

    def _facts(self) -> Mapping[str, Any]:
        return {"limit": self.limit, "limit_value": self.limit_value,
                "observed": self.observed, "unit": self.unit, "detail": self.detail}


@final
class SandboxTimeoutError(CorralError, TimeoutError):
    """A run went past its wall-clock deadline and was killed.

    ``stdout`` / ``stderr`` hold whatever output was captured before the kill.
    """

    code = ErrorCode.TIMEOUT
    exit_status = 124
    http_status = 504

    def __init__(self, message: str, *, timeout_ms: int = 0,
                 stdout: bytes = b"", stderr: bytes = b"") -> None:
        super().__init__(message)
        self.timeout_ms = timeout_ms
        self.stdout = stdout
        self.stderr = stderr

    def _facts(self) -> Mapping[str, Any]:
        return {"timeout_ms": self.timeout_ms}


@final
class SandboxCancelledError(CorralError):
    """The caller cancelled a run (a cancel token, or a cancelled request)."""

    code = ErrorCode.CANCELLED
    exit_status = 130
    http_status = 499


@final
class CreateCancelledError(CorralError):
    """A sandbox's creation was cancelled; everything it had built was rolled back."""

    code = ErrorCode.CREATE_CANCELLED
    exit_status = 130
    http_status = 499


@final
class UnhandledWorkerError(CorralError):
    """A worker or handler died without producing a result.

    ``exit_code`` is its exit status (negative: killed by that signal) and
    ``stderr_tail`` the last bytes it wrote to stderr, decoded.
    """

    code = ErrorCode.UNHANDLED_WORKER
    exit_status = 70
    http_status = 502

    def __init__(self, message: str, *, exit_code: int | None = None,
                 stderr_tail: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail

    def _facts(self) -> Mapping[str, Any]:
        return {"exit_code": self.exit_code, "stderr_tail": self.stderr_tail}


@final
class ConfigInvalidError(CorralError, ValueError):
    """A spec, option or argument is invalid. ``field`` names it."""

    code = ErrorCode.CONFIG_INVALID
    exit_status = 64
    http_status = 400

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")

    def _facts(self) -> Mapping[str, Any]:
        return {"field": self.field, "reason": self.reason}


@final
class OrphanedError(CorralError):
    """A sandbox was left behind by a host process that died, and was reaped."""

    code = ErrorCode.ORPHANED
    exit_status = 75
    http_status = 410


@final
class SnapshotNotSupportedError(CorralError):
    """This sandbox cannot take snapshots."""

    code = ErrorCode.SNAPSHOT_NOT_SUPPORTED
    exit_status = 69
    http_status = 501


@final
class RestoreNotSupportedError(CorralError):
    """This sandbox cannot restore snapshots."""

    code = ErrorCode.RESTORE_NOT_SUPPORTED
    exit_status = 69
    http_status = 501


@final
class PauseNotSupportedError(CorralError):
    """This sandbox cannot be paused or resumed."""

    code = ErrorCode.PAUSE_NOT_SUPPORTED
    exit_status = 69
    http_status = 501


@final
class InvalidSnapshotHandleError(CorralError):
    """A snapshot handle is malformed, tampered with, stale or from another provider."""

    code = ErrorCode.INVALID_SNAPSHOT_HANDLE
    exit_status = 65
    http_status = 400


@final
class ProviderError(CorralError):
    """Catch-all for provider failures; the underlying error is ``__cause__``."""

    code = ErrorCode.PROVIDER_ERROR
    exit_status = 70
    http_status = 500

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        if cause is not None:
            self.__cause__ = cause


@final
class SessionEndedError(CorralError):
    """A session (:mod:`corral.sessions`) has ended and runs no more cells: it was
    closed, passed its idle timeout or maximum lifetime, or its interpreter exited.
    ``reason`` says which (``closed``, ``idle-timeout``, ``max-lifetime``, ``exited``,
    ``interrupt-ignored``, ``protocol``); an end caused by a limit raises that limit's
    error instead (``LimitsExceededError("memory")``)."""

    code = ErrorCode.SESSION_ENDED
    exit_status = 75
    http_status = 410

    def __init__(self, message: str, *, reason: str = "closed") -> None:
        super().__init__(message)
        self.reason = reason

    def _facts(self) -> Mapping[str, Any]:
        return {"reason": self.reason}


ERROR_CLASSES: Mapping[ErrorCode, type[CorralError]] = {
    cls.code: cls
    for cls in (
        LevelNotSupportedError, LimitsExceededError, SandboxTimeoutError,
        SandboxCancelledError, CreateCancelledError, UnhandledWorkerError,
        ConfigInvalidError, OrphanedError, SnapshotNotSupportedError,
        RestoreNotSupportedError, PauseNotSupportedError,
        InvalidSnapshotHandleError, ProviderError, SessionEndedError,
    )
}


def error_from_code(code: str, message: str) -> CorralError:
    """Rebuild an error from a code and message (e.g. one read off the wire).

    The class's own facts take neutral values (``exit_code=None``, ...);
    unknown codes give :class:`ProviderError`, never a new class.
    """
    try:
        ecode = ErrorCode(code)
    except ValueError:
        return ProviderError(f"unknown error code {code!r}: {message}")
    cls = ERROR_CLASSES[ecode]
    if cls is LevelNotSupportedError:
        return LevelNotSupportedError("unknown", (), message)
    if cls is LimitsExceededError:
        err = LimitsExceededError("output", 0)
        CorralError.__init__(err, message)
        return err
    if cls is ConfigInvalidError:
        return ConfigInvalidError("(remote)", message)
    return cls(message)


_LIMIT_KINDS: frozenset[str] = frozenset(LimitsExceededError._UNITS)


def _text(doc: Mapping[str, Any], key: str, default: str = "") -> str:
    v = doc.get(key, default)
    return v[:MAX_ERROR_TEXT] if isinstance(v, str) else default


def _int_or(doc: Mapping[str, Any], key: str, default: int | None) -> int | None:
    v = doc.get(key, default)
    return v if type(v) is int and -(2 ** 63) <= v < 2 ** 63 else default


def error_from_dict(doc: object, *, result: RunResult | None = None) -> CorralError:
    """The inverse of :meth:`CorralError.to_dict`: the same class with the same facts
    and message. ``result`` (decoded by the caller's own codec, e.g. the HTTP API's)
    becomes ``err.result``; a timeout's partial output is taken from it.

    Never raises and never builds a class outside this module: a ``doc`` that is not
    an object, or has no known ``code``, gives :class:`ProviderError` saying so; a
    fact of the wrong type takes its neutral value; text is capped."""
    if not isinstance(doc, Mapping):
        return ProviderError(f"a malformed error (a {type(doc).__name__}, not an object)")
    message = _text(doc, "message")
    code = doc.get("code")
    try:
        ecode = ErrorCode(code) if isinstance(code, str) else None
    except ValueError:
        ecode = None
    err: CorralError
    if ecode is None:
        shown = code[:80] if isinstance(code, str) else type(code).__name__
        err = ProviderError(f"unknown error code {shown!r}: {message}")
    elif ecode is ErrorCode.LEVEL_NOT_SUPPORTED:
        supported = doc.get("supported")
        err = LevelNotSupportedError(
            _text(doc, "requested", "unknown"),
            tuple(s[:MAX_ERROR_TEXT] for s in supported[:64] if isinstance(s, str))
            if isinstance(supported, list) else (),
            _text(doc, "detail"), missing=_text(doc, "missing"),
            field=_text(doc, "field", "level") or "level")
    elif ecode is ErrorCode.LIMITS_EXCEEDED:
        limit = doc.get("limit")
        err = LimitsExceededError(
            limit if isinstance(limit, str) and limit in _LIMIT_KINDS else "output",  # type: ignore[arg-type]
            _int_or(doc, "limit_value", 0) or 0, _int_or(doc, "observed", 0) or 0,
            _text(doc, "detail"))
    elif ecode is ErrorCode.TIMEOUT:
        err = SandboxTimeoutError(
            message, timeout_ms=_int_or(doc, "timeout_ms", 0) or 0,
            stdout=result.stdout if result is not None else b"",
            stderr=result.stderr if result is not None else b"")
    elif ecode is ErrorCode.UNHANDLED_WORKER:
        err = UnhandledWorkerError(message, exit_code=_int_or(doc, "exit_code", None),
                                   stderr_tail=_text(doc, "stderr_tail"))
    elif ecode is ErrorCode.CONFIG_INVALID:
        err = ConfigInvalidError(_text(doc, "field", "?") or "?",
                                 _text(doc, "reason", message))
    elif ecode is ErrorCode.SESSION_ENDED:
        err = SessionEndedError(message, reason=_text(doc, "reason", "closed")[:64])
    else:
        err = ERROR_CLASSES[ecode](message)
    if ecode is not None and message and str(err) != message:
        CorralError.__init__(err, message)  # the far end's own words
    err.result = result
    return err


def error_from_json(data: bytes | str) -> CorralError:
    """:func:`error_from_dict` of one JSON document (at most :data:`MAX_ERROR_JSON`
    bytes); anything that does not parse is :class:`ProviderError`, never an
    exception of the parser."""
    import json  # here: the CLI's one-shot path imports this module, never json

    if len(data) > MAX_ERROR_JSON:
        return ProviderError(f"an error of {len(data)} bytes (at most {MAX_ERROR_JSON})")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        return ProviderError(f"a malformed error ({type(e).__name__})")
    return error_from_dict(doc)
