"""The pure core does no I/O: it must not even import an I/O module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import corral

SRC = Path(corral.__file__).parent
PURE = [
    "errors.py", "spec.py", "protocol.py", "_protocol_frames.py", "_protocol_codec.py",
    "snippets/validate.py",
]
FORBIDDEN = {"os", "subprocess", "asyncio", "socket", "threading", "ctypes", "io", "shutil"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            out.add("__import__")
    return out


@pytest.mark.parametrize("name", PURE)
def test_pure_module_imports_no_io(name: str) -> None:
    path = SRC / name
    if not path.exists():
        pytest.skip(f"{name} not written yet")
    bad = imported_modules(path) & (FORBIDDEN | {"__import__"})
    assert not bad, f"{name} imports {sorted(bad)}"


def test_the_check_can_fail(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text("import json\nfrom os import path\nimport asyncio.tasks\n")
    assert imported_modules(p) & FORBIDDEN == {"os", "asyncio"}


def test_only_sys_unsafe_imports_ctypes() -> None:
    offenders = [
        str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
        if "ctypes" in imported_modules(p) and p.name != "_sys_unsafe.py"
    ]
    assert offenders == []
