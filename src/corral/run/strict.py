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
import dataclasses
import posixpath
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.core.cancel import CancelToken, call_on_cancel
from corral.core.contract import Sandbox, SandboxProvider, SupportsStreamingExec
from corral.core.errors import (
    ConfigInvalidError,
    CorralError,
    CreateCancelledError,
    LevelNotSupportedError,
)
from corral.core.result import (
    DEFAULT_MAX_STDERR_BYTES,
    DEFAULT_MAX_STDOUT_BYTES,
    Outcome,
    OutputCallback,
    RunResult,
)
from corral.core.spec import (
    Capability,
    ExecOpts,
    Level,
    NetworkPolicy,
    SandboxLimits,
    SandboxSpec,
)
from corral.core.sync import sync_twin
from corral.core.tasks import settle

if TYPE_CHECKING:
    from corral.providers.linux.policy.plan import Bind

__all__ = ["StrictOptions", "make_strict_options", "run_strict", "run_strict_async"]


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
    binds: Sequence[Bind] = (),
    tenant_id: str = "corral-run",
    files_in: Mapping[str, bytes] | None = None,
    files_out: Sequence[str] = (),
    on_file_out: Callable[[str, bytes | None], object] | None = None,
    make_cwd: bool = False,
    network: NetworkPolicy | None = None,
    image: str | None = None,
    environment: str | None = None,
) -> RunResult:
    """Run ``command args`` once in a fresh strict sandbox; return how it ended.

    Args:
        command: absolute path of the executable as seen inside the sandbox
            (the host's /usr and the interpreter's prefix are visible, read-only);
            with ``image``, a path in the image or a bare name looked up on the
            image's ``PATH`` (its ``Env`` over the base).
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
        binds: :class:`corral.providers.linux.Bind` values for the private
            provider (another path inside, read-write); as ``ro_binds``.
        files_in: sandbox path (relative to ``/work``, or absolute under it) ->
            content, written through the contract's ``write_file`` before the
            command starts (parents are created).
        files_out: sandbox paths read back through ``read_file`` once the command
            has ended (on every outcome that started it, before the sandbox is
            destroyed); each is passed to ``on_file_out(path, data)``, with
            ``data`` ``None`` when there is no such regular file.
        make_cwd: create ``cwd`` (``mkdir -p`` in the sandbox, relative to
            ``/work``) before the command starts, so a fresh sandbox's empty
            ``/work`` does not refuse it.
        network: the sandbox's network policy (default ``none``: loopback only); the
            result's ``denials`` list what it refused (see docs/network.md).
        image: an image (local layout, tar, rootfs dir or registry reference) that is
            the sandbox's root instead of the host's dirs (docs/images.md, "The image
            as the sandbox's root").
        environment: a built environment's name or digest (docs/environments.md):
            its packages read-only at /opt/corral/env, on the command's PYTHONPATH.

    Raises:
        LevelNotSupportedError: ``provider`` does not offer the strict level, or
            this host cannot give it (or a limit asked for): nothing ran.
        ConfigInvalidError: bad arguments.
    """
    return await _run(make_strict_options(
        command, args, timeout_ms=timeout_ms, env=env, cwd=cwd, stdin=stdin,
        max_stdout_bytes=max_stdout_bytes, max_stderr_bytes=max_stderr_bytes, limits=limits,
        cancel=cancel, on_stdout=on_stdout, on_stderr=on_stderr, provider=provider,
        ro_binds=ro_binds, binds=binds, tenant_id=tenant_id, files_in=files_in,
        files_out=files_out, on_file_out=on_file_out, make_cwd=make_cwd, network=network,
        image=image, environment=environment))


