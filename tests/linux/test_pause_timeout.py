"""An exec on a paused sandbox honours its timeout (issue 27 item 4).

Before: an exec on a paused sandbox waited for ``resume`` however long that took, and
a command that was running when the sandbox was paused could not be killed at its
timeout (the kill request waited for the frozen agent). Now the timeout counts from
the call, paused time too: the exec raises SandboxTimeoutError at its deadline, and a
command the timeout passed is killed when the sandbox is resumed. Each test never
resumes before the exec has answered, so the old behaviour fails by its guard.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.core.errors import SandboxTimeoutError
from corral.core.result import Outcome
from corral.core.spec import ExecOpts, SandboxLimits, SandboxSpec


def make_spec(**limits: int) -> SandboxSpec:
    """(not conftest's: a module named conftest is another directory's when the run's
    arguments name several test directories)"""
    return SandboxSpec(tenant_id="t", run_id="r", limits=SandboxLimits(**limits))

pytestmark = pytest.mark.linux

#: how long a test waits for an exec that should answer at its deadline (a hang guard,
#: not a timing assertion: the old code waited for a resume that never came)
GUARD_S = 30


def _needs_pause(p: Any) -> None:
    if "pause" not in p.capabilities:
        pytest.skip("this host has no cgroup freezer for corral (no pause)")


def test_exec_on_a_paused_sandbox_times_out(linux: Any) -> None:
    async def test(p: Any) -> None:
        _needs_pause(p)
        async with await p.create(make_spec()) as sb:
            await sb.write_file("marker", b"")
            await sb.pause()
            with pytest.raises(SandboxTimeoutError) as ei:
                await asyncio.wait_for(
                    sb.exec(["rm", "marker"], ExecOpts(timeout_ms=300)), GUARD_S)
            res = ei.value.result
            assert res is not None and res.outcome is Outcome.TIMEOUT
            assert res.exit_code is None and res.limit_value == 300
            assert "paused" in res.detail
            await sb.resume()
            assert await sb.read_file("marker") == b""  # it never ran
            r = await sb.exec(["sh", "-c", "echo ok"], ExecOpts(timeout_ms=10_000))
            assert r.stdout == b"ok\n"

    linux(test)


def test_a_command_paused_past_its_timeout_is_killed_at_resume(linux: Any) -> None:
    async def test(p: Any) -> None:
        _needs_pause(p)
        async with await p.create(make_spec()) as sb:
            run = asyncio.ensure_future(sb.exec(
                ["sh", "-c", "echo up; exec sleep 600"], ExecOpts(timeout_ms=1500)))
            for _ in range(200):  # until the command runs
                if sb.process_count() >= 1:
                    break
                await asyncio.sleep(0.05)
            assert sb.process_count() >= 1
            await sb.pause()
            try:
                with pytest.raises(SandboxTimeoutError) as ei:
                    await asyncio.wait_for(run, GUARD_S)
                assert ei.value.result is not None
                assert ei.value.result.outcome is Outcome.TIMEOUT
                assert sb.process_count() >= 1  # frozen, not yet killed
            finally:
                await sb.resume()
            for _ in range(200):  # killed once thawed
                if sb.process_count() == 0:
                    break
                await asyncio.sleep(0.05)
            assert sb.process_count() == 0
            r = await sb.exec(["sh", "-c", "echo again"], ExecOpts(timeout_ms=10_000))
            assert r.stdout == b"again\n"

    linux(test)
