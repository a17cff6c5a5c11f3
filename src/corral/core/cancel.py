"""CancelToken: cancellation for sync callers and for ``create`` (seed 01's AbortSignal).

The token is thread-safe and loop-free. Async code reaches it through the one
bridge here: :func:`call_on_cancel` (run a function in a loop's thread when the
token fires) and, built on it, :class:`CancelScope` (cancel the enclosing task
when the token fires, and say afterwards whether that is how it ended). Every
front door and provider uses these two; none bridges a token by hand.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

if TYPE_CHECKING:
    import asyncio

__all__ = ["CancelScope", "CancelToken", "call_on_cancel"]


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


def call_on_cancel(token: CancelToken | None, loop: asyncio.AbstractEventLoop,
                   fn: Callable[[], object]) -> Callable[[], None]:
    """When ``token`` fires (in any thread), run ``fn`` in ``loop``'s thread; at once (soon)
    if it already has. Returns the function that unhooks it (a no-op for no token).
    A loop already closed by then is skipped: its work is over."""
    if token is None:
        return _nothing

    def hop() -> None:
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed
            pass

    return token.add_callback(hop)


def _nothing() -> None:
    pass


@final
class CancelScope:
    """``async with CancelScope(token) as scope:`` -- the token cancels the task running
    the block; the block's CancelledError from that is swallowed and ``scope.cancelled``
    is True afterwards (a cancellation from elsewhere passes through untouched, as with
    ``asyncio.timeout``). With ``token=None`` the scope does nothing."""

    __slots__ = ("_done", "_fired", "_remove", "_task", "_token", "cancelled")

    def __init__(self, token: CancelToken | None) -> None:
        self._token = token
        self._task: asyncio.Task[Any] | None = None
        self._remove: Callable[[], None] = _nothing
        self._fired = False
        self._done = False
        #: whether the token ended the block
        self.cancelled = False

    async def __aenter__(self) -> CancelScope:
        if self._token is not None:
            import asyncio  # not at the top: the fork server imports this module

            self._task = asyncio.current_task()
            self._remove = call_on_cancel(self._token, asyncio.get_running_loop(), self._fire)
        return self

    def _fire(self) -> None:
        if not self._done and self._task is not None:
            self._fired = True
            self._task.cancel()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: object) -> bool:
        self._done = True
        self._remove()
        if self._fired and self._task is not None:
            import asyncio

            if self._task.uncancel() == 0 and et is asyncio.CancelledError:
                self.cancelled = True
                return True
        return False
