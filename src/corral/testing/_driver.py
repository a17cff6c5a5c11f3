"""The conformance kit's driver: the list of named checks (:func:`provider_checks`), one
check run alone (:class:`ProviderCheck`), and :func:`check_provider`, which runs them all
and reports every failure.

A check fails by raising ``AssertionError`` (or any other exception, which is reported with
its type); the driver runs the selected checks one after another, never stops at the first
failure, runs the leak check after the last, and raises one ``AssertionError`` that names
every failed check as ``[check-name] what went wrong``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from corral.core.contract import SandboxProvider
from corral.core.spec import Level
from corral.core.sync import sync_twin
from corral.testing._checks import (
    check_destroy,
    check_exec,
    check_files,
    check_isolation,
    check_kill,
    check_network_allowlist,
    check_path_escape,
    check_streaming,
    check_timeout,
)
from corral.testing._checks_files import check_file_ops
from corral.testing._checks_life import check_cancel, check_lifecycle
from corral.testing._checks_refusals import (
    check_bad_input,
    check_level,
    check_limits,
    check_network,
)
from corral.testing._kit import Kit, KitOptions, within

__all__ = ["CHECKS", "ProviderCheck", "check_provider", "check_provider_sync",
           "provider_checks"]


@dataclass(frozen=True, slots=True)
class ProviderCheck:
    """One conformance check, by name; await it to run it alone against a provider.

    Attributes:
        name: its stable name (``exec``, ``path-escape`` ...), as ``only`` / ``skip``
            and the failure messages spell it.
        doc: one line on what it asserts.
        processes: it runs commands, so it is left out when ``KitOptions.processes``
            is false (the other checks then skip only their command-running parts).
    """

    name: str
    doc: str
    processes: bool
    body: Callable[[Kit], Awaitable[None]]

    async def __call__(self, provider: SandboxProvider, options: KitOptions | None = None
                       ) -> None:
        """Run this check (then the leak check) against ``provider``.

        Raises:
            AssertionError: it failed; the message names the check and provider.
            ValueError: it runs commands and ``options.processes`` is false.
        """
        options = options or KitOptions()
        if self.processes and not options.processes:
            raise ValueError(f"check {self.name!r} runs commands; options.processes is False")
        await _run(provider, options, (self,))


def _check(name: str, body: Callable[[Kit], Awaitable[None]], *,
           processes: bool = False) -> ProviderCheck:
    doc = " ".join((body.__doc__ or name).split())
    return ProviderCheck(name=name, doc=doc, processes=processes, body=body)


_CHECKS: tuple[ProviderCheck, ...] = (
    _check("exec", check_exec, processes=True),
    _check("files", check_files),
    _check("path-escape", check_path_escape),
    _check("file-ops", check_file_ops),
    _check("isolation", check_isolation),
    _check("streaming", check_streaming, processes=True),
    _check("kill", check_kill, processes=True),
    _check("timeout", check_timeout, processes=True),
    _check("destroy", check_destroy),
    _check("level", check_level),
    _check("limits", check_limits),
    _check("network", check_network),
    _check("network-allowlist", check_network_allowlist, processes=True),
    _check("bad-input", check_bad_input),
    _check("cancel", check_cancel),
    _check("lifecycle", check_lifecycle),
)

#: The names of the checks, in the order they run. ``only`` / ``skip`` take these names.
CHECKS: tuple[str, ...] = tuple(c.name for c in _CHECKS)


def provider_checks(*, processes: bool = True) -> tuple[ProviderCheck, ...]:
    """Every conformance check, in the order :func:`check_provider` runs them.

    ``processes=False`` leaves out the checks that run commands (for a test double).
    Parametrize a test over them to see one test per check per provider::

        @pytest.mark.parametrize("check", provider_checks(), ids=lambda c: c.name)
        def test_conformance(check):
            asyncio.run(check(MyProvider(), KitOptions(network=...)))
    """
    return tuple(c for c in _CHECKS if processes or not c.processes)


def _highest(levels: Collection[Level]) -> Level:
    if not levels:
        raise AssertionError("provider.levels is empty: a provider supports at least one level")
    return max(levels, key=lambda lv: Level(lv).rank)


def _select(only: Collection[str] | None, skip: Collection[str]) -> list[ProviderCheck]:
    for name in [*(only or ()), *skip]:
        if name not in CHECKS:
            raise ValueError(f"unknown check {name!r} (known: {', '.join(CHECKS)})")
    return [c for c in _CHECKS if (only is None or c.name in only) and c.name not in skip]


async def _run(provider: SandboxProvider, options: KitOptions,
               checks: Sequence[ProviderCheck]) -> None:
    lv = options.level or _highest(provider.levels)
    host_dir = tempfile.mkdtemp(prefix="corral-kit-host-")
    kit = Kit(provider, options, level=lv, host_dir=host_dir)
    failures: list[str] = []
    try:
        for check in checks:
            kit.check_name = check.name
            try:
                await within(check.body(kit), 120.0, f"check {check.name!r}")
            except AssertionError as e:
                failures.append(f"[{check.name}] {e}")
            except Exception as e:  # a provider bug is a failure of this check, not of the kit
                failures.append(f"[{check.name}] unexpected {type(e).__qualname__}: {e}")
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


async def check_provider(provider: SandboxProvider, options: KitOptions | None = None, *,
                         only: Collection[str] | None = None,
                         skip: Collection[str] = ()) -> None:
    """Run the conformance checks against ``provider``; raise if any fails.

    Args:
        provider: the provider under test.
        options: how to run them (:class:`KitOptions`; default: the highest level
            of ``provider.levels``, network ``none``, this interpreter).
        only, skip: names from :data:`CHECKS` to run or leave out.

    Raises:
        AssertionError: one or more checks failed; the message lists each as
            ``[check-name] what went wrong``.
        ValueError: an unknown check name.
    """
    options = options or KitOptions()
    checks = [c for c in _select(only, skip) if options.processes or not c.processes]
    await _run(provider, options, checks)


#: :func:`check_provider` for sync code (its own event loop; see corral.core.sync).
check_provider_sync = sync_twin(check_provider, name="check_provider_sync")
