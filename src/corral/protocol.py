"""The JSON-lines wire protocol between host and handler (seed 01, ``json-stdio``).

Pure, no I/O: :func:`encode_frame` turns a frame into one line of bytes,
:func:`parse_frame` turns one line into a :data:`ParseResult`, and
:class:`FrameDecoder` (or :func:`parse_frames` around it) turns a stream of
chunks into one result per line. The caller owns every read and write.

A bad line never raises: it comes back as :class:`FrameErr` holding a
:class:`ProtocolError` value and the stream goes on with the next line.
Python names are snake_case; wire names are the seed's camelCase. Key order,
types, the line cap and the evolution rules are in ``docs/protocol.md``.

Defined in :mod:`corral._protocol_frames` (the values) and
:mod:`corral._protocol_codec` (encoding, parsing, streaming); this module is
their public home.
"""

from __future__ import annotations

from ._protocol_codec import (
    FrameDecoder,
    encode_frame,
    frame_from_dict,
    frame_to_dict,
    parse_frame,
    parse_frames,
)
from ._protocol_frames import (
    DEFAULT_MAX_LINE_BYTES,
    EXCERPT_BYTES,
    PROTOCOL_VERSION,
    SUSPEND_EXIT_CODE,
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
    SandboxSuspensionRequest,
    StdinFrame,
    StdoutFrame,
    SuspendFrame,
    WireFrame,
)

# fmt: off
__all__ = [
    "DEFAULT_MAX_LINE_BYTES", "EXCERPT_BYTES", "ErrorBody", "ErrorFrame", "FrameDecoder",
    "FrameErr", "FrameOk", "InvokeFrame", "OutputFrame", "PROTOCOL_VERSION", "ParseResult",
    "ProtocolContext", "ProtocolError", "ProtocolErrorKind", "ResumeFrame", "SUSPEND_EXIT_CODE",
    "SandboxSuspensionRequest", "StdinFrame", "StdoutFrame", "SuspendFrame", "WireFrame",
    "encode_frame", "frame_from_dict", "frame_to_dict", "parse_frame", "parse_frames"
]
# fmt: on

for _obj in (
    ErrorBody, ErrorFrame, FrameDecoder, FrameErr, FrameOk, InvokeFrame, OutputFrame,
    ProtocolContext, ProtocolError, ProtocolErrorKind, ResumeFrame, SandboxSuspensionRequest,
    SuspendFrame, encode_frame, frame_from_dict, frame_to_dict, parse_frame, parse_frames,
):
    _obj.__module__ = __name__  # documented here, where users import them from
del _obj
