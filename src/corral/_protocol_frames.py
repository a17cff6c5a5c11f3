"""The wire protocol's values (seed 01): version and caps, the five frames, the
context an ``invoke`` carries, and the parse results (:class:`FrameOk`,
:class:`FrameErr` holding a :class:`ProtocolError`). Pure data, no I/O.

Import them from :mod:`corral.protocol`, which re-exports every name here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, final

from .errors import ConfigInvalidError
from .spec import ResumeInfo

# fmt: off
__all__ = [
    "DEFAULT_MAX_LINE_BYTES", "EXCERPT_BYTES", "ErrorBody", "ErrorFrame", "FrameErr", "FrameOk",
    "InvokeFrame", "OutputFrame", "PROTOCOL_VERSION", "ParseResult", "ProtocolContext",
    "ProtocolError", "ProtocolErrorKind", "ResumeFrame", "SUSPEND_EXIT_CODE",
    "SandboxSuspensionRequest", "StdinFrame", "StdoutFrame", "SuspendFrame", "WireFrame",
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


class SandboxSuspensionRequest(Exception):
    """Raised by handler code to wait durably on a token; the handler-base entrypoint
    turns it into a :class:`SuspendFrame` and exits with :data:`SUSPEND_EXIT_CODE`."""

    def __init__(self, token_id: str) -> None:
        if not isinstance(token_id, str) or not token_id:
            raise ConfigInvalidError("token_id", "must be a non-empty string")
        super().__init__(f"handler suspended on wait token {token_id!r}")
        self.token_id = token_id


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolContext:
    """The run context on ``invoke`` as ``ctx``; wire names are camelCase (``runId`` ...)."""

    run_id: str
    tenant_id: str
    node_id: str | None = None
    dry_run: bool = False
    state: Mapping[str, Any] = field(default_factory=dict)
    node_outputs: Mapping[str, Any] = field(default_factory=dict)
    resume: ResumeInfo | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InvokeFrame:
    """Host to handler: run once with ``input`` in context ``ctx``."""

    input: Any
    ctx: ProtocolContext
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
