"""One test (at least) per option of seed 03's table, plus the sync/async entry points."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from corral import ConfigInvalidError
from corral.run.bounded import (
    Outcome,
    RunResult,
    run_bounded,
    run_bounded_async,
    spawn_process,
)
from corral.runner.tree import Supervised, popen_process

Py = Callable[[str], tuple[str, list[str]]]
DUMP_ENV = "import json,os; print(json.dumps(dict(os.environ)))"


def test_command_must_be_absolute() -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        run_bounded("true", timeout_ms=1000)
    assert ei.value.field == "command"
    with pytest.raises(ConfigInvalidError):
        run_bounded("bin/true", timeout_ms=1000)


def test_args_forwarded_verbatim_no_shell(py: Py) -> None:
    args = ["a b", "$HOME", "*", "'q'", ""]
    cmd, base = py("import sys,json; print(json.dumps(sys.argv[1:]))")
    r = run_bounded(cmd, [*base, *args], timeout_ms=5000)
    assert json.loads(r.stdout_text) == args
    with pytest.raises(ConfigInvalidError) as ei:
        run_bounded(cmd, "not-a-list", timeout_ms=1000)  # type: ignore[arg-type]
    assert ei.value.field == "args"


def test_relative_cwd_refused() -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        run_bounded("/bin/true", timeout_ms=1000, cwd="some/dir")
    assert ei.value.field == "cwd"


def test_given_cwd_used_and_kept(py: Py, tmp_path: Path) -> None:
    r = run_bounded(*py("import os; print(os.getcwd())"), timeout_ms=5000, cwd=tmp_path)
    assert r.stdout_text.strip() == str(tmp_path) and r.cwd == str(tmp_path)
    assert not r.cwd_owned and tmp_path.is_dir()


def test_owned_cwd_removed_even_if_made_unwritable(py: Py) -> None:
    code = ("import os; os.makedirs('a/b'); open('a/b/f','w').write('x');"
            "os.chmod('a/b', 0o500); os.chmod('a', 0o500); print(os.getcwd())")
    r = run_bounded(*py(code), timeout_ms=5000)
    assert r.outcome is Outcome.EXIT and r.exit_code == 0, r.stderr_text
    assert r.cwd_owned and r.stdout_text.strip() == r.cwd
    assert os.path.basename(r.cwd).startswith("corral-run-")
    assert not os.path.exists(r.cwd)


def _env_of(r: RunResult) -> dict[str, str]:
    return dict(line.split("=", 1) for line in r.stdout_text.splitlines())


def test_env_is_an_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_SECRET", "s3cret")
    r = run_bounded("/usr/bin/env", timeout_ms=5000, env={"MINE": "1"})
    env = _env_of(r)
    assert "CORRAL_TEST_SECRET" not in env and "s3cret" not in r.stdout_text
    assert set(env) <= {"MINE", "PATH", "HOME", "TMPDIR"}
    assert env["MINE"] == "1"
    assert env["HOME"] == env["TMPDIR"] == r.cwd  # the owned cwd
    if "PATH" in os.environ:
        assert env["PATH"] == os.environ["PATH"]


def test_env_caller_overrides_bootstrap_and_given_cwd_keeps_host_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/host/home")
    monkeypatch.delenv("TMPDIR", raising=False)
    r = run_bounded("/usr/bin/env", timeout_ms=5000, cwd=tmp_path, env={"PATH": "/x"})
    env = _env_of(r)
    assert env["PATH"] == "/x" and env["HOME"] == "/host/home" and "TMPDIR" not in env


@pytest.mark.parametrize(("env", "field"), [
    ({"A=B": "1"}, "env"), ({"": "1"}, "env"), ({"A": "nul\0"}, "env[A]"),
    ({"A": 1}, "env[A]"),
])
def test_bad_env_refused(env: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        run_bounded("/bin/true", timeout_ms=1000, env=env)  # type: ignore[arg-type]
    assert ei.value.field == field


@pytest.mark.parametrize("bad", [0, -5, True, 1.5, None, "100"])
def test_timeout_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        run_bounded("/bin/true", timeout_ms=bad)  # type: ignore[arg-type]
    assert ei.value.field == "timeout_ms"


def test_grace_must_be_below_timeout() -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        run_bounded("/bin/true", timeout_ms=500, grace_period_ms=500)
    assert ei.value.field == "grace_period_ms"
    with pytest.raises(ConfigInvalidError):
        run_bounded("/bin/true", timeout_ms=500, grace_period_ms=-1)
    # the default grace shrinks to half a short timeout instead of failing
    assert run_bounded("/bin/true", timeout_ms=100).outcome is Outcome.EXIT


def test_shutdown_signal(py: Py) -> None:
    code = ("import signal,sys,time\n"
            "def h(*a): print('got', signal.Signals(a[0]).name, flush=True); sys.exit(3)\n"
            "signal.signal(signal.SIGINT, h); print('ready', flush=True); time.sleep(30)")
    r = run_bounded(*py(code), timeout_ms=400, shutdown_signal="SIGINT", grace_period_ms=300)
    assert r.outcome is Outcome.TIMEOUT and r.exit_code == 3
    assert r.stdout_text == "ready\ngot SIGINT\n"
    with pytest.raises(ConfigInvalidError) as ei:
        run_bounded("/bin/true", timeout_ms=100, shutdown_signal="SIGNOPE")
    assert ei.value.field == "shutdown_signal"


def test_shutdown_signal_sigkill_needs_no_grace(py: Py) -> None:
    r = run_bounded(*py("import time; time.sleep(30)"), timeout_ms=200,
                    shutdown_signal=signal.SIGKILL)
    assert r.outcome is Outcome.TIMEOUT and r.exit_code == -signal.SIGKILL


def test_stdin_absent_is_immediate_eof(py: Py) -> None:
    r = run_bounded(*py("import sys; print(len(sys.stdin.buffer.read()))"), timeout_ms=5000)
    assert r.stdout_text == "0\n"


def test_stdin_str_is_utf8(py: Py) -> None:
    r = run_bounded(*py("import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"),
                    timeout_ms=5000, stdin="héllo")
    assert r.stdout == "héllo".encode()


def test_large_stdin_round_trip_does_not_deadlock() -> None:
    data = os.urandom(4 * 1024 * 1024)
    r = run_bounded("/bin/cat", timeout_ms=20_000, stdin=data)
    assert r.outcome is Outcome.EXIT and r.stdout == data


def test_stdin_ignored_by_child_is_dropped(py: Py) -> None:
    r = run_bounded(*py("import os; os.close(0); print('closed')"), timeout_ms=5000,
                    stdin=b"z" * (1 << 20))
    assert r.outcome is Outcome.EXIT and r.stdout_text == "closed\n"


@pytest.mark.parametrize("name", ["max_stdout_bytes", "max_stderr_bytes", "node_heap_mb",
                                  "mem_mb", "cpu_ms"])
@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_caps_and_limits_must_be_positive_ints(name: str, bad: object) -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        run_bounded("/bin/true", timeout_ms=1000, **{name: bad})  # type: ignore[arg-type]
    assert ei.value.field == name


def test_default_caps(py: Py) -> None:
    code = "import sys; sys.stdout.write('o'*(8<<20)); sys.stderr.write('e'*((1<<20)+1))"
    r = run_bounded(*py(code), timeout_ms=20_000)
    assert r.outcome is Outcome.OVERFLOW_STDERR and len(r.stderr) == 1 << 20
    assert len(r.stdout) == 8 << 20 and not r.stdout_truncated


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_node_heap_mb_applied_for_node() -> None:
    node = shutil.which("node")
    assert node is not None
    code = ("console.log(process.env.NODE_OPTIONS);"
            "console.log(require('v8').getHeapStatistics().heap_size_limit)")
    r = run_bounded(os.path.realpath(node), ["-e", code], timeout_ms=20_000, node_heap_mb=64,
                    env={"NODE_OPTIONS": "--no-warnings"})
    opts, limit = r.stdout_text.split("\n")[:2]
    assert r.node_heap_mb_applied
    assert opts == "--max-old-space-size=64 --no-warnings"
    assert int(limit) < 200 * 1024 * 1024  # default is ~2-4 GiB


def test_node_heap_mb_not_applied_for_other_commands(py: Py) -> None:
    r = run_bounded(*py(DUMP_ENV), timeout_ms=5000, node_heap_mb=64)
    assert not r.node_heap_mb_applied and "NODE_OPTIONS" not in json.loads(r.stdout_text)


def test_streaming_callbacks_see_output_as_it_arrives(py: Py) -> None:
    seen: list[tuple[float, str, bytes]] = []
    code = ("import sys,time; print('a', flush=True); print('e', file=sys.stderr, flush=True);"
            "time.sleep(0.5); print('b', flush=True)")
    r = run_bounded(*py(code), timeout_ms=5000,
                    on_stdout=lambda c: seen.append((time.monotonic(), "out", c)),
                    on_stderr=lambda c: seen.append((time.monotonic(), "err", c)))
    end = time.monotonic()
    assert b"".join(c for _, s, c in seen if s == "out") == b"a\nb\n" == r.stdout
    assert b"".join(c for _, s, c in seen if s == "err") == b"e\n"
    assert seen[0][0] < end - 0.3  # the first chunk came long before the end


def test_streaming_callback_gets_only_bytes_within_cap(py: Py) -> None:
    got: list[bytes] = []
    r = run_bounded(*py("print('x'*100)"), timeout_ms=5000, max_stdout_bytes=10,
                    on_stdout=got.append)
    assert b"".join(got) == b"x" * 10 and r.outcome is Outcome.OVERFLOW_STDOUT


def test_callback_error_kills_the_run_and_is_raised(py: Py) -> None:
    def boom(chunk: bytes) -> None:
        raise KeyError("callback failed")

    with pytest.raises(KeyError):
        run_bounded(*py("import time; print('go', flush=True); time.sleep(30)"),
                    timeout_ms=20_000, on_stdout=boom)


def test_spawner_seam_receives_the_run(py: Py) -> None:
    seen: list[tuple[Sequence[str], str, Mapping[str, str]]] = []

    def spy(argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
            stdin: int, stdout: int, stderr: int) -> Supervised | int:
        seen.append((argv, cwd, dict(env)))
        return spawn_process(argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr)

    r = run_bounded(*py("print(1)"), timeout_ms=5000, spawner=spy)
    assert r.stdout_text == "1\n" and len(seen) == 1
    argv, cwd, env = seen[0]
    assert list(argv[1:]) == py("print(1)")[1] and cwd == r.cwd and "CORRAL_RUN_TOKEN" not in env


def test_a_spawner_returning_a_bare_pid_is_reaped_directly(py: Py) -> None:
    # no supervisor: the runner reaps the pid itself and kills its process group only
    r = run_bounded(*py("import os; print(os.getppid())"), timeout_ms=5000,
                    spawner=popen_process)
    assert r.outcome is Outcome.EXIT and r.exit_code == 0 and r.strays_killed == 0
    assert int(r.stdout_text) == os.getpid()
    r = run_bounded(*py("import time; time.sleep(30)"), timeout_ms=300, grace_period_ms=50,
                    spawner=popen_process)
    assert r.outcome is Outcome.TIMEOUT and r.exit_code == -signal.SIGTERM


def test_async_twin(py: Py) -> None:
    async def main() -> list[RunResult]:
        return list(await asyncio.gather(*(
            run_bounded_async(*py(f"print({i})"), timeout_ms=5000) for i in range(5))))

    results = asyncio.run(main())
    assert [r.stdout_text for r in results] == [f"{i}\n" for i in range(5)]


def test_sync_from_a_thread_while_a_loop_runs_elsewhere(py: Py) -> None:
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever)
    t.start()
    try:
        out: list[RunResult] = []
        worker = threading.Thread(
            target=lambda: out.append(run_bounded(*py("print('w')"), timeout_ms=5000)))
        worker.start()
        worker.join()
        assert out[0].stdout_text == "w\n"
        assert run_bounded(*py("print('m')"), timeout_ms=5000).stdout_text == "m\n"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join()
        loop.close()


def test_sync_called_inside_a_coroutine(py: Py) -> None:
    async def main() -> RunResult:
        return run_bounded(*py("print('c')"), timeout_ms=5000)

    assert asyncio.run(main()).stdout_text == "c\n"
