"""A session closed while a cell runs: the cell's ``run`` ends with the typed
``SessionEndedError``, every task of the session has ended (nothing new pending on the
loop), and no process or cgroup of it is left."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from corral import SessionEndedError
from corral.sessions import AsyncSession
from proctree import cmdline, descendants

pytestmark = pytest.mark.usefixtures("strict")


def _my_cgroups() -> list[str]:
    from corral.providers.linux.host.cgroups import CgroupManager
    m = CgroupManager()
    if m.support.version == "none":
        return []
    return [n for n in m.list_cgroups() if f"-{os.getpid()}-" in n]


def test_close_during_a_cell_ends_every_task_process_and_cgroup() -> None:
    procs_before, cgroups_before = descendants(), set(_my_cgroups())

    async def main() -> tuple[set[asyncio.Task[Any]], BaseException | None]:
        before = asyncio.all_tasks()
        session = await AsyncSession.create()  # its provider is made here, closed with it
        started = asyncio.Event()
        cell = asyncio.ensure_future(session.run(
            "import time\nprint('in', flush=True)\ntime.sleep(300)",
            timeout_s=600, on_stdout=lambda _t: started.set()))
        await asyncio.wait_for(started.wait(), 30)
        await session.close()
        try:
            await asyncio.wait_for(cell, 10)
            err: BaseException | None = None
        except BaseException as e:  # the test looks at its type
            err = e
        left = {t for t in asyncio.all_tasks() - before if not t.done()}
        return left, err

    left, err = asyncio.run(main())
    assert left == set()
    assert isinstance(err, SessionEndedError), repr(err)
    left_procs = descendants() - procs_before
    assert not {p for p in left_procs if "_serve_spawns" not in cmdline(p)}
    assert set(_my_cgroups()) - cgroups_before == set()
