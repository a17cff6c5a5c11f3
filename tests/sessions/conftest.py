"""Fixtures for sessions: the strict provider's skip, and (marker ``env_build``) the
site-packages dir with pandas and matplotlib (tests/session_env.py)."""

from __future__ import annotations

import pytest

from session_env import build_site
from strict_tier import host_can_sandbox, unavailable

SKIP_REASON = host_can_sandbox()


@pytest.fixture(scope="session")
def data_site() -> str:
    return build_site()


@pytest.fixture
def strict() -> None:
    """Skip (or fail under CORRAL_REQUIRE_STRICT=1) where the strict provider cannot run."""
    if SKIP_REASON:
        unavailable(SKIP_REASON)
