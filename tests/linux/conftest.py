"""Fixtures for the strict Linux provider's tests."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from corral.spec import SandboxLimits, SandboxSpec


def _host_can_sandbox() -> str:
    """"" if this host has what LinuxProvider needs, else why not."""
    if sys.platform != "linux":
        return "not Linux"
    from corral.providers.linux import _sys_unsafe as su
    if su.machine_arch() not in ("x86_64", "aarch64"):
        return f"no seccomp filter for {su.machine_arch()}"
    pid = os.fork()
    if pid == 0:
        try:
            su.unshare(su.CLONE_NEWUSER | su.CLONE_NEWNS | su.CLONE_NEWPID | su.CLONE_NEWNET)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return "" if os.waitstatus_to_exitcode(status) == 0 else "cannot create namespaces"


SKIP_REASON = _host_can_sandbox()
needs_sandbox = pytest.mark.skipif(bool(SKIP_REASON), reason=SKIP_REASON or "ok")


def make_spec(**limits: int) -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r", limits=SandboxLimits(**limits))


ProviderTest = Callable[[Any], Awaitable[None]]


def run_with_provider(test: ProviderTest, **kwargs: Any) -> None:
    """Run ``test(provider)`` in a fresh event loop; the provider is closed after it."""
    from corral.providers.linux import LinuxProvider

    async def main() -> None:
        provider = LinuxProvider(**kwargs)
        try:
            await test(provider)
        finally:
            await provider.aclose()

    asyncio.run(main())


@pytest.fixture
def linux() -> Callable[..., None]:
    """``linux(test, **provider_kwargs)``: run an async test against a LinuxProvider."""
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    return run_with_provider
