"""A real local Ray cluster for tests/ray: a head and two worker nodes on loopback.

Started once per session (``ray_cluster``) by ``ray start`` subprocesses on 127.0.0.2
(head) and 127.0.0.3 / 127.0.0.4 (workers), with a private temp dir and usage stats
off, and stopped by the pids of their sessions (never by process name). Every test here
that starts the cluster is marked ``ray`` and ``slow``: skipped when Ray is not installed,
run by the whole suite (CI installs the ``ray`` extra); the fast tier (``-m "not slow"``)
leaves them out. ``test_pure_*.py`` need no Ray and run in every tier.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))

HAVE_RAY = importlib.util.find_spec("ray") is not None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ray: needs Ray (the ray extra) and starts a local "
                            "cluster; skipped without Ray")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        # test_pure_*.py: pure placement / wire tests, no Ray, in the fast tier
        if str(item.path).startswith(here) and not item.path.name.startswith("test_pure_"):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.slow)
            if not HAVE_RAY:
                item.add_marker(pytest.mark.skip(reason="Ray is not installed "
                                                        "(pip install corral[ray])"))


_RUNNING: list[Any] = []  # the cluster while it runs (at most one)


def _stop() -> None:
    """Disconnect and stop the cluster (once); the rest of the suite runs without it."""
    while _RUNNING:
        cluster = _RUNNING.pop()
        try:
            import ray
            if ray.is_initialized():
                ray.shutdown()
        finally:
            cluster.stop()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the cluster after the last test of this folder, not at the end of the whole
    session: the tests after these do not share the machine with a Ray cluster."""
    here = os.path.dirname(__file__)
    if _RUNNING and (nextitem is None or not str(nextitem.path).startswith(here)):
        _stop()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """The running cluster (a LocalCluster), with this process connected to it. Started
    once per session; stopped after the last test of this folder (or at the session's
    end)."""
    import warnings

    from corral.providers.ray.cluster import LocalCluster
    cluster = LocalCluster(workers=2, head_cpus=0, port=6391)
    cluster.start()
    _RUNNING.append(cluster)
    old = {k: os.environ.get(k) for k in ("RAY_USAGE_STATS_ENABLED", "RAY_AUTH_MODE")}
    os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import ray
            ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False,
                     namespace="corral-tests")
        yield cluster
    finally:
        _stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
