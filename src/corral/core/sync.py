"""The one sync adapter: run a coroutine to completion from sync code, with or without a
running loop in the calling thread (:func:`run_sync`), and the sync twin of an async front
door made from it with the same signature (:func:`sync_twin`).

Every sync call runs on one process-wide event loop, in a daemon thread named
``corral-sync`` started on first use (:func:`background_loop`). One loop, not a fresh
one per call, because providers and pools keep state bound to the loop they first ran
on (a linux provider's fork server channel, its spares, a snippet pool's slots): a
provider passed to ``run_strict`` or ``run_snippet_sync`` from sync code, twice, must
meet the same loop both times. Consequences, documented on each twin: output callbacks
(``on_stdout`` ...) run on that thread; a provider used from sync code should be closed
from sync code too (:func:`close_sync`); calling a twin from the ``corral-sync`` thread
itself (from a callback) is refused, since it would wait on itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, Protocol, TypeVar

__all__ = ["background_loop", "close_sync", "run_sync", "sync_twin"]

T = TypeVar("T")
P = ParamSpec("P")

#: how long a sync call interrupted in its thread (KeyboardInterrupt) waits for its
#: cancelled run to clean up (kill, destroy) before the interrupt goes on
_CLEANUP_WAIT_S = 30.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid = 0


def background_loop() -> asyncio.AbstractEventLoop:
    """The process-wide loop every sync call runs on, started on first use (again in
    a forked child, where the parent's thread does not exist)."""
    global _loop, _thread, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="corral-sync",
                                      daemon=True)
            thread.start()
            _loop, _thread, _pid = loop, thread, os.getpid()
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on :func:`background_loop` and return its result.

    Works from any thread, with or without a running loop of its own (a coroutine that
    calls a sync API blocks its loop until done). An interrupt of the waiting thread
    (KeyboardInterrupt) cancels the run and waits for it to clean up before it goes on.
    """
    loop = background_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("a corral sync call from the corral-sync thread itself (an "
                           "output callback?) would wait on itself: await the async door")
    finished = threading.Event()

    async def run() -> T:
        try:
            return await coro
        finally:
            finished.set()

    fut: concurrent.futures.Future[T] | None = None
    try:
        fut = asyncio.run_coroutine_threadsafe(run(), loop)
        return fut.result()
    except BaseException:
        if fut is not None and not fut.done():
            fut.cancel()
            finished.wait(_CLEANUP_WAIT_S)
        raise


class _Closable(Protocol):
    async def aclose(self) -> None: ...


def close_sync(obj: _Closable) -> None:
    """``await obj.aclose()`` (a provider, a pool) from sync code, on the loop sync calls
    used it on."""
    run_sync(obj.aclose())


def sync_twin(fn: Callable[P, Coroutine[Any, Any, T]], *, name: str) -> Callable[P, T]:
    """The synchronous twin of the async function ``fn``, named ``name``: the same
    parameters, run to completion with :func:`run_sync` (on the process-wide loop).
    Cancel it from any thread with the ``cancel`` token the function takes, where it
    takes one."""

    def twin(*args: P.args, **kwargs: P.kwargs) -> T:
        return run_sync(fn(*args, **kwargs))

    functools.update_wrapper(twin, fn)
    twin.__name__ = twin.__qualname__ = name
    twin.__doc__ = (f"Synchronous twin of :func:`{fn.__module__}.{fn.__name__}` (same "
                    "arguments, same result; runs on the process-wide loop of "
                    ":mod:`corral.core.sync`).\n\n" + (fn.__doc__ or ""))
    return twin
