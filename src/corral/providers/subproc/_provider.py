"""The subproc provider (level ``context-isolated``): every command is a bounded run.

A sandbox is a private directory (``mkdtemp``, mode 0700) holding ``work/``
(the commands' cwd and ``HOME``) and ``tmp/`` (``TMPDIR``), plus the process
trees of the commands run in it. Each command runs through the bounded runner
(:mod:`corral.runner.engine`): own session and process group, environment
allowlist, wall-clock timeout, output caps, whole-tree kill at its end.

NOT a security boundary: commands run as the caller's user, see the host's
files and network. It isolates the caller from crashes, hangs, leaks and
runaway output of the code it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Final, final

from corral.core.cancel import CancelToken
from corral.core.contract import ProcessHandle, Sandbox, SandboxProvider
from corral.core.errors import ConfigInvalidError, LevelNotSupportedError, ProviderError
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
    check_argv,
)
from corral.images.hostdir import DEFAULT_MAX_IMAGE_BYTES, check_image_spec
from corral.providers._hostdir import HostDirSandbox, make_sandbox_dir, remove_sandbox_dir
from corral.providers.subproc._process import ChunkQueue, SubprocProcess
from corral.runner.engine import BoundedRun
from corral.runner.options import make_options
from corral.runner.tree import spawn_process

__all__ = ["SubprocProvider", "SubprocSandbox"]

_NAME: Final = "subproc"
_PREFIX: Final = "corral-subproc-"


@final
class SubprocSandbox(HostDirSandbox):
    """A private work dir plus the process trees of the commands run in it."""

    def __init__(self, spec: SandboxSpec, base: str, provider: SubprocProvider) -> None:
        super().__init__(spec, base, provider_name=_NAME)
        self._p = provider
        self._runs: set[BoundedRun] = set()
        self._procs: set[SubprocProcess] = set()

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        out = {"HOME": self.work_dir, "TMPDIR": self.tmp_dir}
        if "PATH" in os.environ:
            out["PATH"] = os.environ["PATH"]
        out.update(env or {})
        return out

    def _command(self, argv0: str, cwd: str, env: Mapping[str, str]) -> str:
        if os.path.isabs(argv0):
            return argv0
        if "/" in argv0:
            return os.path.join(cwd, argv0)
        found = shutil.which(argv0, path=env.get("PATH", os.defpath))
        if found is None:
            raise ConfigInvalidError("argv[0]", f"command not found on PATH: {argv0!r}")
        return os.path.abspath(found)

    def _start(self, argv: Sequence[str], *, cwd: str | None, env: Mapping[str, str] | None,
               timeout_ms: int, stdin: bytes | None, out_cap: int, err_cap: int,
               out: ChunkQueue | None = None, err: ChunkQueue | None = None,
               stdin_pipe: bool = False) -> BoundedRun:
        args = check_argv(argv)
        where = self._cwd(cwd)
        full_env = self._env(env)
        opts = make_options(
            self._command(args[0], where, full_env), args[1:], timeout_ms=timeout_ms,
            cwd=where, env=full_env, shutdown_signal=self._p.shutdown_signal,
            grace_period_ms=min(self._p.grace_period_ms, timeout_ms // 2), stdin=stdin,
            max_stdout_bytes=out_cap, max_stderr_bytes=err_cap, node_heap_mb=None,
            mem_mb=None, cpu_ms=None, cancel=None,
            on_stdout=out.put if out else None, on_stderr=err.put if err else None,
            spawner=spawn_process)
        run = BoundedRun(opts, keep_output=out is None, stdin_pipe=stdin_pipe)
        run.start()
        if run.result is not None and run.result.outcome is Outcome.SPAWN_ERROR:
            run.result.check()
        return run

    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> RunResult:
        self._alive("exec")
        opts = opts or ExecOpts()
        timeout = self._p.exec_timeout_ms
        if opts.timeout_ms is not None:
            timeout = min(timeout, opts.timeout_ms)
        out_cap, err_cap = opts.output_caps(self._p.max_stdout_bytes, self._p.max_stderr_bytes)
        run = self._start(argv, cwd=opts.cwd, env=opts.env, timeout_ms=timeout,
                          stdin=opts.stdin, out_cap=out_cap, err_cap=err_cap)
        self._runs.add(run)
        try:
            result = await run.wait()
        finally:
            self._runs.discard(run)
        return self._exec_result(result)

    def _exec_result(self, result: RunResult) -> RunResult:
        if self._destroyed:
            raise ProviderError(f"exec: sandbox {self.id} was destroyed while it ran")
        return result.check()

    async def start_process(self, argv: Sequence[str],
                            opts: ProcessOpts | None = None) -> ProcessHandle:
        self._alive("start_process")
        opts = opts or ProcessOpts()
        timeout = opts.timeout_ms if opts.timeout_ms is not None else self._p.process_timeout_ms
        out, err = ChunkQueue(), ChunkQueue()
        run = self._start(argv, cwd=opts.cwd, env=opts.env, timeout_ms=timeout, stdin=None,
                          out_cap=self._p.max_process_output_bytes,
                          err_cap=self._p.max_process_output_bytes, out=out, err=err,
                          stdin_pipe=opts.stdin)
        proc = SubprocProcess(run, out, err, stdin_open=opts.stdin)
        self._procs.add(proc)
        return proc

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        runs = list(self._runs)
        procs, self._procs = list(self._procs), set()
        for run in runs:
            run.kill()
        for proc in procs:
            with contextlib.suppress(Exception):
                await proc.kill()
        for run in runs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(run.wait_finished(), 10.0)
        await remove_sandbox_dir(self.base)


@final
class SubprocProvider(SandboxProvider):
    """Level ``context-isolated``: each command a bounded child process tree.

    NOT a security boundary (see the module docstring). It enforces per
    command: the wall-clock timeout, the output caps and the whole-tree kill.
    It cannot enforce per-sandbox limits (rlimits are per process: a tree of
    N processes gets N budgets) nor any network policy, so a spec setting
    ``limits.mem_mb`` / ``cpu_ms`` / ``disk_mb`` / ``max_processes``, or a
    network policy other than ``unrestricted``, is refused with
    :class:`LevelNotSupportedError` whose ``field`` names it.

    Args:
        temp_dir: where sandbox directories are made (default: the system's).
        exec_timeout_ms: the longest an ``exec`` may run; ``ExecOpts.timeout_ms``
            narrows it.
        process_timeout_ms: the timeout of a started process without its own.
        max_stdout_bytes / max_stderr_bytes: caps on ``exec`` output (passing
            one raises ``LimitsExceededError("output")``).
        max_process_output_bytes: cap per stream of a started process.
        shutdown_signal / grace_period_ms: how a timed-out command is stopped.
        max_image_bytes: cap on the file bytes of an image directory.

    Mode ``json-stdio`` takes ``spec.image``: a local directory of the handler's
    files, copied into the work dir at ``create`` (this level has no root
    filesystem of its own; see :mod:`corral.images.hostdir`).
    ``handler-image`` is refused with ``ConfigInvalidError("mode")``.
    """

    name = _NAME
    levels = frozenset({Level.CONTEXT_ISOLATED})
    capabilities = frozenset({Capability.CONTEXT_ISOLATED.value, Capability.STREAMING.value,
                              Capability.FILES.value})

    def __init__(self, *, temp_dir: str | None = None, exec_timeout_ms: int = 600_000,
                 process_timeout_ms: int = 3_600_000,
                 max_stdout_bytes: int = DEFAULT_MAX_STDOUT_BYTES,
                 max_stderr_bytes: int = DEFAULT_MAX_STDERR_BYTES,
                 max_process_output_bytes: int = 64 * 1024 * 1024,
                 shutdown_signal: int | str = "SIGTERM", grace_period_ms: int = 2000,
                 max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> None:
        for field, value in (("exec_timeout_ms", exec_timeout_ms),
                             ("process_timeout_ms", process_timeout_ms),
                             ("max_stdout_bytes", max_stdout_bytes),
                             ("max_stderr_bytes", max_stderr_bytes),
                             ("max_process_output_bytes", max_process_output_bytes),
                             ("max_image_bytes", max_image_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigInvalidError(field, f"must be a positive integer, got {value!r}")
        if isinstance(grace_period_ms, bool) or not isinstance(grace_period_ms, int) \
                or grace_period_ms < 0:
            raise ConfigInvalidError("grace_period_ms", "must be an integer >= 0")
        self.temp_dir = temp_dir
        self.exec_timeout_ms = exec_timeout_ms
        self.process_timeout_ms = process_timeout_ms
        self.max_stdout_bytes = max_stdout_bytes
        self.max_stderr_bytes = max_stderr_bytes
        self.max_process_output_bytes = max_process_output_bytes
        self.shutdown_signal = shutdown_signal
        self.grace_period_ms = grace_period_ms
        self.max_image_bytes = max_image_bytes

    def _validate(self, spec: SandboxSpec) -> str | None:
        if not isinstance(spec, SandboxSpec):
            raise ConfigInvalidError("spec", f"must be a SandboxSpec, not {type(spec).__name__}")
        if spec.environment is not None:
            raise ConfigInvalidError(
                "environment", "the subproc provider does not show environments (the linux "
                "provider does: docs/environments.md)")
        if spec.level != Level.CONTEXT_ISOLATED:
            raise LevelNotSupportedError(
                spec.level.value, [Level.CONTEXT_ISOLATED.value],
                "the subproc provider gives process isolation only, not a security boundary"
                if spec.level == Level.STRICT else "use the inprocess provider for level none")
        for field, value in spec.limits.asked().items():
            raise LevelNotSupportedError(
                spec.level.value, [Level.CONTEXT_ISOLATED.value],
                "unset it or use the 'linux' provider", field=f"limits.{field}",
                missing=f"a per-sandbox {field} limit (provider 'subproc' has rlimits only, "
                f"and they are per process; asked {field}={value})")
        if spec.network.kind != "unrestricted":
            raise LevelNotSupportedError(
                spec.level.value, [Level.CONTEXT_ISOLATED.value],
                "pass NetworkPolicy.unrestricted()", field="network",
                missing=f"network policy {spec.network.kind!r} (provider 'subproc' runs "
                "commands in the host's network)")
        if spec.mode not in (None, InvocationMode.JSON_STDIO, InvocationMode.HANDLER_IMAGE):
            raise ConfigInvalidError(
                "mode", "provider 'subproc' runs general-purpose sandboxes (mode None) and "
                f"'json-stdio' handlers, not {spec.mode.value!r}")
        return check_image_spec(spec, _NAME)

    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None) -> Sandbox:
        image = self._validate(spec)
        base = await make_sandbox_dir(prefix=_PREFIX, temp_dir=self.temp_dir, image=image,
                                      max_image_bytes=self.max_image_bytes, cancel=cancel)
        return SubprocSandbox(spec, base, self)
