"""Suite-wide test hooks: the strict tier (see strict_tier.py).

Test modules in any folder import ``strict_tier`` (and ``cgroup_view``) by that name:
this folder is put on ``sys.path`` here (several folders have a conftest.py, so
conftests are not importable by name).
"""

from __future__ import annotations

import glob
import logging
import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from strict_tier import pytest_configure, pytest_runtest_setup

__all__ = ["pytest_configure", "pytest_runtest_logstart", "pytest_runtest_setup",
           "pytest_sessionfinish", "pytest_sessionstart"]

#: directories that hold a test CA's private key (tests/linux/netservers.py, the
#: ``test_ca`` fixture, which names them after this session's pid); a test session must
#: leave none of its own behind (other sessions running at the same time have their own)
_KEY_DIRS = ("corral-netca-*", f"corral-test-ca-{os.getpid()}-*")
_before: set[str] = set()


def _key_dirs() -> set[str]:
    tmp = tempfile.gettempdir()
    return {d for pat in _KEY_DIRS for d in glob.glob(os.path.join(tmp, pat))}


#: what asyncio logs when a task or callback has no owner that awaits it (issue 25: a
#: test session in which this process logs either fails, whatever the tests said)
_UNOWNED = ("Exception in callback", "Task was destroyed but it is pending",
            "Task exception was never retrieved")


class _UnownedTasks(logging.Handler):
    """Records asyncio's reports of tasks nobody awaited, with the test running then."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.test = "(collection)"
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # a bad record is not ours to report
            return
        if msg.startswith(_UNOWNED) and len(self.seen) < 50:
            self.seen.append(f"{self.test}: {msg.splitlines()[0][:300]}")


_unowned = _UnownedTasks()


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _unowned.test = nodeid


def pytest_sessionstart(session: pytest.Session) -> None:
    _before.update(_key_dirs())
    logging.getLogger("asyncio").addHandler(_unowned)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = sorted(_key_dirs() - _before)
    if left:
        print(f"\ntest session left directories holding private keys: {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    logging.getLogger("asyncio").removeHandler(_unowned)
    if _unowned.seen:
        print("\nasyncio reported tasks or callbacks nobody awaited:")
        for line in _unowned.seen:
            print(f"  {line}")
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
