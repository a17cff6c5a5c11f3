"""Fixtures for the bounded runner tests: short ``python -I -S -c`` children."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterator

import pytest

PY = sys.executable


def find_by_argv(token: str) -> list[int]:
    """Pids of live (non-zombie) processes whose argv contains ``token``."""
    hits = []
    needle = token.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read():
                    hits.append(int(name))
        except OSError:
            continue
    return hits


@pytest.fixture
def py() -> Callable[[str], tuple[str, list[str]]]:
    """``py(code)`` -> (command, args) running ``code`` in a fresh, fast interpreter."""

    def make(code: str) -> tuple[str, list[str]]:
        return PY, ["-I", "-S", "-c", code]

    return make


@pytest.fixture
def argv_token() -> Iterator[str]:
    """A random token to put in a child's argv; any process still carrying it
    at teardown is killed (so a failing test leaves nothing behind)."""
    token = "corral-test-" + secrets.token_hex(6)
    yield token
    for pid in find_by_argv(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def wait_gone() -> Callable[[str], list[int]]:
    """``wait_gone(token)``: poll up to 2 s for processes carrying ``token`` to vanish."""

    def wait(token: str) -> list[int]:
        deadline = time.monotonic() + 2
        while True:
            left = find_by_argv(token)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.02)

    return wait
