"""Handler dispatch: ``invoke(provider, spec, handler_ref, input)`` -> an :data:`HandlerReply`.

One call creates a sandbox, runs the handler once over the frames of seed 01
and destroys the sandbox (always, in ``finally``). The modes (``spec.mode``):

* ``in-context``: the sandbox calls the handler in the caller's process (the
  ``inprocess`` provider's ``call``), through the same frame logic as the
  entrypoint and a JSON round trip, so values behave as they would over a pipe.
* ``json-stdio``: any process provider; the handler-base entrypoint runs as
  ``python -I <corral>/handler/entrypoint.py MODULE:ATTR`` in the sandbox.
* ``handler-image``: the provider runs ``spec.image`` as the sandbox's root; the
  dispatcher starts the image's own ``Entrypoint`` + ``Cmd`` (any language: it must
  speak the frames on stdio), ``handler_ref.entrypoint_path`` in place of ``Cmd``.

The table of frames and exit codes -> outcomes and errors is in
``docs/handlers.md`` and in :func:`decide` (defined with the outcome types in
:mod:`corral.dispatch.reply`; the in-context mode is
:mod:`corral.dispatch.in_context`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, Final, TypeVar

from corral.core.cancel import CancelScope, CancelToken
from corral.core.contract import ProcessHandle, Sandbox, SandboxProvider
from corral.core.errors import (
    ConfigInvalidError,
    ProviderError,
    SandboxCancelledError,
    SandboxTimeoutError,
)
from corral.core.spec import (
    HandlerRef,
    InvocationMode,
    ProcessOpts,
    SandboxInvocationContext,
    SandboxSpec,
)
from corral.core.sync import sync_twin
from corral.core.tasks import settle
from corral.dispatch.in_context import in_context
from corral.dispatch.reply import (
    HandlerReply,
    decide,
    read_result,
)
from corral.handler import entrypoint_script, format_target
from corral.wire.protocol import (
    DEFAULT_MAX_LINE_BYTES,
    FrameDecoder,
    InvokeFrame,
    ResumeFrame,
    WireFrame,
    encode_frame,
)

__all__ = [
    "DEFAULT_INVOKE_TIMEOUT_MS",
    "DEFAULT_STDERR_TAIL_BYTES",
    "invoke",
    "invoke_in",
    "invoke_sync",
]

T = TypeVar("T")

#: the wall-clock deadline of one invocation when the caller gives none
DEFAULT_INVOKE_TIMEOUT_MS: Final = 30_000
#: how much of the handler's stderr an UnhandledWorkerError keeps (the last bytes)
DEFAULT_STDERR_TAIL_BYTES: Final = 8192



# ---------------------------------------------------------------- bounding


async def _bounded(work: Coroutine[Any, Any, T], timeout_ms: int, cancel: CancelToken | None,
                   what: str, stderr: Callable[[], bytes] = lambda: b"") -> T:
    """Await ``work`` until the deadline or the cancel token; then cancel it and raise."""
    scope = CancelScope(cancel)
    deadline = asyncio.timeout(timeout_ms / 1000)
    try:
        async with scope, deadline:
            return await work
    except TimeoutError:
        if not deadline.expired():
            raise  # the work's own timeout error, not ours
        raise SandboxTimeoutError(
            f"{what} ran past its timeout of {timeout_ms} ms and was stopped",
            timeout_ms=timeout_ms, stderr=stderr()) from None
    finally:
        work.close()  # never started (cancelled before its first step): no warning
    assert cancel is not None and scope.cancelled
    raise SandboxCancelledError(f"{what} cancelled: {cancel.reason}")


# ---------------------------------------------------------------- process modes


class _Tail:
    """The last ``size`` bytes of a stream."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.buf = bytearray()

    async def pump(self, chunks: AsyncIterator[bytes]) -> None:
        async for chunk in chunks:
            self.buf += chunk
            if len(self.buf) > self.size:
                del self.buf[: len(self.buf) - self.size]

    def text(self) -> str:
        return bytes(self.buf).decode("utf-8", "replace")


async def _feed(proc: ProcessHandle, data: bytes) -> None:
    # a handler may exit (or fail) before reading its stdin: the frames decide then
    with contextlib.suppress(ProviderError):
        await proc.stdin.write(data)
    with contextlib.suppress(ProviderError):
        await proc.stdin.close()


async def _talk(proc: ProcessHandle, data: bytes, tail: _Tail, cap: int) -> HandlerReply:
    feeder = asyncio.ensure_future(_feed(proc, data))
    errs = asyncio.ensure_future(tail.pump(proc.stderr))
    try:
        frame = await read_result(proc.stdout, cap)
        status = await proc.wait()
        await errs
        await feeder
        return decide(frame, exit_code=status.exit_code, stderr_tail=tail.text())
    finally:
        await settle((feeder, errs))
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.kill())


