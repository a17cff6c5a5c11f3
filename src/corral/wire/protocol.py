"""The JSON-lines wire protocol between host and handler (seed 01, ``json-stdio``).

Pure, no I/O: :func:`encode_frame` turns a frame into one line of bytes,
:func:`parse_frame` turns one line into a :data:`ParseResult`, and
:class:`FrameDecoder` (or :func:`parse_frames` around it) turns a stream of
chunks into one result per line. The caller owns every read and write.

A bad line never raises: it comes back as :class:`FrameErr` holding a
:class:`ProtocolError` value and the stream goes on with the next line.
Python names are snake_case; wire names are the seed's camelCase. Key order,
types, the line cap and the evolution rules are in ``docs/protocol.md``.

The values (version, caps, the five frames, parse results, ProtocolError) come
first, then the codec (encoding, parsing, streaming).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, final

from corral.core.errors import ConfigInvalidError
from corral.core.spec import ResumeInfo, SandboxInvocationContext, SandboxSuspensionRequest

# fmt: off
__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "EXCERPT_BYTES",
    "ErrorBody",
    "ErrorFrame",
    "FrameDecoder",
    "FrameErr",
    "FrameOk",
    "InvokeFrame",
    "OutputFrame",
    "PROTOCOL_VERSION",
    "ParseResult",
    "ProtocolError",
    "ProtocolErrorKind",
    "ResumeFrame",
    "SUSPEND_EXIT_CODE",
    "SandboxSuspensionRequest",
    "StdinFrame",
    "StdoutFrame",
    "SuspendFrame",
    "WireFrame",
    "encode_frame",
    "encode_own_invoke",
    "frame_from_dict",
    "frame_to_dict",
    "parse_frame",
    "parse_frames",
]
# fmt: on

#: Carried as ``v`` on every frame; bumped only on an incompatible change.
PROTOCOL_VERSION: Final = 1
#: A handler that wrote a suspend frame exits with this status ("suspended, not failed").
SUSPEND_EXIT_CODE: Final = 42
#: Longest line (bytes before the ``\n``, a ``\r`` included) the decoder accepts.
DEFAULT_MAX_LINE_BYTES: Final = 16 * 1024 * 1024
#: A protocol error keeps at most this many bytes of the offending line.
EXCERPT_BYTES: Final = 200


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InvokeFrame:
    """Host to handler: run once with ``input`` in context ``ctx``."""

    input: Any
    ctx: SandboxInvocationContext
    v: Literal[1] = field(default=1, init=False)
    kind: Literal["invoke"] = field(default="invoke", init=False)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeFrame:
    """Host to handler: token ``token_id`` completed with ``value`` (sent before ``invoke``)."""

    token_id: str
    value: Any
    v: Literal[1] = field(default=1, init=False)
    kind: Literal["resume"] = field(default="resume", init=False)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OutputFrame:
    """Handler to host: the handler returned ``output``."""

    output: Any
    v: Literal[1] = field(default=1, init=False)
    kind: Literal["output"] = field(default="output", init=False)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorBody:
    """The ``error`` object of an error frame; ``details`` is omitted when None."""

    code: str
    message: str
    details: Mapping[str, Any] | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorFrame:
    """Handler to host: the handler failed with ``error``."""

    error: ErrorBody
    v: Literal[1] = field(default=1, init=False)
    kind: Literal["error"] = field(default="error", init=False)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SuspendFrame:
    """Handler to host: waiting durably on ``token_id``; exit code 42 follows."""

    token_id: str
    v: Literal[1] = field(default=1, init=False)
    kind: Literal["suspend"] = field(default="suspend", init=False)


StdinFrame: TypeAlias = InvokeFrame | ResumeFrame
StdoutFrame: TypeAlias = OutputFrame | ErrorFrame | SuspendFrame
WireFrame: TypeAlias = InvokeFrame | ResumeFrame | OutputFrame | ErrorFrame | SuspendFrame


class ProtocolErrorKind(enum.StrEnum):
    """Why a line is not a frame. A closed set."""

    NOT_JSON = "not-json"
    NOT_OBJECT = "not-object"
    BAD_VERSION = "bad-version"
    UNKNOWN_KIND = "unknown-kind"
    MISSING_FIELD = "missing-field"
    BAD_FIELD = "bad-field"
    LINE_TOO_LONG = "line-too-long"
    BAD_UTF8 = "bad-utf8"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolError:
    """A line that is not a frame (a value, never raised): ``path`` is the wire field
    path (``"ctx.runId"``) or None; ``excerpt`` the first :data:`EXCERPT_BYTES` bytes."""

    kind: ProtocolErrorKind
    message: str
    path: str | None = None
    excerpt: bytes = b""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FrameOk:
    """A line that parsed: ``frame`` holds the frame."""

    frame: WireFrame
    kind: Literal["ok"] = field(default="ok", init=False)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FrameErr:
    """A line that did not parse: ``error`` says why."""

    error: ProtocolError
    kind: Literal["err"] = field(default="err", init=False)


ParseResult: TypeAlias = FrameOk | FrameErr


# -- the codec --------------------------------------------------------------
# ---------------------------------------------------------------- encoding


def frame_to_dict(frame: WireFrame) -> dict[str, Any]:
    """The wire dict of a frame, keys in wire order; typed fields are checked as
    :func:`parse_frame` checks them (a bad one raises :class:`ConfigInvalidError`)."""
    if isinstance(frame, InvokeFrame) and not isinstance(frame.ctx, SandboxInvocationContext):
        raise ConfigInvalidError("ctx", "must be a SandboxInvocationContext")
    for name, wire in (("run_id", "runId"), ("tenant_id", "tenantId")):
        if isinstance(frame, InvokeFrame) and not getattr(frame.ctx, name):
            raise ConfigInvalidError(f"ctx.{wire}", "the wire needs it (invoke fills it "
                                     "from the spec)")
    if isinstance(frame, ErrorFrame) and not isinstance(frame.error, ErrorBody):
        raise ConfigInvalidError("error", "must be an ErrorBody")
    resume = frame.ctx.resume if isinstance(frame, InvokeFrame) else None
    if resume is not None and not isinstance(resume, ResumeInfo):
        raise ConfigInvalidError("ctx.resume", "must be a ResumeInfo or None")
    out: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": getattr(frame, "kind", None)}
    if isinstance(frame, InvokeFrame):
        out |= {"input": frame.input, "ctx": _ctx_dict(frame.ctx)}
    elif isinstance(frame, ResumeFrame):
        out |= {"tokenId": frame.token_id, "value": frame.value}
    elif isinstance(frame, SuspendFrame):
        out["tokenId"] = frame.token_id
    elif isinstance(frame, OutputFrame):
        out["output"] = frame.output
    elif isinstance(frame, ErrorFrame):
        err: dict[str, Any] = {"code": frame.error.code, "message": frame.error.message}
        if frame.error.details is not None:
            err["details"] = frame.error.details
        out["error"] = err
    else:
        raise ConfigInvalidError("frame", f"not a wire frame: {type(frame).__name__}")
    checked = frame_from_dict(out)
    if isinstance(checked, FrameErr):
        raise ConfigInvalidError(checked.error.path or "frame", checked.error.message)
    return out


def _ctx_dict(c: SandboxInvocationContext) -> dict[str, Any]:
    ctx: dict[str, Any] = {"runId": c.run_id, "tenantId": c.tenant_id}
    if c.node_id is not None:
        ctx["nodeId"] = c.node_id
    ctx |= {"dryRun": c.dry_run, "state": c.state, "nodeOutputs": c.node_outputs}
    if c.resume is not None:
        ctx["resume"] = {"tokenId": c.resume.token_id, "value": c.resume.value}
    return ctx


_ENCODE_ERRORS = (TypeError, ValueError, RecursionError)


def _dumps(obj: object) -> bytes:
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


def _culprit(doc: Mapping[str, Any], prefix: str = "") -> str:
    """The wire path of the first field that will not serialise."""
    for key, value in doc.items():
        try:
            _dumps(value)
        except _ENCODE_ERRORS:
            if key in ("ctx", "error", "resume") and isinstance(value, Mapping):
                return _culprit(value, f"{prefix}{key}.")
            return prefix + key
    return "frame"


def encode_frame(frame: WireFrame) -> bytes:
    """One frame as compact UTF-8 JSON plus ``b"\\n"``; a payload ``json`` cannot write
    (an object, NaN, a lone surrogate ...) raises :class:`ConfigInvalidError` naming it."""
    doc = frame_to_dict(frame)
    try:
        return _dumps(doc) + b"\n"
    except _ENCODE_ERRORS as exc:
        raise ConfigInvalidError(_culprit(doc), f"not JSON-serialisable: {exc}") from exc


def encode_own_invoke(job: Mapping[str, Any], run_id: str, tenant_id: str) -> bytes:
    """``encode_frame(InvokeFrame(job, SandboxInvocationContext(run_id, tenant_id)))``,
    the same bytes, for a host that built the job itself (the snippet pool, once per
    run): the context's fields are the defaults, so :func:`frame_to_dict`'s parse-back
    check (a third of the framing cost) has nothing to find. What ``json`` cannot write
    (a lone surrogate in a source) goes through :func:`encode_frame` for its typed error."""
    ctx = SandboxInvocationContext(run_id=run_id, tenant_id=tenant_id)
    if not (run_id and tenant_id):  # the wire needs both: encode_frame says so
        return encode_frame(InvokeFrame(input=dict(job), ctx=ctx))
    doc = {"v": PROTOCOL_VERSION, "kind": "invoke", "input": dict(job),
           "ctx": _ctx_dict(ctx)}
    try:
        return _dumps(doc) + b"\n"
    except _ENCODE_ERRORS:
        return encode_frame(InvokeFrame(input=dict(job), ctx=ctx))


# ---------------------------------------------------------------- parsing


class _Reject(Exception):
    """Internal: carries (kind, message, path) of a field error out of the checks."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("an object repeats a key")
    return obj


