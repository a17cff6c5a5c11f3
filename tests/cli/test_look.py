"""The CLI where a person watches (issue 14, item 5): colour and a live status line on
a terminal, plain text when piped, ``--json`` for one result, NDJSON ``--events`` for
a stream. The terminal cases run the real ``corral`` command with stderr on a pty."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from ptyrun import on_pty, terminal_env, text

from corral.cli import main
from corral.cli._style import LiveStatus, Palette, colour_wanted

PY = sys.executable
ESC = b"\x1b["


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("env", "tty", "want"), [
    ({}, True, True),
    ({}, False, False),
    ({"NO_COLOR": "1"}, True, False),
    ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, True, False),  # NO_COLOR wins
    ({"FORCE_COLOR": "1"}, False, True),
    ({"TERM": "dumb"}, True, False),
    ({"NO_COLOR": ""}, True, True),  # an empty value does not count
])
def test_colour_rules(env: dict[str, str], tty: bool, want: bool) -> None:
    stream = _Tty() if tty else io.StringIO()
    assert colour_wanted(stream, env) is want
    painted = Palette(colour_wanted(stream, env)).paint("x", "red")
    assert (painted != "x") is want


def test_status_line_is_erased_around_output_and_at_stop() -> None:
    err, out = _Tty(), _Tty()
    with LiveStatus("running x", stream=err, enabled=True, interval=0.01) as st:
        time.sleep(0.05)
        st.write(out, "half a line")  # no newline: the status is not redrawn after it
        drawn = err.getvalue().count("running x")
        time.sleep(0.05)
        assert err.getvalue().count("running x") == drawn
        st.write(out, " ends\n")
        time.sleep(0.05)
    assert drawn >= 1 and err.getvalue().count("running x") > drawn
    assert err.getvalue().endswith("\r\x1b[2K")  # erased at the end
    assert out.getvalue() == "half a line ends\n"


def test_status_disabled_draws_nothing() -> None:
    err, out = io.StringIO(), io.StringIO()
    with LiveStatus("running x", stream=err, enabled=False, interval=0.01) as st:
        time.sleep(0.03)
        st.write(out, "a\n")
    assert err.getvalue() == "" and out.getvalue() == "a\n"


def _run_on_pty(args: list[str]) -> tuple[int, bytes, bytes]:
    """``corral ARGS`` with stderr on a pty (a person's terminal), stdout on a pipe."""
    code, out, seen = on_pty(args, timeout=30)
    return code, out, text(seen)


def test_terminal_gets_a_live_status_and_a_coloured_end_pipe_gets_the_bytes() -> None:
    code, out, tty = _run_on_pty(["run", "--", PY, "-c",
                                  "import time; time.sleep(0.6); print('done')"])
    assert code == 0
    assert out == b"done\n"  # stdout is a pipe: the exact bytes, no escapes
    assert b"running python" in tty and b"\r\x1b[2K" in tty  # drawn and erased
    assert b"\x1b[32mexit 0" in tty  # the closing line, in green


def test_terminal_failure_is_red() -> None:
    code, _, tty = _run_on_pty(["run", "--timeout", "300ms", "--", PY, "-c",
                                "import time; time.sleep(30)"])
    assert code == 124
    assert b"\x1b[31;1mtimeout" in tty


def test_no_color_keeps_the_status_line_but_drops_colour() -> None:
    code, _, seen = on_pty(["run", "--", PY, "-c", "import time; time.sleep(0.3)"],
                           env=terminal_env(NO_COLOR="1"), timeout=30)
    tty = text(seen)
    assert code == 0
    assert b"running python" in tty and b"exit 0" in tty
    assert b"\x1b[3" not in tty and b"\x1b[1m" not in tty  # no SGR colour, only the erase


def test_piped_stderr_has_no_escape_at_all() -> None:
    r = subprocess.run([PY, "-m", "corral", "run", "--timeout", "300ms", "--", PY, "-c",
                        "import time; print('x', flush=True); time.sleep(30)"],
                       capture_output=True, timeout=30, check=False,
                       env={k: v for k, v in os.environ.items() if k != "FORCE_COLOR"})
    assert r.returncode == 124 and r.stdout == b"x\n"
    assert ESC not in r.stderr and b"\r" not in r.stderr
    assert r.stderr.startswith(b"corral: timeout")


def test_events_stream_then_result(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--events", "--", PY, "-c",
                 "import sys; print('a', flush=True); sys.stderr.write('b\\n'); "
                 "sys.stderr.flush(); sys.stdout.buffer.write(b'\\xff'); sys.exit(3)"])
    assert code == 3
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[0]["event"] == "start" and lines[0]["argv"][0] == PY
    assert lines[-1]["event"] == "result" and lines[-1]["exit_code"] == 3
    assert lines[-1]["exit_status"] == 3

    def stream(name: str) -> bytes:
        data = b""
        for e in lines[1:-1]:
            if e["event"] == name:
                data += (base64.b64decode(e["data"]) if e.get("encoding") == "base64"
                         else e["data"].encode())
        return data

    assert stream("stdout") == b"a\n\xff" and stream("stderr") == b"b\n"
    assert {e["event"] for e in lines[1:-1]} <= {"stdout", "stderr"}


