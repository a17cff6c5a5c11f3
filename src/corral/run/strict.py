"""``run_strict``: one bounded run inside a strict sandbox.

The same shape as :func:`corral.run.bounded.run_bounded` (a :class:`RunResult`
with one pinned outcome), but the command runs behind the strict level's
boundary (on linux: fresh namespaces, a minimal read-only root, no network, a
seccomp filter, every capability dropped, and cgroup limits on the whole tree).
One sandbox is created for the run and destroyed when it ends, on every path.

It works through the provider contract only (:mod:`corral.core.contract`): any
provider whose ``levels`` include ``strict`` serves it (a weaker one is refused
with :class:`~corral.core.errors.LevelNotSupportedError` before anything runs).
Output streams to ``on_stdout`` / ``on_stderr`` while the command runs when the
sandbox offers the ``streaming-exec`` capability
(:class:`~corral.core.contract.SupportsStreamingExec`; linux does); without it
the callbacks see the output once the command has ended.

Differences from ``run_bounded``: ``cwd`` is a path inside the sandbox
(relative to its private ``/work``); the limits are the sandbox's (for the
whole process tree, through cgroups, so processes and disk limits exist too);
a command that cannot be started exits 127 (126 when not executable) with the
reason on stderr, as a shell would, instead of the ``spawn-error`` outcome.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from corral.core.cancel import CancelToken, call_on_cancel
from corral.core.contract import SandboxProvider, SupportsStreamingExec
from corral.core.errors import (
    ConfigInvalidError,
    LevelNotSupportedError,
    LimitsExceededError,
    SandboxTimeoutError,
)
from corral.core.spec import (
    Capability,
    ExecOpts,
    ExecResult,
    Level,
    ResourceUsage,
    SandboxLimits,
    SandboxSpec,
)
from corral.core.sync import sync_twin
from corral.run.bounded import DEFAULT_MAX_STDERR_BYTES, DEFAULT_MAX_STDOUT_BYTES
from corral.run.result import Outcome, OutputBuffer, OutputCallback, RunResult, signal_name

__all__ = ["run_strict", "run_strict_async"]

_LIMIT_OUTCOME = {
    "memory": Outcome.MEMORY_LIMIT, "cpu": Outcome.CPU_LIMIT,
    "processes": Outcome.PROCESSES_LIMIT, "disk": Outcome.DISK_LIMIT,
}


async def run_strict_async(
    command: str,
    args: Sequence[str] = (),
    *,
    timeout_ms: int,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin: bytes | str | None = None,
    max_stdout_bytes: int = DEFAULT_MAX_STDOUT_BYTES,
    max_stderr_bytes: int = DEFAULT_MAX_STDERR_BYTES,
    limits: SandboxLimits | None = None,
    cancel: CancelToken | None = None,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    provider: SandboxProvider | None = None,
    ro_binds: Sequence[str] = (),
    tenant_id: str = "corral-run",
) -> RunResult:
    """Run ``command args`` once in a fresh strict sandbox; return how it ended.

    Args:
        command: absolute path of the executable as seen inside the sandbox
            (the host's /usr and the interpreter's prefix are visible, read-only).
        timeout_ms: wall-clock limit, enforced from outside (> 0).
        env: the command's environment, an allowlist over a minimal base.
        cwd: working directory inside the sandbox, relative to ``/work``.
        stdin: written to the command's stdin, then closed; absent: closed.
        max_stdout_bytes / max_stderr_bytes: caps, exact to the byte; passing
            one kills the command (``overflow-stdout`` / ``overflow-stderr``).
        limits: the sandbox's limits (``None`` fields take the provider's defaults).
        cancel: a token; cancelling kills the run (outcome ``cancelled``).
        on_stdout / on_stderr: called with each chunk (up to the cap) as it arrives.
        provider: a provider whose ``levels`` include ``strict``, reused (a linux
            one keeps its fork server warm) and not closed; default: a private
            linux provider, closed when the run ends.
        ro_binds: more host paths the private provider shows read-only (another
            interpreter's prefix, a toolchain); with ``provider``, set them there.

    Raises:
        LevelNotSupportedError: ``provider`` does not offer the strict level, or
            this host cannot give it (or a limit asked for): nothing ran.
        ConfigInvalidError: bad arguments.
    """
    if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
        raise ConfigInvalidError("timeout_ms", "must be a positive integer")
    if not command.startswith("/"):
        raise ConfigInvalidError("command", f"must be an absolute path: {command!r}")
    for name, cap in (("max_stdout_bytes", max_stdout_bytes),
                      ("max_stderr_bytes", max_stderr_bytes)):
        if not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0:
            raise ConfigInvalidError(name, "must be a positive integer")
    data = stdin.encode() if isinstance(stdin, str) else stdin
    own = provider is None
    if provider is None:
        from corral.providers.linux import LinuxProvider
        # one run: a pre-warmed spare would be built only to be thrown away
        provider = LinuxProvider(stdout_cap=max_stdout_bytes, stderr_cap=max_stderr_bytes,
                                 spares=0, ro_binds=tuple(ro_binds))
    else:
        if ro_binds:
            raise ConfigInvalidError("ro_binds", "give them to the provider you pass in")
        if Level.STRICT not in provider.levels:
            raise LevelNotSupportedError(
                Level.STRICT.value, frozenset(lv.value for lv in provider.levels),
                f"run_strict needs a strict provider; {provider.name!r} is not one")
    started = time.monotonic()
    bufs = (OutputBuffer(max_stdout_bytes, on_stdout, True),
            OutputBuffer(max_stderr_bytes, on_stderr, True))
    loop = asyncio.get_running_loop()
    overflow: list[Outcome] = []
    try:
        spec = SandboxSpec(tenant_id=tenant_id, run_id=uuid.uuid4().hex, level=Level.STRICT,
                           limits=limits or SandboxLimits())
        sandbox = await provider.create(spec, cancel=cancel)
        try:
            argv = [command, *args]
            opts = ExecOpts(timeout_ms=timeout_ms, env=env, cwd=cwd, stdin=data)
            if (Capability.STREAMING_EXEC.value in provider.capabilities
                    and isinstance(sandbox, SupportsStreamingExec)):
                task = asyncio.ensure_future(sandbox.exec_streaming(
                    argv, opts, on_output=lambda fd, chunk: _take(fd, chunk)))
            else:  # the output comes with the result (see _result)
                task = asyncio.ensure_future(sandbox.exec(argv, opts))

            def _take(fd: int, chunk: bytes) -> None:
                if bufs[fd - 1].feed(chunk) and not overflow:
                    overflow.append(Outcome.OVERFLOW_STDOUT if fd == 1
                                    else Outcome.OVERFLOW_STDERR)
                    task.cancel()

            remove = call_on_cancel(cancel, loop, task.cancel)
            try:
                result: ExecResult | BaseException
                try:
                    result = await task
                except (SandboxTimeoutError, LimitsExceededError, asyncio.CancelledError) as e:
                    if isinstance(e, asyncio.CancelledError) and not (
                            overflow or (cancel is not None and cancel.cancelled)):
                        raise  # our caller's cancellation: let it through
                    result = e
            finally:
                remove()
        finally:
            await sandbox.destroy()
    finally:
        if own:
            await provider.aclose()
    return _result(result, bufs, overflow, cancel, timeout_ms,
                   (time.monotonic() - started) * 1000)


def _result(res: ExecResult | BaseException, bufs: tuple[OutputBuffer, OutputBuffer],
            overflow: list[Outcome], cancel: CancelToken | None, timeout_ms: int,
            duration_ms: float) -> RunResult:
    def common() -> dict[str, Any]:
        out, err = (b"".join(b.chunks) for b in bufs)
        return {"stdout_bytes": out, "stderr_bytes": err, "stdout_truncated": bufs[0].truncated,
                "stderr_truncated": bufs[1].truncated, "duration_ms": duration_ms,
                "cwd": "/work"}

    if overflow:
        cap = bufs[0 if overflow[0] is Outcome.OVERFLOW_STDOUT else 1].cap
        return RunResult(outcome=overflow[0], limit_value=cap, **common())
    if isinstance(res, ExecResult):
        code = res.exit_code
        for buf, data in zip(bufs, (res.stdout, res.stderr), strict=True):
            if data and not buf.total:  # never streamed: the reason a command could not start
                buf.feed(data)
        return RunResult(outcome=Outcome.EXIT, exit_code=code if code >= 0 else None,
                         signal=signal_name(-code) if code < 0 else None, returncode=code,
                         usage=res.usage, **common())
    if isinstance(res, SandboxTimeoutError):
        return RunResult(outcome=Outcome.TIMEOUT, limit_value=timeout_ms,
                         usage=ResourceUsage(wall_ms=int(duration_ms)),
                         **common())
    if isinstance(res, LimitsExceededError):
        if res.limit == "output":  # the provider's own cap, when a shared provider's is lower
            which = Outcome.OVERFLOW_STDERR if bufs[1].truncated else Outcome.OVERFLOW_STDOUT
            return RunResult(outcome=which, limit_value=res.limit_value,
                             **common())
        return RunResult(outcome=_LIMIT_OUTCOME[res.limit], limit_value=res.limit_value,
                         **common())
    assert cancel is not None and cancel.cancelled
    return RunResult(outcome=Outcome.CANCELLED, **common())


#: the synchronous twin (same parameters): its own short-lived event loop, or a helper
#: thread when called where a loop is running. Cancel with the ``cancel`` token.
run_strict = sync_twin(run_strict_async, name="run_strict")
