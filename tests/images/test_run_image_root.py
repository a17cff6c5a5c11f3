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


def test_a_reference_is_pulled_on_the_library_path_then_runs_one_shot(
        plain_registry: rs.Registry, xdg: str) -> None:
    # the one-shot path never pulls (pull_policy never): a reference the cache lacks goes
    # to the library path, which pulls it; the next run finds it and takes the fast path
    plain_registry.push("corral/oneshot", "1", rs.busybox_image({"app/hello.txt": "fast\n"}))
    entry = ("import sys, _corral_cli; sys.exit(_corral_cli.main(sys.argv[1:]))")
    argv = [sys.executable, "-c", entry, "run", "--image",
            f"{plain_registry.host}/corral/oneshot:1", "--", "cat", "hello.txt"]
    env = {**os.environ, "XDG_CACHE_HOME": xdg, "CORRAL_REGISTRIES": f"http://{plain_registry.host}",
           "CORRAL_CLI_TRACE": "1"}
    paths = []
    for _ in range(2):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                              stdin=subprocess.DEVNULL, check=False)
        assert done.returncode == 0 and done.stdout == "fast\n", done.stderr
        paths.append("corral: trace: one-shot path" in done.stderr)
    assert paths == [False, True]
