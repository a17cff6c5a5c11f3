"""Every termination path kills the whole tree, double-forked daemons included."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

from corral.run.bounded import Outcome, run_bounded

Py = Callable[[str], tuple[str, list[str]]]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the supervisor needs prctl (Linux)")


def _daemon_code(token: str, then: str) -> str:
    """Fork; the child calls setsid and forks a sleeper carrying ``token``, then exits."""
    sleeper = [sys.executable, "-I", "-S", "-c", "import time; time.sleep(30)", token]
    return (
        "import os,sys,time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv({sys.executable!r}, {sleeper!r})\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "time.sleep(0.2)\n"  # the daemon is re-parented and running
        "print('daemon started', flush=True)\n"
        f"{then}\n"
    )


@pytest.mark.parametrize(("then", "outcome"), [
    ("", Outcome.EXIT),
    ("time.sleep(30)", Outcome.TIMEOUT),
    ("sys.stdout.write('x' * 5000); sys.stdout.flush(); time.sleep(30)",
     Outcome.OVERFLOW_STDOUT),
])
@pytest.mark.slow
def test_double_forked_setsid_daemon_is_killed(
        py: Py, argv_token: str, wait_gone: Callable[[str], list[int]],
        then: str, outcome: Outcome) -> None:
    r = run_bounded(*py(_daemon_code(argv_token, then)), timeout_ms=2000,
                    grace_period_ms=100, max_stdout_bytes=4096)
    assert r.outcome is outcome
    assert r.stdout_text.startswith("daemon started")
    assert r.strays_killed >= 1
    assert wait_gone(argv_token) == []  # the fixture kills it if this fails


def test_background_job_in_the_group_is_killed_when_the_child_exits(
        py: Py, argv_token: str, wait_gone: Callable[[str], list[int]]) -> None:
    code = (f"import subprocess; subprocess.Popen([{sys.executable!r}, '-c', "
            f"'import time; time.sleep(30)', {argv_token!r}]); print('bg')")
    r = run_bounded(*py(code), timeout_ms=5000)
    assert r.outcome is Outcome.EXIT and r.exit_code == 0 and r.strays_killed == 0
    assert wait_gone(argv_token) == []


def test_a_stray_holding_the_pipe_does_not_hang_the_run(
        py: Py, argv_token: str, wait_gone: Callable[[str], list[int]]) -> None:
    # the daemon inherits stdout; the run still ends when the child does
    code = _daemon_code(argv_token, "")
    r = run_bounded(*py(code), timeout_ms=20_000)
    assert r.outcome is Outcome.EXIT and r.duration_ms < 10_000
    assert wait_gone(argv_token) == []


def test_strays_found_without_the_proc_children_file(
        py: Py, argv_token: str, wait_gone: Callable[[str], list[int]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import corral.runner.tree as tree

    # kernels without CONFIG_PROC_CHILDREN: the supervisor (a fork of this
    # process, so it sees the patch) finds its children by scanning /proc
    monkeypatch.setattr(tree, "_children", lambda: tree._children_by_scan(os.getpid()))
    r = run_bounded(*py(_daemon_code(argv_token, "")), timeout_ms=5000)
    assert r.outcome is Outcome.EXIT and r.strays_killed == 1
    assert wait_gone(argv_token) == []
