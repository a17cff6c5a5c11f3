"""A snippet that runs out of memory says so, typed and naming the limit, and keeps the
facts and logs captured so far (issue 16: it was ``WorkerCrashed ... exit status 70``
with empty facts). Strict (linux) and context-isolated."""

from __future__ import annotations

import asyncio

import pytest
from snippet_levels import LEVELS

from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet

GROW = """
x = []
n = 0
print("start")
while True:
    x.append("a" * 10**6)
    n += 1
"""


@pytest.mark.parametrize("level", LEVELS)
def test_a_growing_list_ends_in_a_named_memory_error_with_its_facts(level: str) -> None:
    async def main() -> None:
        async with SnippetPool(spares=0, max_workers=1, mem_mb=64) as pool:
            t = await run_snippet(GROW, pool=pool, level=level)
            assert [e.type for e in t.errors] == ["MemoryError"], t.errors
            assert "64 MiB" in t.errors[0].message and t.errors[0].line == 6
            assert [line.text for line in t.logs] == ["start"]
            assert isinstance(t.facts["n"], int) and 16 <= t.facts["n"] <= 80
            assert t.facts["x"] == "…[truncated]" and "facts" in t.truncated
            # the slot serves the next run as usual
            assert (await run_snippet("1 + 1", pool=pool, level=level)).result == "2"

    asyncio.run(main())
