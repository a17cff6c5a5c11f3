"""What every conformance check gets: the options of a run of the kit (:class:`KitOptions`),
the :class:`Kit` (the provider, spec builder and helpers) and the small assertion helpers.

A check is an async function taking a :class:`Kit` (in :mod:`._checks`,
:mod:`._checks_refusals` and :mod:`._checks_life`); it fails by raising
``AssertionError``. :mod:`._driver` lists and runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TypeVar

from corral.core.contract import Sandbox, SandboxProvider
from corral.core.errors import ConfigInvalidError
from corral.core.result import RunResult
from corral.core.spec import ExecOpts, Level, NetworkPolicy, SandboxLimits, SandboxSpec

__all__ = ["Kit", "KitOptions", "drain", "expect", "expect_config_invalid", "read_until",
           "within"]

T = TypeVar("T")

_LIMIT_FIELDS = frozenset({"mem_mb", "cpu_ms", "disk_mb", "max_processes"})


@dataclass(frozen=True, slots=True, kw_only=True)
class KitOptions:
    """How the conformance kit runs against one provider (one frozen value).

    Attributes:
        level: the level the kit's sandboxes ask for; default the highest in
            ``provider.levels``. (Every level *not* in ``provider.levels`` is
            asked for too, and must be refused.)
        python: the interpreter path as seen inside the sandbox; commands are
            ``[python, "-I", "-S", "-c", code]`` (no shell is needed).
        network: the network policy of the kit's specs (default ``none``); a
            provider that cannot enforce ``none`` passes the policy it accepts.
            (The ``network`` check asks for every policy whatever this is.)
        image: passed through as ``SandboxSpec.image``.
        supports_limits: limit fields (``mem_mb``, ``cpu_ms``, ``disk_mb``,
            ``max_processes``) the provider claims to enforce: for these,
            refusing at create is a failure. Others may be enforced or refused.
        leak_check: awaited whenever every sandbox the kit made is destroyed
            (after the destroy and cancel checks and after the last check run);
            it raises ``AssertionError`` if provider resources remain.
        processes: ``False`` leaves out everything that runs commands (for test
            doubles such as :class:`~corral.testing.FakeProvider`).
    """

    level: Level | None = None
    python: str = sys.executable
    network: NetworkPolicy = field(default_factory=NetworkPolicy.none)
    image: str | None = None
    supports_limits: Collection[str] = frozenset()
    leak_check: Callable[[], Awaitable[None]] | None = None
    processes: bool = True

    def __post_init__(self) -> None:
        if self.level is not None:
            object.__setattr__(self, "level", Level(self.level))
        limits = frozenset(self.supports_limits)
        if isinstance(self.supports_limits, str) or not limits <= _LIMIT_FIELDS:
            raise ValueError(f"supports_limits: {sorted(limits - _LIMIT_FIELDS)} are not limit "
                             f"fields (known: {', '.join(sorted(_LIMIT_FIELDS))})")
        object.__setattr__(self, "supports_limits", limits)


def expect(cond: object, message: str) -> None:
    """Fail the current check with ``message`` unless ``cond`` holds (works under ``-O``)."""
    if not cond:
        raise AssertionError(message)


async def within(aw: Awaitable[T], seconds: float, what: str) -> T:
    """Await ``aw``; fail the check if it takes longer than ``seconds``."""
    cm = asyncio.timeout(seconds)
    try:
        async with cm:
            return await aw
    except TimeoutError:
        if cm.expired():  # not a SandboxTimeoutError (also a TimeoutError) from the provider
            raise AssertionError(f"{what} did not finish within {seconds:g} s") from None
        raise


async def expect_config_invalid(what: str, aw: Awaitable[object], problems: list[str]) -> None:
    """Expect ``aw`` to raise ConfigInvalidError; note a problem otherwise."""
    try:
        await within(aw, 10.0, what)
    except ConfigInvalidError:
        return
    except AssertionError as e:
        problems.append(str(e))
    except Exception as e:
        problems.append(f"{what}: expected ConfigInvalidError, got {type(e).__name__}: {e}")
    else:
        problems.append(f"{what}: was allowed (expected ConfigInvalidError)")


class Kit:
    """What a check gets: the provider, how to build specs, and helpers."""

    def __init__(self, provider: SandboxProvider, options: KitOptions, *, level: Level,
                 host_dir: str) -> None:
        self.provider = provider
        self.options = options
        self.level = level
        self.python = options.python
        self.network = options.network
        self.image = options.image
        self.supports_limits = frozenset(options.supports_limits)
        self.leak_check = options.leak_check
        self.processes = options.processes
        #: a directory on the host, outside every sandbox: escape targets point here
        self.host_dir = host_dir
        self.tenant_id = f"kit-{uuid.uuid4().hex[:12]}"
        self._n = 0
        self.check_name = ""

    def spec(self, *, level: Level | None = None, limits: SandboxLimits | None = None,
             network: NetworkPolicy | None = None) -> SandboxSpec:
        """A spec with a unique run id, at the kit's level, network and image."""
        self._n += 1
        return SandboxSpec(
            tenant_id=self.tenant_id, run_id=f"{self.check_name or 'kit'}-{self._n}",
            image=self.image, network=network or self.network, level=level or self.level,
            limits=limits or SandboxLimits(),
        )

    def py(self, code: str) -> list[str]:
        """argv running ``code`` with the kit's python (isolated mode, no site)."""
        return [self.python, "-I", "-S", "-c", code]

    async def run(self, sb: Sandbox, code: str, opts: ExecOpts | None = None,
                  *, seconds: float = 20.0) -> RunResult:
        """``sb.exec`` of a python snippet, guarded by ``seconds``."""
        return await within(sb.exec(self.py(code), opts), seconds, "exec of a python snippet")

    async def create(self, spec: SandboxSpec | None = None) -> Sandbox:
        return await within(self.provider.create(spec or self.spec()), 60.0, "create")

    @contextlib.asynccontextmanager
    async def sandbox(self, spec: SandboxSpec | None = None) -> AsyncIterator[Sandbox]:
        """A fresh sandbox, destroyed (guarded) when the block ends."""
        sb = await self.create(spec)
        try:
            yield sb
        finally:
            await within(sb.destroy(), 20.0, "destroy")

    async def check_leaks(self, when: str) -> None:
        if self.leak_check is not None:
            try:
                await within(self.leak_check(), 20.0, "leak_check")
            except AssertionError as e:
                raise AssertionError(f"leak_check after {when}: {e}") from None


async def drain(it: AsyncIterator[bytes]) -> bytes:
    """Read an output stream to EOF."""
    out = bytearray()
    async for chunk in it:
        expect(isinstance(chunk, bytes | bytearray),
               f"output chunks must be bytes, got {type(chunk).__name__}")
        out += chunk
    return bytes(out)


async def read_until(it: AsyncIterator[bytes], marker: bytes, seconds: float,
                     what: str) -> bytes:
    """Read chunks until ``marker`` appears; fail after ``seconds``."""
    acc = bytearray()

    async def go() -> None:
        while marker not in acc:
            try:
                acc.extend(await anext(it))
            except StopAsyncIteration:
                raise AssertionError(
                    f"{what}: stream ended before {marker!r} (got {bytes(acc)!r})") from None

    await within(go(), seconds, f"{what} (waiting for {marker!r}, got {bytes(acc)!r})")
    return bytes(acc)
