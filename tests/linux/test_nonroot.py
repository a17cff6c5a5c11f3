"""Strict where users are not root (issue 16): without a delegated cgroup the default
spec runs (its defaults fit the host, and doctor says which limits it runs without),
a limit asked for is refused with the cause and the fix, and rlimit-only limits are
there to choose explicitly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.core.errors import ConfigInvalidError, CorralError, LevelNotSupportedError
from corral.core.result import Outcome
from corral.core.spec import ExecOpts, Level, SandboxLimits, SandboxSpec
from corral.providers.linux import LinuxProvider

PY = os.path.realpath(sys.executable)
#: an unprivileged uid every Debian has (nobody)
UID = 65534


@pytest.fixture(autouse=True)
def _sandbox_available(linux: object) -> None:
    """The linux fixture (tests/linux/conftest.py) skips where the host cannot sandbox."""


@pytest.fixture
def corral_as_nobody(nobody_python: tuple[str, str]
                     ) -> Callable[[list[str]], subprocess.CompletedProcess[str]]:
    """Run ``corral ARGS`` as uid 65534 (a copy of the package it can read)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to become an unprivileged user")
    py, src = nobody_python

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        code = (f"import sys; sys.path.insert(0, {src!r})\n"
                f"from corral.cli import main; sys.exit(main({args!r}))")
        return subprocess.run([py, "-I", "-c", code], user=UID, group=UID, extra_groups=[],
                              capture_output=True, text=True, timeout=60, cwd="/",
                              env={"PATH": "/usr/bin:/bin", "HOME": "/tmp",
                                   "LANG": "C.UTF-8"})
    return run


def test_without_a_cgroup_the_default_spec_runs_and_doctor_says_what_it_lacks(
        corral_as_nobody: Callable[[list[str]], subprocess.CompletedProcess[str]]) -> None:
    r = corral_as_nobody(["run", "--level", "strict", "--", "/usr/bin/id", "-u"])
    assert (r.returncode, r.stdout) == (0, "0\n"), r.stderr
    # never silently: the run says which default limits it goes without, and the way out
    assert "note: this sandbox has no memory or process-count limit" in r.stderr
    assert "--limits rlimit" in r.stderr
    doc = corral_as_nobody(["doctor", "--json"])
    linux = next(p for p in json.loads(doc.stdout)["providers"] if p["name"] == "linux")
    assert linux["usable"]
    assert "default spec runs without its default memory" in linux["summary"]


def test_a_limit_asked_for_is_refused_with_the_cause_and_the_fix(
        corral_as_nobody: Callable[[list[str]], subprocess.CompletedProcess[str]]) -> None:
    r = corral_as_nobody(["run", "--level", "strict", "--mem-mb", "100", "--", "/usr/bin/id"])
    assert r.returncode == 69
    msg = r.stderr.strip().splitlines()[-1]
    assert "limits.mem_mb" in msg and "cgroup memory" in msg and "fix:" in msg
    assert "limits_by='rlimit'" in msg
    assert len(msg) < 700, msg  # the cause and the fix, not the host's whole cgroup report


