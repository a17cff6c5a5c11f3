"""The pure modules do no I/O: they import no I/O module, and of corral only other pure modules.

The pure layers are the core (errors, values, the contract), the wires' codecs,
the snippet validator, the Linux provider's policy (plan, seccomp) and the egress
policy. Each is
checked by reading its source (no import needed), so the check also holds for
code paths a test never runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import corral

SRC = Path(corral.__file__).parent
PURE = [
    "corral.core.errors", "corral.core.spec", "corral.core.result", "corral.core.contract",
    "corral.core.files",
    "corral.wire.protocol", "corral.wire.jsonline", "corral.wire.agent", "corral.wire.agentmsg",
    "corral.wire.fork",
    "corral.wire.records",
    "corral.snippets.validator", "corral.snippets.validator.policy",
    "corral.snippets.validator.rules",
    "corral.providers.linux.policy.plan", "corral.providers.linux.policy.seccomp",
    "corral.providers.linux.policy.outcomes",
    "corral.providers.linux.policy.bpf", "corral.providers.linux.policy.syscall_numbers",
    # the egress policy (the plan parses a spec's network policy with it)
    "corral.providers.linux.host.egress.policy",
]
#: corral modules a pure module may import besides the pure ones: value types only
ALSO_ALLOWED = {"corral.core", "corral.core.cancel", "corral.wire", "corral.snippets",
                "corral.providers.linux.policy"}
FORBIDDEN = {"os", "subprocess", "asyncio", "socket", "threading", "ctypes", "io", "shutil",
             "importlib", "select", "signal", "tempfile", "pathlib", "urllib", "http"}


def path_of(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    pkg = SRC / rel / "__init__.py"
    return pkg if pkg.exists() else SRC / rel.with_suffix(".py")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (full dotted names), at any depth of the file."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            out.add("<relative>")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            out.add("__import__")
    return out


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io(module: str) -> None:
    imported = imported_modules(path_of(module))
    bad = {m for m in imported if m.split(".")[0] in FORBIDDEN | {"__import__", "<relative>"}}
    assert not bad, f"{module} imports {sorted(bad)}"
    impure = {m for m in imported if m.startswith("corral")
              and m not in PURE and m not in ALSO_ALLOWED}
    assert not impure, f"{module} imports corral modules that are not pure: {sorted(impure)}"


def test_the_check_can_fail(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text("import json\nfrom os import path\nimport asyncio.tasks\n"
                 "from corral.run import bounded\n")
    got = imported_modules(p)
    assert {m.split(".")[0] for m in got} & FORBIDDEN == {"os", "asyncio"}
    assert "corral.run" in got


def test_only_sys_unsafe_imports_ctypes() -> None:
    offenders = [
        str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
        if any(m.split(".")[0] == "ctypes" for m in imported_modules(p))
        and p.name != "_sys_unsafe.py"
    ]
    assert offenders == []


def test_no_module_rewrites_another_modules_name() -> None:
    """Every public name is defined where users import it from (no ``__module__``
    rewriting to hide a private home)."""
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if ".__module__ =" in p.read_text() or "__module__ = __name__" in p.read_text()]
    assert offenders == []
