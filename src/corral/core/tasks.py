"""Owners for tasks that a call starts and does not await where it starts them.

Every task corral makes has an owner that awaits it (issue "tasks nobody owns"): an
``asyncio.TaskGroup`` where the tasks live inside one ``async with`` block, a held-open
group for servers (``providers.linux.host.egress.tasks.TaskOwner``), or one of these:

- :func:`settle`: the coroutine that made some tasks ends them before it returns
  (cancel what still runs, then wait for every one, its exception retrieved). A
  ``TaskGroup`` would do the same but turns the block's own exception into an
  ``ExceptionGroup``; the callers here keep their typed errors as they are.
- :class:`TaskSet`: an object's background tasks started from plain (non-async)
  code, a callback or a constructor; the object's close awaits :meth:`TaskSet.aclose`,
  so none outlives it and none is destroyed pending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar, final

__all__ = ["TaskSet", "settle"]

T = TypeVar("T")


async def settle(tasks: Iterable[asyncio.Future[Any] | None]) -> None:
    """Cancel each of ``tasks`` that has not ended and wait until all have; their
    results and exceptions are dropped (the caller read what it needed). Shielded: a
    cancellation of the caller meanwhile still leaves every task ended."""
    todo = [t for t in tasks if t is not None]
    for t in todo:
        if not t.done():
            t.cancel()
    if not todo:
        return
    gathered = asyncio.gather(*todo, return_exceptions=True)  # every exception retrieved
    try:
        await asyncio.shield(gathered)
    except asyncio.CancelledError:
        await gathered  # the tasks are cancelled already: this is short
        raise


@final
class TaskSet:
    """Background tasks of one object: started by :meth:`spawn` (from plain code
    too), awaited by :meth:`drain` or ended by :meth:`aclose`."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # seen: the owner reports failures where it awaits

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        """Wait until every task (those spawned meanwhile too) has ended."""
        while self._tasks:
            tasks = list(self._tasks)
            await asyncio.wait(tasks)
            self._forget_done(tasks)

    async def aclose(self) -> None:
        """Cancel every task still running and wait until all have ended."""
        while self._tasks:
            tasks = list(self._tasks)
            await settle(tasks)
            self._forget_done(tasks)

    def _forget_done(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Drop the ended ones now: their ``_done`` callback is only scheduled, and
        awaiting tasks that have all ended does not yield to the loop, so waiting for
        it to run would spin forever (a snippet pool's close did, on 3.12 and 3.13)."""
        for t in tasks:
            if t.done():
                self._tasks.discard(t)
                if not t.cancelled():
                    t.exception()  # seen (settle's gather saw it too)
