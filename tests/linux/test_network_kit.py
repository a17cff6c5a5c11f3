"""The conformance kit's ``network-allowlist`` check fails a provider that advertises
the capability without enforcing it (issue 13); the linux provider passes it (in
tests/test_conformance.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from corral.core.cancel import CancelToken
from corral.core.spec import NetworkPolicy, SandboxSpec
from corral.providers.subproc import SubprocProvider
from corral.testing import KitOptions, provider_checks


class _Boasting(SubprocProvider):
    """Claims an allowlist, then runs every sandbox with the host's network (weaker
    than asked: what the contract forbids)."""

    def __init__(self, tmp: str) -> None:
        super().__init__(temp_dir=tmp)
        self.capabilities = frozenset({*self.capabilities, "network-allowlist"})

    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None) -> Any:
        return await super().create(
            dataclasses.replace(spec, network=NetworkPolicy.unrestricted()), cancel=cancel)


def test_the_check_fails_a_provider_that_only_claims_an_allowlist(tmp_path: Path) -> None:
    check = next(c for c in provider_checks() if c.name == "network-allowlist")

    async def go() -> None:
        async with _Boasting(str(tmp_path)) as p:
            await check(p, KitOptions(network=NetworkPolicy.unrestricted()))

    with pytest.raises(AssertionError, match=r"unlisted 127\.0\.0\.1:[0-9]+ reached it"):
        asyncio.run(go())


def test_linux_sandboxes_satisfy_the_network_protocols() -> None:
    from corral.core.contract import SupportsNetworkPolicy, SupportsPreviewUrl
    from corral.providers.linux import LinuxSandbox
    for proto in (SupportsNetworkPolicy, SupportsPreviewUrl):
        for name in (n for n in dir(proto) if not n.startswith("_")):
            assert callable(getattr(LinuxSandbox, name)), name
