"""``cpu_ms`` is a cap on the whole sandbox for its whole life (issue 10, item 4).

The attack: a command starts a ``setsid`` respawner that keeps forking spinning
children and returns at once. Before the fix the host read the cgroup's CPU
usage only while an exec ran and killed only that exec's process group, so the
respawner burnt on (11 s of CPU after a 1 s cap). Now one provider-wide watcher
reads every capped sandbox's usage, kills the whole sandbox at the cap, and every
later call on it raises ``LimitsExceededError("cpu")`` with the figure observed.

Every spinner here is bounded on its own (it stops after 20 s; the respawner
after 20 s and 200 children), the sandboxes have process and memory limits and
every exec a wall timeout, and each sandbox is destroyed in ``finally``.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from typing import Any

import pytest

from cgroup_view import sandbox_cgroup
from corral.core.errors import LimitsExceededError
from corral.core.spec import ExecOpts, ProcessOpts, SandboxLimits, SandboxSpec
from corral.providers.linux.host.cpuwatch import CpuWatch
from strict_tier import needs_cgroup_limits

pytestmark = pytest.mark.linux
PY = sys.executable
CAP = 1000
# the sandbox may run a little past the cap: one poll (20 ms) on each CPU, the
# kill's own latency and a loaded test machine's event-loop lag
SLACK = 1500


def spec() -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="cpu-cap", limits=SandboxLimits(
        cpu_ms=CAP, max_processes=32, mem_mb=256))


def py(code: str) -> list[str]:
    return [PY, "-I", "-S", "-c", textwrap.dedent(code)]


SPIN = """
    import time
    end = time.monotonic() + 20          # bounded: 20 s of spinning
    while time.monotonic() < end:
        pass
"""

# A detached respawner: its own session (so killing the exec's process group
# misses it), stdio on /dev/null (so the exec returns at once), two spinners
# kept alive, each replaced when it dies. Bounded by time and by a fork count.
RESPAWNER = """
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        end = time.monotonic() + 20
        kids, forks = set(), 0

        def spin():
            while time.monotonic() < end:
                pass
            os._exit(0)

        while time.monotonic() < end and forks < 200:
            while len(kids) < 2 and forks < 200:
                try:
                    pid = os.fork()
                except OSError:
                    break
                if pid == 0:
                    spin()
                kids.add(pid)
                forks += 1
            try:
                pid, _ = os.wait()
                kids.discard(pid)
            except ChildProcessError:
                time.sleep(0.05)
        os._exit(0)
    os.wait()
    print("respawner started")
"""


async def cg_settled(sb: Any, timeout: float = 10.0) -> tuple[int, list[int]]:
    """Wait (bounded) until the sandbox's cgroup holds no process; its usage and pids."""
    cg = sandbox_cgroup(sb)
    assert cg is not None, "the sandbox has no cgroup"
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while cg.pids() and loop.time() < end:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)   # would a survivor still add to the usage?
    return cg.usage().cpu_ms, cg.pids()


@pytest.mark.slow
def test_respawner_between_execs_is_killed_at_the_cap(linux: Any) -> None:
    async def test(p: Any) -> None:
        sb = await p.create(spec())
        try:
            r = await sb.exec(py(RESPAWNER), ExecOpts(timeout_ms=10_000))
            assert r.stdout == b"respawner started\n", r
            # no exec runs now: the respawner burns on its own
            used, left = await cg_settled(sb)
            assert left == [], f"processes of the sandbox survived the cap: {left}"
            assert sb.host_pids() == []
            assert CAP <= used < CAP + SLACK, f"used {used} ms of CPU with cpu_ms={CAP}"
            assert not sb.alive
            with pytest.raises(LimitsExceededError) as ei:
                await sb.exec(["true"], ExecOpts(timeout_ms=10_000))
            assert (ei.value.limit, ei.value.limit_value) == ("cpu", CAP)
            assert ei.value.observed >= CAP, ei.value
            with pytest.raises(LimitsExceededError):
                await sb.start_process(["true"])
            with pytest.raises(LimitsExceededError):
                await sb.read_file("x")
        finally:
            await sb.destroy()

    linux(test)


@pytest.mark.slow
def test_spinning_exec_gets_the_observed_figure(linux: Any) -> None:
    async def test(p: Any) -> None:
        sb = await p.create(spec())
        try:
            with pytest.raises(LimitsExceededError) as ei:
                await sb.exec(py(SPIN), ExecOpts(timeout_ms=15_000))
            assert (ei.value.limit, ei.value.limit_value) == ("cpu", CAP)
            assert CAP <= ei.value.observed < CAP + SLACK, ei.value
            used, left = await cg_settled(sb)
            assert left == [] and used < CAP + SLACK, (used, left)
            with pytest.raises(LimitsExceededError) as again:  # the sandbox is dead
                await sb.exec(["true"])
            assert again.value.limit == "cpu" and again.value.observed >= CAP
        finally:
            await sb.destroy()

    linux(test)


@pytest.mark.slow
def test_running_process_wait_reports_the_cap(linux: Any) -> None:
    async def test(p: Any) -> None:
        sb = await p.create(spec())
        try:
            proc = await sb.start_process(py(SPIN), ProcessOpts(timeout_ms=15_000))
            with pytest.raises(LimitsExceededError) as ei:
                await asyncio.wait_for(proc.wait(), 15)
            assert ei.value.limit == "cpu" and ei.value.observed >= CAP, ei.value
        finally:
            await sb.destroy()

    linux(test)


@needs_cgroup_limits()
def test_sandbox_under_its_cap_keeps_working(linux: Any) -> None:
    async def test(p: Any) -> None:
        sb = await p.create(spec())
        try:
            for _ in range(3):
                r = await sb.exec(["sh", "-c", "echo ok"], ExecOpts(timeout_ms=10_000))
                assert r.stdout == b"ok\n"
            await asyncio.sleep(0.5)
            assert sb.alive
            r = await sb.exec(["true"])
            assert r.exit_code == 0
        finally:
            await sb.destroy()

    linux(test)


# -- the watcher's schedule, without sandboxes ------------------------------------------------

@pytest.mark.slow
def test_watch_reads_less_often_far_from_the_cap() -> None:
    async def main() -> None:
        used = {"a": 0, "b": 0}
        reads = {"a": 0, "b": 0}
        hits: list[tuple[str, int]] = []

        def reader(k: str) -> Any:
            def read() -> int:
                reads[k] += 1
                return used[k]
            return read

        w = CpuWatch(ncpu=lambda: 2)
        w.add("a", 60_000, reader("a"), lambda u: hits.append(("a", u)))   # idle, far
        w.add("b", 1_000, reader("b"), lambda u: hits.append(("b", u)))
        await asyncio.sleep(0.3)
        assert reads["a"] == 1       # next read due in 30 s (60 s left on 2 CPUs)
        used["b"] = 1_200
        await asyncio.sleep(0.7)     # b's next read was due 0.5 s after its first
        assert hits == [("b", 1_200)]
        assert len(w) == 1
        w.discard("a")
        assert len(w) == 0
        w.close()

    asyncio.run(main())
