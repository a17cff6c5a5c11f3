"""The ``in-context`` mode: the handler runs in the caller's process (the
``inprocess`` provider's ``call``), behind a JSON round trip of every frame so
values behave as they would over a pipe; ``exit()`` in a handler becomes
``unhandled-worker`` instead of ending the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from corral.core.contract import Sandbox
from corral.core.errors import ConfigInvalidError, UnhandledWorkerError
from corral.core.spec import HandlerRef, SandboxInvocationContext
from corral.dispatch.reply import HandlerReply, decide
from corral.handler import build_context
from corral.handler.base import call_handler, load_handler, result_frame
from corral.wire.protocol import (
    FrameOk,
    InvokeFrame,
    ResumeFrame,
    StdoutFrame,
    WireFrame,
    encode_frame,
    parse_frame,
)

__all__ = ["in_context"]


def _roundtrip(frame: WireFrame) -> Any:
    res = parse_frame(encode_frame(frame))
    assert isinstance(res, FrameOk)  # the encoder writes only frames the decoder accepts
    return res.frame


def _exit_error(exc: SystemExit) -> UnhandledWorkerError:
    code = exc.code if isinstance(exc.code, int) else 1
    return UnhandledWorkerError(f"the in-context handler called exit({exc.code!r})",
                                exit_code=code)


async def _call_in_context(fn: Callable[..., Any], payload: Any,
                           ctx: SandboxInvocationContext) -> StdoutFrame:
    """Async handlers run on the caller's loop; sync ones in a daemon thread.
    ``exit()`` in a handler must not end the caller: it becomes unhandled-worker."""
    if inspect.iscoroutinefunction(fn):
        try:
            try:
                value = await fn(payload, ctx)
            except SystemExit as exc:
                raise _exit_error(exc) from None
        except Exception as exc:
            err = exc
            return result_frame(lambda: _reraise(err))
        return result_frame(lambda: value)
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[StdoutFrame] = loop.create_future()

    def settle(frame: StdoutFrame) -> None:
        if not fut.done():
            fut.set_result(frame)

    def sync_call(payload: Any, ctx: SandboxInvocationContext) -> Any:
        try:
            return fn(payload, ctx)
        except SystemExit as exc:
            raise _exit_error(exc) from None

    def run() -> None:
        frame = result_frame(lambda: call_handler(sync_call, payload, ctx))
        with contextlib.suppress(RuntimeError):  # the caller's loop is gone (timed out)
            loop.call_soon_threadsafe(settle, frame)

    threading.Thread(target=run, name="corral-in-context", daemon=True).start()
    return await fut


def _reraise(exc: BaseException) -> Any:
    raise exc


async def in_context(sandbox: Sandbox, ref: HandlerRef, resumes: list[ResumeFrame],
                      inv: InvokeFrame) -> HandlerReply:
    call: Callable[..., Awaitable[Any]] | None = getattr(sandbox, "call", None)
    if call is None:
        raise ConfigInvalidError(
            "mode", f"{type(sandbox).__name__} cannot call handlers in-context; "
            "use 'json-stdio', or the inprocess provider")
    assert ref.module_path is not None
    module = ref.module_path
    work = getattr(sandbox, "work_dir", None)
    if isinstance(work, str) and module.endswith(".py") and not os.path.isabs(module):
        module = os.path.join(work, module)  # a file given through ``files=``
    fn = load_handler(module, ref.attribute)
    inv = _roundtrip(inv)  # the handler sees the values a pipe would give it
    ctx = build_context(inv, [_roundtrip(r) for r in resumes])
    frame = await call(_call_in_context, fn, inv.input, ctx)
    return decide(_roundtrip(frame), exit_code=None)

