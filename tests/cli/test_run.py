"""``corral run``: called in-process through corral.cli.main."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import corral.cli
from corral.cli import main

PY = sys.executable


@pytest.fixture(autouse=True)
def _run_verb(monkeypatch: pytest.MonkeyPatch) -> None:
    # until the lead adds "run" to VERBS; harmless afterwards
    monkeypatch.setitem(corral.cli.VERBS, "run", "run")


def test_live_output_and_child_exit_code(capfd: pytest.CaptureFixture[str]) -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(5)"
    assert main(["run", "--", PY, "-I", "-S", "-c", code]) == 5
    out, err = capfd.readouterr()
    assert out == "out\n" and err == "err\n"


def test_command_resolved_on_path(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--", "sh", "-c", "echo via-path"]) == 0
    assert capfd.readouterr().out == "via-path\n"


def test_json_result(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", "--env", "A=1", "--", "/usr/bin/env"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outcome"] == "exit" and doc["exit_code"] == 0
    assert "A=1\n" in doc["stdout"] and doc["cwd_owned"] is True


def test_env_and_pass_env(capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_CLI_PASSED", "p")
    monkeypatch.setenv("CORRAL_CLI_SECRET", "s")
    assert main(["run", "--json", "--pass-env", "CORRAL_CLI_PASSED", "--env", "X=y=z",
                 "--", "/usr/bin/env"]) == 0
    out = json.loads(capsys.readouterr().out)["stdout"]
    assert "CORRAL_CLI_PASSED=p\n" in out and "X=y=z\n" in out and "SECRET" not in out


@pytest.mark.parametrize(("argv", "status", "outcome"), [
    (["--timeout", "300", "--grace-ms", "100", "--", PY, "-c", "import time; time.sleep(30)"],
     124, "timeout"),
    (["--max-stdout", "10", "--", PY, "-c", "print('x'*100)"], 137, "overflow-stdout"),
    (["--max-stderr", "10", "--", PY, "-c", "import sys; sys.stderr.write('x'*100)"], 137,
     "overflow-stderr"),
    (["--cpu-ms", "100", "--", PY, "-I", "-S", "-c", "while True: pass"], 137, "cpu-limit"),
    (["--mem-mb", "5", "--", PY, "-I", "-S", "-c", "pass"], 137, "memory-limit"),
    (["--", "/nonexistent/cmd"], 127, "spawn-error"),
    (["--", PY, "-c", "import os; os.kill(os.getpid(), 15)"], 128 + 15, "exit"),
])
def test_outcome_exit_statuses(argv: list[str], status: int, outcome: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", *argv]) == status
    assert json.loads(capsys.readouterr().out)["outcome"] == outcome


def test_outcome_message_without_json(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--timeout", "200", "--", PY, "-c", "import time; time.sleep(30)"]) == 124
    assert "corral: timeout:" in capfd.readouterr().err


def _interrupt_once_handled() -> None:
    """SIGINT ourselves once the CLI has put its handler in (a loaded machine may take
    longer than any fixed delay to get there), then a moment later."""
    deadline = time.monotonic() + 20
    while signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        if time.monotonic() > deadline:
            return  # the assertions below will say what went wrong
        time.sleep(0.01)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGINT)


def test_sigint_cancels(capsys: pytest.CaptureFixture[str]) -> None:
    timer = threading.Thread(target=_interrupt_once_handled)
    timer.start()
    try:
        status = main(["run", "--json", "--", PY, "-c", "import time; time.sleep(30)"])
    finally:
        timer.join()
    assert status == 130
    assert json.loads(capsys.readouterr().out)["outcome"] == "cancelled"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_stdin_file_and_cwd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "in.txt"
    f.write_bytes(b"from a file")
    assert main(["run", "--json", "--stdin", str(f), "--cwd", str(tmp_path), "--",
                 PY, "-c", "import os,sys; print(os.getcwd(), sys.stdin.read())"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stdout"] == f"{tmp_path} from a file\n" and doc["cwd_owned"] is False


@pytest.mark.parametrize("argv", [
    ["--"], ["--", "no-such-command-xyz"], ["--env", "NOEQUALS", "--", "/bin/true"],
    ["--timeout", "0", "--", "/bin/true"], ["--stdin", "/nonexistent/file", "--", "/bin/true"],
])
def test_bad_options_exit_64(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *argv]) == 64
    assert "config-invalid" in capsys.readouterr().err


def test_strict_only_limits_refused_below_strict(capsys: pytest.CaptureFixture[str]) -> None:
    # a process or disk limit needs the strict sandbox's cgroup and tmpfs: never ignored
    assert main(["run", "--max-processes", "4", "--", "/bin/true"]) == 64
    assert "config-invalid" in capsys.readouterr().err
