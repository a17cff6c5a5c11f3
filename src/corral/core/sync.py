"""The one sync adapter: run a coroutine to completion from sync code, with or without a
running loop in the calling thread (:func:`run_sync`), and the sync twin of an async front
door made from it with the same signature (:func:`sync_twin`)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

__all__ = ["run_sync", "sync_twin"]

T = TypeVar("T")
P = ParamSpec("P")


def run_sync(coro: Coroutine[Any, Any, T], *, name: str) -> T:
    """Run ``coro`` on a fresh event loop and return its result.

    Without a running loop in this thread, the loop runs here. Called from
    inside a running loop (a coroutine calling a sync API by mistake), it runs
    in a helper thread named ``name`` and blocks that loop until done.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        with asyncio.Runner() as runner:
            return runner.run(coro)
    box: list[Any] = []

    def in_thread() -> None:
        try:
            with asyncio.Runner() as runner:
                box.append(runner.run(coro))
        except BaseException as e:  # handed to the caller's thread below
            box.append(e)

    t = threading.Thread(target=in_thread, name=name)
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    result: T = box[0]
    return result


def sync_twin(fn: Callable[P, Coroutine[Any, Any, T]], *, name: str) -> Callable[P, T]:
    """The synchronous twin of the async function ``fn``, named ``name``: the same
    parameters, run to completion with :func:`run_sync` (its own loop, or a helper
    thread when called from inside a running loop). Cancel it from any thread with
    the ``cancel`` token the function takes, where it takes one."""
    thread = "corral-" + name.replace("_", "-")

    def twin(*args: P.args, **kwargs: P.kwargs) -> T:
        return run_sync(fn(*args, **kwargs), name=thread)

    functools.update_wrapper(twin, fn)
    twin.__name__ = twin.__qualname__ = name
    twin.__doc__ = (f"Synchronous twin of :func:`{fn.__module__}.{fn.__name__}` (same "
                    "arguments, same result; see :func:`corral.core.sync.sync_twin`).\n\n"
                    + (fn.__doc__ or ""))
    return twin
