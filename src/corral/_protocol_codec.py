"""The wire protocol's codec (seed 01): frames to bytes and bytes to frames.

Pure, no I/O: :func:`encode_frame` writes one frame as one line,
:func:`parse_frame` reads one line into a :data:`ParseResult` (never raising),
and :class:`FrameDecoder` / :func:`parse_frames` cut a stream of chunks into
lines. Import them from :mod:`corral.protocol`, which re-exports every name here.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from typing import Any, final

from ._protocol_frames import (
    DEFAULT_MAX_LINE_BYTES,
    EXCERPT_BYTES,
    PROTOCOL_VERSION,
    ErrorBody,
    ErrorFrame,
    FrameErr,
    FrameOk,
    InvokeFrame,
    OutputFrame,
    ParseResult,
    ProtocolContext,
    ProtocolError,
    ProtocolErrorKind,
    ResumeFrame,
    SuspendFrame,
    WireFrame,
)
from .errors import ConfigInvalidError
from .spec import ResumeInfo

__all__ = [
    "FrameDecoder", "encode_frame", "frame_from_dict", "frame_to_dict", "parse_frame",
    "parse_frames",
]


# ---------------------------------------------------------------- encoding


def frame_to_dict(frame: WireFrame) -> dict[str, Any]:
    """The wire dict of a frame, keys in wire order; typed fields are checked as
    :func:`parse_frame` checks them (a bad one raises :class:`ConfigInvalidError`)."""
    if isinstance(frame, InvokeFrame) and not isinstance(frame.ctx, ProtocolContext):
        raise ConfigInvalidError("ctx", "must be a ProtocolContext")
    if isinstance(frame, ErrorFrame) and not isinstance(frame.error, ErrorBody):
        raise ConfigInvalidError("error", "must be an ErrorBody")
    resume = frame.ctx.resume if isinstance(frame, InvokeFrame) else None
    if resume is not None and not isinstance(resume, ResumeInfo):
        raise ConfigInvalidError("ctx.resume", "must be a ResumeInfo or None")
    out: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": getattr(frame, "kind", None)}
    if isinstance(frame, InvokeFrame):
        c = frame.ctx
        ctx: dict[str, Any] = {"runId": c.run_id, "tenantId": c.tenant_id}
        if c.node_id is not None:
            ctx["nodeId"] = c.node_id
        ctx |= {"dryRun": c.dry_run, "state": c.state, "nodeOutputs": c.node_outputs}
        if c.resume is not None:
            ctx["resume"] = {"tokenId": c.resume.token_id, "value": c.resume.value}
        out |= {"input": frame.input, "ctx": ctx}
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


def _ctx(doc: Mapping[str, Any]) -> ProtocolContext:
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
    return ProtocolContext(**fields)


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
