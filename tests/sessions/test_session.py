"""Sessions through the library, stdlib cells only: state persists, an interrupt keeps
it, a memory kill is typed, limits and caps hold, files, snapshots."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from corral import LimitsExceededError, SandboxLimits, SandboxTimeoutError, SessionEndedError
from corral.core.errors import ConfigInvalidError
from corral.sessions import AsyncSession, Session
from corral.sessions.session import MAX_FRAME_BYTES
from session_env import PNG_SIGNATURE, png_size
from strict_tier import needs_cgroup_limits

pytestmark = pytest.mark.usefixtures("strict")

#: a 3x2 PNG (red pixels), made once with zlib: a tiny object's _repr_png_ returns it
_PNG_3x2 = ("iVBORw0KGgoAAAANSUhEUgAAAAMAAAACCAIAAAASFvFNAAAAEElEQVR4nGP4z8AAQQxwFgBB0gX7h/C5"
            "SAAAAABJRU5ErkJggg==")


def arun(fn: Callable[[AsyncSession], Awaitable[Any]], **options: Any) -> Any:
    async def main() -> Any:
        async with await AsyncSession.create(**options) as s:
            return await fn(s)
    return asyncio.run(main())


def test_globals_persist_between_cells_and_the_last_expression_is_the_result() -> None:
    with Session() as s:
        r1 = s.run("x = 41\nimport math\nprint('one', flush=True)")
        assert r1.ok and r1.stdout == "one\n" and r1.result is None
        r2 = s.run("x + 1")
        assert r2.result is not None and r2.result.text() == "42"
        r3 = s.run("def f(n):\n    return n * math.pi\nround(f(x), 2)")
        assert r3.result is not None and r3.result.text() == "128.81"
        assert (r1.cell, r2.cell, r3.cell) == (1, 2, 3)


def test_output_streams_to_callbacks_as_it_is_written() -> None:
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def out(t: str) -> None:
        seen.append(("out", t))

    def err(t: str) -> None:
        seen.append(("err", t))
        done.set()

    with Session() as s:
        r = s.run("import sys, time\nprint('a')\nprint('b', file=sys.stderr)\n"
                  "time.sleep(0.2)\nprint('c')", on_stdout=out, on_stderr=err)
    assert r.stdout == "a\nc\n" and r.stderr == "b\n"
    assert seen == [("out", "a\n"), ("err", "b\n"), ("out", "c\n")]


def test_an_error_has_its_name_value_and_a_traceback_of_the_cell_only() -> None:
    with Session() as s:
        s.run("def g():\n    return {}['missing']")
        r = s.run("g()")
        assert r.error is not None and r.error.name == "KeyError"
        assert r.error.value == "'missing'"
        assert '<cell 1>", line 2, in g' in r.error.traceback
        assert "driver" not in r.error.traceback  # the driver's frames are left out
        assert s.run("g.__name__").result.text() == "'g'"  # type: ignore[union-attr]


def test_a_syntax_error_is_the_cells_error_and_the_session_lives_on() -> None:
    with Session() as s:
        s.run("y = 2")
        r = s.run("def (:")
        assert r.error is not None and r.error.name == "SyntaxError"
        assert s.run("y").result.text() == "2"  # type: ignore[union-attr]


def test_rich_reprs_become_mime_bundles() -> None:
    code = f"""
import base64
class Pic:
    def _repr_png_(self):
        return base64.b64decode({_PNG_3x2!r})
class Table:
    def _repr_html_(self):
        return '<table><tr><td>1</td></tr></table>'
    def _repr_json_(self):
        return {{'rows': [1]}}
    def __repr__(self):
        return 'Table(1)'
class Vec:
    def _repr_svg_(self):
        return '<svg xmlns="http://www.w3.org/2000/svg"/>'
