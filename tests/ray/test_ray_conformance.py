"""The conformance kit against the Ray provider on a real local cluster (a head and two
worker nodes): every check, then no sandbox or process left on any node."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from raysupport import no_leaks, provider

from corral.testing import KitOptions, check_provider


def test_check_provider(ray_cluster: Any) -> None:
    async def go() -> None:
        p = provider()
        try:
            assert len(p.nodes()) == 2, [n.address for n in p.nodes()]
            assert "files" in p.capabilities  # the kit's file-operation check runs
            await check_provider(p, KitOptions(
                python=sys.executable, leak_check=lambda: no_leaks(p),
                supports_limits={"mem_mb", "cpu_ms", "disk_mb", "max_processes"}))
        finally:
            await p.aclose()
    asyncio.run(go())