def _opts(mode: InvocationMode, ref: HandlerRef) -> ProcessOpts:
    """json-stdio with an entrypoint of the image's (not inside corral's package): it is
    told where the host's corral is (the provider binds it at the same path).
    handler-image: the target, when the ref names one, as ``CORRAL_HANDLER``."""
    if mode is InvocationMode.HANDLER_IMAGE:
        if ref.module_path is None:
            return ProcessOpts(stdin=True)
        return ProcessOpts(stdin=True, env={"CORRAL_HANDLER": format_target(ref)})
    if ref.entrypoint_path is None:
        return ProcessOpts(stdin=True)
    root = os.path.dirname(os.path.dirname(os.path.dirname(entrypoint_script())))
    return ProcessOpts(stdin=True, env={"CORRAL_PYTHONPATH": root})


def _argv(mode: InvocationMode, ref: HandlerRef, sandbox: Sandbox) -> list[str]:
    if mode is InvocationMode.JSON_STDIO:
        entry = ref.entrypoint_path or entrypoint_script()
        return [sys.executable, "-I", entry, format_target(ref)]
    return image_argv(sandbox, ref)


def image_argv(sandbox: Sandbox, ref: HandlerRef) -> list[str]:
    """What mode ``handler-image`` runs: the image's own ``Entrypoint`` + ``Cmd`` (its
    config, as ``docker run IMAGE`` would), with ``ref.entrypoint_path`` in place of
    ``Cmd`` when given (``docker run IMAGE PATH``; alone when the image has no
    ``Entrypoint``). A sandbox whose root is an image tells them as
    ``image_entrypoint`` and ``image_cmd`` (the linux and oci providers)."""
    entry = getattr(sandbox, "image_entrypoint", None)
    cmd = getattr(sandbox, "image_cmd", None)
    if entry is None or cmd is None:
        raise ConfigInvalidError(
            "mode", f"mode 'handler-image': this {type(sandbox).__name__} has no image as "
            "its root (the linux and oci providers run one)")
    if ref.entrypoint_path is not None:
        return [*entry, ref.entrypoint_path]
    if not entry and not cmd:
        raise ConfigInvalidError(
            "image", "mode 'handler-image' runs the image's Entrypoint and Cmd, and the "
            "image sets neither; set them in the image or name one with "
            "HandlerRef(entrypoint_path=...)")
    return [*entry, *cmd]


# ---------------------------------------------------------------- the front door