@dataclass(frozen=True, slots=True, kw_only=True)
class StrictOptions:
    """One strict run's options, checked (:func:`make_strict_options`): what
    :func:`run_strict_async`'s keywords say, as the one value the run reads."""

    command: str
    args: tuple[str, ...]
    timeout_ms: int
    env: Mapping[str, str] | None
    cwd: str | None
    stdin: bytes | None
    max_stdout_bytes: int
    max_stderr_bytes: int
    limits: SandboxLimits
    cancel: CancelToken | None
    on_stdout: OutputCallback | None
    on_stderr: OutputCallback | None
    #: the caller's provider (reused, not closed), or None: a private one per run
    provider: SandboxProvider | None
    ro_binds: tuple[str, ...]
    binds: tuple[Bind, ...]
    tenant_id: str
    files_in: Mapping[str, bytes]
    files_out: tuple[str, ...]
    on_file_out: Callable[[str, bytes | None], object] | None
    make_cwd: bool
    network: NetworkPolicy
    image: str | None
    environment: str | None


def make_strict_options(
    command: str, args: Sequence[str] = (), *, timeout_ms: int,
    env: Mapping[str, str] | None = None, cwd: str | None = None,
    stdin: bytes | str | None = None, max_stdout_bytes: int = DEFAULT_MAX_STDOUT_BYTES,
    max_stderr_bytes: int = DEFAULT_MAX_STDERR_BYTES, limits: SandboxLimits | None = None,
    cancel: CancelToken | None = None, on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None, provider: SandboxProvider | None = None,
    ro_binds: Sequence[str] = (), binds: Sequence[Bind] = (), tenant_id: str = "corral-run",
    files_in: Mapping[str, bytes] | None = None, files_out: Sequence[str] = (),
    on_file_out: Callable[[str, bytes | None], object] | None = None,
    make_cwd: bool = False, network: NetworkPolicy | None = None, image: str | None = None,
    environment: str | None = None,
) -> StrictOptions:
    """:func:`run_strict_async`'s keywords as one checked :class:`StrictOptions`;
    ConfigInvalidError (naming the option) or LevelNotSupportedError (``provider``
    not strict) before anything is created."""
    if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
        raise ConfigInvalidError("timeout_ms", "must be a positive integer")
    if not command.startswith("/") and (image is None or "/" in command or not command):
        raise ConfigInvalidError("command", f"must be an absolute path: {command!r}")
    if files_out and on_file_out is None:
        raise ConfigInvalidError("on_file_out", "files_out needs a callback to hand them to")
    for name, cap in (("max_stdout_bytes", max_stdout_bytes),
                      ("max_stderr_bytes", max_stderr_bytes)):
        if not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0:
            raise ConfigInvalidError(name, "must be a positive integer")
    if provider is not None:
        if ro_binds or binds:
            raise ConfigInvalidError("ro_binds" if ro_binds else "binds",
                                     "give them to the provider you pass in")
        if Level.STRICT not in provider.levels:
            raise LevelNotSupportedError(
                Level.STRICT.value, frozenset(lv.value for lv in provider.levels),
                f"run_strict needs a strict provider; {provider.name!r} is not one")
    return StrictOptions(
        command=command, args=tuple(args), timeout_ms=timeout_ms, env=env, cwd=cwd,
        stdin=stdin.encode() if isinstance(stdin, str) else stdin,
        max_stdout_bytes=max_stdout_bytes, max_stderr_bytes=max_stderr_bytes,
        limits=limits or SandboxLimits(), cancel=cancel, on_stdout=on_stdout,
        on_stderr=on_stderr, provider=provider, ro_binds=tuple(ro_binds), binds=tuple(binds),
        tenant_id=tenant_id, files_in=dict(files_in or {}), files_out=tuple(files_out),
        on_file_out=on_file_out, make_cwd=make_cwd, network=network or NetworkPolicy(),
        image=image, environment=environment)


