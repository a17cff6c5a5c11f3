"""Suite-wide test hooks: the strict tier (see strict_tier.py).

Test modules in any folder import ``strict_tier`` (and ``cgroup_view``) by that name:
this folder is put on ``sys.path`` here (several folders have a conftest.py, so
conftests are not importable by name).
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from strict_tier import pytest_configure, pytest_runtest_setup

__all__ = ["pytest_configure", "pytest_runtest_setup", "pytest_sessionfinish",
           "pytest_sessionstart"]

#: directories that hold a test CA's private key (tests/linux/netservers.py, the
#: ``test_ca`` fixture, which names them after this session's pid); a test session must
#: leave none of its own behind (other sessions running at the same time have their own)
_KEY_DIRS = ("corral-netca-*", f"corral-test-ca-{os.getpid()}-*")
_before: set[str] = set()


def _key_dirs() -> set[str]:
    tmp = tempfile.gettempdir()
    return {d for pat in _KEY_DIRS for d in glob.glob(os.path.join(tmp, pat))}


def pytest_sessionstart(session: pytest.Session) -> None:
    _before.update(_key_dirs())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = sorted(_key_dirs() - _before)
    if left:
        print(f"\ntest session left directories holding private keys: {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def sci_built() -> object:
    """The shared ``sci`` environment (tests/env_fixture.py), built once per session
    (a cache hit after the first cold build). For ``env_build`` tests only."""
    from env_fixture import build_sci
    return build_sci()


@pytest.fixture
def sci_env(sci_built: object, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of the shared ``sci`` environment, with ``CORRAL_ENV_DIR`` naming its
    store for this test (providers, the CLI and servers started here find it)."""
    from env_fixture import ENV_NAME, env_root
    monkeypatch.setenv("CORRAL_ENV_DIR", str(env_root()))
    return ENV_NAME
