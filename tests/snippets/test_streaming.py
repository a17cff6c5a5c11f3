"""run_snippet(on_log=...): log lines handed out live, on the caller's loop, as the
transcript holds them; a raising or slow listener does not break or stall the run;
a huge print loop stays bounded. At strict and context-isolated."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from snippet_levels import LEVELS

from corral.snippets.host import runner
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet, run_snippet_sync, shutdown_snippet_pool
from corral.snippets.host.transcript import CAPS, TRUNCATION_MARK, LogLine, Transcript

PRINT_SLEEP_PRINT = "import time\nprint('first')\ntime.sleep(0.5)\nprint('second')\n"


def arun(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """An async test run on a fresh loop (the default pool lives on its own loop)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))
    return wrapper


@pytest.fixture(scope="module", autouse=True)
def _pool() -> Iterator[None]:
    yield
    shutdown_snippet_pool()


async def _run_watching(source: str, **kw: Any) -> tuple[Transcript, list[Any]]:
    """Run ``source`` with a listener that records each line and, for each, schedules a
    "tick" on the loop: a tick between two lines shows the loop was free between them
    (the lines were not handed out together at the end)."""
    events: list[Any] = []
    loop = asyncio.get_running_loop()

    def on_log(line: LogLine) -> None:
        assert asyncio.get_running_loop() is loop  # the caller's loop, never another's
        events.append(line.text)
        loop.call_soon(events.append, "tick")

    t = await run_snippet(source, on_log=on_log, **kw)
    events.append("returned")
    return t, events


@pytest.mark.parametrize("level", LEVELS)
@arun
async def test_lines_arrive_while_the_run_goes_on(level: str) -> None:
    t, events = await _run_watching(PRINT_SLEEP_PRINT, level=level, timeout_ms=5000)
    # 'first' was handed out, the loop ran, and only then came 'second': the lines
    # were not batched at the end of the run
    assert events[:3] == ["first", "tick", "second"], events
    assert events[-1] == "returned" and events.count("tick") == 2
    assert [x.text for x in t.logs] == ["first", "second"] and t.ok
    # and, as a (lenient) timing: the first line came well before the run's end
    loop = asyncio.get_running_loop()
    got: list[float] = []
    t = await run_snippet(PRINT_SLEEP_PRINT, level=level,
                          on_log=lambda line: got.append(loop.time()))
    ended = loop.time()
    assert len(got) == 2 and ended - got[0] > 0.3, (got, ended)


@pytest.mark.parametrize("level", LEVELS)
@arun
async def test_on_a_pool_of_the_callers_loop(level: str) -> None:
    async with SnippetPool(max_workers=1, spares=0) as pool:
        t, events = await _run_watching(PRINT_SLEEP_PRINT, level=level, pool=pool)
    assert events[:3] == ["first", "tick", "second"], events
    assert [x.text for x in t.logs] == ["first", "second"]


@pytest.mark.parametrize("level", LEVELS)
def test_sync_twin_calls_the_listener_in_the_calling_thread(level: str) -> None:
    me = threading.get_ident()
    seen: list[tuple[str, int, float]] = []
    t = run_snippet_sync(PRINT_SLEEP_PRINT, level=level, on_log=lambda line: seen.append(
        (line.text, threading.get_ident(), time.monotonic())))
    ended = time.monotonic()
    assert [(text, ident) for text, ident, _ in seen] == [("first", me), ("second", me)]
    assert ended - seen[0][2] > 0.3
    assert tuple(LogLine(stream="stdout", text=x) for x in ("first", "second")) == t.logs


@pytest.mark.parametrize("level", LEVELS)
@arun
async def test_caps_and_truncation_are_the_transcripts(level: str) -> None:
    # a line past line_chars is cut; then the byte cap ends the logs
    long = CAPS["line_chars"] + 500
    got: list[LogLine] = []
    t = await run_snippet(f"print('x' * {long})\nimport logging\nlogging.warning('w')\n"
                          "for i in range(200):\n    print(str(i) * 300)\n",
                          level=level, on_log=got.append)
    assert tuple(got) == t.logs and "logs" in t.truncated
    assert got[0].text.endswith(TRUNCATION_MARK) and len(got[0].text) == CAPS["line_chars"]
    assert got[1] == LogLine(stream="log", text="WARNING:root:w")
    assert sum(len(x.text.encode()) for x in got) <= CAPS["log_bytes"]
    assert len(got) < 200
    # the line count cap
    got2: list[LogLine] = []
    t = await run_snippet("for i in range(1500):\n    print(i)\n", level=level,
                          on_log=got2.append)
    assert tuple(got2) == t.logs and len(got2) == CAPS["log_lines"] and "logs" in t.truncated
    assert got2[-1].text == str(CAPS["log_lines"] - 1)
    # a cut line alone marks logs truncated too
    got3: list[LogLine] = []
    t = await run_snippet(f"print('y' * {long})", level=level, on_log=got3.append)
    assert tuple(got3) == t.logs and t.truncated == frozenset({"logs"})


