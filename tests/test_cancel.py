from __future__ import annotations

import asyncio
import threading

from corral import CancelToken


def test_cancel_once_runs_callbacks() -> None:
    tok = CancelToken()
    hits: list[int] = []
    tok.add_callback(lambda: hits.append(1))
    remove = tok.add_callback(lambda: hits.append(2))
    remove()
    tok.cancel("why")
    tok.cancel("again")
    assert hits == [1]
    assert tok.cancelled and tok.reason == "why"
    tok.add_callback(lambda: hits.append(3))  # already cancelled: runs at once
    assert hits == [1, 3]


def test_async_wait_woken_from_thread() -> None:
    tok = CancelToken()

    async def main() -> None:
        t = threading.Timer(0.05, tok.cancel)
        t.start()
        await asyncio.wait_for(tok.wait_cancelled_async(), 5)
        t.join()

    asyncio.run(main())
    assert tok.cancelled


def test_sync_wait_times_out() -> None:
    assert CancelToken().wait_cancelled(0.01) is False
