"""A FIFO concurrency limiter for asyncio whose limit can change while in use.

``acquire`` takes a permit or waits in strict arrival order; ``release``
hands the permit straight to the oldest waiter (no barging). A waiter that is
cancelled leaves the queue at once; one cancelled just after being handed a
permit passes it on, so a permit is never lost.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import final

from corral.core.errors import ConfigInvalidError

__all__ = ["FifoLimiter"]


@final
class FifoLimiter:
    """At most ``limit`` holders; the rest wait first come, first served."""

    def __init__(self, limit: int) -> None:
        self._limit = self._check(limit)
        self._running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @staticmethod
    def _check(limit: int) -> int:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigInvalidError("max_workers", f"must be an integer >= 1, got {limit!r}")
        return limit

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def set_limit(self, limit: int) -> None:
        """Change the limit; if it grew, the oldest waiters start now."""
        self._limit = self._check(limit)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._running < self._limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._running += 1
                waiter.set_result(None)

    async def acquire(self) -> None:
        if self._running < self._limit and not self._waiters:
            self._running += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a permit, then cancelled: pass it on
            else:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        if self._running <= 0:
            raise RuntimeError("release() without acquire()")
        self._running -= 1
        self._wake()
