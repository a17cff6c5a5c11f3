"""Nothing of a run outlives it: the supervisor holds the tree with the kernel, no marker.

The runner used to find escaped descendants by a ``CORRAL_RUN_TOKEN`` in
their environment: a daemon that scrubbed its environment escaped, the token
leaked into the child's environment, and a SIGKILL of the calling process
left the child running with no timeout. Now a supervisor (a child subreaper
that dies with the runner) holds the tree; see ``corral.runner.tree``.

Every process started here is bounded (sleeps of at most 30 s) and killed by
pid in a ``finally`` (the ``argv_token`` fixture kills by argv as well).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.run.bounded import Outcome, run_bounded

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the supervisor needs prctl (Linux)")

PY = sys.executable


def _scrubbed_daemon(pidfile: str, token: str, then: str = "") -> str:
    """Python code: double-fork a setsid daemon that execs with an empty environment.

    The daemon writes its pid to ``pidfile`` (and carries ``token`` in its
    argv, so the fixture can find it); the code prints once it is running.
    """
    daemon = ("import os,time\n"
              f"open({pidfile!r} + '.tmp','w').write(str(os.getpid()))\n"
              f"os.rename({pidfile!r} + '.tmp', {pidfile!r})\n"
              "time.sleep(30)\n")
    return (
        "import os,sys,time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.environ.clear()\n"
        "        n = os.open('/dev/null', os.O_RDWR)\n"  # a daemon lets go of the pipes
        "        for i in range(3): os.dup2(n, i)\n"
        f"        os.execve({PY!r}, [{PY!r}, '-I', '-S', '-c', {daemon!r}, {token!r}], {{}})\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        f"while not os.path.exists({pidfile!r}): time.sleep(0.01)\n"
        "print('daemon started', flush=True)\n"
        f"{then}\n"
    )


def _read_pid(path: Path) -> int:
    return int(path.read_text())


def _alive(pid: int) -> bool:
    """Running (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2:].split()[0] != b"Z"


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _env_of(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


def test_control_a_scrubbed_daemon_outlives_a_plain_subprocess(
        tmp_path: Path, argv_token: str) -> None:
    """Without the runner, the daemon lives on: what the runner tests below prevent."""
    pidfile = tmp_path / "daemon.pid"
    daemon = 0
    try:
        p = subprocess.run([PY, "-I", "-S", "-c", _scrubbed_daemon(str(pidfile), argv_token)],
                           capture_output=True, timeout=20, check=False)
        assert p.stdout == b"daemon started\n", p.stderr
        daemon = _read_pid(pidfile)
        time.sleep(0.2)
        assert _alive(daemon)
        assert _env_of(daemon) == b""  # it scrubbed everything: no marker could find it
    finally:
        if daemon:
            _kill([daemon])


@pytest.mark.parametrize(("then", "outcome"), [
    ("", Outcome.EXIT),
    ("time.sleep(30)", Outcome.TIMEOUT),
])
def test_scrubbed_setsid_daemon_dies_with_the_run(
        tmp_path: Path, argv_token: str, wait_gone: Callable[[str], list[int]],
        then: str, outcome: Outcome) -> None:
    pidfile = tmp_path / "daemon.pid"
    try:
        r = run_bounded(PY, ["-I", "-S", "-c", _scrubbed_daemon(str(pidfile), argv_token, then)],
                        timeout_ms=3000, grace_period_ms=100)
        assert r.outcome is outcome, r.stderr_text
        assert r.stdout_text == "daemon started\n"
        assert r.strays_killed >= 1  # the daemon left the group: a stray, and counted
        daemon = _read_pid(pidfile)
        assert not _alive(daemon)  # killed and reaped before run_bounded returned
        assert wait_gone(argv_token) == []
    finally:
        if pidfile.exists():
            _kill([_read_pid(pidfile)])


_CALLER = """
import sys
from corral.run.bounded import run_bounded
code, timeout_ms = sys.argv[1], int(sys.argv[2])
run_bounded(sys.executable, ["-I", "-S", "-c", code], timeout_ms=timeout_ms)
"""


_CLI = "import sys; from corral.cli import main; sys.exit(main(sys.argv[1:]))"


#: the same, with the supervisor forked by the caller's spawn helper (issue 26: the first
#: run of a process forks it from the caller while the helper starts); the helper's pid
#: goes to the file named by the third argument
_HELPED = _CALLER.replace("run_bounded(sys.executable", (
    "from corral.runner.tree import spawn_helper_pid, warm_spawn_helper\n"
    "assert warm_spawn_helper(30)\n"
    "open(sys.argv[3], 'w').write(str(spawn_helper_pid()))\n"
    "run_bounded(sys.executable"))


@pytest.mark.parametrize("caller_kind", ["run_bounded", "run_bounded+mem_mb", "corral run",
                                         "run_bounded, spawn helper"])
def test_sigkill_of_the_caller_kills_the_tree(
        tmp_path: Path, argv_token: str, caller_kind: str) -> None:
    """The process calling run_bounded (or ``corral run``) is SIGKILLed: its child tree dies too.

    The command writes its own pid, double-forks a scrubbed daemon (pid in a
    file too), then sleeps; the run's timeout (25 s; 60 s for the CLI's
    default) is far beyond the wait here (5 s), so only the caller's death
    can end them. ``mem_mb`` puts the rlimit trampoline in the chain. The
    run's own temp dir (its cwd) is removed too: by the supervisor, which finds
    nobody reading its report.
    """
    pidfile = tmp_path / "daemon.pid"
    cmdfile = tmp_path / "command.pid"
    cwdfile = tmp_path / "cwd"  # the run's own temp dir, written before the pid
    code = (f"import os; open({str(cwdfile)!r},'w').write(os.getcwd())\n"
            f"open({str(cmdfile)!r},'w').write(str(os.getpid()))\n"
            + _scrubbed_daemon(str(pidfile), argv_token, "time.sleep(30)"))
    helperfile = tmp_path / "helper.pid"
    if caller_kind == "corral run":
        argv = [PY, "-c", _CLI, "run", "--level", "context-isolated", "--", PY, "-I", "-S",
                "-c", code]
    elif caller_kind == "run_bounded, spawn helper":
        argv = [PY, "-c", _HELPED, code, "25000", str(helperfile)]
    else:
        caller_code = _CALLER if caller_kind == "run_bounded" else _CALLER.replace(
            "timeout_ms=timeout_ms)", "timeout_ms=timeout_ms, mem_mb=512)")
        argv = [PY, "-c", caller_code, code, "25000"]
    caller = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while not (pidfile.exists() and cmdfile.exists() and cmdfile.read_text()):
            assert caller.poll() is None, caller.stderr.read() if caller.stderr else b""
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.02)
        pids = [_read_pid(cmdfile), _read_pid(pidfile)]
        if helperfile.exists():  # the helper ends with its caller too
            pids.append(_read_pid(helperfile))
        assert all(_alive(p) for p in pids)
        caller.kill()  # SIGKILL: no finally, no atexit, no cleanup in the caller
        caller.wait(timeout=10)
        deadline = time.monotonic() + 15  # far below the run's own timeout; a loaded host is slow
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [p for p in pids if _alive(p)] == []
        # the run's own temp dir: nobody is left to remove it but the supervisor
        run_dir = cwdfile.read_text()
        assert os.path.basename(run_dir).startswith("corral-run-")
        while os.path.lexists(run_dir) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not os.path.lexists(run_dir), f"the run's temp dir {run_dir} was left"
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait(timeout=10)
        if caller.stderr is not None:
            caller.stderr.close()
        _kill(pids)


