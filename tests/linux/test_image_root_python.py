"""The image root with the image's own interpreter (issue 28, item 2, "Must show"):
``corral run --image ROOT -- python3 -c 'import numpy'`` where the host has no numpy,
the probe suite (tests/linux/test_probes.py) and the conformance kit
(``corral.testing.check_provider``) run with every sandbox's root the image.

The image is **the one slow build** of the suite (marked ``image_build``): a Debian
bookworm minbase root with ``python3`` and ``python3-numpy``, debootstrapped from the
host's Debian mirror on first use (about a minute) and cached under
``/var/cache/corral-images-test/<key of its inputs>`` (imageroot_support.py), so a
second run takes it from there. Skipped where it cannot be built (not root, no
debootstrap), failed under CORRAL_REQUIRE_STRICT=1 like every strict test.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
import test_probes
from imageroot_support import python_numpy_rootfs

# the probe suite, collected here a second time: run with the image as the root
from test_probes import (  # noqa: F401
    canary,
    host_listeners,
    host_sleeper,
    test_canary_read,
    test_commands_cannot_reach_the_agent,
    test_connect_host_loopback,
    test_cpu_limit,
    test_disk_limit,
    test_double_forked_survivor_dies_with_the_sandbox,
    test_env_network_and_identity,
    test_host_processes,
    test_kernel_surface,
    test_memory_limit,
    test_output_flood,
    test_process_limit,
    test_raw_sockets,
    test_symlink_out,
    test_write_outside_work_dir,
)

from corral.testing import KitOptions, check_provider
from strict_tier import host_can_sandbox, needs_strict, unavailable

pytestmark = [pytest.mark.linux, pytest.mark.image_build, needs_strict(host_can_sandbox())]


@pytest.fixture(scope="module")
def numpy_root() -> str:
    try:
        root = python_numpy_rootfs()
    except RuntimeError as e:
        unavailable(f"the python3-numpy test image could not be built: {e}")
    if root is None:
        unavailable("the python3-numpy test image needs root and debootstrap")
    return root


#: the image's own interpreter: the probes run with it (their controls with the host's)
IMAGE_PY = "/usr/bin/python3"


@pytest.fixture(autouse=True)
def _probes_in_the_image(numpy_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_probes, "IMAGE", numpy_root)
    monkeypatch.setattr(test_probes, "SANDBOX_PY", IMAGE_PY)


def test_the_images_python_imports_a_package_the_host_lacks(numpy_root: str) -> None:
    code = "import numpy, sys; print(numpy.__version__, sys.prefix)"
    # the control: a python of this host without numpy (the running one, or Debian's
    # own where the running one has it, as a pyenv build with numpy installed does)
    for py in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        host = subprocess.run([py, "-I", "-c", code], capture_output=True, text=True,
                              timeout=60, check=False)
        if host.returncode != 0:
            break
    assert host.returncode != 0 and "No module named 'numpy'" in host.stderr  # control
    done = subprocess.run([sys.executable, "-m", "corral", "run", "--level", "strict",
                           "--image", numpy_root, "--", "python3", "-c", code],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    version, prefix = done.stdout.split()
    assert version.split(".")[0].isdigit() and prefix == "/usr"


def test_the_conformance_kit_with_the_image_as_the_root(numpy_root: str) -> None:
    from corral.providers.linux import LinuxProvider

    async def go() -> None:
        async with LinuxProvider() as p:
            await check_provider(p, KitOptions(
                python=IMAGE_PY, image=numpy_root,
                supports_limits={"mem_mb", "cpu_ms", "disk_mb", "max_processes"}))
    asyncio.run(go())


def test_the_probes_ran_in_the_image(numpy_root: str) -> None:
    # the suite above really had the image as its root: a marker only the image has
    res = test_probes.run_sandboxed("baseline.py", {})
    assert res.exit_code == 0, res.stderr_text

    async def look() -> bytes:
        async with test_probes.strict_sandbox() as sb:
            r = await sb.exec([IMAGE_PY, "-c",
                               "import os; print(os.path.exists('/usr/lib/python3/dist-packages/"
                               "numpy'))"])
            return bytes(r.stdout)
    assert asyncio.run(look()).strip() == b"True"
