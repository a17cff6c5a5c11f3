"""500+ runs mixing every ending; nothing may outlive them."""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from corral import CancelToken
from corral.run.bounded import CWD_PREFIX, Outcome, run_bounded, run_bounded_async
from corral.runner.tree import warm_spawn_helper

PY = [sys.executable, "-I", "-S", "-c"]
SLEEP = [*PY, "import time; time.sleep(30)"]
FLOOD = [*PY, "import sys\nwhile True: sys.stdout.write('x'*65536)"]


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children() -> list[int]:
    """Our child processes, less the spawn helper (one per process, for its life)."""
    from corral.runner.tree import spawn_helper_pid
    me, helper = str(os.getpid()), spawn_helper_pid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and int(name) != helper:
            out.append(int(name))
    return out


def _tempdirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(CWD_PREFIX)}


def _refuse(argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
            stdin: int, stdout: int, stderr: int) -> int:
    raise OSError(errno.EMFILE, "no fds (test spawner)")


async def _mixed(i: int) -> Outcome:
    kind = i % 10
    if kind in (0, 1, 2):
        r = await run_bounded_async("/bin/true", timeout_ms=5000)
    elif kind == 3:
        r = await run_bounded_async(SLEEP[0], SLEEP[1:], timeout_ms=60)
    elif kind == 4:
        tok = CancelToken()
        asyncio.get_running_loop().call_later(0.03, tok.cancel)
        r = await run_bounded_async(SLEEP[0], SLEEP[1:], timeout_ms=5000, cancel=tok)
    elif kind == 5:
        r = await run_bounded_async(FLOOD[0], FLOOD[1:], timeout_ms=5000,
                                    max_stdout_bytes=100_000)
    elif kind == 6:
        r = await run_bounded_async("/nonexistent/cmd", timeout_ms=5000)
    elif kind == 7:
        r = await run_bounded_async("/bin/true", timeout_ms=5000, spawner=_refuse)
    elif kind == 8:
        task = asyncio.ensure_future(run_bounded_async(SLEEP[0], SLEEP[1:], timeout_ms=5000))
        await asyncio.sleep(0.03)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return Outcome.CANCELLED
        raise AssertionError("not cancelled")
    else:
        r = await run_bounded_async("/bin/cat", timeout_ms=5000, stdin=b"s" * 200_000)
    return r.outcome


@pytest.mark.slow
def test_500_mixed_runs_leak_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the runs' owned cwds go to a temp dir of this test's own, so another test run on
    # the machine cannot make it look as if we leaked (or hide a leak of ours)
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    # warm up lazily created things (imports, the loop's first use)
    run_bounded("/bin/true", timeout_ms=5000)
    assert warm_spawn_helper(30)  # its socket is one fd of ours, for the process's life
    fds, kids, threads, tmps = _fds(), _children(), threading.active_count(), _tempdirs()

    async def batch(start: int) -> list[Outcome]:
        return list(await asyncio.gather(*(_mixed(i) for i in range(start, start + 10))))

    seen: Counter[Outcome] = Counter()
    for start in range(0, 500, 10):
        if start % 50 == 0:  # some through the sync door, cancel token from a thread
            tok = CancelToken()
            timer = threading.Timer(0.03, tok.cancel)
            timer.start()
            seen[run_bounded(SLEEP[0], SLEEP[1:], timeout_ms=5000, cancel=tok).outcome] += 1
            timer.join()
        seen.update(asyncio.run(batch(start)))

    assert seen[Outcome.EXIT] >= 200
    assert seen[Outcome.TIMEOUT] == 50
    assert seen[Outcome.CANCELLED] >= 100
    assert seen[Outcome.OVERFLOW_STDOUT] == 50
    assert seen[Outcome.SPAWN_ERROR] == 100
    assert _fds() == fds
    assert _children() == kids == []
    assert threading.active_count() == threads
    assert _tempdirs() == tmps
