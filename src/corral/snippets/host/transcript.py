"""The transcript of one snippet run: frozen values, caps, and the checked reading of the wire.

The worker inside the sandbox builds a transcript dict; the host never trusts
it: :func:`transcript_from_wire` checks every field's type, applies the caps
again (marking what it cut in ``truncated``) and sanitizes paths out of error
messages and tracebacks with :func:`corral.snippets.host.sanitize.sanitize_stack`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, final

from corral.core.errors import UnhandledWorkerError
from corral.core.spec import Level
from corral.snippets.host.sanitize import sanitize_stack
from corral.snippets.validator import Violation

__all__ = [
    "CAPS",
    "LOG_STREAMS",
    "LogCaps",
    "TRUNCATION_MARK",
    "LogLine",
    "SnippetError",
    "Transcript",
    "thaw",
    "transcript_from_wire",
    "transcript_rejected",
]

#: Caps on every transcript field (characters for text, UTF-8 bytes for ``*_bytes``).
CAPS: Final[Mapping[str, int]] = MappingProxyType({
    "log_lines": 1000,         # log lines kept
    "log_bytes": 65536,        # text of all log lines together
    "line_chars": 4096,        # one log line
    "facts_bytes": 65536,      # the facts as compact JSON
    "facts_names": 256,        # top-level names in facts
    "value_chars": 1024,       # one string or repr inside facts
    "items": 100,              # items of one list/dict inside facts
    "depth": 6,                # nesting inside facts
    "result_chars": 4096,      # the result's repr
    "message_chars": 4096,     # one error message
    "traceback_chars": 16384,  # one traceback (the tail is kept)
    "errors": 16,              # errors kept
})  # fmt: skip
#: Appended to (or, for tracebacks, put in front of) text that was cut.
TRUNCATION_MARK: Final = "…[truncated]"
LOG_STREAMS: Final = frozenset({"stdout", "stderr", "log"})

LogStream = Literal["stdout", "stderr", "log"]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LogLine:
    """One line of output: ``stream`` is stdout, stderr (print, sys.std*) or log (logging)."""

    stream: LogStream
    text: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SnippetError:
    """An error of a run. ``type`` is the exception's class name, or ``ValidationError``
    (then ``code``, ``line``, ``column`` and ``path`` come from the validator),
    ``TimeoutError`` or ``WorkerCrashed`` (the process died; ``exit_code`` says how)."""

    type: str
    message: str
    line: int | None = None
    column: int | None = None
    path: str | None = None
    code: str | None = None
    traceback: str = ""
    exit_code: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "line": self.line,
                "column": self.column, "path": self.path, "code": self.code,
                "traceback": self.traceback, "exit_code": self.exit_code}


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A frozen facts value back as plain JSON (dicts and lists)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Transcript:
    """What one snippet run did.

    Attributes:
        logs: print and logging lines, in order.
        facts: JSON-safe snapshot of the top-level names (taken even when the code
            raised; read-only: dicts are mappings, lists are tuples; :func:`thaw`).
        result: ``repr`` of the last expression statement's value, as a REPL shows
            it, or None (no final expression, it was None, or the code raised).
        errors: what went wrong (validation errors, the exception, a timeout, a crash).
        duration_ms: wall time of the run itself (0 when rejected unrun).
        timed_out: the run hit its timeout and was stopped.
        truncated: the fields a cap cut (``logs``, ``facts``, ``result``, ``errors``).
        level: the isolation level the snippet ran at (``strict`` or
            ``context-isolated``); None when it did not run (rejected by the validator).
        limits: how the run's memory, processes and cpu were held, for a person
            (``{"memory": "cgroup v1 memory+swap for the whole sandbox", ...}``, or
            ``"rlimit per process (no delegated cgroup)"`` for a user without a
            delegated cgroup); empty when it did not run.
    """

    logs: tuple[LogLine, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    result: str | None = None
    errors: tuple[SnippetError, ...] = ()
    duration_ms: float = 0.0
    timed_out: bool = False
    truncated: frozenset[str] = frozenset()
    level: Level | None = None
    limits: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def ok(self) -> bool:
        """True when the snippet ran to the end without an error."""
        return not self.errors and not self.timed_out

    @property
    def rejected(self) -> bool:
        """True when the validator refused the snippet (it did not run)."""
        return any(e.type == "ValidationError" for e in self.errors)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (the ``--json`` form of ``corral python``)."""
        return {"logs": [{"stream": x.stream, "text": x.text} for x in self.logs],
                "facts": thaw(self.facts), "result": self.result,
                "errors": [e.to_dict() for e in self.errors], "duration_ms": self.duration_ms,
                "timed_out": self.timed_out, "truncated": sorted(self.truncated),
                "level": None if self.level is None else self.level.value,
                "limits": dict(self.limits)}


