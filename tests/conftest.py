"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral


@pytest.fixture(scope="session")
def nobody_python() -> Iterator[tuple[str, str]]:
    """(interpreter, import root) that uid 65534 can reach, for tests that drop to it.

    The checkout (and its venv) may sit under a 0700 home such as /root, which
    another uid cannot walk: copy the corral package to a world-readable temp
    dir and use the venv's real interpreter file. Removed after the session.
    """
    root = tempfile.mkdtemp(prefix="corral-nobody-")
    try:
        os.chmod(root, 0o755)
        shutil.copytree(Path(corral.__file__).parent, Path(root) / "corral",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for d, dirs, files in os.walk(root):
            for name in dirs:
                os.chmod(os.path.join(d, name), 0o755)
            for name in files:
                os.chmod(os.path.join(d, name), 0o644)
        yield os.path.realpath(sys.executable), root
    finally:
        shutil.rmtree(root, ignore_errors=True)
