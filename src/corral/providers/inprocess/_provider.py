"""The in-process provider (level ``none``): trusted code only, no boundary at all."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar, final

from corral.core.cancel import CancelToken
from corral.core.contract import ProcessHandle, Sandbox, SandboxProvider
from corral.core.errors import (
    ConfigInvalidError,
    LevelNotSupportedError,
    ProviderError,
)
from corral.core.result import (
    DEFAULT_MAX_STDERR_BYTES,
    DEFAULT_MAX_STDOUT_BYTES,
    Outcome,
    RunResult,
)
from corral.core.spec import (
    Capability,
    ExecOpts,
    InvocationMode,
    Level,
    ProcessOpts,
    SandboxSpec,
)
from corral.core.tasks import settle
from corral.images.hostdir import DEFAULT_MAX_IMAGE_BYTES, check_image_spec
from corral.providers._hostdir import HostDirSandbox, make_sandbox_dir, remove_sandbox_dir
from corral.providers.inprocess._proc import Child, InProcessHandle, spawn

__all__ = ["InProcessProvider", "InProcessSandbox"]

T = TypeVar("T")

_NAME: Final = "inprocess"
#: variables copied from the host environment when the caller does not set them
_BOOTSTRAP_FROM_HOST: Final = ("PATH",)


@final
class InProcessSandbox(HostDirSandbox):
    """A sandbox that is only a private temp dir and child processes of the caller.

    Files live in ``<tmp>/work`` (the commands' cwd and ``HOME``); ``TMPDIR``
    is ``<tmp>/tmp``. Every command runs in its own process group, killed as
    a whole on timeout, kill and destroy; what an ``exec`` leaves running in
    its group is killed when it returns.
    """

    def __init__(self, spec: SandboxSpec, base: str, caps: tuple[int, int]) -> None:
        super().__init__(spec, base, provider_name=_NAME)
        self._caps = caps
        self._children: set[Child] = set()

    # -- helpers -------------------------------------------------------------
    def _env(self, env: Any) -> dict[str, str]:
        out = {k: os.environ[k] for k in _BOOTSTRAP_FROM_HOST if k in os.environ}
        out.update(HOME=self.work_dir, TMPDIR=self.tmp_dir, LANG="C.UTF-8")
        if env is not None:
            out.update(env)
        return out

    async def _spawn(self, argv: Sequence[str], *, cwd: str | None, env: Any, stdin: bool,
                     caps: tuple[int, int] | None) -> Child:
        child = await spawn(argv, cwd=self._cwd(cwd), env=self._env(env), stdin=stdin,
                            caps=caps)
        if self._destroyed:  # destroy ran while we were starting it
            child.kill_group()
            await child.wait()
            raise ProviderError(f"sandbox {self.id} was destroyed")
        self._children.add(child)
        return child

    # -- the contract --------------------------------------------------------
    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> RunResult:
        self._alive("exec")
        opts = opts or ExecOpts()
        child = await self._spawn(argv, cwd=opts.cwd, env=opts.env,
                                  stdin=opts.stdin is not None,
                                  caps=opts.output_caps(self._caps[0], self._caps[1]))
        feeder: asyncio.Future[None] | None = None
        outcome, limit = Outcome.EXIT, None
        try:
            if opts.stdin is not None:
                feeder = asyncio.ensure_future(_feed(child, bytes(opts.stdin)))
            timeout = opts.timeout_ms / 1000 if opts.timeout_ms is not None else None
            try:
                code = await asyncio.wait_for(child.wait(), timeout)
            except TimeoutError:
                child.kill_group()
                code = await child.wait()
                outcome, limit = Outcome.TIMEOUT, opts.timeout_ms
            await child.finish_pipes()
            if feeder is not None and outcome is Outcome.EXIT:
                await feeder
            if self._destroyed:
                raise ProviderError(f"exec: sandbox {self.id} was destroyed while it ran")
            out, err = child.out.buf, child.err.buf
            assert out is not None and err is not None
            if child.over and outcome is Outcome.EXIT:
                over = out if child.over == 1 else err
                outcome = Outcome.OVERFLOW_STDOUT if child.over == 1 else Outcome.OVERFLOW_STDERR
                limit = over.cap
            result = RunResult(
                outcome=outcome, exit_code=code, stdout=out.value(), stderr=err.value(),
                stdout_truncated=out.truncated, stderr_truncated=err.truncated,
                usage=child.usage(), limit_value=limit,
                observed=(out if child.over == 1 else err).total if child.over else None)
            return result.check()
        finally:
            child.kill_group()  # also on asyncio cancellation of exec
            await settle([feeder])
            if child.proc.returncode is not None:
                self._children.discard(child)

    async def start_process(self, argv: Sequence[str],
                            opts: ProcessOpts | None = None) -> ProcessHandle:
        self._alive("start_process")
        opts = opts or ProcessOpts()
        child = await self._spawn(argv, cwd=opts.cwd, env=opts.env, stdin=opts.stdin,
                                  caps=None)
        return InProcessHandle(child, opts.timeout_ms)

    async def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call an in-context handler in the caller's process (awaiting it if async).

        Level ``none``: the handler shares the caller's memory, files and
        privileges. Only for trusted code.
        """
        self._alive("call")
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        children, self._children = list(self._children), set()
        for child in children:
            child.kill_group()
        for child in children:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(child.wait(), 10.0)
            with contextlib.suppress(Exception):
                await child.finish_pipes(2.0)
        await remove_sandbox_dir(self.base)


async def _feed(child: Child, data: bytes) -> None:
    w = child.proc.stdin
    assert w is not None
    try:
        w.write(data)
        await w.drain()
        w.close()
        await w.wait_closed()
    except (BrokenPipeError, ConnectionResetError):
        pass


@final
class InProcessProvider(SandboxProvider):
    """Level ``none``: commands run as plain child processes of the caller.

    NOT a security boundary: code runs with the caller's user, network and
    host filesystem. It enforces no limits and no network policy, so a spec
    that sets a limit, or asks for a network policy other than
    ``unrestricted``, is refused with :class:`LevelNotSupportedError` whose
    ``field`` names it (``limits.mem_mb``, ``network``).

    Modes: None, ``in-context`` and ``json-stdio``. ``json-stdio`` may name
    ``spec.image``: a local directory of the handler's files, copied into the
    work dir at ``create`` (no root filesystem of its own at this level; see
    :mod:`corral.images.hostdir`). ``handler-image`` is refused with
    ``ConfigInvalidError("mode")``.

    Args:
        temp_dir: where sandbox directories are made (default: the system's).
        max_stdout_bytes / max_stderr_bytes: caps on ``exec`` output (passing
            one kills the command's group and raises ``LimitsExceededError("output")``;
            ``ExecOpts`` may narrow them).
        max_image_bytes: cap on the file bytes of an image directory.
    """

    name = _NAME
    levels = frozenset({Level.NONE})
    capabilities = frozenset({Capability.STREAMING.value, Capability.FILES.value})

    def __init__(self, *, temp_dir: str | None = None,
                 max_stdout_bytes: int = DEFAULT_MAX_STDOUT_BYTES,
                 max_stderr_bytes: int = DEFAULT_MAX_STDERR_BYTES,
                 max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> None:
        for name, value in (("max_stdout_bytes", max_stdout_bytes),
                            ("max_stderr_bytes", max_stderr_bytes),
                            ("max_image_bytes", max_image_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigInvalidError(name, "must be a positive integer")
        self.temp_dir = temp_dir
        self.max_stdout_bytes = max_stdout_bytes
        self.max_stderr_bytes = max_stderr_bytes
        self.max_image_bytes = max_image_bytes

    def _validate(self, spec: SandboxSpec) -> str | None:
        if not isinstance(spec, SandboxSpec):
            raise ConfigInvalidError("spec", f"must be a SandboxSpec, not {type(spec).__name__}")
        if spec.environment is not None:
            raise ConfigInvalidError(
                "environment", "the inprocess provider does not show environments (the linux "
                "provider does: docs/environments.md)")
        if spec.level != Level.NONE:
            raise LevelNotSupportedError(
                spec.level.value, [Level.NONE.value],
                "the inprocess provider runs code as the caller; use 'subproc' or 'linux'")
        for field, value in spec.limits.asked().items():
            raise LevelNotSupportedError(
                spec.level.value, [Level.NONE.value],
                "unset it or use a provider that enforces it", field=f"limits.{field}",
                missing=f"any limit at all (provider 'inprocess' runs commands as plain "
                f"children of the caller; asked {field}={value})")
        if spec.network.kind != "unrestricted":
            raise LevelNotSupportedError(
                spec.level.value, [Level.NONE.value], "pass NetworkPolicy.unrestricted()",
                field="network", missing=f"network policy {spec.network.kind!r} (provider "
                "'inprocess' runs commands in the caller's network)")
        if spec.mode is InvocationMode.IN_CONTEXT and spec.image is not None:
            raise ConfigInvalidError(
                "image", "provider 'inprocess' takes an image (a directory of the handler's "
                "files) only with mode 'json-stdio'; in-context handlers load from the caller")
        return check_image_spec(spec, _NAME)

    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None) -> Sandbox:
        image = self._validate(spec)
        base = await make_sandbox_dir(prefix="corral-inprocess-", temp_dir=self.temp_dir,
                                      image=image, max_image_bytes=self.max_image_bytes,
                                      cancel=cancel)
        return InProcessSandbox(spec, base, (self.max_stdout_bytes, self.max_stderr_bytes))
