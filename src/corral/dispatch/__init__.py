"""Handler dispatch: ``invoke(provider, spec, handler_ref, input)`` -> an :data:`HandlerReply`.

``invocation`` runs one call (create, the frame conversation, destroy);
``outcome`` holds the outcome types and the table of frames and exit codes ->
outcome or error; ``in_context`` the mode that calls the handler in the
caller's process. The names below are the public face of dispatch.
"""

from __future__ import annotations

from corral.dispatch.invocation import (
    DEFAULT_INVOKE_TIMEOUT_MS,
    DEFAULT_STDERR_TAIL_BYTES,
    invoke,
    invoke_in,
    invoke_sync,
)
from corral.dispatch.reply import (
    HandlerOutput,
    HandlerReply,
    HandlerSuspended,
    ProtocolViolation,
    decide,
)

__all__ = [
    "DEFAULT_INVOKE_TIMEOUT_MS",
    "DEFAULT_STDERR_TAIL_BYTES",
    "HandlerReply",
    "HandlerOutput",
    "ProtocolViolation",
    "HandlerSuspended",
    "decide",
    "invoke",
    "invoke_in",
    "invoke_sync",
]
