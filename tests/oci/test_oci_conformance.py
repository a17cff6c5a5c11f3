"""The conformance kit against the oci provider (crun; runsc where installed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from corral.testing import KitOptions, check_provider


async def _kit(p: Any) -> None:
    async def leaks() -> None:
        left = p.leaks()
        assert not left, f"left on the host: {left}"

    try:
        await check_provider(p, KitOptions(
            python="/usr/bin/python3", leak_check=leaks,
            supports_limits={"mem_mb", "max_processes", "cpu_ms", "disk_mb"}))
    finally:
        await p.aclose()


@pytest.mark.parametrize("runtime", ["crun", "runsc"])
def test_check_provider(runtime: str, make_oci: Callable[..., Any]) -> None:
    asyncio.run(_kit(make_oci(runtime)))
