"""The strict tier: tests that need the strict (linux) provider working on this host.

Where the strict provider cannot run (no user namespaces, no seccomp filter for the
arch, no usable cgroups ...) such a test is skipped with the reason, unless
``CORRAL_REQUIRE_STRICT=1``: then it fails with the reason instead, so a run that is
meant to cover the strict provider (CI sets the variable) cannot pass without it.

Use :func:`needs_strict` as a mark (the ``strict_tier`` marker, acted on by this
module's hooks, which ``tests/conftest.py`` installs) or call :func:`unavailable`
where a test finds out late. Skips that are not about the strict provider being
usable (not root, a v2-only test on a v1 host, an optional capability such as the
freezer) stay plain skips.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import pytest

__all__ = ["ENV", "cgroup_limits_reason", "host_can_sandbox", "needs_cgroup_limits",
           "needs_strict", "pytest_configure", "pytest_runtest_setup", "required", "unavailable"]

#: set to 1 to turn every strict-tier skip into a failure
ENV = "CORRAL_REQUIRE_STRICT"


def required() -> bool:
    """Whether the strict tier must run (``CORRAL_REQUIRE_STRICT=1``)."""
    return os.environ.get(ENV, "") == "1"


def unavailable(reason: str) -> NoReturn:
    """Skip the current test because the strict provider cannot run here, or fail it
    with the same reason under ``CORRAL_REQUIRE_STRICT=1``."""
    if required():
        pytest.fail(f"{ENV}=1 but the strict tier cannot run here: {reason}", pytrace=False)
    pytest.skip(reason)


def needs_strict(reason: str) -> pytest.MarkDecorator:
    """Mark a test (or module, or param) that needs the strict provider; ``reason`` is
    why it cannot run here ("" when it can: the mark then does nothing)."""
    return pytest.mark.strict_tier(reason)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"strict_tier(reason): needs the strict provider; skipped with the reason "
        f"when it cannot run here, failed under {ENV}=1")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("strict_tier"):
        reason = str(mark.args[0]) if mark.args else ""
        if reason:
            unavailable(reason)


def host_can_sandbox() -> str:
    """"" if this host has the kernel primitives LinuxProvider needs, else why not."""
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


_cgroup_reason: str | None = None


def cgroup_limits_reason() -> str:
    """"" if this host's cgroups can enforce the limits tests ask for (memory with swap,
    pids, cpu) for this uid, else why not. A non-root user with nothing delegated is
    such a host: the provider refuses those limits there (LevelNotSupportedError), so
    a test that needs them is skipped with this reason (failed under
    ``CORRAL_REQUIRE_STRICT=1``). Computed once."""
    global _cgroup_reason
    if _cgroup_reason is None:
        _cgroup_reason = host_can_sandbox()
        if not _cgroup_reason:
            from corral.providers.linux.host.cgroups import detect
            support = detect(prefix="corraltest")
            if not support.available >= {"memory", "memsw", "pids", "cpu"}:
                _cgroup_reason = ("needs cgroup limits (memory+swap, pids, cpu): "
                                  + support.describe())
    return _cgroup_reason


def needs_cgroup_limits() -> pytest.MarkDecorator:
    """Mark a test that asks for ``mem_mb``, ``max_processes`` or ``cpu_ms`` at strict
    (or counts the processes a provider's cgroups hold)."""
    return needs_strict(cgroup_limits_reason())
