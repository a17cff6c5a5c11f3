"""Fixtures for sessions: the strict provider's skip. The ``env_build`` tests run in
the shared ``sci`` environment (the ``sci_env`` fixture of tests/conftest.py)."""

from __future__ import annotations

import pytest

from strict_tier import host_can_sandbox, unavailable

SKIP_REASON = host_can_sandbox()


@pytest.fixture
def strict() -> None:
    """Skip (or fail under CORRAL_REQUIRE_STRICT=1) where the strict provider cannot run."""
    if SKIP_REASON:
        unavailable(SKIP_REASON)
