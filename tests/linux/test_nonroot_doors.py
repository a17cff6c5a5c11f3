"""Every door as a user who is not root (issue 26): ``corral python``, ``run_snippet``
and the MCP tool ``run_in_sandbox`` run at the strongest level that user has, say how
they hold memory, processes and cpu, and ``corral doctor`` says the same.

Run as root, each test drops to uid 65534 (a copy of the package it can read, and
``/usr/bin/python3``-reachable interpreter: conftest's ``nobody_python``); run as a user
(the v2 guest's shapes c and e, scripts/test-v2.sh), as that user itself. Here (cgroup
v1, root-owned hierarchies) uid 65534 has no cgroup: the doors fall back to rlimits per
process and say so; in shape c (a delegated cgroup v2) they hold limits by cgroup.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.providers.linux.host.cgroups import detect

PY = os.path.realpath(sys.executable)
UID = 65534
ROOT = os.geteuid() == 0

AsUser = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(autouse=True)
def _sandbox_available(linux: object) -> None:
    """The linux fixture (tests/linux/conftest.py) skips where the host cannot sandbox."""


def _user_path() -> list[str]:
    """sys.path entries a user process needs: the package's copy (root) or the checkout."""
    import corral
    return [str(Path(corral.__file__).parent.parent)]


@pytest.fixture
def as_user(nobody_python: tuple[str, str]) -> AsUser:
    """``as_user(code)`` / ``as_user(code, cli=[...])``: Python ``code`` (or ``corral
    ARGS``) run as a user that is not root: uid 65534 when the tests run as root, this
    uid otherwise."""
    py, src = nobody_python if ROOT else (PY, _user_path()[0])

    def run(code: str = "", *, cli: list[str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        if cli is not None:
            code = f"from corral.cli import main; sys.exit(main({cli!r}))"
        body = f"import sys; sys.path.insert(0, {src!r})\n{code}"
        extra: dict[str, Any] = ({"user": UID, "group": UID, "extra_groups": []} if ROOT
                                 else {})
        return subprocess.run([py, "-I", "-c", body], capture_output=True, text=True,
                              timeout=timeout, cwd="/", env={
                                  "PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"},
                              **extra)
    return run


def _doctor(as_user: AsUser) -> dict[str, Any]:
    r = as_user(cli=["doctor", "--json"])
    assert r.returncode == 0, r.stderr
    report: dict[str, Any] = json.loads(r.stdout)
    return report


def _linux(report: dict[str, Any]) -> dict[str, Any]:
    linux: dict[str, Any] = next(p for p in report["providers"] if p["name"] == "linux")
    return linux


def test_corral_python_runs_at_the_strongest_and_doctor_says_the_same(
        as_user: AsUser) -> None:
    report = _doctor(as_user)
    linux = _linux(report)
    assert report["host"]["uid"] != 0
    assert linux["usable"], linux["summary"]
    r = as_user(cli=["python", "--json", "sum(range(10))"])
    assert r.returncode == 0, r.stderr  # was 69: level-not-supported on mem_mb, max_processes
    t = json.loads(r.stdout)
    assert (t["result"], t["level"], t["errors"]) == ("45", "strict", [])
    # how the run was held is what doctor says for this user
    assert t["limits"]["memory"] == linux["limits"]["memory"]
    assert t["limits"]["processes"] == linux["limits"]["processes"]
    cg = report["host"]["cgroups"]
    if {"memory", "memsw", "pids"} <= set(cg["available"]):
        assert linux["limits_by"] == "cgroup"
        assert t["limits"]["memory"].startswith(f"cgroup {cg['version']} memory+swap")
        assert "note: limits" not in r.stderr
    else:
        assert linux["limits_by"] == "rlimit"
        assert t["limits"]["memory"] == "rlimit per process (no delegated cgroup)"
        assert "rlimits per process (no delegated cgroup)" in linux["summary"]
        # and the text form says it too, on stderr
        text = as_user(cli=["python", "sum(range(10))"])
        assert text.returncode == 0 and text.stdout.startswith("=> 45"), text.stderr
        assert ("corral: note: limits: memory: rlimit per process (no delegated cgroup)"
                in text.stderr)


def test_cgroup_limits_asked_for_are_refused_where_the_user_has_none(
        as_user: AsUser) -> None:
    linux = _linux(_doctor(as_user))
    r = as_user(cli=["python", "--limits", "cgroup", "sum(range(10))"])
    if linux["limits_by"] == "cgroup":
        assert r.returncode == 0 and r.stdout.startswith("=> 45"), r.stderr
        return
    # never silently weaker: asked for cgroup limits, refused naming what is missing
    assert r.returncode == 69, (r.returncode, r.stdout, r.stderr)
    msg = r.stderr.strip().splitlines()[-1]
    assert "level-not-supported" in msg and "cgroup memory" in msg and "fix:" in msg
    explicit = as_user(cli=["python", "--limits", "rlimit", "sum(range(10))"])
    assert explicit.returncode == 0 and explicit.stdout.startswith("=> 45"), explicit.stderr


def test_doctor_names_the_hierarchy_that_holds_the_controllers(as_user: AsUser) -> None:
    """On a host whose memory controller is bound to cgroup v1, a user is told v1 and a
    fix that can work there, never the systemd v2 delegation (which cannot bring it)."""
    report = _doctor(as_user)
    cg = report["host"]["cgroups"]
    row = next(c for c in report["host"]["checks"] if c["name"] == "cgroups")
    here = detect()  # this process's view (root: the same host's hierarchies)
    if ROOT and here.version == "v1":
        assert cg["version"] == "v1", cg
    if cg["version"] == "v1" and not cg["available"]:
        assert not row["ok"]
        assert "systemd-run" not in row["detail"] and "Delegate=yes" not in row["detail"]
        assert "cgroup_root" in row["detail"]
    elif cg["version"] == "v2" and not {"memory", "pids"} <= set(cg["available"]):
        assert "Delegate=yes" in row["detail"]  # v2: delegation is the fix


_SNIPPET = """
import asyncio, json
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet

async def main(mem_mb):
    pool = SnippetPool(mem_mb=mem_mb, spares=0, max_workers=1)
    try:
        t = await run_snippet("x = bytearray(200 << 20)\\nlen(x)", pool=pool,
                              timeout_ms=8000)
    finally:
        await pool.aclose()
    return {"result": t.result, "errors": [e.type for e in t.errors], "level": t.level.value,
            "limits": dict(t.limits)}

print(json.dumps([asyncio.run(main(64)), asyncio.run(main(512))]))
"""


def test_run_snippet_holds_memory_for_a_user(as_user: AsUser) -> None:
    """run_snippet as the user: a 200 MiB allocation fails under a 64 MiB pool and
    succeeds under 512 MiB (the control: the probe allocates for real), at strict, held
    the way doctor says."""
    linux = _linux(_doctor(as_user))
    r = as_user(_SNIPPET, timeout=180)
    assert r.returncode == 0, r.stderr
    held, control = json.loads(r.stdout.strip().splitlines()[-1])
    assert held["level"] == control["level"] == "strict"
    assert held["errors"] == ["MemoryError"] and held["result"] is None
    assert control["errors"] == [] and control["result"] == str(200 << 20)
    assert held["limits"]["memory"] == linux["limits"]["memory"]


def _mcp_site() -> str | None:
    """The dir holding the MCP SDK, if the user can read it (root drops to 65534)."""
    try:
        import mcp
        from mcp import Client  # noqa: F401  (not tests/mcp, a namespace package)
    except ImportError:
        return None
    where = getattr(mcp, "__file__", None)
    return str(Path(where).parent.parent) if where else None


def test_mcp_run_in_sandbox_for_a_user(nobody_python: tuple[str, str]) -> None:
    """The MCP tool through the SDK's own client, ``corral mcp`` on stdio started as the
    user. It runs at the strongest the user has once the MCP server's provider takes
    ``limits_by="auto"`` (``corral.provider(level=..., limits_by="auto")``)."""
    site = _mcp_site()
    if site is None:
        pytest.skip("the mcp extra is not installed")
    from mcp import Client, StdioServerParameters
    py, src = nobody_python if ROOT else (PY, _user_path()[0])
    code = (f"import sys; sys.path[:0] = [{src!r}, {site!r}]\n"
            "from corral.cli import main; sys.exit(main(['mcp']))")
    argv = [py, "-I", "-c", code]
    if ROOT:
        argv = ["/usr/bin/setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
                *argv]
    params = StdioServerParameters(command=argv[0], args=argv[1:], cwd="/",
                                   env={"PATH": "/usr/bin:/bin", "HOME": "/tmp",
                                        "LANG": "C.UTF-8"})

    async def main() -> dict[str, Any]:
        async with Client(params) as c:
            r = await c.call_tool("run_in_sandbox", {"source": "sum(range(10))"})
            out: dict[str, Any] = dict(r.structured_content or {})
            out["is_error"] = r.is_error
            return out

    t = asyncio.run(asyncio.wait_for(main(), 120))
    assert not t["is_error"], t
    assert (t["result"], t["level"]) == ("45", "strict")


def test_as_the_caller_too_the_transcript_says_what_doctor_says() -> None:
    """The same check as whoever runs the tests (root here: cgroup v1 limits)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
    cli = "import sys; from corral.cli import main; sys.exit(main(sys.argv[1:]))"
    doc = subprocess.run([sys.executable, "-c", cli, "doctor", "--json"],
                         capture_output=True, text=True, timeout=120, env=env)
    linux = _linux(json.loads(doc.stdout))
    r = subprocess.run([sys.executable, "-c", cli, "python", "--json", "sum(range(10))"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)
    assert t["result"] == "45" and t["level"] == "strict"
    assert {k: t["limits"][k] for k in ("memory", "processes")} == {
        k: linux["limits"][k] for k in ("memory", "processes")}
    if ROOT and detect().version == "v1":
        assert linux["limits_by"] == "cgroup"
        assert t["limits"]["memory"] == "cgroup v1 memory+swap for the whole sandbox"
