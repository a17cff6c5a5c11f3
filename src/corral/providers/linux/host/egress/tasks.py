"""An owner for tasks that outlive the call that starts them: a task group held open.

``asyncio.TaskGroup`` owns the tasks made in an ``async with`` block, but a proxy or a
sandbox's preview URLs serve connections across many calls (``start`` in one task,
``aclose`` in another). :class:`TaskOwner` holds a task group open in a runner task of
its own: :meth:`TaskOwner.spawn` makes each connection's task in that group,
:meth:`TaskOwner.aclose` cancels what still runs and awaits the runner, which awaits
every task of the group. So every task has an owner that awaits it: none is left to a
server (``asyncio.start_server`` makes and owns a task for a coroutine callback; the
network code passes plain callbacks that spawn here instead) and none outlives the
object that made it.

A task that fails with an exception would end the whole group (every connection of the
proxy), so each spawned coroutine is guarded: an exception is logged and counted in
:attr:`TaskOwner.errors` (a bug: tests want 0), and the task ends with None.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar, final

__all__ = ["TaskOwner"]

_log = logging.getLogger(__name__)
T = TypeVar("T")


@final
class TaskOwner:
    """A task group open from :meth:`open` until :meth:`aclose` (see the module doc)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._runner: asyncio.Task[None] | None = None
        self._group: asyncio.TaskGroup | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False
        #: spawned coroutines that ended with an unexpected exception (logged)
        self.errors = 0

    async def open(self) -> None:
        """Open the group (idempotent); spawning works from now until :meth:`aclose`."""
        if self._runner is not None or self.closed:
            return
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._stop = asyncio.Event()
        self._runner = loop.create_task(self._run(ready), name=f"{self.name} task group")
        await asyncio.shield(ready)

    async def _run(self, ready: asyncio.Future[None]) -> None:
        assert self._stop is not None
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                ready.set_result(None)
                await self._stop.wait()
                for task in list(self._tasks):
                    task.cancel()
        finally:
            self._group = None
            if not ready.done():
                ready.cancel()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T | None] | None:
        """Run ``coro`` as a task of the group; None (``coro`` closed unrun) when the
        group is not open or is closing."""
        if self._group is None or self.closed:
            coro.close()
            return None
        task = self._group.create_task(self._guard(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _guard(self, coro: Coroutine[Any, Any, T]) -> T | None:
        try:
            return await coro
        except Exception:
            self.errors += 1
            _log.exception("%s: a task failed", self.name)
            return None

    def __len__(self) -> int:
        """Tasks of the group that have not ended."""
        return len(self._tasks)

    async def aclose(self) -> None:
        """Cancel every task still running and wait until all have ended (idempotent)."""
        self.closed = True
        if self._runner is None:
            return
        if self._stop is not None:
            self._stop.set()
        await self._runner
