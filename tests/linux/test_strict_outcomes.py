"""Every strict outcome carries what happened: the signal, the usage, and the figure
observed against the limit (issue 16: "killed by nothing", nulls and zero usage)."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from corral.cli import main
from corral.core.errors import LimitsExceededError
from corral.core.result import Outcome
from corral.core.spec import ExecOpts, Level, SandboxLimits, SandboxSpec
from corral.run.strict import run_strict
from strict_tier import needs_cgroup_limits

PY = os.path.realpath(sys.executable)
HOG = "x = bytearray(200 << 20); x[::4096] = b'a' * len(x[::4096])"
SPIN = "while True: pass"


@pytest.fixture(autouse=True)
def _sandbox_available(linux: object) -> None:
    """The linux fixture (tests/linux/conftest.py) skips where the host cannot sandbox."""


@needs_cgroup_limits()
def test_memory_limit_names_the_signal_usage_and_observed_peak() -> None:
    r = run_strict(PY, ["-I", "-S", "-c", HOG], timeout_ms=20_000,
                   limits=SandboxLimits(mem_mb=64))
    assert r.outcome is Outcome.MEMORY_LIMIT
    assert r.exit_code == -signal.SIGKILL and r.signal == "SIGKILL"
    assert r.limit_value == 64
    assert r.observed is not None and 32 <= r.observed <= 80, r.observed
    assert r.usage.peak_mem_mb >= r.observed and r.usage.wall_ms > 0
    err = r.error()
    assert isinstance(err, LimitsExceededError) and err.result is r
    assert "SIGKILL" in err.message and "nothing" not in err.message


@needs_cgroup_limits()
def test_cpu_limit_names_the_signal_usage_and_observed_time() -> None:
    r = run_strict(PY, ["-I", "-S", "-c", SPIN], timeout_ms=20_000,
                   limits=SandboxLimits(cpu_ms=500))
    assert r.outcome is Outcome.CPU_LIMIT
    assert r.signal in ("SIGKILL", "SIGXCPU")
    assert r.limit_value == 500
    assert r.observed is not None and r.observed >= 500
    assert r.usage.cpu_ms >= 500  # the sandbox's CPU time, from its cgroup


@needs_cgroup_limits()
def test_exec_error_carries_the_same_result() -> None:
    """Sandbox.exec raises the contract's error; ``err.result`` is the run as a value."""
    import asyncio

    from corral.providers.linux import LinuxProvider

    async def go() -> None:
        async with LinuxProvider(spares=0) as p:
            spec = SandboxSpec(level=Level.STRICT, limits=SandboxLimits(mem_mb=64))
            async with await p.create(spec) as sb:
                with pytest.raises(LimitsExceededError) as ei:
                    await sb.exec([PY, "-I", "-S", "-c", "print('hi', flush=True);" + HOG],
                                  ExecOpts(timeout_ms=20_000))
                res = ei.value.result
                assert res is not None and res.outcome is Outcome.MEMORY_LIMIT
                assert res.stdout == b"hi\n" and res.exit_code == -signal.SIGKILL

    asyncio.run(go())


@needs_cgroup_limits()
def test_a_started_process_says_which_limit_ended_it() -> None:
    """A background process (``start_process``) the memory limit killed waits to a
    ``memory-limit`` result, as exec does (it said ``exit -9``: a session then had to
    guess). The control: one that SIGKILLs itself in the same sandbox is an exit."""
    import asyncio

    from corral.core.spec import ProcessOpts
    from corral.providers.linux import LinuxProvider

    async def go() -> None:
        async with LinuxProvider(spares=0) as p:
            spec = SandboxSpec(level=Level.STRICT, limits=SandboxLimits(mem_mb=64))
            async with await p.create(spec) as sb:
                proc = await sb.start_process([PY, "-I", "-S", "-c", HOG],
                                              ProcessOpts(timeout_ms=20_000))
                res = await proc.wait()
                assert res.outcome is Outcome.MEMORY_LIMIT, res
                assert res.exit_code == -signal.SIGKILL and res.limit_value == 64
                assert res.observed is not None and res.usage.peak_mem_mb >= res.observed
                proc = await sb.start_process(
                    [PY, "-I", "-S", "-c", "import os; os.kill(os.getpid(), 9)"],
                    ProcessOpts(timeout_ms=20_000))
                res = await proc.wait()
                assert (res.outcome, res.exit_code) == (Outcome.EXIT, -signal.SIGKILL), res

    asyncio.run(go())


@needs_cgroup_limits()
def test_cli_json_has_the_facts(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["run", "--level", "strict", "--mem-mb", "64", "--json", "--", PY, "-I",
                   "-S", "-c", HOG])
    out = json.loads(capsys.readouterr().out)
    assert status == 137
    assert out["outcome"] == "memory-limit" and out["signal"] == "SIGKILL"
    assert out["exit_code"] == -signal.SIGKILL and out["limit_value"] == 64
    assert out["observed"] and out["usage"]["peak_mem_mb"] > 0