def _short(value: object) -> str:
    if value is None or isinstance(value, str | int | float):
        return repr(value)[:40]
    return f"a JSON {type(value).__name__}"


_WANT: dict[str, tuple[str, Callable[[object], bool]]] = {
    "token": ("a non-empty string", lambda v: isinstance(v, str) and v != ""),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("a boolean", lambda v: isinstance(v, bool)),
    "object": ("an object", lambda v: isinstance(v, dict)),
    "any": ("any JSON value", lambda v: True),
}


def _get(obj: Mapping[str, Any], key: str, path: str, want: str, *, optional: bool = False) -> Any:
    """``obj[key]`` checked against ``want``; an optional field may be absent or null."""
    value = obj.get(key)
    if optional and value is None:
        return None
    if key not in obj:
        raise _Reject(ProtocolErrorKind.MISSING_FIELD, f"missing field {path!r}", path)
    text, check = _WANT[want]
    if not check(value):
        nullable = " or null" if optional else ""
        msg = f"field {path!r} must be {text}{nullable}, not {_short(value)}"
        raise _Reject(ProtocolErrorKind.BAD_FIELD, msg, path)
    return value


def _ctx(doc: Mapping[str, Any]) -> SandboxInvocationContext:
    ctx = _get(doc, "ctx", "ctx", "object")
    fields = {
        "run_id": _get(ctx, "runId", "ctx.runId", "token"),
        "tenant_id": _get(ctx, "tenantId", "ctx.tenantId", "token"),
        "node_id": _get(ctx, "nodeId", "ctx.nodeId", "token", optional=True),
        "dry_run": _get(ctx, "dryRun", "ctx.dryRun", "bool"),
        "state": _get(ctx, "state", "ctx.state", "object"),
        "node_outputs": _get(ctx, "nodeOutputs", "ctx.nodeOutputs", "object"),
    }
    resume = _get(ctx, "resume", "ctx.resume", "object", optional=True)
    if resume is not None:
        token = _get(resume, "tokenId", "ctx.resume.tokenId", "token")
        value = _get(resume, "value", "ctx.resume.value", "any")
        fields["resume"] = ResumeInfo(token_id=token, value=value)
    return SandboxInvocationContext(**fields)


