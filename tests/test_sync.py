"""The one sync adapter: a sync twin works with or without a running loop in its thread,
always on the one process-wide loop (so a provider used twice from sync code meets the
same loop both times), and an interrupt cancels the run and lets it clean up."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import threading
import time

import pytest

from corral.core.sync import background_loop, run_sync, sync_twin


async def _where(x: int, *, plus: int = 0) -> tuple[int, str, int]:
    await asyncio.sleep(0)
    return x + plus, threading.current_thread().name, id(asyncio.get_running_loop())


twin = sync_twin(_where, name="where")


def test_twin_keeps_the_signature_and_runs_without_a_loop() -> None:
    assert inspect.signature(twin) == inspect.signature(_where)
    assert twin.__name__ == "where" and "Synchronous twin" in (twin.__doc__ or "")
    assert twin(1, plus=2)[:2] == (3, "corral-sync")


def test_every_call_meets_the_same_loop_from_any_thread() -> None:
    seen: list[int] = []

    def call() -> None:
        seen.append(twin(1)[2])

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen.append(twin(2)[2])
    assert set(seen) == {id(background_loop())}


def test_twin_called_inside_a_running_loop() -> None:
    async def main() -> tuple[int, str, int]:
        return twin(5)

    value, thread, _ = asyncio.run(main())
    assert value == 5 and thread == "corral-sync"


def test_run_sync_hands_exceptions_back() -> None:
    async def boom() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        run_sync(boom())


def test_a_call_from_the_loop_thread_itself_is_refused() -> None:
    async def inner() -> None:
        run_sync(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="wait on itself"):
        run_sync(inner())


def test_an_interrupt_cancels_the_run_and_waits_for_its_cleanup() -> None:
    cleaned = threading.Event()
    started = threading.Event()

    async def slow() -> None:
        try:
            started.set()
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.05)  # cleanup that takes a moment
            cleaned.set()

    def interrupt() -> None:
        started.wait(5)
        time.sleep(0.2)  # the caller is waiting on the result by now
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: a signal, not a flag

    t = threading.Thread(target=interrupt)
    t.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_sync(slow())
    waited = time.monotonic() - t0
    t.join()
    assert cleaned.is_set()
    # the wait was interrupted, not ended by the 30 s sleep running out
    assert waited < 25, waited
