"""Image registry tests: a loopback ``docker-registry`` per session (regsupport.py, which
tests import by that unique name; several folders have a conftest.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import regsupport as rs

__all__ = ["plain_registry"]


@pytest.fixture(scope="module")
def plain_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rs.Registry]:
    """An anonymous registry on loopback, per test module (stopped at the module's end:
    a registry process living on would be a child of the test run that later leak
    checks, tests/runner/test_runner_leaks.py, rightly count)."""
    if rs.REGISTRY_BIN is None:
        pytest.skip("Debian's docker-registry is not installed (scripts/test.sh installs it)")
    with rs.registry(str(tmp_path_factory.mktemp("registry"))) as reg:
        yield reg