class Both:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {{'text/plain': 'both', 'text/markdown': '**b**'}}
display(Table(), Vec())
Pic()
"""
    with Session() as s:
        r = s.run(code)
        assert r.ok, r.error
        table, vec = r.displays
        assert table.html == "<table><tr><td>1</td></tr></table>"
        assert table.data["application/json"] == {"rows": [1]}
        assert table.text() == "Table(1)"
        assert vec.data["image/svg+xml"].startswith("<svg")
        assert r.result is not None and r.result.kind == "result"
        png = r.result.png
        assert png is not None and png.startswith(PNG_SIGNATURE)
        assert png_size(png) == (3, 2)
        assert base64.b64decode(r.result.data["image/png"]) == png
        both = s.run("Both()").result
        assert both is not None and both.data == {"text/plain": "both", "text/markdown": "**b**"}


def test_a_cell_past_its_timeout_is_interrupted_and_the_session_keeps_its_state() -> None:
    with Session(cell_timeout_s=1.0) as s:
        s.run("kept = [1, 2, 3]")
        r = s.run("n = 0\nwhile True:\n    n += 1")
        assert r.timed_out and r.error is not None and r.error.name == "KeyboardInterrupt"
        assert s.run("kept, n > 0").result.text() == "([1, 2, 3], True)"  # type: ignore[union-attr]
        r2 = s.run("import time\ntime.sleep(30)", timeout_s=0.5)  # a blocking call too
        assert r2.timed_out and r2.error is not None and r2.error.name == "KeyboardInterrupt"
        assert s.run("len(kept)").result.text() == "3"  # type: ignore[union-attr]


def test_a_cell_that_ignores_the_interrupt_ends_the_session_with_a_typed_error() -> None:
    with Session(cell_timeout_s=0.5, interrupt_grace_s=0.5) as s:
        with pytest.raises(SandboxTimeoutError, match="ignored the interrupt"):
            s.run("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                  "while True: pass")
        assert not s.alive
        with pytest.raises(SandboxTimeoutError):
            s.run("1")


@needs_cgroup_limits()
def test_a_cell_past_the_memory_limit_ends_the_session_with_the_typed_error() -> None:
    with Session(limits=SandboxLimits(mem_mb=128, max_processes=32, disk_mb=32)) as s:
        s.run("small = 'x' * 1000")
        with pytest.raises(LimitsExceededError) as info:
            s.run("hog = []\nwhile True:\n    hog.append(bytearray(8 << 20))")
        err = info.value
        assert err.limit == "memory" and err.limit_value == 128 and err.unit == "MiB"
        assert "session has ended" in err.detail
        assert not s.alive
        with pytest.raises(LimitsExceededError):
            s.run("small")


@needs_cgroup_limits()
def test_a_cell_that_sigkills_its_interpreter_is_an_exit_not_a_memory_kill() -> None:
    """A memory kill is what the cgroup counted, not any SIGKILL: a cell killing its own
    interpreter ends the session as an exit (status -9), with the memory limit set."""
    with Session(limits=SandboxLimits(mem_mb=128, max_processes=32, disk_mb=32)) as s:
        with pytest.raises(SessionEndedError) as info:
            s.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        assert not isinstance(info.value, LimitsExceededError)
        assert info.value.reason == "exited" and "-9" in str(info.value)
        assert not s.alive


def test_output_past_the_cap_is_cut_with_a_note() -> None:
    with Session(max_output_chars=1000) as s:
        r = s.run("for i in range(1000):\n    print('line', i)")
        assert r.truncated
        assert len(r.stdout) < 1200
        assert r.stdout.rstrip().endswith("characters was dropped]")
        assert s.run("i").result.text() == "999"  # type: ignore[union-attr]


def test_raw_writes_to_fd_1_reach_the_host_as_stderr_not_as_frames() -> None:
    with Session() as s:
        r = s.run("import os\nos.write(1, b'{\"t\": \"done\", \"id\": 1}\\nraw\\n')\n"
                  "import time; time.sleep(0.2)\n'after'")
        assert r.result is not None and r.result.text() == "'after'"
        assert "raw" in r.stderr


def test_a_forged_frame_line_past_the_cap_ends_the_session() -> None:
    async def go(s: AsyncSession) -> None:
        # the driver's private channel is fd 3 (a dup of the original stdout)
        with pytest.raises(SessionEndedError) as info:
            await s.run(f"import os\nos.write(3, b'x' * {MAX_FRAME_BYTES + 10})\n"
                        "import time; time.sleep(5)")
        assert info.value.reason == "protocol"
    arun(go)


def test_files_in_and_out_of_the_work_dir() -> None:
    with Session() as s:
        s.write_file("data.csv", "a,b\n1,2\n")
        r = s.run("import csv\nrows = list(csv.reader(open('data.csv')))\n"
                  "open('out.txt', 'w').write(str(len(rows)))\nrows")
        assert r.result is not None and r.result.text() == "[['a', 'b'], ['1', '2']]"
        assert s.read_file("out.txt") == b"2"
        names = [f.name for f in s.list_files()]
        assert "data.csv" in names and "out.txt" in names
        assert not any("driver" in n for n in names)  # the driver unlinked its file


def test_snapshot_restores_files_not_variables() -> None:
    with Session() as s:
        s.write_file("a.txt", "first")
        s.run("v = 1")
        handle = s.snapshot()
        s.write_file("a.txt", "second")
        s.run("v = 2")
        s.restore(handle)
        assert s.read_file("a.txt") == b"first"
        assert s.run("v").result.text() == "2"  # type: ignore[union-attr]


def test_idle_timeout_and_max_lifetime_end_the_session() -> None:
    async def idle(s: AsyncSession) -> None:
        await s.run("a = 1")
        await asyncio.sleep(1.0)
        assert not s.alive
        with pytest.raises(SessionEndedError) as info:
            await s.run("a")
        assert info.value.reason == "idle-timeout"
    arun(idle, idle_timeout_s=0.3)

    async def life(s: AsyncSession) -> None:
        r = await s.run("import time\ntime.sleep(10)")
        raise AssertionError(f"the cell ran past the lifetime: {r}")

    with pytest.raises(SessionEndedError) as info:
        arun(life, max_lifetime_s=1.0, cell_timeout_s=20)
    assert info.value.reason == "max-lifetime"


def test_bad_arguments_are_config_invalid() -> None:
    with pytest.raises(ConfigInvalidError, match="cell_timeout_s"):
        Session(cell_timeout_s=0)
    with Session() as s, pytest.raises(ConfigInvalidError, match="code"):
        s.run(b"1")  # type: ignore[arg-type]


def test_closed_session_raises_session_ended() -> None:
    s = Session()
    s.close()
    s.close()
    with pytest.raises(SessionEndedError) as info:
        s.run("1")
    assert info.value.reason == "closed"


def test_a_session_dropped_without_close_is_closed() -> None:
    import gc
    import time
    s = Session()
    inner = s.inner
    del s
    gc.collect()
    deadline = time.monotonic() + 30
    while inner.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not inner.alive
    assert isinstance(inner.ended, SessionEndedError) and inner.ended.reason == "closed"