def test_rlimit_limits_are_enforced_per_command() -> None:
    """limits_by="rlimit": memory per process (RLIMIT_AS), processes for the sandbox
    (RLIMIT_NPROC), CPU per process (RLIMIT_CPU); the control without them shows each
    probe does what it says."""
    hog = "x = bytearray(200 << 20); print('allocated')"
    forks = ("import os, time\nn = 0\ntry:\n    while n < 40:\n        if os.fork() == 0:\n"
             "            time.sleep(3); os._exit(0)\n        n += 1\nexcept OSError:\n"
             "    pass\nprint(n)")
    spin = "while True: pass"

    async def go(limits: SandboxLimits) -> list[tuple[Outcome, int | None, str]]:
        out = []
        async with LinuxProvider(limits_by="rlimit", spares=0,
                                 default_limits=SandboxLimits()) as p:
            sb = await p.create(SandboxSpec(level=Level.STRICT, limits=limits))
            async with sb:
                for code in (hog, forks, spin):
                    try:
                        r = await sb.exec([PY, "-I", "-S", "-c", code],
                                          ExecOpts(timeout_ms=4000))
                    except CorralError as e:  # the error's result is the run
                        r = e.result or pytest.fail(f"no result on {e!r}")
                    out.append((r.outcome, r.exit_code, r.stdout_text + r.stderr_text))
        return out

    limited = asyncio.run(go(SandboxLimits(mem_mb=64, max_processes=8, cpu_ms=1000)))
    assert limited[0][1] == 1 and "MemoryError" in limited[0][2]
    assert limited[1][0] is Outcome.EXIT and int(limited[1][2]) <= 8 - 2  # agent + python
    assert limited[2][0] is Outcome.CPU_LIMIT
    control = asyncio.run(go(SandboxLimits()))
    assert "allocated" in control[0][2]
    assert int(control[1][2]) == 40
    assert control[2][0] is Outcome.TIMEOUT


def test_limits_by_is_checked() -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        LinuxProvider(limits_by="cgroups", spares=0)
    assert ei.value.field == "limits_by"


def test_fitted_defaults_are_said(tmp_path: Path) -> None:
    """Where no controller is usable (a cgroup root that does not exist stands in for a
    host without delegation) the memory and process defaults are left out and listed
    with the reason; asked explicitly, they are kept (and then refused at create)."""
    p = LinuxProvider(spares=0, cgroup_root={"memory": str(tmp_path / "none"),
                                             "pids": str(tmp_path / "none")})
    try:
        assert set(p.unenforced_defaults) == {"mem_mb", "max_processes"}
        assert all(p.unenforced_defaults.values())
        d = p.options.default_limits
        assert (d.mem_mb, d.max_processes, d.disk_mb) == (None, None, 256)
    finally:
        asyncio.run(p.aclose())
    q = LinuxProvider(spares=0, cgroup_root={"memory": str(tmp_path / "none")},
                      default_limits=SandboxLimits(mem_mb=128))
    try:
        assert q.unenforced_defaults == {} and q.options.default_limits.mem_mb == 128
    finally:
        asyncio.run(q.aclose())


def test_refusal_is_level_not_supported_naming_the_field() -> None:
    """The refusal stays the contract's error (the message shortened, not the type)."""
    p = LinuxProvider(spares=0)
    try:
        if "memory" in p._cgroups.support.available:
            pytest.skip("this host can enforce mem_mb by cgroup as this user")
        with pytest.raises(LevelNotSupportedError) as ei:
            p.plan(SandboxSpec(level=Level.STRICT, limits=SandboxLimits(mem_mb=64)))
        assert ei.value.field == "limits.mem_mb" and "fix:" in ei.value.detail
    finally:
        asyncio.run(p.aclose())


def test_the_cli_chooses_rlimits_explicitly(
        corral_as_nobody: Callable[[list[str]], subprocess.CompletedProcess[str]],
        nobody_python: tuple[str, str]) -> None:
    hog = "x = bytearray(300 << 20); print('allocated')"
    PY = nobody_python[0]  # an interpreter uid 65534 can run (tests/linux/conftest.py)
    r = corral_as_nobody(["run", "--level", "strict", "--limits", "rlimit", "--mem-mb", "64",
                          "--", PY, "-I", "-S", "-c", hog])
    assert r.returncode == 1 and "MemoryError" in r.stderr, (r.returncode, r.stderr)
    assert "note:" not in r.stderr  # every default is enforced, by rlimits
    control = corral_as_nobody(["run", "--level", "strict", "--limits", "rlimit", "--", PY,
                                "-I", "-S", "-c", hog])
    assert control.returncode == 0 and control.stdout == "allocated\n", control.stderr
