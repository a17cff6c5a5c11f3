"""The provider-wide CPU watcher: ``cpu_ms`` for every live sandbox, for its whole life.

``cpu_ms`` is a total (CPU time of all the sandbox's processes together), not a
rate, so cgroup throttling (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) cannot
express it, and cgroup v1 has no kill at a usage figure. The host therefore
reads each capped sandbox's cgroup usage and kills the sandbox when it reaches
the cap, whether or not a command of it is running.

One timer on the event loop serves every sandbox of a provider. A sandbox with
``r`` ms left cannot reach its cap within ``r / ncpu`` ms of wall time (its
processes run on at most ``ncpu`` CPUs at once), so that is when it is read
next, but at least every ``MAX_S`` (CPUs can come online) and at most every
``MIN_S``: an idle sandbox or one far from its cap costs a file read now and
then, one close to it is read every 20 ms. The overshoot is bounded by
``MIN_S`` x ``ncpu`` plus the event loop's lag and the kill's latency.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final, final

__all__ = ["MAX_S", "MIN_S", "CpuWatch"]

#: the shortest and the longest wait between two reads of one sandbox's usage
MIN_S: Final = 0.02
MAX_S: Final = 2.0


def _online_cpus() -> int:
    return os.cpu_count() or 1


@dataclass(eq=False, slots=True)
class _Watched:
    cap: int
    usage: Callable[[], int]
    on_cap: Callable[[int], None]


@final
class CpuWatch:
    """Calls ``on_cap(used)`` once when a watched ``usage()`` (ms) reaches its cap.

    Runs on the event loop of the latest :meth:`add`; nothing runs while nothing
    is watched. ``usage`` and ``on_cap`` must be quick and must not block.
    """

    def __init__(self, *, ncpu: Callable[[], int] = _online_cpus) -> None:
        self._ncpu = ncpu
        self._items: dict[Hashable, _Watched] = {}
        self._heap: list[tuple[float, int, Hashable]] = []  # (due, seq, key)
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def add(self, key: Hashable, cap: int, usage: Callable[[], int],
            on_cap: Callable[[int], None]) -> None:
        """Watch ``key`` (a no-op if watched already); its first read is due at once."""
        if key in self._items:
            return
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._disarm()
            self._loop = loop
        self._items[key] = _Watched(cap, usage, on_cap)
        heapq.heappush(self._heap, (loop.time(), next(self._seq), key))
        self._arm()

    def discard(self, key: Hashable) -> None:
        """Stop watching ``key`` (no-op if not watched)."""
        if self._items.pop(key, None) is not None and not self._items:
            self._heap.clear()
            self._disarm()

    def close(self) -> None:
        """Stop watching everything."""
        self._items.clear()
        self._heap.clear()
        self._disarm()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf

    def _arm(self) -> None:
        if not self._heap or self._loop is None or self._loop.is_closed():
            return
        due = self._heap[0][0]
        if self._timer is None or due < self._timer_at:
            self._disarm()
            self._timer = self._loop.call_at(due, self._tick)
            self._timer_at = due

    def _tick(self) -> None:
        self._timer, self._timer_at = None, math.inf
        loop = self._loop
        assert loop is not None
        now = loop.time()
        ncpu = max(1, self._ncpu())
        while self._heap and self._heap[0][0] <= now + 0.001:
            _due, _n, key = heapq.heappop(self._heap)
            w = self._items.get(key)
            if w is None:
                continue  # discarded
            try:
                used = int(w.usage())
            except (OSError, ValueError):
                used = -1  # unreadable for now: try again soon
            if used >= w.cap:
                del self._items[key]
                try:
                    w.on_cap(used)
                except Exception as e:
                    loop.call_exception_handler({"message": "cpu_ms enforcement failed",
                                                 "exception": e})
                continue
            wait = MIN_S if used < 0 else (w.cap - used) / 1000 / ncpu
            heapq.heappush(self._heap, (now + min(MAX_S, max(MIN_S, wait)),
                                        next(self._seq), key))
        self._arm()
