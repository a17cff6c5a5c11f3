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
from strict_tier import unavailable

PY = sys.executable
#: the tests here are about the context-isolated level (strict is the default: issue 27)
CI = ["--level", "context-isolated"]


@pytest.fixture(autouse=True)
def _run_verb(monkeypatch: pytest.MonkeyPatch) -> None:
    # until the lead adds "run" to VERBS; harmless afterwards
    monkeypatch.setitem(corral.cli.VERBS, "run", "run")


def test_live_output_and_child_exit_code(capfd: pytest.CaptureFixture[str]) -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(5)"
    assert main(["run", *CI, "--", PY, "-I", "-S", "-c", code]) == 5
    out, err = capfd.readouterr()
    assert out == "out\n" and err == "err\n"


def test_command_resolved_on_path(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *CI, "--", "sh", "-c", "echo via-path"]) == 0
    assert capfd.readouterr().out == "via-path\n"


def test_json_result(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *CI, "--json", "--env", "A=1", "--", "/usr/bin/env"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outcome"] == "exit" and doc["exit_code"] == 0
    assert "A=1\n" in doc["stdout"] and doc["cwd_owned"] is True


def test_env_and_pass_env(capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_CLI_PASSED", "p")
    monkeypatch.setenv("CORRAL_CLI_SECRET", "s")
    assert main(["run", *CI, "--json", "--pass-env", "CORRAL_CLI_PASSED", "--env", "X=y=z",
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
    assert main(["run", *CI, "--json", *argv]) == status
    assert json.loads(capsys.readouterr().out)["outcome"] == outcome


def test_outcome_message_without_json(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *CI, "--timeout", "200", "--", PY, "-c",
                 "import time; time.sleep(30)"]) == 124
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
        status = main(["run", *CI, "--json", "--", PY, "-c", "import time; time.sleep(30)"])
    finally:
        timer.join()
    assert status == 130
    assert json.loads(capsys.readouterr().out)["outcome"] == "cancelled"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_stdin_file_and_cwd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "in.txt"
    f.write_bytes(b"from a file")
    assert main(["run", *CI, "--json", "--stdin", str(f), "--cwd", str(tmp_path), "--",
                 PY, "-c", "import os,sys; print(os.getcwd(), sys.stdin.read())"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stdout"] == f"{tmp_path} from a file\n" and doc["cwd_owned"] is False


@pytest.mark.parametrize("argv", [
    ["--"], ["--env", "NOEQUALS", "--", "/bin/true"],
    ["--timeout", "0", "--", "/bin/true"], ["--stdin", "/nonexistent/file", "--", "/bin/true"],
])
def test_bad_options_exit_64(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *CI, *argv]) == 64
    assert "config-invalid" in capsys.readouterr().err


def test_strict_only_limits_refused_below_strict(capsys: pytest.CaptureFixture[str]) -> None:
    # a process or disk limit needs the strict sandbox's cgroup and tmpfs: never ignored
    assert main(["run", *CI, "--max-processes", "4", "--", "/bin/true"]) == 64
    assert "config-invalid" in capsys.readouterr().err


# -- output to a terminal: the command's escape sequences are shown, not obeyed ----

HOSTILE = (b"\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[31mred\x1b[0m\n"
           + "\u009b2J".encode() + b"\xff caf\xc3\xa9\tok\r\n")
SHOWN = (b"\\x1b]0;pwned\\x07\\x1b]52;c;cHduZWQ=\\x07\\x1b[31mred\\x1b[0m\n"
         b"\\x9b2J\\xff caf\xc3\xa9\tok\r\n")
#: writes HOSTILE to stdout and stderr, the C1 CSI split across two writes
WRITER = ("import sys, time\n"
          "data = bytes.fromhex(sys.argv[1])\n"
          "cut = data.index(bytes([0xc2])) + 1\n"
          "for out in (sys.stdout.buffer, sys.stderr.buffer):\n"
          "    out.write(data[:cut]); out.flush(); time.sleep(0.05)\n"
          "    out.write(data[cut:]); out.flush()\n")
SRC = str(Path(corral.cli.__file__).resolve().parents[2])


def _cli_on_pty(argv: list[str]) -> tuple[int, bytes, bytes]:
    """Run ``corral`` in a child whose stdout is a pty (raw mode: no newline
    translation) and whose stderr is a pipe; returns (status, tty bytes, pipe bytes)."""
    import pty
    import subprocess
    import tty

    master, slave = pty.openpty()
    tty.setraw(slave)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c",
             "import sys; from corral.cli import main; sys.exit(main(sys.argv[1:]))", *argv],
            stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": SRC})
        os.close(slave)
        slave = -1
        got = bytearray()
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the pty is gone
                break
            if not chunk:
                break
            got += chunk
        assert proc.stderr is not None
        with proc.stderr:
            err = proc.stderr.read()
        status = proc.wait(timeout=60)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    return status, bytes(got), err


@pytest.mark.parametrize("level", ["context-isolated", "strict"])
def test_escape_sequences_reach_a_terminal_as_text(level: str) -> None:
    py = os.path.realpath(PY)  # the real interpreter: the strict sandbox binds its prefix
    status, shown, piped = _cli_on_pty(["run", "--level", level, "--", py, "-I", "-S", "-c",
                                        WRITER, HOSTILE.hex()])
    if level == "strict" and status == 69 and b"level-not-supported" in piped:
        unavailable(piped.decode(errors="replace"))
    assert status == 0, (shown, piped)
    assert shown == SHOWN                  # the terminal: sequences as text
    assert piped == HOSTILE                # the pipe: byte-exact


def test_raw_output_passes_bytes_to_a_terminal() -> None:
    status, shown, piped = _cli_on_pty(["run", "--raw-output", "--", os.path.realpath(PY),
                                        "-I", "-S", "-c", WRITER, HOSTILE.hex()])
    assert status == 0
    assert shown == HOSTILE and piped == HOSTILE


def test_piped_output_is_byte_exact(capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(["run", *CI, "--", PY, "-I", "-S", "-c", WRITER, HOSTILE.hex()]) == 0
    assert capfdbinary.readouterr() == (HOSTILE, HOSTILE)


def test_ro_bind_holding_a_unix_socket_is_refused(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    (tmp_path / "run").mkdir()
    sock = tmp_path / "run" / "daemon.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        status = main(["run", "--level", "strict", "--ro-bind", str(tmp_path), "--",
                       "/bin/true"])
    err = capsys.readouterr().err
    if status == 69 and "level-not-supported" in err:
        unavailable(err)
    assert status == 64, err
    assert "config-invalid" in err and str(sock) in err and "unix socket" in err
