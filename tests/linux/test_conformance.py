"""The conformance kit (corral.testing.check_provider) against LinuxProvider."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from corral.testing import check_provider

pytestmark = pytest.mark.linux


def test_linux_provider_passes_the_conformance_kit(linux: Callable[..., None]) -> None:
    async def test(provider: Any) -> None:
        await check_provider(provider, python=sys.executable,
                             supports_limits=("mem_mb", "cpu_ms", "disk_mb", "max_processes"))

    linux(test)