def test_events_at_strict_carry_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    from strict_tier import cgroup_limits_reason, unavailable
    if cgroup_limits_reason():
        unavailable(cgroup_limits_reason())
    code = main(["run", "--events", "--level", "strict", "--mem-mb", "64", "--",
                 os.path.realpath(PY), "-I", "-S", "-c",
                 "x = bytearray(200 << 20); x[::4096] = b'a' * len(x[::4096])"])
    assert code == 137
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert last["event"] == "result" and last["outcome"] == "memory-limit"
    assert last["limit_value"] == 64


def test_json_and_events_do_not_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", "--events", "--", PY, "-c", "pass"]) == 64
    assert "not allowed with" in capsys.readouterr().err


def _python_on_pty(code: str) -> bytes:
    """``corral python -c CODE`` with stdout and stderr on one pty: what a person sees."""
    _, _, seen = on_pty(["python", "--level", "context-isolated", "-c", code],
                        stdout_too=True)
    return text(seen)


# an OSC that sets the window title, a colour, and C1 CSI: each must reach the
# terminal as text (issue 16's terminal rule, now for `corral python` too)
HOSTILE = ("print('\\x1b]0;pwned\\x07T\\x1b[31mR\\x9b2J')\n"
           "facts = {'k': '\\x1b[5m'}\n"
           "raise ValueError('\\x1b[2J')")


def test_python_on_a_terminal_shows_escapes_as_text() -> None:
    seen = _python_on_pty(HOSTILE)
    assert b"\\x1b]0;pwned\\x07T\\x1b[31mR\\x9b2J" in seen
    assert b"\x1b]0;" not in seen and b"\x1b[31mR" not in seen and b"\x1b[2J" not in seen
    assert b"\xc2\x9b" not in seen  # the C1 CSI, as UTF-8
    assert b"ValueError" in seen and b"\x1b[31;1merror:" in seen  # corral's own colour


def test_python_piped_gives_the_text_as_is() -> None:
    r = subprocess.run([PY, "-m", "corral", "python", "--level", "context-isolated", "-c",
                        "print('\\x1b[31mR')"], capture_output=True, timeout=60, check=False)
    assert r.returncode == 0
    assert r.stdout.splitlines()[0] == b"\x1b[31mR"  # a pipe: exact, for programs
    assert ESC not in r.stderr


def test_a_host_only_command_at_strict_gets_a_hint(tmp_path: Any) -> None:
    """A command that exists on the host but not in the sandbox (a pyenv shim, a tool
    under ~ or /opt): the 127 comes with what the sandbox sees and how to fix it."""
    from strict_tier import host_can_sandbox, unavailable
    if host_can_sandbox():
        unavailable(host_can_sandbox())
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    r = subprocess.run([PY, "-m", "corral", "run", "--level", "strict", "--", str(tool)],
                       capture_output=True, timeout=60, check=False)
    assert r.returncode == 127
    assert b"exists on this host but not inside the strict sandbox" in r.stderr
    assert b"--ro-bind its directory" in r.stderr
    # and a command that runs there and itself exits 127 gets no such note
    r = subprocess.run([PY, "-m", "corral", "run", "--level", "strict", "--", "/bin/sh",
                        "-c", "exit 127"], capture_output=True, timeout=60, check=False)
    assert r.returncode == 127 and b"exists on this host" not in r.stderr
