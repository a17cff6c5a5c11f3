"""The conformance kit (corral.testing) against every provider: one test per check per
provider, ``test_conformance[<provider>-<check>]``, as anyio runs its suite per backend.

The linux provider's tests are the strict tier: skipped where it cannot run, failed
instead under CORRAL_REQUIRE_STRICT=1 (tests/strict_tier.py).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.core.contract import SandboxProvider
from corral.core.spec import NetworkPolicy
from corral.providers.inprocess import InProcessProvider
from corral.providers.subproc import SubprocProvider
from corral.testing import FakeProvider, KitOptions, ProviderCheck, provider_checks
from strict_tier import host_can_sandbox, needs_strict

Setup = Callable[[Path], tuple[SandboxProvider, KitOptions]]


def _no_dirs_left(tmp: Path) -> KitOptions:
    async def no_leaks() -> None:
        left = os.listdir(tmp)
        assert not left, f"sandbox dirs left behind: {left}"

    return KitOptions(network=NetworkPolicy.unrestricted(), leak_check=no_leaks)


def _inprocess(tmp: Path) -> tuple[SandboxProvider, KitOptions]:
    return InProcessProvider(temp_dir=str(tmp)), _no_dirs_left(tmp)


def _subproc(tmp: Path) -> tuple[SandboxProvider, KitOptions]:
    return SubprocProvider(temp_dir=str(tmp)), _no_dirs_left(tmp)


def _linux(tmp: Path) -> tuple[SandboxProvider, KitOptions]:
    from corral.providers.linux import LinuxProvider
    return LinuxProvider(), KitOptions(
        python=sys.executable, supports_limits={"mem_mb", "cpu_ms", "disk_mb", "max_processes"})


def _oci_why() -> str:
    """'' where the oci provider can run crun here, else what is missing."""
    from corral.core.errors import LevelNotSupportedError
    from corral.providers.oci import OciProvider
    try:
        OciProvider("crun")  # makes nothing until a create
    except LevelNotSupportedError as e:
        return e.missing
    return ""


def _oci(tmp: Path) -> tuple[SandboxProvider, KitOptions]:
    from corral.providers.oci import OciProvider
    p = OciProvider("crun", state_dir=str(tmp / "oci"))

    async def no_leaks() -> None:
        left = p.leaks()
        assert not left, f"left on the host: {left}"

    return p, KitOptions(python="/usr/bin/python3", leak_check=no_leaks,
                         supports_limits={"mem_mb", "cpu_ms", "disk_mb", "max_processes"})


def _fake(tmp: Path) -> tuple[SandboxProvider, KitOptions]:
    return FakeProvider(), KitOptions(processes=False)


STRICT_WHY = host_can_sandbox()
OCI_WHY = _oci_why()
PROVIDERS: dict[str, tuple[Setup, bool, list[pytest.MarkDecorator]]] = {
    # name: (setup, runs commands, marks)
    "inprocess": (_inprocess, True, []),
    "subproc": (_subproc, True, []),
    "linux": (_linux, True, [pytest.mark.linux, needs_strict(STRICT_WHY)]),
    "oci": (_oci, True, [pytest.mark.skipif(bool(OCI_WHY), reason=f"oci/crun: {OCI_WHY}")]),
    "fake": (_fake, False, []),
}
#: checks slow enough to leave out of the fast tier (``-m "not slow"``), per provider
SLOW: set[tuple[str, str]] = set()


def _params() -> list[object]:
    out: list[object] = []
    for name, (_setup, processes, marks) in PROVIDERS.items():
        for check in provider_checks(processes=processes):
            slow = [pytest.mark.slow] if (name, check.name) in SLOW else []
            out.append(pytest.param(name, check, id=f"{name}-{check.name}",
                                    marks=[*marks, *slow]))
    return out


@pytest.mark.parametrize(("provider", "check"), _params())
def test_conformance(provider: str, check: ProviderCheck, tmp_path: Path) -> None:
    setup = PROVIDERS[provider][0]

    async def go() -> None:
        p, options = setup(tmp_path)
        async with p:
            await check(p, options)

    asyncio.run(go())


def test_every_check_runs_for_every_provider_that_can_run_it() -> None:
    names = [c.name for c in provider_checks()]
    assert names == list(dict.fromkeys(names))  # unique, stable order
    without = {c.name for c in provider_checks(processes=False)}
    assert without < set(names)
    assert {"exec", "streaming", "kill", "timeout", "network-allowlist"} == set(names) - without
