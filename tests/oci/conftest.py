"""Fixtures of the oci provider's tests: ``make_oci(runtime)`` gives a fresh provider or
skips with what is missing (with ``CORRAL_REQUIRE_STRICT=1`` a missing crun fails)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from corral.core.errors import LevelNotSupportedError


def _make(runtime: str = "crun", **options: Any) -> Any:
    from corral.providers.oci import OciProvider
    try:
        return OciProvider(runtime, **options)
    except LevelNotSupportedError as e:
        if os.environ.get("CORRAL_REQUIRE_STRICT") == "1" and runtime == "crun":
            raise
        pytest.skip(f"oci/{runtime} unusable here: {e.missing}")


@pytest.fixture
def make_oci() -> Callable[..., Any]:
    return _make
