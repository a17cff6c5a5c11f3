"""FakeProvider: a scripted test double for code that drives a provider. NOT a sandbox.

Like httpx's ``MockTransport``: nothing is executed. Every ``exec`` (and every
started process) is answered by a handler you write; files live in a dict
with the same path rules as a real sandbox (``..``, absolute paths and empty
paths are refused with ConfigInvalidError).

::

    def handler(argv, opts):
        if argv[:2] == ["python", "-c"]:
            return RunResult(stdout=b"42\\n", stderr=b"", exit_code=0)
        return RunResult(stdout=b"", stderr=b"not found", exit_code=127)

    provider = FakeProvider(handler)
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TypeAlias, final

from corral.core.cancel import CancelToken
from corral.core.contract import ProcessHandle, ProcessStdin, Sandbox, SandboxProvider
from corral.core.errors import (
    ConfigInvalidError,
    CreateCancelledError,
    LevelNotSupportedError,
    ProviderError,
)
from corral.core.result import RunResult
from corral.core.spec import ExecOpts, Level, ProcessOpts, SandboxSpec, check_argv
from corral.providers.confined import split_relative

__all__ = ["FakeHandler", "FakeProvider", "FakeSandbox"]

#: ``handler(argv, opts) -> RunResult`` (or an awaitable of one). It may raise
#: corral errors (SandboxTimeoutError, LimitsExceededError, ...) to simulate them.
FakeHandler: TypeAlias = Callable[[Sequence[str], ExecOpts],
                                  "RunResult | Awaitable[RunResult]"]

#: the work dir as absolute paths name it inside a fake sandbox
FAKE_WORK_DIR = "/work"


def _ok(argv: Sequence[str], opts: ExecOpts) -> RunResult:
    return RunResult(stdout=b"", stderr=b"", exit_code=0)


@final
class FakeProvider(SandboxProvider):
    """A provider that runs nothing: exec answers come from ``handler``.

    Args:
        handler: answers every exec and started process; default exit 0, no output.
        levels: the levels it claims (default all); others raise LevelNotSupportedError.
        capabilities: capability strings to advertise (no lifecycle methods exist).
        accept_limits: accept specs with limits (which nothing enforces: make the
            handler raise LimitsExceededError to simulate a hit). Default: refuse
            them with LevelNotSupportedError (``field="limits.<name>"``), as an
            honest provider that cannot enforce them does.
        networks: the network policy kinds it accepts (default all: nothing runs,
            so nothing reaches a network); others are refused with
            LevelNotSupportedError (``field="network"``).
        name: the provider's name.

    It refuses what the contract's refusal table says with the same errors as a
    real provider: a spec that is not a ``SandboxSpec``, an empty or NUL-holding
    ``argv``, and a ``cwd`` outside the work dir raise ConfigInvalidError.

    ``sandboxes`` lists every sandbox made, for assertions.
    """

    def __init__(self, handler: FakeHandler | None = None, *,
                 levels: Iterable[Level | str] = tuple(Level),
                 capabilities: Iterable[str] = (), accept_limits: bool = False,
                 networks: Iterable[str] = ("none", "allowlist", "unrestricted"),
                 name: str = "fake") -> None:
        self.handler = handler or _ok
        self.levels = frozenset(Level(lv) for lv in levels)
        self.capabilities = frozenset(capabilities) - {"snapshot", "restore", "pause"}
        self.accept_limits = accept_limits
        self.networks = frozenset(networks)
        self.name = name
        self.sandboxes: list[FakeSandbox] = []

    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None) -> Sandbox:
        if not isinstance(spec, SandboxSpec):
            raise ConfigInvalidError("spec", f"must be a SandboxSpec, not {type(spec).__name__}")
        levels = [lv.value for lv in self.levels]
        if spec.level not in self.levels:
            raise LevelNotSupportedError(spec.level.value, levels,
                                         f"FakeProvider {self.name!r} was configured without it")
        if not self.accept_limits:
            for field in spec.limits.asked():
                raise LevelNotSupportedError(
                    spec.level.value, levels, "pass accept_limits=True to accept them anyway",
                    field=f"limits.{field}", missing="any limit (FakeProvider enforces none)")
        if spec.network.kind not in self.networks:
            raise LevelNotSupportedError(
                spec.level.value, levels, f"FakeProvider {self.name!r} was configured without it",
                field="network", missing=f"network policy {spec.network.kind!r}")
        if cancel is not None and cancel.cancelled:
            raise CreateCancelledError(f"create cancelled: {cancel.reason}")
        sb = FakeSandbox(spec, self.handler)
        self.sandboxes.append(sb)
        return sb


@final
class FakeSandbox(Sandbox):
    """An in-memory sandbox. ``files`` maps paths (``"a/b.txt"``) to bytes; ``calls``
    records ``(argv, opts)`` of every exec and started process."""

    def __init__(self, spec: SandboxSpec, handler: FakeHandler) -> None:
        self.id = f"fake-{uuid.uuid4().hex}"
        self.spec = spec
        self.files: dict[str, bytes] = {}
        self.calls: list[tuple[tuple[str, ...], ExecOpts]] = []
        self.destroyed = False
        self._handler = handler
        self._procs: list[_FakeProcess] = []

    def _alive(self, what: str) -> None:
        if self.destroyed:
            raise ProviderError(f"{what}: fake sandbox {self.id} was destroyed")

    def _key(self, path: str) -> str:
        parts = split_relative(path, root_alias=FAKE_WORK_DIR)
        key = "/".join(parts)
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in self.files:
                raise ConfigInvalidError("path", f"not a directory: {'/'.join(parts[:i])!r}")
        if any(k.startswith(key + "/") for k in self.files):
            raise ConfigInvalidError("path", f"is a directory: {path!r}")
        return key

    def _check(self, argv: Sequence[str], cwd: str | None) -> None:
        check_argv(argv)
        if cwd is not None and cwd not in ("", ".", FAKE_WORK_DIR, FAKE_WORK_DIR + "/"):
            split_relative(cwd, root_alias=FAKE_WORK_DIR)

    async def _answer(self, argv: Sequence[str], opts: ExecOpts) -> RunResult:
        self._check(argv, opts.cwd)
        self.calls.append((tuple(argv), opts))
        result = self._handler(argv, opts)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, RunResult):
            raise ProviderError(f"fake handler returned {type(result).__name__}, not RunResult")
        return result

    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> RunResult:
        self._alive("exec")
        return await self._answer(argv, opts or ExecOpts())

    async def write_file(self, path: str, data: bytes | str) -> None:
        self._alive("write_file")
        self.files[self._key(path)] = (
            data.encode() if isinstance(data, str) else bytes(data))

    async def read_file(self, path: str) -> bytes:
        self._alive("read_file")
        key = self._key(path)
        if key not in self.files:
            raise FileNotFoundError(path)
        return self.files[key]

    async def start_process(self, argv: Sequence[str],
                            opts: ProcessOpts | None = None) -> ProcessHandle:
        """A fake process: the handler answers once stdin is closed (``stdin=False``: at once)."""
        self._alive("start_process")
        opts = opts or ProcessOpts()
        self._check(argv, opts.cwd)
        p = _FakeProcess(self, list(argv), opts)
        self._procs.append(p)
        return p

    async def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        for p in self._procs:
            await p.kill()
        self.files.clear()


class _FakeStdin(ProcessStdin):
    def __init__(self, proc: _FakeProcess) -> None:
        self._proc = proc

    async def write(self, data: bytes) -> None:
        if self._proc.stdin_closed:
            raise ProviderError("stdin is closed")
        self._proc.stdin_data += data

    async def close(self) -> None:
        if not self._proc.stdin_closed:
            self._proc.stdin_closed = True
            self._proc.start()


class _FakeProcess(ProcessHandle):
    def __init__(self, sb: FakeSandbox, argv: list[str], opts: ProcessOpts) -> None:
        self._sb, self._argv, self._opts = sb, argv, opts
        self.stdin_data = bytearray()
        self.stdin_closed = not opts.stdin
        self.stdin = _FakeStdin(self)
        self._result: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self.stdout = self._stream(lambda r: r.stdout)
        self.stderr = self._stream(lambda r: r.stderr)
        if self.stdin_closed:
            self.start()

    def start(self) -> None:
        if self._task is None and not self._result.done():
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        opts = ExecOpts(stdin=bytes(self.stdin_data), env=self._opts.env, cwd=self._opts.cwd,
                        timeout_ms=self._opts.timeout_ms)
        try:
            res = await self._sb._answer(self._argv, opts)
        except Exception as e:
            res = RunResult(stdout=b"", stderr=f"{type(e).__name__}: {e}".encode(), exit_code=1)
        if not self._result.done():
            self._result.set_result(res)

    async def _stream(self, pick: Callable[[RunResult], bytes]) -> AsyncIterator[bytes]:
        data = pick(await asyncio.shield(self._result))
        if data:
            yield data

    async def wait(self) -> RunResult:
        return RunResult(exit_code=(await asyncio.shield(self._result)).exit_code)

    async def kill(self) -> None:
        if not self._result.done():
            self._result.set_result(RunResult(stdout=b"", stderr=b"", exit_code=-9))
        if self._task is not None and not self._task.done():
            self._task.cancel()
