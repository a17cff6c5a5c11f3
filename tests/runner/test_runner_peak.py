"""Peak memory in a large host (issue 26): Linux copies the spawning process's RSS
high-water mark into the command's at exec, so a command forked from a large caller
read 0 ("not measured") whenever its own peak was below the caller's. The supervisor
now comes from the spawn helper, a small process, and says what the command's mark
starts from."""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Iterator

import pytest

import corral.runner.tree as tree
from corral.run.bounded import run_bounded

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

PY = sys.executable
#: a command whose peak is 150 MiB (touched pages, not a lazy mapping)
HOG = ("/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else PY,
       ["-I", "-S", "-c", "x = b'\\1' * (150 << 20); print(len(x) >> 20)"])


def _rss_mib() -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) // 1024


@pytest.fixture
def large_host() -> Iterator[None]:
    """This test process grown past 300 MiB of resident memory (320 MiB of touched
    bytes), freed at the end."""
    ballast = b"\1" * (320 << 20)
    try:
        assert _rss_mib() > 300
        yield
    finally:
        del ballast


def test_a_150_mib_peak_is_reported_from_a_caller_above_300_mib(large_host: None) -> None:
    assert tree.warm_spawn_helper(60), "no spawn helper on this Linux host"
    r = run_bounded(HOG[0], HOG[1], timeout_ms=60_000, mem_mb=600)
    assert r.exit_code == 0 and r.stdout_text == "150\n", r.stderr_text
    # the command's own peak: at least its 150 MiB, and not the caller's 300+
    assert 150 <= r.usage.peak_mem_mb < 250, r.usage


def test_control_forked_from_the_large_caller_the_peak_is_not_measured(
        large_host: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the old spawn gave (the supervisor forked from this process): the same
    command's mark starts at the caller's, so the peak cannot be told: 0, never the
    caller's size passed off as the command's."""
    monkeypatch.setattr(tree._HELPER, "_off", True)
    r = run_bounded(HOG[0], HOG[1], timeout_ms=60_000, mem_mb=600)
    assert r.exit_code == 0 and r.stdout_text == "150\n", r.stderr_text
    assert r.usage.peak_mem_mb == 0, r.usage


def test_the_helper_is_one_small_process_for_many_runs() -> None:
    assert tree.warm_spawn_helper(60)
    helper = tree.spawn_helper_pid()
    for _ in range(3):
        assert run_bounded("/bin/true", timeout_ms=10_000).exit_code == 0
    assert tree.spawn_helper_pid() == helper
    with open(f"/proc/{helper}/status") as f:
        hwm = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:"))
    assert hwm < 64 * 1024, hwm  # KiB: a small interpreter, whatever this host's size


def test_what_the_caller_changes_reaches_commands_through_the_helper() -> None:
    """The helper was started with this process's umask and rlimits; once they change,
    commands get the new ones (a new helper is started from now), never the old."""
    assert tree.warm_spawn_helper(60)
    first = tree.spawn_helper_pid()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    old = os.umask(0o027)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 200), hard))
        for _ in range(2):  # the first after the change forks here; then a new helper
            r = run_bounded("/bin/sh", ["-c", "umask; ulimit -n"], timeout_ms=10_000)
            assert r.stdout_text.split() == ["0027", str(min(soft, 200))], r
            tree.warm_spawn_helper(60)
        assert tree.spawn_helper_pid() not in (0, first)
    finally:
        os.umask(old)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_helper_that_dies_is_replaced_and_the_run_goes_on() -> None:
    """A command can kill the helper (same user): that run and the next still run (the
    supervisor forked here), and a new helper serves after."""
    import signal
    assert tree.warm_spawn_helper(60)
    first = tree.spawn_helper_pid()
    os.kill(first, signal.SIGKILL)
    r = run_bounded("/bin/echo", ["ok"], timeout_ms=10_000)
    assert r.exit_code == 0 and r.stdout_text == "ok\n", r
    assert tree.warm_spawn_helper(60)
    assert tree.spawn_helper_pid() not in (0, first)
    assert run_bounded("/bin/echo", ["ok"], timeout_ms=10_000).stdout_text == "ok\n"
    assert not os.path.exists(f"/proc/{first}")  # the dead one was reaped
