"""``corral run -- CMD``'s level when none is given (issue 27, item 2).

It was context-isolated, which the command's own help calls NOT a security boundary.
Now it is strict where this host can run strict (the doctor's verdict for the linux
provider), through the same one-shot fast path as ``--level strict``; where it cannot,
the run falls back to context-isolated only with a warning on stderr (and in the
``--json`` result / an ``--events`` event) that says why and how to choose a level on
purpose, and a run that asked for something only strict gives stays strict.

"Strict cannot run here" is made real, not mocked: the CLI runs as root of a user
namespace whose ``user.max_user_namespaces`` is 0, so it can make no namespace of its
own (the doctor then says "missing user namespace")."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import pytest

from corral.cli import _parser, main
from corral.cli.run import default_level
from strict_tier import host_can_sandbox, needs_strict

CORRAL = [sys.executable, "-c", "import sys, _corral_cli; sys.exit(_corral_cli.main())"]


def corral(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CORRAL, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd="/")


@needs_strict(host_can_sandbox())
def test_the_default_level_is_strict_in_the_result_and_the_events() -> None:
    r = corral("run", "--json", "--", "/bin/true")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["level"] == "strict" and "warnings" not in doc
    assert doc["cwd"] == "/work"                 # the sandbox's, not a host temp dir
    assert "warning" not in r.stderr
    r = corral("run", "--events", "--", "/bin/true")
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["event"] for e in events] == ["start", "result"]
    assert events[0]["level"] == "strict" and events[1]["level"] == "strict"


@needs_strict(host_can_sandbox())
def test_the_default_level_takes_the_fast_path() -> None:
    """Piped, a plain `corral run -- CMD` is built by the one-shot path, as `--level
    strict` is (benchmarks/bench_strict.py compares their times)."""
    r = corral("run", "--", "/usr/bin/id", "-u", env={"CORRAL_CLI_TRACE": "1"})
    assert r.returncode == 0, r.stderr
    assert "corral: trace: one-shot path" in r.stderr
    # the sandbox's root is uid 0 inside, whatever the caller is
    assert r.stdout == "0\n"


def _no_userns() -> list[str]:
    """argv prefix: run as root of a user namespace that may make none of its own."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) on this host")
    probe = subprocess.run([unshare, "--user", "--map-root-user", "true"],
                           capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("this host gives this user no user namespace at all: "
                    + probe.stderr.decode(errors="replace").strip())
    return [unshare, "--user", "--map-root-user", "sh", "-c",
            'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', "sh"]


def test_where_strict_cannot_run_the_fallback_is_said_with_why() -> None:
    pre = _no_userns()
    r = subprocess.run([*pre, *CORRAL, "run", "--", "/bin/echo", "hi"], capture_output=True,
                       text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hi\n"
    warning = [ln for ln in r.stderr.splitlines() if ln.startswith("corral: warning:")]
    assert len(warning) == 1, r.stderr
    assert "running at context-isolated, NOT a security boundary" in warning[0]
    assert "missing user namespace" in warning[0]            # why, as `corral doctor` says
    assert "--level context-isolated" in warning[0]          # how to choose it and silence it

    r = subprocess.run([*pre, *CORRAL, "run", "--json", "--", "/bin/true"],
                       capture_output=True, text=True, timeout=120, cwd="/")
    doc = json.loads(r.stdout)
    assert doc["level"] == "context-isolated"
    assert len(doc["warnings"]) == 1 and "missing user namespace" in doc["warnings"][0]
    assert "corral: warning:" in r.stderr

    r = subprocess.run([*pre, *CORRAL, "run", "--events", "--", "/bin/true"],
                       capture_output=True, text=True, timeout=120, cwd="/")
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["event"] for e in events] == ["warning", "start", "result"]
    assert events[1]["level"] == "context-isolated"

    # chosen on purpose: no warning
    r = subprocess.run([*pre, *CORRAL, "run", "--level", "context-isolated", "--",
                        "/bin/true"], capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_where_strict_cannot_run_a_snippet_is_refused_not_run_weaker() -> None:
    pre = _no_userns()
    r = subprocess.run([*pre, *CORRAL, "python", "1 + 1"], capture_output=True, text=True,
                       timeout=120, cwd="/")
    assert r.returncode == 69, (r.stdout, r.stderr)
    assert "corral: level-not-supported:" in r.stderr
    assert "missing user namespace" in r.stderr and "--level context-isolated" in r.stderr
    r = subprocess.run([*pre, *CORRAL, "python", "--level", "context-isolated", "1 + 1"],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0 and "=> 2" in r.stdout, r.stderr


def _args(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["run", *argv, "--", "/bin/true"])


def test_the_decision() -> None:
    usable = lambda: (True, "every boundary and limit enforced")  # noqa: E731
    unusable = lambda: (False, "strict not usable here: missing seccomp")  # noqa: E731
    assert default_level(_args(), usable) == ("strict", None)
    level, warning = default_level(_args(), unusable)
    assert level == "context-isolated"
    assert warning is not None and "missing seccomp" in warning
    assert "NOT a security boundary" in warning and "--level context-isolated" in warning
    # asked for what only strict gives: strict is kept (and the run says why it cannot)
    for extra in (["--bind", "/usr"], ["--ro-bind", "/usr"], ["--allow-host", "a.example"],
                  ["--network", "none"], ["--max-processes", "4"], ["--disk-mb", "8"],
                  ["--limits", "rlimit"]):
        assert default_level(_args(*extra), unusable) == ("strict", None), extra


def test_help_says_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "strict (the default where this host can run it" in text
    assert "falls back to context- isolated with a warning" in text  # wrapped at the -
