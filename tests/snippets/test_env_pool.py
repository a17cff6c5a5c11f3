"""An environment's warm pool keeps, beside its template, the next run's child forked
ahead of its job (its *spare*, ``--prefork``). Each run is still a fresh process, the
slot holds exactly the template and its spare between jobs (a process a run left
behind is still seen), and no spare outlives its slot: closing the pool (with a run in
flight), cancelling a run, a crashed run and a killed template leave no process."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from snippet_levels import STRICT_SKIP

from corral.core.errors import ProviderError, UnhandledWorkerError
from corral.core.spec import Level
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import _run_in
from corral.snippets.host.transcript import Transcript
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS
from env_toy import TOY, descendants, toy_pool
from strict_tier import needs_strict

pytestmark = needs_strict(STRICT_SKIP)


def run(pool: SnippetPool, source: str, *, guard: bool = True) -> Any:
    """A run of ``source`` (``guard=False``: no import guard, no run-time guard: for the
    runs that play a crash, which the guard would refuse)."""
    return _run_in(pool, [("main.py", source)], tenant_id="t", level=Level.STRICT,
                   timeout_ms=10_000, allowed=DEFAULT_ALLOWED_IMPORTS | {TOY}, guard=guard)


def slot_processes(pool: SnippetPool) -> int:
    (slot,) = [s for q in pool._idle.values() for s in q]
    return int(slot.sandbox.process_count())  # type: ignore[attr-defined]


async def gone(pids: set[int]) -> set[int]:
    """Which of ``pids`` are still alive after at most 10 s."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 10
    while (left := descendants() & pids) and loop.time() < end:
        await asyncio.sleep(0.05)
    return left


def test_each_run_is_a_fresh_process_and_the_spare_waits(tmp_path: Path) -> None:
    async def main() -> None:
        async with toy_pool(tmp_path / "envs") as pool:
            pids = []
            for _ in range(3):
                t: Transcript = await run(pool, f"import logging, {TOY}\n"
                                                "print(logging.os.getpid(), logging.os.getppid())")
                assert t.ok, t.errors
                pid, parent = t.logs[0].text.split()
                pids.append(pid)
                # between jobs: the template and the next run's child, nothing else
                assert slot_processes(pool) == 2
            assert len(set(pids)) == 3  # never one process for two runs
            assert len({pool.served[i][3] for i in range(3)}) == 1  # one template served them
            assert int(parent) == pool.served[0][3]  # the template's child
            # a crashed run: reported, and the slot goes on with a fresh spare
            t = await run(pool, "import os\nos.kill(os.getpid(), 9)", guard=False)
            assert [e.type for e in t.errors] == ["WorkerCrashed"], t.errors
            assert slot_processes(pool) == 2
            t = await run(pool, "1 + 1")
            assert t.ok and t.result == "2", t.errors

    asyncio.run(main())


def test_a_run_that_leaves_a_process_behind_is_still_seen(tmp_path: Path) -> None:
    """The slot's own count is its template and its spare: one more (a process the run
    detached from its group) retires the slot. The run here may fork (no validator, no
    run-time guard, and RLIMIT_NPROC does not bind the sandbox's root): the check is what
    is tested, not the guards."""
    async def main() -> None:
        async with toy_pool(tmp_path / "envs") as pool:
            t = await run(pool, "1")
            assert t.ok
            first = pool.served[-1][2]
            src = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                   "    time.sleep(30)\n    os._exit(0)\n")
            t = await run(pool, src, guard=False)
            assert pool.statistics().replaced >= 1, t
            t = await run(pool, "1")
            assert t.ok and pool.served[-1][2] != first  # a new sandbox served it

    asyncio.run(main())


@pytest.mark.parametrize("how", ["close", "cancel", "kill-template"])
def test_no_spare_outlives_its_slot(tmp_path: Path, how: str) -> None:
    async def main() -> None:
        before = descendants()
        async with toy_pool(tmp_path / "envs") as pool:
            t = await run(pool, "1")
            assert t.ok
            assert slot_processes(pool) == 2
            during = descendants() - before
            # the sandbox's processes (the agent, the template, the spare)
            inside = {pid for pid in during if _in_sandbox(pid)}
            assert len(inside) >= 3, "no sandbox process seen (the test would prove nothing)"
            if how == "kill-template":  # the run kills its template: the slot is discarded
                with pytest.raises(UnhandledWorkerError):
                    await run(pool, "import os, time\nos.kill(os.getppid(), 9)\n"
                                    "time.sleep(5)", guard=False)
                assert pool.statistics().replaced == 1
            else:
                task = asyncio.ensure_future(run(pool, "import time\ntime.sleep(30)"))
                await asyncio.sleep(0.5)
                assert pool.statistics().running == 1
                if how == "cancel":
                    task.cancel()
                else:
                    await pool.aclose()
                with pytest.raises((asyncio.CancelledError, UnhandledWorkerError,
                                    ProviderError)):
                    await task
            await pool._closing.drain()  # the discarded slot is closed
            # its sandbox's processes are gone (the template, the spare, the run), while
            # the pool and its provider live on (unless closed)
            assert not await gone(inside), how
        assert not await gone(during)

    asyncio.run(main())


def _in_sandbox(pid: int) -> bool:
    """Whether ``pid`` runs in a pid namespace other than this process's."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    except OSError:
        return False
