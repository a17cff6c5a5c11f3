"""Run the real ``corral`` command where a person would see it: on a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

PY = sys.executable


def terminal_env(**extra: str) -> dict[str, str]:
    """This environment without colour switches, ``TERM=xterm``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["TERM"] = "xterm"
    env.update(extra)
    return env


def on_pty(args: Sequence[str], *, stdout_too: bool = False,
           env: Mapping[str, str] | None = None, timeout: float = 60.0
           ) -> tuple[int, bytes, list[tuple[float, bytes]]]:
    """``python -m corral ARGS`` with stderr (and with ``stdout_too`` stdout) on a pty,
    else stdout on a pipe. Returns (status, the piped stdout, the chunks the terminal
    got with the monotonic time each came). The process is killed if still running."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([PY, "-m", "corral", *args], stdin=subprocess.DEVNULL,
                            stdout=slave if stdout_too else subprocess.PIPE, stderr=slave,
                            env=dict(env) if env is not None else terminal_env())
    os.close(slave)
    seen: list[tuple[float, bytes]] = []
    out = b""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every slave end closed
                    break
                if not chunk:
                    break
                seen.append((time.monotonic(), chunk))
            elif proc.poll() is not None:
                break
        if proc.stdout is not None:
            out = proc.stdout.read()
        status = proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        os.close(master)
    return status, out, seen


def text(seen: list[tuple[float, bytes]]) -> bytes:
    return b"".join(chunk for _, chunk in seen)