async def _run(o: StrictOptions) -> RunResult:
    """One strict run of ``o``: a fresh sandbox, the command, the sandbox destroyed."""
    provider, own = o.provider, o.provider is None
    if provider is None:
        from corral.providers.linux import LinuxProvider
        # one run: a pre-warmed spare would be built only to be thrown away
        provider = LinuxProvider(stdout_cap=o.max_stdout_bytes, stderr_cap=o.max_stderr_bytes,
                                 spares=0, ro_binds=o.ro_binds, binds=o.binds)
    started = time.monotonic()
    streams = {1: o.on_stdout, 2: o.on_stderr}
    #: what streamed so far (already capped by the provider): the output a cancelled
    #: run keeps, since a cancelled exec returns nothing
    seen: dict[int, list[bytes]] = {1: [], 2: []}

    def on_output(fd: int, chunk: bytes) -> None:
        seen[fd].append(chunk)
        cb = streams[fd]
        if cb is not None:
            cb(chunk)

    try:
        spec = SandboxSpec(tenant_id=o.tenant_id, run_id=uuid.uuid4().hex, level=Level.STRICT,
                           limits=o.limits, network=o.network, image=o.image,
                           environment=o.environment)
        try:
            sandbox = await provider.create(spec, cancel=o.cancel)
        except CreateCancelledError:  # the cancel came while the sandbox was being made
            return RunResult(outcome=Outcome.CANCELLED, cwd="/work",
                             duration_ms=(time.monotonic() - started) * 1000)
        try:
            if o.make_cwd and o.cwd:
                await _make_dir(sandbox, o.cwd, o.timeout_ms)
            for path, content in o.files_in.items():
                await sandbox.write_file(path, content)
            argv = [o.command, *o.args]
            opts = ExecOpts(timeout_ms=o.timeout_ms, env=o.env, cwd=o.cwd, stdin=o.stdin,
                            max_stdout_bytes=o.max_stdout_bytes,
                            max_stderr_bytes=o.max_stderr_bytes)
            streaming = (Capability.STREAMING_EXEC.value in provider.capabilities
                         and isinstance(sandbox, SupportsStreamingExec))
            if streaming:
                assert isinstance(sandbox, SupportsStreamingExec)
                task = asyncio.ensure_future(sandbox.exec_streaming(argv, opts,
                                                                    on_output=on_output))
            else:  # the output comes with the result
                task = asyncio.ensure_future(sandbox.exec(argv, opts))
            remove = call_on_cancel(o.cancel, asyncio.get_running_loop(), task.cancel)
            try:
                try:
                    result = await task
                except CorralError as e:
                    if e.result is None:
                        raise
                    result = e.result
                except asyncio.CancelledError:
                    if o.cancel is None or not o.cancel.cancelled:
                        raise  # our caller's cancellation: let it through
                    result = RunResult(outcome=Outcome.CANCELLED, stdout=b"".join(seen[1]),
                                       stderr=b"".join(seen[2]))
            finally:
                remove()
                await settle([task])  # ended (a cancelled caller's too) before destroy
            for path in o.files_out:
                try:
                    got: bytes | None = await sandbox.read_file(path)
                except (FileNotFoundError, ConfigInvalidError):
                    got = None
                assert o.on_file_out is not None
                o.on_file_out(path, got)
        finally:
            await sandbox.destroy()
    finally:
        if own:
            await provider.aclose()
    if not streaming:
        for fd, data_ in ((1, result.stdout), (2, result.stderr)):
            if data_:
                on_output(fd, data_)
    return dataclasses.replace(result, duration_ms=(time.monotonic() - started) * 1000,
                               cwd=result.cwd or posixpath.normpath(
                                   posixpath.join("/work", o.cwd or "")),
                               level=Level.STRICT.value)


async def _make_dir(sandbox: Sandbox, cwd: str, timeout_ms: int) -> None:
    """``mkdir -p cwd`` inside the sandbox (the contract has no mkdir; its
    ``write_file`` creates parents only for a file)."""
    res = await sandbox.exec(["/bin/mkdir", "-p", "--", cwd],
                             ExecOpts(timeout_ms=min(timeout_ms, 10_000)))
    if res.exit_code != 0:
        raise ConfigInvalidError("cwd", f"cannot create {cwd!r} in the sandbox: "
                                        f"{res.stderr_text.strip()}")


#: the synchronous twin (same parameters): its own short-lived event loop, or a helper
#: thread when called where a loop is running. Cancel with the ``cancel`` token.
run_strict = sync_twin(run_strict_async, name="run_strict")
