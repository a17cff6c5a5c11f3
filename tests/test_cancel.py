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


# -- the one bridge to asyncio ------------------------------------------------------
def test_cancel_scope_ends_the_block_when_the_token_fires_from_another_thread() -> None:
    import asyncio
    import threading

    from corral.core.cancel import CancelScope

    async def main() -> None:
        token = CancelToken()
        reached_end = False
        threading.Timer(0.05, token.cancel, args=("stop",)).start()
        async with CancelScope(token) as scope:
            await asyncio.sleep(10)
            reached_end = True
        assert scope.cancelled and not reached_end and token.reason == "stop"

    asyncio.run(main())


def test_cancel_scope_leaves_other_cancellations_alone() -> None:
    import asyncio

    import pytest

    from corral.core.cancel import CancelScope

    async def body(token: CancelToken) -> None:
        async with CancelScope(token):
            await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.ensure_future(body(CancelToken()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # no token: a plain block; an already-cancelled token: cancelled at the first await
        async with CancelScope(None) as scope:
            await asyncio.sleep(0)
        assert not scope.cancelled
        done = CancelToken()
        done.cancel()
        async with CancelScope(done) as scope:
            await asyncio.sleep(10)
        assert scope.cancelled

    asyncio.run(main())


def test_call_on_cancel_runs_in_the_loop_and_can_be_unhooked() -> None:
    import asyncio
    import threading

    from corral.core.cancel import call_on_cancel

    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        a, b = CancelToken(), CancelToken()
        call_on_cancel(a, loop, lambda: seen.append(threading.current_thread().name))
        unhook = call_on_cancel(b, loop, lambda: seen.append("b"))
        unhook()
        threading.Thread(target=a.cancel, name="other").start()
        b.cancel()
        await asyncio.sleep(0.1)
        assert seen == [threading.current_thread().name]

    asyncio.run(main())
