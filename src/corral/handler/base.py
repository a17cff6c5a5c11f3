"""The handler-base entrypoint: frames on stdin -> one handler call -> one frame on stdout.

Runs inside the sandbox (``python -m corral.handler TARGET``, or the script at
:data:`~corral.core.spec.DEFAULT_ENTRYPOINT_PATH` in an image). It reads zero or
more ``resume`` frames and then one ``invoke`` frame, loads the handler named
by ``TARGET`` (``MODULE_OR_FILE:ATTRIBUTE``, from argv or the
:data:`HANDLER_ENV` variable), calls ``handler(input, ctx)`` and writes exactly
one ``output``, ``error`` or ``suspend`` frame. Exit codes: 0 after
``output``, 1 after ``error``, :data:`~corral.wire.protocol.SUSPEND_EXIT_CODE` (42)
after ``suspend``. While the handler runs, file descriptor 1 points at stderr,
so nothing the handler (or a child it starts) prints can corrupt the frame
stream. The same call logic serves the dispatcher's in-context mode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import IO, Any, Final

from corral.core.errors import ConfigInvalidError, CorralError, ErrorCode
from corral.core.spec import HandlerRef, SandboxInvocationContext
from corral.wire.protocol import (
    DEFAULT_MAX_LINE_BYTES,
    SUSPEND_EXIT_CODE,
    ErrorBody,
    ErrorFrame,
    FrameDecoder,
    FrameErr,
    InvokeFrame,
    OutputFrame,
    ResumeFrame,
    SandboxSuspensionRequest,
    StdoutFrame,
    SuspendFrame,
    encode_frame,
)

__all__ = [
    "HANDLER_ENV",
    "build_context",
    "call_handler",
    "error_frame_for",
    "format_target",
    "load_handler",
    "main",
    "parse_target",
    "read_stdin_frames",
    "result_frame",
]

#: the environment variable naming the handler when argv does not
HANDLER_ENV: Final = "CORRAL_HANDLER"
#: at most this much of a traceback travels in an error frame's details
_TRACEBACK_CHARS: Final = 4000
_USAGE: Final = "usage: python -m corral.handler MODULE_OR_FILE:ATTRIBUTE (or set CORRAL_HANDLER)"


def build_context(invoke: InvokeFrame,
                  resumes: Sequence[ResumeFrame] = ()) -> SandboxInvocationContext:
    """The handler's ctx: the invoke frame's, with ``resumed_tokens`` mapping every
    completed token to its value (the resume frames, plus ``ctx.resume``)."""
    c = invoke.ctx
    tokens: dict[str, Any] = {r.token_id: r.value for r in resumes}
    if c.resume is not None:
        tokens.setdefault(c.resume.token_id, c.resume.value)
    return dataclasses.replace(c, resumed_tokens=tokens)


# ---------------------------------------------------------------- naming and loading


def parse_target(target: str) -> tuple[str, str]:
    """``"pkg.mod:attr"`` or ``"/path/h.py:attr"`` -> (module_path, attribute).
    Without ``:`` the attribute is ``handler``."""
    if not isinstance(target, str) or not target.strip():
        raise ConfigInvalidError("handler", "empty handler target; " + _USAGE)
    module, sep, attr = target.rpartition(":")
    if not sep or "/" in attr or not attr:
        module, attr = target, "handler"
    if not module:
        raise ConfigInvalidError("handler", f"no module in handler target {target!r}")
    return module, attr


def format_target(ref: HandlerRef) -> str:
    """The ``MODULE_OR_FILE:ATTRIBUTE`` target of a :class:`HandlerRef`."""
    if ref.module_path is None:
        raise ConfigInvalidError("handler.module_path", "names no module; set module_path")
    return f"{ref.module_path}:{ref.attribute}"


def _is_file(module_path: str) -> bool:
    return module_path.endswith(".py") or "/" in module_path or os.sep in module_path


def load_handler(module_path: str, attribute: str = "handler") -> Callable[..., Any]:
    """Import ``module_path`` (dotted name, or a ``.py`` file) and return ``attribute``
    (dots walk into it). Any failure is :class:`ConfigInvalidError` on field ``handler``."""
    try:
        if _is_file(module_path):
            path = os.path.abspath(module_path)
            name = "_corral_handler_" + str(abs(hash(path)))
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"not a Python file: {module_path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_path)
    except ConfigInvalidError:
        raise
    except Exception as exc:
        reason = f"cannot load {module_path!r}: {type(exc).__name__}: {exc}"
        raise ConfigInvalidError("handler", reason) from exc
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ConfigInvalidError("handler", f"{module_path!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigInvalidError("handler", f"{module_path}:{attribute} is not callable")
    fn: Callable[..., Any] = obj
    return fn


# ---------------------------------------------------------------- calling


def call_handler(fn: Callable[..., Any], payload: Any, ctx: SandboxInvocationContext) -> Any:
    """``fn(payload, ctx)``; a coroutine (or other awaitable) result runs under asyncio.run."""
    result = fn(payload, ctx)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


def error_frame_for(exc: BaseException) -> ErrorFrame:
    """The error frame for an exception a handler raised.

    A :class:`~corral.core.errors.CorralError` keeps its code, message and facts
    (as ``details``). Any other exception is ``unhandled-worker`` with the
    message ``"Type: text"`` and the exception type and traceback in ``details``.
    """
    if isinstance(exc, CorralError):
        facts = {k: v for k, v in exc.to_dict().items() if k not in ("code", "message")}
        safe = _json_safe(facts)
        return ErrorFrame(error=ErrorBody(code=str(exc.code), message=exc.message,
                                          details=safe or None))
    tb = "".join(traceback.format_exception(exc))[-_TRACEBACK_CHARS:]
    return ErrorFrame(error=ErrorBody(
        code=str(ErrorCode.UNHANDLED_WORKER), message=f"{type(exc).__name__}: {exc}",
        details={"exception": type(exc).__name__, "traceback": tb}))


def _json_safe(facts: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in facts.items():
        if v is None or isinstance(v, str | bool | int):
            out[k] = v
        elif isinstance(v, list | tuple) and all(isinstance(x, str) for x in v):
            out[k] = list(v)
    return out


def result_frame(call: Callable[[], Any]) -> StdoutFrame:
    """Run ``call`` and turn its result into the one frame to send back.

    A return value becomes ``output`` (one that JSON cannot write becomes a
    ``config-invalid`` error naming ``output``), a
    :class:`~corral.wire.protocol.SandboxSuspensionRequest` becomes ``suspend``, and
    any other ``Exception`` becomes ``error`` (see :func:`error_frame_for`).
    """
    try:
        value = call()
    except SandboxSuspensionRequest as req:
        return SuspendFrame(token_id=req.token_id)
    except Exception as exc:
        return error_frame_for(exc)
    frame = OutputFrame(output=value)
    try:
        encode_frame(frame)
    except ConfigInvalidError as exc:
        return error_frame_for(exc)
    return frame


# ---------------------------------------------------------------- the process entrypoint


def read_stdin_frames(fd: int, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                      ) -> tuple[list[ResumeFrame], InvokeFrame]:
    """Read frames from ``fd`` up to and including the invoke frame."""
    decoder = FrameDecoder(max_line_bytes)
    resumes: list[ResumeFrame] = []
    eof = False
    while not eof:
        chunk = os.read(fd, 1 << 16)
        eof = not chunk
        results = decoder.feed(chunk) if chunk else decoder.close()
        for res in results:
            if isinstance(res, FrameErr):
                e = res.error
                raise ConfigInvalidError(e.path or "stdin", f"bad frame ({e.kind}): {e.message}")
            frame = res.frame
            if isinstance(frame, ResumeFrame):
                resumes.append(frame)
            elif isinstance(frame, InvokeFrame):
                return resumes, frame
            else:
                raise ConfigInvalidError("stdin", f"a {frame.kind!r} frame goes host-bound only")
    raise ConfigInvalidError("stdin", "stdin ended before an invoke frame")


def _exit_code(frame: StdoutFrame) -> int:
    if isinstance(frame, SuspendFrame):
        return SUSPEND_EXIT_CODE
    return 0 if isinstance(frame, OutputFrame) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """The entrypoint: returns the process exit code (see the module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    # fd 1 carries frames only: keep a private copy, then point fd 1 (and sys.stdout)
    # at stderr, so prints of the handler and of its children land on stderr
    frames_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out: IO[bytes] = os.fdopen(frames_fd, "wb", buffering=0)
    frame = result_frame(lambda: _run(args))
    if isinstance(frame, ErrorFrame):
        tb = (frame.error.details or {}).get("traceback")
        print(tb if isinstance(tb, str) else f"{frame.error.code}: {frame.error.message}",
              file=sys.stderr)
    sys.stderr.flush()
    out.write(encode_frame(frame))
    out.close()
    return _exit_code(frame)


def _run(args: list[str]) -> Any:
    target = args[0] if args else os.environ.get(HANDLER_ENV, "")
    if len(args) > 1:
        raise ConfigInvalidError("argv", "expected one handler target; " + _USAGE)
    module_path, attribute = parse_target(target)
    resumes, invoke = read_stdin_frames(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the rest of stdin is not the handler's
    os.close(devnull)
    if not _is_file(module_path) and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does, also under -I
    fn = load_handler(module_path, attribute)
    return call_handler(fn, invoke.input, build_context(invoke, resumes))