def transcript_rejected(violations: Sequence[Violation]) -> Transcript:
    """The transcript of a snippet the validator refused: one ValidationError each, no run."""
    errors = tuple(
        SnippetError(type="ValidationError", message=v.message, line=v.line, column=v.column,
                     path=v.path, code=v.code.value)
        for v in violations[: CAPS["errors"]])
    cut = frozenset({"errors"}) if len(violations) > CAPS["errors"] else frozenset()
    return Transcript(errors=errors, truncated=cut)


def _bad(what: str) -> UnhandledWorkerError:
    return UnhandledWorkerError(f"the snippet worker sent a malformed transcript: {what}")


def _cut(text: str, limit: int, cut: set[str], name: str, *, tail: bool = False) -> str:
    if len(text) <= limit:
        return text
    cut.add(name)
    keep = max(limit - len(TRUNCATION_MARK), 0)
    return TRUNCATION_MARK + text[-keep:] if tail else text[:keep] + TRUNCATION_MARK


def _opt_int(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(what)
    return value


#: Containers a transcript may nest: the wire object, facts, a name, then the facts' own
#: depth (the worker turns anything deeper into its repr).
_MAX_NESTING: Final = CAPS["depth"] + 4


def _nesting_ok(value: object, limit: int) -> bool:
    """Whether ``value`` nests at most ``limit`` dicts/lists/tuples deep (iterative, so a
    hostile depth cannot overflow the stack)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


class LogCaps:
    """The transcript's log caps, applied one line at a time, in order: what
    :func:`transcript_from_wire` keeps of a run's log lines, and what a live listener
    (``run_snippet(on_log=...)``) is handed as the lines arrive. The same class does
    both, so a line the caps count is the very line the listener got.

    A line longer than ``line_chars`` is cut (ending in :data:`TRUNCATION_MARK`); once a
    line would pass ``log_lines`` or ``log_bytes`` (UTF-8 of the kept text) no later line
    is kept. ``cut`` says a cap cut something (``truncated`` then names ``logs``)."""

    __slots__ = ("_size", "cut", "full", "kept")

    def __init__(self) -> None:
        self.kept = 0
        self._size = 0
        self.full = False
        self.cut = False

    def take(self, stream: str, text: str) -> LogLine | None:
        """The line to keep for ``(stream, text)`` (already checked: a known stream and a
        str), or None when the caps are spent."""
        if self.full:
            return None
        if len(text) > CAPS["line_chars"]:
            self.cut = True
            text = text[: max(CAPS["line_chars"] - len(TRUNCATION_MARK), 0)] + TRUNCATION_MARK
        self._size += len(text.encode("utf-8", "replace"))
        if self.kept >= CAPS["log_lines"] or self._size > CAPS["log_bytes"]:
            self.full = self.cut = True
            return None
        self.kept += 1
        return LogLine(stream=stream, text=text)  # type: ignore[arg-type]  # checked


def _logs(raw: object, cut: set[str]) -> tuple[LogLine, ...]:
    if not isinstance(raw, list):
        raise _bad("logs")
    out: list[LogLine] = []
    caps = LogCaps()
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("stream"), str) \
                or item["stream"] not in LOG_STREAMS or not isinstance(item.get("text"), str):
            raise _bad("logs[]")
        line = caps.take(item["stream"], item["text"])
        if line is None:
            break
        out.append(line)
    if caps.cut:
        cut.add("logs")
    return tuple(out)


def _facts(raw: object, cut: set[str]) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise _bad("facts")
    out: dict[str, Any] = {}
    size = 2
    for name, value in raw.items():
        if not isinstance(name, str):
            raise _bad("facts (a name is not a string)")
        try:
            cost = len(json.dumps(value, ensure_ascii=False, allow_nan=False)) + len(name) + 4
        except (TypeError, ValueError, RecursionError, OverflowError):
            raise _bad(f"facts[{name[:40]!r}]") from None
        if len(out) >= CAPS["facts_names"] or size + cost > CAPS["facts_bytes"]:
            cut.add("facts")
            break
        out[name], size = value, size + cost
    frozen: Mapping[str, Any] = _freeze(out)
    return frozen


def _errors(raw: object, cut: set[str], paths: Sequence[str]) -> tuple[SnippetError, ...]:
    if not isinstance(raw, list):
        raise _bad("errors")
    if len(raw) > CAPS["errors"]:
        cut.add("errors")
    out: list[SnippetError] = []
    for item in raw[: CAPS["errors"]]:
        if not isinstance(item, dict) or not isinstance(item.get("type"), str) \
                or not isinstance(item.get("message"), str) \
                or not isinstance(item.get("traceback", ""), str):
            raise _bad("errors[]")
        path = item.get("path")
        if path is not None and not isinstance(path, str):
            raise _bad("errors[].path")
        message = sanitize_stack(item["message"], extra_paths=paths)
        tb = sanitize_stack(item.get("traceback", ""), extra_paths=paths)
        out.append(SnippetError(
            type=_cut(item["type"], 200, cut, "errors"),
            message=_cut(message, CAPS["message_chars"], cut, "errors"),
            line=_opt_int(item.get("line"), "errors[].line"),
            column=_opt_int(item.get("column"), "errors[].column"),
            path=None if path is None else _cut(path, 200, cut, "errors"),
            traceback=_cut(tb, CAPS["traceback_chars"], cut, "errors", tail=True),
            exit_code=_opt_int(item.get("exit_code"), "errors[].exit_code")))
    return tuple(out)


def transcript_from_wire(raw: object, *, sandbox_paths: Sequence[str] = (),
                         level: Level | None = None) -> Transcript:
    """Check and cap a transcript dict from the worker. Raises UnhandledWorkerError if
    malformed, whatever ``raw`` is (the worker's process is hostile input). ``level`` is
    the level the run had (the host knows it; the worker is not asked)."""
    if not isinstance(raw, dict):
        raise _bad("not an object")
    if not _nesting_ok(raw, _MAX_NESTING):
        raise _bad("nests too deeply")
    try:
        return _checked(raw, sandbox_paths, level)
    except UnhandledWorkerError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError,
            MemoryError) as exc:  # a shape the checks above missed: still the worker's fault
        raise _bad(type(exc).__name__) from None


def _checked(raw: dict[Any, Any], sandbox_paths: Sequence[str],
             level: Level | None) -> Transcript:
    cut: set[str] = set()
    result = raw.get("result")
    if result is not None and not isinstance(result, str):
        raise _bad("result")
    duration = raw.get("duration_ms", 0)
    if isinstance(duration, bool) or not isinstance(duration, int | float) \
            or not -1e12 < duration < 1e12 or not math.isfinite(duration):
        raise _bad("duration_ms")
    timed_out = raw.get("timed_out", False)
    truncated = raw.get("truncated", [])
    if not isinstance(timed_out, bool) or not isinstance(truncated, list) \
            or not all(isinstance(t, str) for t in truncated):
        raise _bad("timed_out/truncated")
    cut.update(t for t in truncated if t in ("logs", "facts", "result", "errors"))
    return Transcript(
        logs=_logs(raw.get("logs", []), cut),
        facts=_facts(raw.get("facts", {}), cut),
        result=None if result is None else _cut(result, CAPS["result_chars"], cut, "result"),
        errors=_errors(raw.get("errors", []), cut, sandbox_paths),
        duration_ms=round(max(float(duration), 0.0), 3),
        timed_out=timed_out,
        truncated=frozenset(cut),
        level=level,
    )