def test_no_corral_variable_in_the_childs_environment() -> None:
    r = run_bounded("/usr/bin/env", timeout_ms=5000, env={"MINE": "1"})
    names = {line.split("=", 1)[0] for line in r.stdout_text.splitlines()}
    assert names <= {"MINE", "PATH", "HOME", "TMPDIR"}, names
    assert not any(n.startswith("CORRAL") for n in names)
    assert "CORRAL_RUN_TOKEN" not in r.stdout_text


def test_the_callers_process_is_not_made_a_subreaper(
        tmp_path: Path, argv_token: str) -> None:
    r = run_bounded("/bin/true", timeout_ms=5000)
    assert r.outcome is Outcome.EXIT
    libc = ctypes.CDLL(None, use_errno=True)
    flag = ctypes.c_int(-1)
    assert libc.prctl(37, ctypes.byref(flag), 0, 0, 0) == 0  # PR_GET_CHILD_SUBREAPER
    assert flag.value == 0


def test_the_supervisor_is_reaped_and_holds_no_fd_of_the_caller(tmp_path: Path) -> None:
    """The command sees only fds 0-2 (the supervisor closed the caller's others)."""
    before = _my_children()
    keep = open(tmp_path / "held", "w")  # noqa: SIM115 - an fd of the caller, inheritable
    os.set_inheritable(keep.fileno(), True)
    try:
        code = "import os; print(sorted(os.listdir('/proc/self/fd')))"
        r = run_bounded(PY, ["-I", "-S", "-c", code], timeout_ms=5000)
    finally:
        keep.close()
    assert r.outcome is Outcome.EXIT and r.exit_code == 0, r.stderr_text
    # 0-2 plus the one listdir itself opens
    assert len(eval(r.stdout_text)) == 4, r.stdout_text
    assert _my_children() <= before  # the supervisor was reaped: no new child of ours


