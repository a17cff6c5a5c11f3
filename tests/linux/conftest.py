"""Fixtures for the strict Linux provider's tests."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import h11
import pytest

import corral
from corral.core.spec import SandboxLimits, SandboxSpec
from strict_tier import host_can_sandbox, needs_strict, unavailable

#: why the strict provider cannot run here ("" when it can); a test that needs it is
#: skipped with this reason, or fails with it under CORRAL_REQUIRE_STRICT=1 (strict_tier.py)
SKIP_REASON = host_can_sandbox()
needs_sandbox = needs_strict(SKIP_REASON)


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
    """``linux(test, **provider_kwargs)``: run an async test against a LinuxProvider
    (skipped where it cannot run; failed instead under CORRAL_REQUIRE_STRICT=1)."""
    if SKIP_REASON:
        unavailable(SKIP_REASON)
    return run_with_provider


@pytest.fixture
def test_ca() -> Iterator[Callable[..., Any]]:
    """``test_ca(*names)``: a fresh CA and server certificate (``netservers.make_ca``)
    whose files, the private keys among them, are removed when the test ends, passed or
    failed."""
    from netservers import make_ca

    root = Path(tempfile.mkdtemp(prefix=f"corral-test-ca-{os.getpid()}-"))
    try:
        yield lambda *names: make_ca(*names, within=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


NOBODY = 65534


def _runs_as_nobody(py: str) -> bool:
    """True when uid 65534 can start ``py`` (and load its stdlib) from ``/``."""
    try:
        r = subprocess.run([py, "-I", "-S", "-c", "import os"], user=NOBODY, group=NOBODY,
                           extra_groups=[], capture_output=True, timeout=60, cwd="/",
                           env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def nobody_interpreter() -> tuple[str, str]:
    """(an interpreter of this Python version that uid 65534 can run, or "", why not).

    The test's own interpreter first; when it sits under a 0700 home (a pyenv build in
    /root/.pyenv: its binary, libpython and stdlib are all there), the system's
    python3.X of the same minor version, which runs the copied package the same way.
    """
    own = os.path.realpath(sys.executable)
    if _runs_as_nobody(own):
        return own, ""
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for d in ("/usr/bin", "/usr/local/bin", "/bin"):
        cand = os.path.join(d, minor)
        if os.access(cand, os.X_OK) and _runs_as_nobody(cand):
            return cand, ""
    return "", (f"uid {NOBODY} cannot run this interpreter ({own}: a parent directory is "
                f"not searchable by it) and no {minor} it can run is installed in /usr/bin "
                "or /usr/local/bin")


@pytest.fixture(scope="session")
def nobody_python() -> Iterator[tuple[str, str]]:
    """(interpreter, import root) that uid 65534 can reach, for tests that drop to it.

    The checkout (and its venv) may sit under a 0700 home such as /root, which
    another uid cannot walk: copy the corral package to a world-readable temp
    dir, and use the venv's real interpreter file if uid 65534 can run it, else a
    system interpreter of the same minor version (:func:`nobody_interpreter`); the
    test is skipped with the reason when there is none. Removed after the session.
    """
    if os.geteuid() != 0:
        pytest.skip("needs root, to become an unprivileged user")
    py, why = nobody_interpreter()
    if not py:
        pytest.skip(why)
    root = tempfile.mkdtemp(prefix="corral-nobody-")
    try:
        os.chmod(root, 0o755)
        shutil.copytree(Path(corral.__file__).parent, Path(root) / "corral",
                        ignore=shutil.ignore_patterns("__pycache__"))
        # and corral's runtime dependency (the egress proxy parses HTTP with h11)
        shutil.copytree(Path(h11.__file__).parent, Path(root) / "h11",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for d, dirs, files in os.walk(root):
            for name in dirs:
                os.chmod(os.path.join(d, name), 0o755)
            for name in files:
                os.chmod(os.path.join(d, name), 0o644)
        yield py, root
    finally:
        shutil.rmtree(root, ignore_errors=True)
