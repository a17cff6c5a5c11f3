"""The Ray tests print nothing between pytest's progress dots (issue 27 item 1): a figure
a test measures goes to logging (``corral.tests.ray``: shown on a failure, or with ``-o
log_cli=true --log-cli-level=INFO``), never through ``capsys.disabled()`` or to the real
terminal. Before, three tests printed lines of free text into ``pytest -q``'s dots."""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).parent


def _loud(path: Path) -> list[str]:
    """Where a test module writes past pytest's capture: ``capsys.disabled()``,
    ``capfd.disabled()``, ``sys.__stdout__`` / ``sys.__stderr__``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and (
                (node.attr == "disabled" and isinstance(node.value, ast.Name)
                 and node.value.id in ("capsys", "capfd"))
                or node.attr in ("__stdout__", "__stderr__")):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_ray_test_writes_past_the_capture() -> None:
    loud = [hit for p in sorted(HERE.glob("*.py")) for hit in _loud(p)]
    assert loud == [], f"free text between pytest's dots from {loud}: log it instead"
