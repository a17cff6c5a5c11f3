"""Which levels the snippet tests run at: strict when the linux provider works here."""

from __future__ import annotations

import asyncio
import sys

import pytest

from strict_tier import needs_strict

__all__ = ["LEVELS", "STRICT_SKIP"]


def _strict_reason() -> str:
    """"" when the linux provider can build a sandbox here, else why not."""
    if sys.platform != "linux":
        return "not Linux"

    async def probe() -> None:
        from corral.core.spec import SandboxSpec
        from corral.providers.linux import LinuxProvider
        provider = LinuxProvider()
        try:
            sandbox = await provider.create(SandboxSpec(tenant_id="probe", run_id="probe"))
            await sandbox.destroy()
        finally:
            await provider.aclose()

    try:
        asyncio.run(probe())
    except Exception as exc:
        return f"the linux provider cannot run here: {exc}"
    return ""


STRICT_SKIP = _strict_reason()
LEVELS = [pytest.param("strict", marks=needs_strict(STRICT_SKIP)), "context-isolated"]
