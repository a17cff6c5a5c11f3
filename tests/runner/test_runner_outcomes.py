"""One test (at least) per outcome of the bounded runner."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence

import pytest

from corral import (
    CancelToken,
    ConfigInvalidError,
    LimitsExceededError,
    ProviderError,
    SandboxCancelledError,
    SandboxTimeoutError,
)
from corral.run.bounded import (
    OUTCOME_EXIT_STATUS,
    Outcome,
    RunResult,
    exit_status_of,
    run_bounded,
    run_bounded_async,
    spawn_process,
)
from corral.runner.engine import exit_outcome
from corral.runner.tree import Supervised

Py = Callable[[str], tuple[str, list[str]]]


def test_exit_zero(py: Py) -> None:
    r = run_bounded(*py("print('hello')"), timeout_ms=5000)
    assert r.outcome is Outcome.EXIT and r.exit_code == 0 and r.signal is None
    assert r.stdout_text == "hello\n" and r.stdout == b"hello\n" and r.ok
    assert r.check() is r and exit_status_of(r) == 0
    assert r.usage.wall_ms >= 0 and r.duration_ms > 0


def test_exit_nonzero_is_not_an_error() -> None:
    r = run_bounded("/bin/sh", ["-c", "echo oops >&2; exit 7"], timeout_ms=5000)
    assert r.outcome is Outcome.EXIT and r.exit_code == 7 and r.exit_code == 7
    assert r.stderr_text == "oops\n" and not r.ok
    assert r.check() is r and exit_status_of(r) == 7


def test_exit_by_signal(py: Py) -> None:
    r = run_bounded(*py("import os,signal; os.kill(os.getpid(), signal.SIGTERM)"),
                    timeout_ms=5000)
    # the one result type: exit_code is the raw status (negative: the signal), as in subprocess
    assert r.outcome is Outcome.EXIT and not r.ok
    assert r.signal == "SIGTERM" and r.exit_code == -signal.SIGTERM
    assert exit_status_of(r) == 128 + signal.SIGTERM


def test_timeout_partial_output_kept(py: Py) -> None:
    r = run_bounded(*py("import time; print('partial', flush=True); time.sleep(30)"),
                    timeout_ms=400)
    assert r.outcome is Outcome.TIMEOUT and r.signal == "SIGTERM"
    assert r.exit_code == -signal.SIGTERM  # honoured the shutdown signal
    assert r.stdout_text == "partial\n" and r.limit_value == 400
    with pytest.raises(SandboxTimeoutError) as ei:
        r.check()
    assert ei.value.stdout == b"partial\n" and ei.value.result is not None
    assert ei.value.result.stdout_text == "partial\n" and ei.value.timeout_ms == 400
    assert exit_status_of(r) == 124


def test_grace_exhausted_by_sigterm_ignoring_child(py: Py) -> None:
    code = ("import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "print('ready', flush=True); time.sleep(30)")
    r = run_bounded(*py(code), timeout_ms=300, grace_period_ms=200)
    assert r.outcome is Outcome.TIMEOUT
    assert r.exit_code == -signal.SIGKILL  # SIGTERM ignored: killed after the grace
    assert r.stdout_text == "ready\n"
    assert r.duration_ms >= 480  # 300 ms timeout + 200 ms grace, not earlier
    assert r.duration_ms < 10_000


def test_cancel_token_from_another_thread(py: Py) -> None:
    tok = CancelToken()
    timer = threading.Timer(0.3, tok.cancel)
    timer.start()
    try:
        r = run_bounded(*py("import time; time.sleep(30)"), timeout_ms=20_000, cancel=tok)
    finally:
        timer.join()
    assert r.outcome is Outcome.CANCELLED and r.exit_code == -signal.SIGTERM
    with pytest.raises(SandboxCancelledError):
        r.check()
    assert exit_status_of(r) == 130


def test_cancel_token_already_cancelled_spawns_nothing() -> None:
    tok = CancelToken()
    tok.cancel()
    calls: list[Sequence[str]] = []

    def spawner(argv: Sequence[str], **kw: object) -> Supervised | int:
        calls.append(argv)
        return spawn_process(argv, **kw)  # type: ignore[arg-type]

    r = run_bounded("/bin/true", timeout_ms=1000, cancel=tok, spawner=spawner)
    assert r.outcome is Outcome.CANCELLED and calls == [] and r.exit_code is None


def test_asyncio_cancellation_kills_reaps_and_propagates(py: Py, tmp_path: object) -> None:
    pidfile = os.path.join(str(tmp_path), "pid")
    code = f"import os,time; open({pidfile!r},'w').write(str(os.getpid())); time.sleep(30)"

    async def main() -> int:
        task = asyncio.create_task(run_bounded_async(*py(code), timeout_ms=20_000))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if os.path.exists(pidfile) and os.path.getsize(pidfile):
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with open(pidfile) as f:
            return int(f.read())

    pid = asyncio.run(main())
    with pytest.raises(ChildProcessError):  # already reaped: no zombie left
        os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_overflow_truncates_exactly_at_cap(py: Py, stream: str) -> None:
    cap = 10_000
    code = f"import sys; sys.{stream}.write('x' * {cap + 1000}); sys.{stream}.flush()"
    kw = {"max_stdout_bytes": cap} if stream == "stdout" else {"max_stderr_bytes": cap}
    r = run_bounded(*py(code), timeout_ms=5000, **kw)  # type: ignore[arg-type]
    assert r.outcome == f"overflow-{stream}"
    data = r.stdout if stream == "stdout" else r.stderr
    assert data == b"x" * cap and len(data) == cap
    assert (r.stdout_truncated, r.stderr_truncated) == (stream == "stdout", stream == "stderr")
    assert r.limit_value == cap
    with pytest.raises(LimitsExceededError) as ei:
        r.check()
    assert ei.value.limit == "output" and ei.value.limit_value == cap
    assert exit_status_of(r) == 137


def test_overflow_kills_a_child_that_keeps_running(py: Py) -> None:
    code = "import sys,time; sys.stdout.write('y'*5000); sys.stdout.flush(); time.sleep(30)"
    r = run_bounded(*py(code), timeout_ms=20_000, max_stdout_bytes=4096)
    assert r.outcome is Outcome.OVERFLOW_STDOUT and r.exit_code == -signal.SIGKILL
    assert len(r.stdout) == 4096 and r.duration_ms < 10_000


def test_output_exactly_at_cap_is_not_overflow(py: Py) -> None:
    r = run_bounded(*py("import sys; sys.stdout.write('z'*4096)"), timeout_ms=5000,
                    max_stdout_bytes=4096)
    assert r.outcome is Outcome.EXIT and len(r.stdout) == 4096
    assert not r.stdout_truncated


def test_spawn_error_missing_command(tmp_path: object) -> None:
    r = run_bounded(os.path.join(str(tmp_path), "nope"), timeout_ms=1000)
    assert r.outcome is Outcome.SPAWN_ERROR and r.exit_code is None
    assert "No such file" in r.detail and r.spawn_errno == errno.ENOENT
    with pytest.raises(ConfigInvalidError) as ei:
        r.check()
    assert ei.value.field == "command"
    assert exit_status_of(r) == 127


def test_spawn_error_through_the_seam() -> None:
    def failing(argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
                stdin: int, stdout: int, stderr: int) -> int:
        raise OSError(errno.EAGAIN, "fork refused by test")

    r = run_bounded("/bin/true", timeout_ms=1000, spawner=failing)
    assert r.outcome is Outcome.SPAWN_ERROR and "fork refused by test" in r.detail
    assert r.cwd_owned and not os.path.exists(r.cwd)
    with pytest.raises(ProviderError):
        r.check()


def test_memory_limit_when_the_child_dies_of_it(py: Py) -> None:
    # 5 MiB of address space: a statically linked interpreter (Debian's) dies of
    # SIGSEGV; one built on a shared libpython (pyenv's) cannot even map it, and its
    # loader exits 127 saying so: memory-limit either way
    r = run_bounded(*py("pass"), timeout_ms=10_000, mem_mb=5)
    assert r.outcome is Outcome.MEMORY_LIMIT, (r.exit_code, r.stderr_text)
    assert r.exit_code in (-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGABRT) or (
        r.exit_code == 127 and "error while loading shared libraries" in r.stderr_text)
    with pytest.raises(LimitsExceededError) as ei:
        r.check()
    assert ei.value.limit == "memory" and ei.value.limit_value == 5


def test_memory_limit_when_the_loader_cannot_map_a_library() -> None:
    # 1 MiB of address space: the loader maps the program but not libc, and exits 127
    # ("failed to map segment from shared object") before main: the limit's doing
    r = run_bounded("/bin/true", timeout_ms=10_000, mem_mb=1)
    assert (r.outcome, r.exit_code) == (Outcome.MEMORY_LIMIT, 127), r.stderr_text
    assert "failed to map segment" in r.stderr_text
    with pytest.raises(LimitsExceededError) as ei:
        r.check()
    assert ei.value.limit == "memory" and ei.value.limit_value == 1
    # control: the same program without the limit runs
    assert run_bounded("/bin/true", timeout_ms=10_000).outcome is Outcome.EXIT


def test_exit_127_is_the_loader_out_of_memory_only_when_it_says_so(py: Py) -> None:
    # a program's own exit 127 (or the loader missing a library) stays an exit
    r = run_bounded(*py("import sys; sys.stderr.write('no such thing\\n'); sys.exit(127)"),
                    timeout_ms=10_000, mem_mb=200)
    assert (r.outcome, r.exit_code) == (Outcome.EXIT, 127)
    assert exit_outcome(127, 0, cpu_ms=None, mem_mb=5, stderr=(
        b"x: error while loading shared libraries: libnope.so: cannot open shared "
        b"object file: No such file or directory\n")) is Outcome.EXIT
    words = b"x: error while loading shared libraries: libc.so.6: failed to map segment " \
        b"from shared object\n"
    assert exit_outcome(127, 0, cpu_ms=None, mem_mb=5, stderr=words) is Outcome.MEMORY_LIMIT
    # no memory limit set: nothing to blame
    assert exit_outcome(127, 0, cpu_ms=None, mem_mb=None, stderr=words) is Outcome.EXIT


def test_memory_limit_handled_by_the_child_is_its_exit(py: Py) -> None:
    # Documented gap: a child that catches ENOMEM (Python: MemoryError) just exits.
    r = run_bounded(*py("b = bytearray(400 * 1024 * 1024)"), timeout_ms=10_000, mem_mb=100)
    assert r.outcome is Outcome.EXIT and r.exit_code == 1 and "MemoryError" in r.stderr_text


@pytest.mark.slow
def test_cpu_limit(py: Py) -> None:
    r = run_bounded(*py("while True: pass"), timeout_ms=20_000, cpu_ms=500)
    assert r.outcome is Outcome.CPU_LIMIT
    assert r.exit_code in (-signal.SIGXCPU, -signal.SIGKILL)
    assert r.usage.cpu_ms >= 500
    with pytest.raises(LimitsExceededError) as ei:
        r.check()
    assert ei.value.limit == "cpu" and ei.value.limit_value == 500


def test_exit_status_table_matches_error_table() -> None:
    for outcome, status in OUTCOME_EXIT_STATUS.items():
        r = RunResult(outcome=outcome, limit_value=1)
        err = r.error()
        assert err is not None
        if outcome is not Outcome.SPAWN_ERROR:
            assert status == err.exit_status, outcome
    assert set(OUTCOME_EXIT_STATUS) == set(Outcome) - {Outcome.EXIT}


def test_without_pidfd_a_watcher_thread_is_used_and_joined(
        py: Py, monkeypatch: pytest.MonkeyPatch) -> None:
    import corral.runner.engine as core

    monkeypatch.setattr(core, "_USE_PIDFD", False)
    threads = threading.active_count()
    assert run_bounded(*py("print(1)"), timeout_ms=5000).stdout_text == "1\n"
    r = run_bounded(*py("import time; time.sleep(30)"), timeout_ms=200)
    assert r.outcome is Outcome.TIMEOUT

    async def cancelled() -> None:
        task = asyncio.create_task(run_bounded_async(*py("import time; time.sleep(30)"),
                                                     timeout_ms=20_000))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert threading.active_count() == threads