def _build(doc: dict[str, Any]) -> WireFrame:
    version = _get(doc, "v", "v", "any")
    if type(version) is not int or version != PROTOCOL_VERSION:
        msg = f"unsupported version {_short(version)}"
        raise _Reject(ProtocolErrorKind.BAD_VERSION, msg, "v")
    kind = _get(doc, "kind", "kind", "any")
    if kind == "invoke":
        return InvokeFrame(input=_get(doc, "input", "input", "any"), ctx=_ctx(doc))
    if kind == "resume":
        token = _get(doc, "tokenId", "tokenId", "token")
        return ResumeFrame(token_id=token, value=_get(doc, "value", "value", "any"))
    if kind == "output":
        return OutputFrame(output=_get(doc, "output", "output", "any"))
    if kind == "suspend":
        return SuspendFrame(token_id=_get(doc, "tokenId", "tokenId", "token"))
    if kind == "error":
        err = _get(doc, "error", "error", "object")
        body = ErrorBody(
            code=_get(err, "code", "error.code", "str"),
            message=_get(err, "message", "error.message", "str"),
            details=_get(err, "details", "error.details", "object", optional=True),
        )
        return ErrorFrame(error=body)
    raise _Reject(ProtocolErrorKind.UNKNOWN_KIND, f"unknown kind {_short(kind)}", "kind")


