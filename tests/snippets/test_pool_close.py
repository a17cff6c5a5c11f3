"""Closing a pool with work in flight: a run going, a run waiting for its turn and a spare
being warmed. When ``aclose`` returns, no task of the pool is pending (every one has an
owner that awaited it: issue 25) and no process the pool started is left. Strict (linux)
and context-isolated."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from snippet_levels import LEVELS

from corral.core.errors import ProviderError, UnhandledWorkerError
from corral.runner.tree import warm_spawn_helper
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet
from corral.snippets.host.transcript import Transcript
from env_toy import descendants


async def until(cond: Any, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("level", LEVELS)
def test_closing_with_work_in_flight_leaves_no_task_and_no_process(level: str) -> None:
    async def main() -> None:
        warm_spawn_helper()  # process-wide (the subproc provider's), not the pool's
        before = descendants()
        pool = SnippetPool(max_workers=1, spares=1)
        try:
            running = asyncio.ensure_future(run_snippet(
                "import time\nwhile True:\n    time.sleep(0.01)", pool=pool, level=level,
                tenant_id="t", timeout_ms=10_000))
            await until(lambda: pool.statistics().running == 1 and len(pool.served) == 1)
            queued = asyncio.ensure_future(run_snippet("1", pool=pool, level=level,
                                                       tenant_id="t"))
            await until(lambda: pool.statistics().queued == 1)
            during = descendants() - before
            assert during, "the pool started no process (the test would prove nothing)"
        finally:
            await pool.aclose()
        others = asyncio.all_tasks() - {asyncio.current_task(), running, queued}
        assert not others, others  # nothing of the pool's is left pending
        done, _ = await asyncio.wait({running, queued}, timeout=30)
        assert done == {running, queued}
        exc = running.exception()
        if exc is None:  # the run ended as its sandbox went: a crash, never a success
            result = running.result()
            assert isinstance(result, Transcript) and not result.ok, result
        else:
            assert isinstance(exc, UnhandledWorkerError | ProviderError), repr(exc)
        assert isinstance(queued.exception(), ProviderError), queued
        # every process the pool started (sandboxes, templates, runs, fork servers) is gone
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while (left := descendants() & during) and loop.time() < end:
            await asyncio.sleep(0.05)
        assert not left, {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left}

    asyncio.run(main())