def _my_children() -> set[int]:
    me = os.getpid()
    out: set[int] = set()
    for tid in os.listdir(f"/proc/{me}/task"):
        with open(f"/proc/{me}/task/{tid}/children") as f:
            out.update(int(x) for x in f.read().split())
    return out


def test_a_command_that_kills_its_supervisor_still_ends_the_run(
        argv_token: str, wait_gone: Callable[[str], list[int]]) -> None:
    """The documented gap, bounded: the runner sees the supervisor die without a
    report, SIGKILLs the command's group, and returns a result with no exit code."""
    # never the test process itself (without a supervisor the parent would be us)
    code = (f"import os,time\nif os.getppid() != {os.getpid()}: os.kill(os.getppid(), 9)\n"
            "time.sleep(30)")
    r = run_bounded(PY, ["-I", "-S", "-c", code, argv_token], timeout_ms=20_000)
    assert r.outcome is Outcome.EXIT and r.exit_code is None and r.duration_ms < 10_000
    assert wait_gone(argv_token) == []


def test_a_stuck_supervisor_does_not_hang_the_run(
        argv_token: str, wait_gone: Callable[[str], list[int]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """If the supervisor never finishes killing (a stray stuck in the kernel),
    the run still ends: the runner SIGKILLs the supervisor and the command's group.

    The supervisor is a fork of this process, so patching ``_kill_all`` here
    makes it sleep instead of killing; the waits are shortened to keep the
    test quick.
    """
    import corral.runner.engine as engine
    import corral.runner.tree as tree

    # the patch reaches a supervisor forked from here: not one the spawn helper forks
    monkeypatch.setattr(tree._HELPER, "_off", True)
    monkeypatch.setattr(tree, "_kill_all", lambda pid: time.sleep(30))
    monkeypatch.setattr(tree, "_REAP_WAIT_S", 0.3)
    monkeypatch.setattr(engine, "_KILL_WAIT_S", 0.3)
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"
    t0 = time.monotonic()
    r = run_bounded(PY, ["-I", "-S", "-c", code, argv_token], timeout_ms=300,
                    grace_period_ms=100)
    assert time.monotonic() - t0 < 10
    assert r.outcome is Outcome.TIMEOUT and r.exit_code is None
    assert wait_gone(argv_token) == []