def _err(kind: ProtocolErrorKind, msg: str, excerpt: bytes, path: str | None = None) -> FrameErr:
    error = ProtocolError(kind=kind, message=msg, path=path, excerpt=excerpt[:EXCERPT_BYTES])
    return FrameErr(error=error)


def frame_from_dict(doc: object, *, excerpt: bytes = b"") -> ParseResult:
    """Check a decoded JSON value and build its frame; unknown fields are ignored."""
    if not isinstance(doc, dict):
        return _err(ProtocolErrorKind.NOT_OBJECT, "a frame must be a JSON object", excerpt)
    try:
        return FrameOk(frame=_build(doc))
    except _Reject as rej:
        kind, message, path = rej.args
        return _err(kind, message, excerpt, path)


def _parse_line(line: bytes) -> ParseResult:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _err(ProtocolErrorKind.BAD_UTF8, f"invalid UTF-8 at byte {exc.start}", line)
    try:
        doc = json.loads(
            text,
            parse_constant=_finite_float,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except RecursionError:
        return _err(ProtocolErrorKind.NOT_JSON, "not JSON: nested too deeply", line)
    except ValueError as exc:
        return _err(ProtocolErrorKind.NOT_JSON, f"not JSON: {str(exc)[:120]}", line)
    return frame_from_dict(doc, excerpt=line)


def parse_frame(line: bytes | str, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> ParseResult:
    """Parse one line (one trailing ``\\n`` or ``\\r\\n`` allowed). Never raises."""
    raw = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else bytes(line)
    raw = raw[:-1] if raw.endswith(b"\n") else raw
    if len(raw) > max_line_bytes:
        msg = f"line over {max_line_bytes} bytes"
        return _err(ProtocolErrorKind.LINE_TOO_LONG, msg, raw[: max_line_bytes + 1])
    return _parse_line(raw[:-1] if raw.endswith(b"\r") else raw)


# ---------------------------------------------------------------- streaming


@final
class FrameDecoder:
    """Feed bytes, get one result per non-empty line (a trailing ``\\r`` is dropped).

    A line over ``max_line_bytes`` (``\\r`` counted) is reported once as
    ``line-too-long`` when it crosses the cap and dropped up to its ``\\n``: the
    buffer never holds more. :meth:`close` parses an unterminated last line.
    """

    __slots__ = ("_buf", "_discarding", "_max")

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if type(max_line_bytes) is not int or max_line_bytes < 1:
            raise ConfigInvalidError("max_line_bytes", "must be a positive int")
        self._max = max_line_bytes
        self._buf = bytearray()
        self._discarding = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for the current unterminated line (never above the cap)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[ParseResult]:
        """Take a chunk; return the results of every line it completes."""
        out: list[ParseResult] = []
        view = memoryview(data)
        start, size = 0, len(data)
        while start < size:
            nl = data.find(b"\n", start)
            end = size if nl < 0 else nl
            if not self._discarding and len(self._buf) + (end - start) <= self._max:
                self._buf += view[start:end]
            elif not self._discarding:
                more = view[start : min(end, start + EXCERPT_BYTES)]
                head = (bytes(self._buf) + bytes(more))[: self._max + 1]
                self._buf.clear()
                self._discarding = True
                msg = f"line over {self._max} bytes"
                out.append(_err(ProtocolErrorKind.LINE_TOO_LONG, msg, head))
            if nl < 0:
                break
            self._end_line(out)
            start = nl + 1
        return out

    def close(self) -> list[ParseResult]:
        """End of stream: parse a pending unterminated line, then reset."""
        out: list[ParseResult] = []
        self._end_line(out)
        return out

    def _end_line(self, out: list[ParseResult]) -> None:
        if self._discarding:
            self._discarding = False
            return
        line = bytes(self._buf[:-1] if self._buf.endswith(b"\r") else self._buf)
        self._buf.clear()
        if line:
            out.append(_parse_line(line))


async def parse_frames(
    chunks: AsyncIterable[bytes], *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> AsyncIterator[ParseResult]:
    """Results for a stream of chunks (e.g. ``ProcessHandle.stdout``), EOF included."""
    decoder = FrameDecoder(max_line_bytes)
    async for chunk in chunks:
        for result in decoder.feed(chunk):
            yield result
    for result in decoder.close():
        yield result
