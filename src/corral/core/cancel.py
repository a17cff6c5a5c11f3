"""CancelToken: cancellation for sync callers and for ``create`` (seed 01's AbortSignal)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import final

__all__ = ["CancelToken"]


@final
class CancelToken:
    """A one-shot, thread-safe cancellation flag.

    ``cancel()`` may be called from any thread. Sync code polls ``cancelled``
    or blocks in ``wait_cancelled(timeout)``; async code awaits
    ``wait_cancelled_async()``; callbacks added with :meth:`add_callback` run
    once, in the thread that cancels (or at once if already cancelled).
    """

    __slots__ = ("_callbacks", "_event", "_lock", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], object]] = []
        self.reason = ""

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str = "cancelled by caller") -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()

    def add_callback(self, cb: Callable[[], object]) -> Callable[[], None]:
        """Run ``cb`` on cancel. Returns a function that removes it again."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(cb)

                def remove() -> None:
                    with self._lock:
                        try:
                            self._callbacks.remove(cb)
                        except ValueError:
                            pass

                return remove
        cb()
        return lambda: None

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    async def wait_cancelled_async(self) -> None:
        if self.cancelled:
            return
        import asyncio  # here, not at the top: the sandbox's fork server imports this module

        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not fut.done():
                fut.set_result(None)

        def wake() -> None:
            loop.call_soon_threadsafe(settle)

        remove = self.add_callback(wake)
        try:
            await fut
        finally:
            remove()
