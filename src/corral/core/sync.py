"""Run a coroutine to completion from sync code, with or without a running loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_sync"]

T = TypeVar("T")


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
