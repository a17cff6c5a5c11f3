"""The one sync adapter: a sync twin works with or without a running loop in its thread."""

from __future__ import annotations

import asyncio
import inspect
import threading

from corral.core.sync import run_sync, sync_twin


async def _where(x: int, *, plus: int = 0) -> tuple[int, str]:
    await asyncio.sleep(0)
    return x + plus, threading.current_thread().name


twin = sync_twin(_where, name="where")


def test_twin_keeps_the_signature_and_runs_without_a_loop() -> None:
    assert inspect.signature(twin) == inspect.signature(_where)
    assert twin.__name__ == "where" and "Synchronous twin" in (twin.__doc__ or "")
    assert twin(1, plus=2) == (3, threading.current_thread().name)


def test_twin_called_inside_a_running_loop_uses_a_helper_thread() -> None:
    async def main() -> tuple[int, str]:
        return twin(5)

    value, thread = asyncio.run(main())
    assert value == 5 and thread == "corral-where"


def test_run_sync_hands_exceptions_back() -> None:
    async def boom() -> None:
        raise KeyError("x")

    async def main() -> None:
        try:
            run_sync(boom(), name="t")
        except KeyError:
            return
        raise AssertionError("no KeyError")

    asyncio.run(main())
