"""``corral run --image REF`` with a registry reference (issue 28, item 2): the image is
pulled from the loopback registry (the operator's allowlist names it) and is the strict
sandbox's root; a registry outside the list is refused before anything runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest
import regsupport as rs

from strict_tier import host_can_sandbox, needs_strict

pytestmark = [pytest.mark.linux, needs_strict(host_can_sandbox())]


@pytest.fixture
def xdg() -> Iterator[str]:
    """XDG_CACHE_HOME for the run: a dir the sandbox's own uid can walk to."""
    d = tempfile.mkdtemp(prefix="corral-run-image-", dir="/var/tmp")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_corral_run_image_pulls_and_runs_in_the_image(plain_registry: rs.Registry,
                                                      xdg: str) -> None:
    img = rs.busybox_image({"app/hello.txt": "pulled\n"})
    digest = plain_registry.push("corral/root", "1", img)
    host = plain_registry.host
    argv = [sys.executable, "-m", "corral", "run", "--json", "--image", f"{host}/corral/root:1",
            "--", "sh", "-c", "pwd; cat hello.txt; ls /"]
    env = {**os.environ, "XDG_CACHE_HOME": xdg, "CORRAL_REGISTRIES": "registry.example"}
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                             check=False)
    assert refused.returncode == 64 and "not one the operator allows" in refused.stderr
    env["CORRAL_REGISTRIES"] = f"http://{host}"
    for ref in (f"{host}/corral/root:1", f"{host}/corral/root@{digest}"):
        argv[6] = ref
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                              check=False)
        assert done.returncode == 0, done.stderr
        lines = json.loads(done.stdout)["stdout"].splitlines()
        assert lines[:2] == ["/app", "pulled"]  # the image's WorkingDir and file
        assert "usr" not in lines and {"bin", "etc", "work", "tmp"} <= set(lines)
