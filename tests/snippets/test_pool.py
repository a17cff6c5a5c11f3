"""Pool behaviour: FIFO order, cancel (queued and running), timeout kill, crash and
replacement, tenant separation, limits and statistics. Strict (linux) and context-isolated."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from snippet_levels import LEVELS

from corral.core.errors import ConfigInvalidError, UnhandledWorkerError
from corral.snippets.host.pool import PoolStatistics, SnippetPool
from corral.snippets.host.runner import run_snippet
from corral.snippets.host.transcript import Transcript


def with_pool(level: str, body: Callable[[SnippetPool], Awaitable[Any]], **kw: Any) -> Any:
    async def main() -> Any:
        kw.setdefault("spares", 0)
        async with SnippetPool(**kw) as pool:
            return await body(pool)

    return asyncio.run(main())


def go(pool: SnippetPool, level: str, source: str, **kw: Any) -> Awaitable[Transcript]:
    return run_snippet(source, pool=pool, level=level, **kw)


async def until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("level", LEVELS)
def test_fifo_order_with_one_worker(level: str) -> None:
    async def body(pool: SnippetPool) -> None:
        await pool.prewarm(level=level, tenant_id="t")
        done: list[int] = []

        async def job(i: int) -> None:
            await go(pool, level, f"import time\ntime.sleep(0.02)\n{i}", tenant_id="t")
            done.append(i)

        tasks = [asyncio.ensure_future(job(i)) for i in range(5)]
        await until(lambda: pool.statistics().queued == 4)
        await asyncio.gather(*tasks)
        assert done == [0, 1, 2, 3, 4]
        stats = pool.statistics()
        assert (stats.completed, stats.running, stats.queued) == (5, 0, 0)

    with_pool(level, body, max_workers=1)


@pytest.mark.parametrize("level", LEVELS)
def test_cancel_while_queued_leaves_the_queue_at_once(level: str) -> None:
    async def body(pool: SnippetPool) -> None:
        first = asyncio.ensure_future(go(pool, level, "import time\ntime.sleep(0.3)\n1"))
        await until(lambda: pool.statistics().running == 1)
        queued = asyncio.ensure_future(go(pool, level, "2"))
        await until(lambda: pool.statistics().queued == 1)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert pool.statistics().queued == 0
        assert (await first).result == "1"
        assert pool.statistics().cancelled == 1

    with_pool(level, body, max_workers=1)


@pytest.mark.parametrize("level", LEVELS)
def test_cancel_while_running_frees_the_slot_at_once(level: str) -> None:
    async def body(pool: SnippetPool) -> None:
        await pool.prewarm(level=level, tenant_id="default", count=2)
        stuck = asyncio.ensure_future(go(pool, level, "while True:\n    pass", timeout_ms=10000))
        await until(lambda: pool.statistics().running == 1)
        nxt = asyncio.ensure_future(go(pool, level, "5"))
        await until(lambda: pool.statistics().queued == 1)
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        stats = pool.statistics()  # the queued job already holds the freed slot
        assert (stats.queued, stats.running, stats.cancelled) == (0, 1, 1)
        assert (await nxt).result == "5"
        assert pool.statistics().replaced == 1  # the cancelled run's slot was discarded

    with_pool(level, body, max_workers=1)


@pytest.mark.parametrize("level", LEVELS)
def test_timeout_kills_and_the_slot_serves_again(level: str) -> None:
    async def body(pool: SnippetPool) -> None:
        t = await go(pool, level, "while True:\n    try:\n        pass\n"
                                  "    except BaseException:\n        pass", timeout_ms=100)
        assert t.timed_out and t.errors[0].type == "TimeoutError"
        assert (await go(pool, level, "7")).result == "7"
        stats = pool.statistics()
        assert (stats.timed_out, stats.completed, stats.replaced) == (1, 2, 0)

    with_pool(level, body, max_workers=1)


@pytest.mark.parametrize("level", LEVELS)
def test_crashed_worker_is_reported_and_the_next_job_works(level: str) -> None:
    async def body(pool: SnippetPool) -> None:
        t = await go(pool, level, "import os\nos._exit(9)", _unsafe_skip_validation=True)
        assert t.errors[0].type == "WorkerCrashed" and t.errors[0].exit_code == 9
        t = await go(pool, level, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
                     _unsafe_skip_validation=True)
        assert t.errors[0].exit_code == -9
        assert (await go(pool, level, "8")).result == "8"
        # Killing the slot's server (the template; in strict, the sandbox's agent, which
        # the run cannot signal: it is its namespace's init): one UnhandledWorkerError,
        # then a replacement serves.
        if level == "strict":
            slot = next(s for q in pool._idle.values() for s in q)
            run = asyncio.ensure_future(go(pool, level, "import time\ntime.sleep(5)"))
            await until(lambda: len(slot.sandbox.host_pids()) == 2)
            os.kill(slot.sandbox.host_pids()[0], signal.SIGKILL)
            with pytest.raises(UnhandledWorkerError):
                await run
        else:
            with pytest.raises(UnhandledWorkerError):
                await go(pool, level, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"
                                      "\nimport time\ntime.sleep(5)", _unsafe_skip_validation=True)
        assert (await go(pool, level, "9")).result == "9"
        stats = pool.statistics()
        assert stats.crashed == 3 and stats.replaced == 1

    with_pool(level, body, max_workers=1)


PROBE = ("import builtins, os\n"
         "seen = getattr(builtins, 'corral_probe', None)\n"
         "builtins.corral_probe = os.urandom(8).hex()\n"
         "print(os.getpid(), os.getppid(), seen, builtins.corral_probe)")


@pytest.mark.parametrize("level", LEVELS)
def test_tenants_never_share_a_process_or_sandbox(level: str) -> None:
    async def body(pool: SnippetPool) -> None:
        await pool.prewarm(level=level, count=1)  # a fresh spare goes to the first tenant
        runs: dict[str, list[tuple[str, ...]]] = {"a": [], "b": []}
        for i in range(8):
            tenant = "ab"[i % 2]
            t = await go(pool, level, PROBE, tenant_id=tenant, _unsafe_skip_validation=True)
            runs[tenant].append(tuple(t.logs[0].text.split()))
        for rows in runs.values():
            assert all(seen == "None" for _pid, _ppid, seen, _tok in rows)  # fresh processes
        tokens = {tenant: {r[3] for r in rows} for tenant, rows in runs.items()}
        assert len(tokens["a"]) == len(tokens["b"]) == 4 and not tokens["a"] & tokens["b"]
        sandboxes = {t: {(sb, tpid) for tn, _lv, sb, tpid in pool.served if tn == t}
                     for t in "ab"}
        assert not {sb for sb, _ in sandboxes["a"]} & {sb for sb, _ in sandboxes["b"]}
        if level == "context-isolated":  # host pids: the templates differ too
            parents = {t: {r[1] for r in rows} for t, rows in runs.items()}
            assert not parents["a"] & parents["b"]

    with_pool(level, body, max_workers=2)


@pytest.mark.parametrize("level", LEVELS)
def test_raising_the_limit_starts_queued_jobs(level: str) -> None:
    async def body(pool: SnippetPool) -> None:
        jobs = [asyncio.ensure_future(go(pool, level, f"import time\ntime.sleep(0.3)\n{i}"))
                for i in range(3)]
        await until(lambda: pool.statistics().queued == 2)
        pool.set_max_concurrent_workers(3)
        assert pool.statistics().queued == 0 and pool.statistics().running == 3
        assert [t.result for t in await asyncio.gather(*jobs)] == ["0", "1", "2"]

    with_pool(level, body, max_workers=1)


def test_statistics_are_a_frozen_snapshot_and_limits_are_checked() -> None:
    async def body(pool: SnippetPool) -> None:
        stats = pool.statistics()
        assert isinstance(stats, PoolStatistics) and stats.max_workers == 3
        with pytest.raises(dataclasses.FrozenInstanceError):
            stats.running = 5  # type: ignore[misc]
        await go(pool, "context-isolated", "1")
        assert stats.completed == 0 and pool.statistics().completed == 1
        assert pool.statistics().idle == 0  # max_idle=0: the slot was retired at once
        with pytest.raises(ConfigInvalidError, match="max_workers"):
            pool.set_max_concurrent_workers(0)

    with_pool("context-isolated", body, max_workers=3, max_idle=0)
    with pytest.raises(ConfigInvalidError, match="mem_mb"):
        SnippetPool(mem_mb=1)


@pytest.mark.parametrize("level", LEVELS)
def test_memory_cap_follows_the_pool(level: str) -> None:
    async def body(pool: SnippetPool) -> None:
        t = await go(pool, level, "x = bytearray(100 * 1024 * 1024)\nlen(x)")
        assert t.errors and t.errors[0].type == "MemoryError"
        assert (await go(pool, level, "y = bytearray(10 * 1024 * 1024)\nlen(y)")).result \
            == str(10 * 1024 * 1024)

    with_pool(level, body, max_workers=1, mem_mb=64)
