"""What a handler's frames and exit code mean: the reply types, the reading of
the one result frame from its stdout, and the mapping to a reply or a typed
error (:func:`decide`; the table is in ``docs/handlers.md``).

Import the public names from :mod:`corral.dispatch.invocation`, which re-exports them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, final

from corral.core.errors import (
    CorralError,
    ErrorCode,
    ProviderError,
    UnhandledWorkerError,
    error_from_dict,
)
from corral.wire.protocol import (
    SUSPEND_EXIT_CODE,
    ErrorBody,
    ErrorFrame,
    FrameDecoder,
    FrameErr,
    FrameOk,
    InvokeFrame,
    OutputFrame,
    ProtocolError,
    ResumeFrame,
    StdoutFrame,
    SuspendFrame,
    WireFrame,
)

__all__ = [
    "HandlerOutput", "HandlerReply", "HandlerSuspended", "ProtocolViolation", "decide",
    "read_result",
]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerOutput:
    """The handler returned ``value`` (decoded JSON)."""

    value: Any
    kind: Literal["output"] = field(default="output", init=False)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerSuspended:
    """The handler waits durably on ``token_id``; re-invoke with it in ``resumed``."""

    token_id: str
    kind: Literal["suspended"] = field(default="suspended", init=False)


HandlerReply: TypeAlias = HandlerOutput | HandlerSuspended


class ProtocolViolation(Exception):
    """The ``__cause__`` of the ``ProviderError`` a malformed frame stream raises.

    ``error`` is the decoder's :class:`~corral.wire.protocol.ProtocolError` when the
    line did not parse, ``None`` for a well-formed frame in the wrong place (a
    second result, or a host-to-handler frame). Never raised on its own.
    """

    def __init__(self, message: str, error: ProtocolError | None = None) -> None:
        super().__init__(message)
        self.error = error


def _error_from_body(body: ErrorBody, exit_code: int | None, stderr_tail: str) -> CorralError:
    """The error a handler's ``error`` frame names, by corral's one error codec
    (:func:`~corral.core.errors.error_from_dict`: its ``details`` are the facts; an
    unknown code is ProviderError); ``unhandled-worker`` takes the real exit code and
    stderr tail of the process, whatever the frame claims."""
    if body.code == ErrorCode.UNHANDLED_WORKER:
        return UnhandledWorkerError(body.message, exit_code=exit_code, stderr_tail=stderr_tail)
    return error_from_dict({**(body.details or {}), "code": body.code, "message": body.message})


def decide(frame: StdoutFrame | None, *, exit_code: int | None,
           stderr_tail: str = "") -> HandlerReply:
    """Turn the one result frame (or none) and the exit code into an outcome or error.

    ``exit_code`` is None in-context (no process). See ``docs/handlers.md``.
    """
    def unhandled(msg: str) -> UnhandledWorkerError:
        return UnhandledWorkerError(msg, exit_code=exit_code, stderr_tail=stderr_tail)

    if isinstance(frame, ErrorFrame):
        raise _error_from_body(frame.error, exit_code, stderr_tail)
    if isinstance(frame, OutputFrame):
        if exit_code in (None, 0):
            return HandlerOutput(value=frame.output)
        raise unhandled(f"the handler wrote an output frame but exited with code {exit_code}")
    if isinstance(frame, SuspendFrame):
        if exit_code in (None, SUSPEND_EXIT_CODE):
            return HandlerSuspended(token_id=frame.token_id)
        raise unhandled(f"the handler wrote a suspend frame but exited with code {exit_code}, "
                        f"not {SUSPEND_EXIT_CODE}")
    if exit_code == SUSPEND_EXIT_CODE:
        raise unhandled(f"the handler exited with code {SUSPEND_EXIT_CODE} (suspended) "
                        "without a suspend frame")
    raise unhandled(f"the handler exited with code {exit_code} without a result frame")


def _violation(message: str, error: ProtocolError | None = None) -> ProviderError:
    return ProviderError(message, ProtocolViolation(message, error))


async def read_result(chunks: AsyncIterator[bytes], cap: int) -> StdoutFrame | None:
    """The one result frame of a stdout stream; any protocol violation raises at once."""
    decoder = FrameDecoder(cap)
    result: StdoutFrame | None = None

    def take(res: FrameOk | FrameErr) -> None:
        nonlocal result
        if isinstance(res, FrameErr):
            e = res.error
            raise _violation(f"malformed frame from the handler ({e.kind}): {e.message}", e)
        frame: WireFrame = res.frame
        if isinstance(frame, InvokeFrame | ResumeFrame):
            raise _violation(f"the handler wrote a host-to-handler {frame.kind!r} frame")
        if result is not None:
            raise _violation(f"the handler wrote a second result frame ({frame.kind!r} after "
                             f"{result.kind!r})")
        result = frame

    async for chunk in chunks:
        for res in decoder.feed(chunk):
            take(res)
    for res in decoder.close():
        take(res)
    return result

