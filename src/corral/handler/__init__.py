"""The handler side of dispatch: the handler-base entrypoint and the ``ctx`` handlers get.

``python -m corral.handler MODULE_OR_FILE:ATTRIBUTE`` (or the script
:func:`entrypoint_script` names, the file images carry at
:data:`~corral.core.spec.DEFAULT_ENTRYPOINT_PATH`) reads the frames of seed 01 on
stdin, calls ``handler(input, ctx)`` and writes one frame back. See
``docs/handlers.md``.
"""

from __future__ import annotations

import os

from corral.handler.base import (
    HANDLER_ENV,
    build_context,
    call_handler,
    error_frame_for,
    format_target,
    load_handler,
    main,
    parse_target,
    read_stdin_frames,
    result_frame,
)

__all__ = [
    "HANDLER_ENV",
    "build_context",
    "call_handler",
    "entrypoint_script",
    "error_frame_for",
    "format_target",
    "load_handler",
    "main",
    "parse_target",
    "read_stdin_frames",
    "result_frame",
]


def entrypoint_script() -> str:
    """The host path of the standalone entrypoint script (copy it into an image at
    :data:`~corral.core.spec.DEFAULT_ENTRYPOINT_PATH`, next to an importable corral)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "entrypoint.py")