@pytest.mark.parametrize("level", LEVELS)
@arun
async def test_a_raising_listener_does_not_break_the_run(
        level: str, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def on_log(line: LogLine) -> None:
        calls.append(line.text)
        raise RuntimeError(f"listener broke on {line.text}")

    with caplog.at_level(logging.WARNING, logger="corral.snippets.host.runner"):
        t = await run_snippet("print('a')\nprint('b')\nprint('c')\n6 * 7", level=level,
                              on_log=on_log)
    assert t.ok and t.result == "42" and [x.text for x in t.logs] == ["a", "b", "c"]
    assert calls == ["a", "b", "c"]
    assert "listener broke on a" in caplog.text  # logged, with its traceback
    assert "raised 3 times" in caplog.text
    # the sync twin too
    calls.clear()
    t = run_snippet_sync("print('a')\nprint('b')\nprint('c')\n6 * 7", level=level,
                         on_log=on_log)
    assert t.ok and calls == ["a", "b", "c"]


@pytest.mark.parametrize("level", LEVELS)
@arun
async def test_a_slow_listener_does_not_stall_the_sandbox(level: str) -> None:
    """The listener blocks the very loop that reads the run (pool= on the caller's loop)
    for 0.1 s a line, 2 s in all: the snippet still stops at its 500 ms timeout (the
    worker's timer, not the host's backstop kill) and every line is handed out."""
    got: list[str] = []

    def slow(line: LogLine) -> None:
        time.sleep(0.1)
        got.append(line.text)

    async with SnippetPool(max_workers=1, spares=0) as pool:
        await run_snippet("1", level=level, pool=pool)  # a warm slot
        t = await run_snippet("for i in range(20):\n    print(i)\nwhile True:\n    pass\n",
                              level=level, pool=pool, timeout_ms=500, on_log=slow)
    assert t.timed_out and t.errors[0].type == "TimeoutError"
    assert "sandbox was killed" not in t.errors[0].message
    assert t.duration_ms < 1500
    assert got == [str(i) for i in range(20)] == [x.text for x in t.logs]


@pytest.mark.parametrize("level", LEVELS)
@arun
async def test_a_huge_print_loop_stays_bounded(level: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A million prints: at most the cap's lines cross the wire, in batches of the
    records that arrived together; the listener sees exactly the transcript's lines."""
    batches: list[int] = []
    feed = runner._LogRelay.feed

    def counting(self: runner._LogRelay, batch: list[dict[str, str]]) -> None:
        batches.append(len(batch))
        feed(self, batch)

    monkeypatch.setattr(runner._LogRelay, "feed", counting)
    got: list[LogLine] = []
    t = await run_snippet("for i in range(1_000_000):\n    print(i)\n'done'", level=level,
                          timeout_ms=10_000, on_log=got.append)
    assert t.ok and t.result == "'done'", t.errors
    assert tuple(got) == t.logs and len(got) == CAPS["log_lines"] and "logs" in t.truncated
    assert sum(batches) == CAPS["log_lines"] and len(batches) <= CAPS["log_lines"]


@arun
async def test_nothing_is_handed_out_after_a_cancel() -> None:
    got: list[str] = []
    task = asyncio.ensure_future(run_snippet(
        "import time\nprint('a')\ntime.sleep(5)\nprint('b')", level="context-isolated",
        on_log=lambda line: got.append(line.text)))
    for _ in range(200):
        await asyncio.sleep(0.05)
        if got:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    assert got == ["a"]


@arun
async def test_a_rejected_snippet_hands_out_nothing() -> None:
    got: list[LogLine] = []
    t = await run_snippet("import os\nprint('x')", on_log=got.append)
    assert t.rejected and got == []
