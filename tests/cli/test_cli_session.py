"""``corral session``: a REPL on a terminal (a pty), cells from -c and stdin, exit statuses."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time

import pytest

from strict_tier import host_can_sandbox, needs_strict

pytestmark = needs_strict(host_can_sandbox())

CORRAL = [sys.executable, "-m", "corral", "session"]


def _read_until(fd: int, want: bytes, seen: bytearray, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while want not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"never saw {want!r} in {bytes(seen)!r}"
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            assert chunk, f"EOF before {want!r}: {bytes(seen)!r}"
            seen += chunk


def _controlling_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is the pty on fd 0,
    and SIGINT at its default, as a shell gives a foreground command, so that Ctrl-C typed
    there is a SIGINT to it (with no controlling terminal the line discipline echoes ``^C``
    and signals nobody; a SIGINT ignored by whatever started pytest, a background shell
    say, would be ignored by the child too)."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_the_repl_on_a_terminal_keeps_state_and_survives_ctrl_c() -> None:
    master, slave = pty.openpty()
    # the session's timeout is far beyond the waits below: the interrupt seen must be
    # Ctrl-C's, not the timeout's (this test once passed on the timeout's, 20 s later)
    proc = subprocess.Popen([*CORRAL, "--timeout", "300s"], stdin=slave, stdout=slave,
                            stderr=slave, close_fds=True, preexec_fn=_controlling_terminal)
    os.close(slave)
    seen = bytearray()
    try:
        _read_until(master, b">>> ", seen)
        del seen[:]
        os.write(master, b"def f(n):\n    return n * 7\n\n")
        _read_until(master, b">>> ", seen)  # the next prompt: the cell ran
        del seen[:]
        os.write(master, b"f(6)\n")
        _read_until(master, b"42", seen)
        _read_until(master, b">>> ", seen)
        del seen[:]
        os.write(master, b"import time; time.sleep(30)\n")
        time.sleep(1.0)
        os.write(master, b"\x03")  # Ctrl-C: the cell is interrupted, the session lives
        _read_until(master, b"KeyboardInterrupt (the cell was interrupted)", seen, 30.0)
        _read_until(master, b">>> ", seen)
        del seen[:]
        os.write(master, b"f(1) + 1\n")
        _read_until(master, b"8", seen)
        os.write(master, b"\x04")  # Ctrl-D ends the session
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_cells_from_c_and_stdin_and_the_exit_statuses() -> None:
    r = subprocess.run([*CORRAL, "-c", "a = 20", "-c", "a + 22"], capture_output=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout == b"42\n", r
    r = subprocess.run(CORRAL, input=b"x = 1\nprint(x + 1)\n", capture_output=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout == b"2\n", r
    r = subprocess.run([*CORRAL, "-c", "1/0"], capture_output=True, timeout=120)
    assert r.returncode == 1 and b"ZeroDivisionError" in r.stderr, r


@pytest.mark.parametrize("escape", [b"\x1b]0;owned\x07", b"\x1b[2J"])
def test_output_is_made_safe_for_the_terminal(escape: bytes) -> None:
    code = f"print({escape.decode()!r})"
    r = subprocess.run([*CORRAL, "-c", code], capture_output=True, timeout=120)
    assert r.returncode == 0, r
    assert b"\x1b" not in r.stdout


@pytest.mark.env_build
def test_a_session_in_an_environment(sci_env: str) -> None:
    """``--environment``: the packages of the shared ``sci`` environment import (its
    store named by ``CORRAL_ENV_DIR``, set by the fixture); an unknown name is refused."""
    r = subprocess.run([*CORRAL, "--environment", sci_env, "-c",
                        "import pandas as pd", "-c", "int(pd.Series([1, 2, 3]).sum())"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["6"], r.stdout
    r = subprocess.run([*CORRAL, "--environment", "no-such-env", "-c", "1"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode != 0 and "environment" in r.stderr, (r.returncode, r.stderr)