def _check(mode: InvocationMode | None, handler_ref: HandlerRef, timeout_ms: int,
           max_line_bytes: int, stderr_tail_bytes: int) -> InvocationMode:
    if mode is None:
        raise ConfigInvalidError(
            "mode", "invoke needs spec.mode: 'in-context', 'json-stdio' or 'handler-image'")
    if not isinstance(handler_ref, HandlerRef):
        raise ConfigInvalidError("handler_ref", "must be a HandlerRef")
    for name, v in (("timeout_ms", timeout_ms), ("stderr_tail_bytes", stderr_tail_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigInvalidError(name, "must be a positive integer")
    FrameDecoder(max_line_bytes)  # validates the cap
    if mode is not InvocationMode.HANDLER_IMAGE and handler_ref.module_path is None:
        raise ConfigInvalidError("handler.module_path", f"mode {mode.value!r} needs a module")
    return mode


async def invoke(
    provider: SandboxProvider,
    spec: SandboxSpec,
    handler_ref: HandlerRef,
    input: Any,  # noqa: A002 - seed 01's name
    ctx: SandboxInvocationContext | None = None,
    *,
    resumed: Mapping[str, Any] | None = None,
    files: Mapping[str, bytes | str] | None = None,
    timeout_ms: int = DEFAULT_INVOKE_TIMEOUT_MS,
    cancel: CancelToken | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    stderr_tail_bytes: int = DEFAULT_STDERR_TAIL_BYTES,
) -> HandlerReply:
    """Run ``handler_ref`` once on ``input`` in a fresh sandbox for ``spec``.

    The mode is ``spec.mode``. The sandbox is destroyed before this returns or
    raises. Arguments and errors as in :func:`invoke_in`; ``cancel`` also
    reaches ``provider.create`` (``CreateCancelledError`` while creating).
    """
    mode = _check(spec.mode, handler_ref, timeout_ms, max_line_bytes, stderr_tail_bytes)
    if cancel is not None and cancel.cancelled:
        raise SandboxCancelledError(f"invoke cancelled: {cancel.reason}")
    _stdin(spec, input, ctx, resumed)  # a payload JSON cannot write fails before create
    sandbox = await provider.create(spec, cancel=cancel)
    try:
        return await invoke_in(
            sandbox, handler_ref, input, ctx, mode=mode, resumed=resumed, files=files,
            timeout_ms=timeout_ms, cancel=cancel, max_line_bytes=max_line_bytes,
            stderr_tail_bytes=stderr_tail_bytes)
    finally:
        await asyncio.shield(sandbox.destroy())


def _stdin(spec: SandboxSpec, payload: Any, ctx: SandboxInvocationContext | None,
           resumed: Mapping[str, Any] | None) -> tuple[list[ResumeFrame], InvokeFrame, bytes]:
    context = ctx if ctx is not None else (spec.invocation or SandboxInvocationContext())
    pctx = dataclasses.replace(context, run_id=spec.run_id, tenant_id=spec.tenant_id,
                               node_id=spec.node_id, resumed_tokens={})
    resumes = [ResumeFrame(token_id=t, value=v) for t, v in (resumed or {}).items()]
    inv = InvokeFrame(input=payload, ctx=pctx)
    out: list[WireFrame] = [*resumes, inv]
    return resumes, inv, b"".join(encode_frame(f) for f in out)


async def invoke_in(
    sandbox: Sandbox,
    handler_ref: HandlerRef,
    input: Any,  # noqa: A002 - seed 01's name
    ctx: SandboxInvocationContext | None = None,
    *,
    mode: InvocationMode | str | None = None,
    resumed: Mapping[str, Any] | None = None,
    files: Mapping[str, bytes | str] | None = None,
    timeout_ms: int = DEFAULT_INVOKE_TIMEOUT_MS,
    cancel: CancelToken | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    stderr_tail_bytes: int = DEFAULT_STDERR_TAIL_BYTES,
) -> HandlerReply:
    """Run ``handler_ref`` once in a live ``sandbox`` the caller owns (not destroyed).

    Args:
        mode: defaults to ``sandbox.spec.mode``.
        ctx: dry_run, state, node_outputs and resume; defaults to ``spec.invocation``.
            run_id, tenant_id and node_id come from ``sandbox.spec``.
        resumed: completed wait tokens -> values, sent as resume frames before invoke.
        files: written into the sandbox's work dir first (e.g. the handler's source;
            a relative ``module_path`` such as ``"h.py"`` then names it).
        timeout_ms: wall-clock deadline of the whole call.
        cancel: stops the call with ``SandboxCancelledError``.
        max_line_bytes: the frame line cap on the handler's stdout.
        stderr_tail_bytes: how much of stderr an ``UnhandledWorkerError`` keeps.

    Returns:
        :class:`HandlerOutput` or :class:`HandlerSuspended`.

    Raises:
        CorralError: the handler's own error with its code (unknown codes become
            ``ProviderError``); ``UnhandledWorkerError`` (no result: exit code and
            stderr tail on it); ``ProviderError`` for a malformed frame stream
            (``__cause__`` a :class:`ProtocolViolation`); ``SandboxTimeoutError``;
            ``SandboxCancelledError``.
    """
    spec = sandbox.spec
    if mode is not None and not isinstance(mode, InvocationMode):
        try:
            mode = InvocationMode(mode)
        except ValueError:
            raise ConfigInvalidError("mode", f"unknown mode {mode!r}") from None
    real = _check(mode or spec.mode, handler_ref, timeout_ms, max_line_bytes, stderr_tail_bytes)
    resumes, inv, stdin = _stdin(spec, input, ctx, resumed)
    if cancel is not None and cancel.cancelled:
        raise SandboxCancelledError(f"invoke cancelled: {cancel.reason}")
    tail = _Tail(stderr_tail_bytes)

    async def run() -> HandlerReply:
        for path, data in (files or {}).items():
            await sandbox.write_file(path, data)
        if real is InvocationMode.IN_CONTEXT:
            return await in_context(sandbox, handler_ref, resumes, inv)
        proc = await sandbox.start_process(_argv(real, handler_ref, sandbox),
                                           _opts(real, handler_ref))
        return await _talk(proc, stdin, tail, max_line_bytes)

    return await _bounded(run(), timeout_ms, cancel, "invoke", lambda: bytes(tail.buf))


#: :func:`invoke` for synchronous callers, with the same arguments (works with or without
#: a running loop in the calling thread; cancel it from any thread with ``cancel``)
invoke_sync = sync_twin(invoke, name="invoke_sync")
