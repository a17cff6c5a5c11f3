"""The provider layer never imports or names a front door (issue 11.1): no
``corral.snippets``, ``corral.dispatch``, ``corral.cli`` or front-door ``corral.run``
module appears in any source file under ``src/corral/providers``; what a sandbox may
fork is given by the caller (``preload_python(..., fork_entries=)``)."""

from __future__ import annotations

import re
from pathlib import Path

import corral.providers

_FRONT_DOORS = re.compile(
    r"corral[./](snippets|dispatch|handler|cli|run[./](strict|bounded))\b")


def test_no_provider_module_names_a_front_door() -> None:
    root = Path(corral.providers.__file__).parent
    sources = sorted(root.rglob("*.py"))
    assert sources
    hits = [f"{p.relative_to(root)}:{n}: {line.strip()}"
            for p in sources
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if _FRONT_DOORS.search(line)]
    assert hits == []
