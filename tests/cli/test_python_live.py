"""``corral python`` on a terminal prints the snippet's log lines as they arrive
(sanitized, tagged, once), then the rest of the transcript; a pipe gets the transcript
in one piece, as before."""

from __future__ import annotations

import subprocess
import sys

from ptyrun import on_pty

PY = sys.executable
SOURCE = ("import time, logging\nprint('one')\ntime.sleep(0.8)\n"
          "logging.warning('two \\x1b[31m')\nprint('three')\n7")


def _on_pty(code: str) -> tuple[int, list[tuple[float, bytes]]]:
    """``corral python -c CODE`` with stdout and stderr on one pty; the chunks a person
    sees, each with when it came."""
    status, _, seen = on_pty(["python", "--level", "context-isolated", "-c", code],
                             stdout_too=True)
    return status, seen


def test_terminal_gets_the_lines_as_they_come_and_once() -> None:
    status, seen = _on_pty(SOURCE)
    assert status == 0
    text = b"".join(chunk for _, chunk in seen)
    first = next(t for t, chunk in seen if b"one" in chunk)
    last = seen[-1][0]
    assert last - first > 0.5, "the first line came only at the end"
    # each line once, the tag painted, the escape shown as text
    assert text.count(b"one\r\n") == 1 and text.count(b"three\r\n") == 1
    assert text.count(b"WARNING:root:two") == 1
    assert b"[log]\x1b[0m WARNING:root:two \\x1b[31m" in text
    assert b"\x1b[31m\r" not in text and b"two \x1b[31m" not in text
    # the rest of the transcript comes after the lines, without them
    assert text.index(b"three\r\n") < text.index(b"=>\x1b[0m 7\r\n")

def test_pipe_gets_the_transcript_as_before() -> None:
    r = subprocess.run([PY, "-m", "corral", "python", "--level", "context-isolated", "-c",
                        SOURCE], capture_output=True, timeout=60, check=False)
    assert r.returncode == 0
    lines = r.stdout.decode().splitlines()
    assert lines[:4] == ["one", "[log] WARNING:root:two \x1b[31m", "three", "=> 7"]
