"""The conformance kit driver: ``check_provider`` runs every check and reports all failures.

Each check is an async function taking a :class:`Kit` (in :mod:`._checks` and
:mod:`._checks_life`). A check fails by raising ``AssertionError`` (or any
other exception, which is reported with its type); the driver runs them one
after another, never stops at the first failure, and raises one
``AssertionError`` that names every failed check.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any, TypeVar

from corral.core.contract import Sandbox, SandboxProvider
from corral.core.spec import ExecOpts, ExecResult, Level, NetworkPolicy, SandboxLimits, SandboxSpec

__all__ = ["CHECKS", "Kit", "check_provider", "check_provider_sync", "expect", "within"]

T = TypeVar("T")

#: The checks, in the order they run. ``only`` / ``skip`` take these names.
CHECKS: tuple[str, ...] = (
    "exec", "files", "path-escape", "isolation", "streaming", "kill", "timeout",
    "destroy", "level", "limits", "cancel", "lifecycle",
)
#: Checks that need exec/start_process to run real commands (skipped by ``processes=False``).
PROCESS_CHECKS: frozenset[str] = frozenset({"exec", "streaming", "kill", "timeout"})


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


class Kit:
    """What a check gets: the provider, how to build specs, and helpers."""

    def __init__(self, provider: SandboxProvider, *, level: Level, python: str,
                 network: NetworkPolicy, image: str | None, supports_limits: frozenset[str],
                 leak_check: Callable[[], Awaitable[None]] | None, processes: bool,
                 host_dir: str) -> None:
        self.provider = provider
        self.level = level
        self.python = python
        self.network = network
        self.image = image
        self.supports_limits = supports_limits
        self.leak_check = leak_check
        self.processes = processes
        #: a directory on the host, outside every sandbox: escape targets point here
        self.host_dir = host_dir
        self.tenant_id = f"kit-{uuid.uuid4().hex[:12]}"
        self._n = 0
        self.check_name = ""

    def spec(self, *, level: Level | None = None,
             limits: SandboxLimits | None = None) -> SandboxSpec:
        """A spec with a unique run id, at the kit's level, network and image."""
        self._n += 1
        return SandboxSpec(
            tenant_id=self.tenant_id, run_id=f"{self.check_name or 'kit'}-{self._n}",
            image=self.image, network=self.network, level=level or self.level,
            limits=limits or SandboxLimits(),
        )

    def py(self, code: str) -> list[str]:
        """argv running ``code`` with the kit's python (isolated mode, no site)."""
        return [self.python, "-I", "-S", "-c", code]

    async def run(self, sb: Sandbox, code: str, opts: ExecOpts | None = None,
                  *, seconds: float = 20.0) -> ExecResult:
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


def _highest(levels: Collection[Level]) -> Level:
    if not levels:
        raise AssertionError("provider.levels is empty: a provider supports at least one level")
    return max(levels, key=lambda lv: Level(lv).rank)


def _select(only: Collection[str] | None, skip: Collection[str]) -> list[str]:
    for name in [*(only or ()), *skip]:
        if name not in CHECKS:
            raise ValueError(f"unknown check {name!r} (known: {', '.join(CHECKS)})")
    return [c for c in CHECKS if (only is None or c in only) and c not in skip]


async def check_provider(
    provider: SandboxProvider,
    *,
    level: Level | str | None = None,
    python: str = sys.executable,
    network: NetworkPolicy | None = None,
    image: str | None = None,
    supports_limits: Collection[str] = (),
    leak_check: Callable[[], Awaitable[None]] | None = None,
    processes: bool = True,
    only: Collection[str] | None = None,
    skip: Collection[str] = (),
) -> None:
    """Run the conformance checks against ``provider``; raise if any fails.

    Args:
        provider: the provider under test.
        level: the level the kit's sandboxes ask for; default the highest in
            ``provider.levels``. (Every level *not* in ``provider.levels`` is
            asked for too, and must be refused.)
        python: the interpreter path as seen inside the sandbox; commands are
            ``[python, "-I", "-S", "-c", code]`` (no shell is needed).
        network: the network policy of the kit's specs (default ``none``); a
            provider that cannot enforce ``none`` passes the policy it accepts.
        image: passed through as ``SandboxSpec.image``.
        supports_limits: limit fields (``mem_mb``, ``cpu_ms``, ``disk_mb``,
            ``max_processes``) the provider claims to enforce: for these,
            refusing at create is a failure. Others may be enforced or refused.
        leak_check: awaited whenever every sandbox the kit made is destroyed
            (after the destroy and cancel checks and at the end); it raises
            ``AssertionError`` if provider resources remain.
        processes: ``False`` skips everything that runs commands (for test
            doubles such as :class:`~corral.testing.FakeProvider`).
        only, skip: names from :data:`CHECKS` to run or leave out.

    Raises:
        AssertionError: one or more checks failed; the message lists each as
            ``[check-name] what went wrong``.
    """
    lv = Level(level) if level is not None else _highest(provider.levels)
    names = _select(only, skip)
    if not processes:
        names = [n for n in names if n not in PROCESS_CHECKS]
    from corral.testing._checks import CHECK_FUNCS  # the checks import this module

    host_dir = tempfile.mkdtemp(prefix="corral-kit-host-")
    kit = Kit(provider, level=lv, python=python, network=network or NetworkPolicy.none(),
              image=image, supports_limits=frozenset(supports_limits),
              leak_check=leak_check, processes=processes, host_dir=host_dir)
    failures: list[str] = []
    try:
        for name in names:
            kit.check_name = name
            try:
                await within(CHECK_FUNCS[name](kit), 120.0, f"check {name!r}")
            except AssertionError as e:
                failures.append(f"[{name}] {e}")
            except Exception as e:  # a provider bug is a failure of this check, not of the kit
                failures.append(f"[{name}] unexpected {type(e).__qualname__}: {e}")
        kit.check_name = "end"
        try:
            await kit.check_leaks("the last check")
        except AssertionError as e:
            failures.append(f"[leaks] {e}")
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    if failures:
        head = (f"provider {getattr(provider, 'name', type(provider).__name__)!r} failed "
                f"{len(failures)} conformance check(s) (level {lv.value!r}):")
        raise AssertionError("\n".join([head, *(f"  {f}" for f in failures)]))


def check_provider_sync(provider: SandboxProvider, **kwargs: Any) -> None:
    """:func:`check_provider` for sync code: runs it in a fresh event loop."""
    asyncio.run(check_provider(provider, **kwargs))
