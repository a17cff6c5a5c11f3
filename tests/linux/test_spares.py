"""Pre-warmed spares and the destroy promise of the strict Linux provider."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from cgroup_view import manager, mine, sandbox_cgroup
from corral.core.errors import ConfigInvalidError
from corral.core.spec import ProcessOpts, SandboxLimits, SandboxSpec

pytestmark = pytest.mark.linux


def make_spec(**limits: int) -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r", limits=SandboxLimits(**limits))


def _cg_value(sb: Any, key: str, v1_name: str, v2_name: str) -> str:
    cg = sandbox_cgroup(sb)
    assert cg is not None
    d = cg.dirs.get("unified") or cg.dirs[key]
    name = v2_name if cg.version == "v2" else v1_name
    with open(os.path.join(d, name)) as f:
        return f.read().strip()


def _idle_spares(p: Any) -> list[str]:
    return [item.sid for pool in p._spares.values() for item in pool]


def test_spares_option_is_checked() -> None:
    from corral.providers.linux import LinuxProvider
    for bad in (-1, 9, True, "1"):
        with pytest.raises(ConfigInvalidError):
            LinuxProvider(spares=bad)


def test_a_claimed_spare_gets_the_specs_limits_and_is_used_once(linux: Any) -> None:
    async def test(p: Any) -> None:
        first = await p.create(make_spec())
        assert await p.wait_spares() == 1
        (spare,) = _idle_spares(p)
        sb = await p.create(make_spec(mem_mb=64, max_processes=9))
        assert sb.id == spare and sb.id != first.id
        assert spare not in _idle_spares(p)
        has_cg = sandbox_cgroup(sb) is not None
        if has_cg and "memory" in manager().support.available:
            assert int(_cg_value(sb, "memory", "memory.limit_in_bytes", "memory.max")) \
                == 64 << 20
        if has_cg and "pids" in manager().support.available:
            assert _cg_value(sb, "pids", "pids.max", "pids.max") == "9"
        r = await sb.exec(["sh", "-c", "echo ok"])
        assert r.stdout == b"ok\n"
        ids = {first.id, sb.id}
        for _ in range(3):
            async with await p.create(make_spec()) as other:
                assert other.id not in ids
                ids.add(other.id)
        await first.destroy()
        await sb.destroy()

    linux(test)


def test_a_spec_of_another_shape_is_built_cold(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()):
            pass
        assert await p.wait_spares() == 1
        (old,) = _idle_spares(p)
        spec = SandboxSpec(tenant_id="t", run_id="r", limits=SandboxLimits(disk_mb=32))
        async with await p.create(spec) as sb:
            assert sb.id != old
            r = await sb.exec(["sh", "-c", "df -k /work | tail -1"])
            assert int(r.stdout.split()[1]) == 32 * 1024
        assert await p.wait_spares() == 1
        assert old not in _idle_spares(p)  # the old shape's spare was ended

    linux(test)


def test_spares_zero_builds_every_sandbox_cold(linux: Any) -> None:
    async def test(p: Any) -> None:
        for _ in range(2):
            async with await p.create(make_spec()) as sb:
                assert (await sb.exec(["true"])).exit_code == 0
        assert await p.wait_spares() == 0
        assert _idle_spares(p) == [] and not p._building

    linux(test, spares=0)


_PF_EXITING = 0x4


def _runs_user_code(pid: int) -> bool:
    """Whether ``pid`` exists, is not a zombie, is not exiting (a killed pid 1 stays
    in the kernel's exit path, state R, until its namespace's other processes are
    gone) and has no SIGKILL pending."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        with open(f"/proc/{pid}/stat") as f:
            flags = int(f.read().rsplit(")", 1)[1].split()[6])
    except (FileNotFoundError, ProcessLookupError):
        return False
    if fields["State"].split()[0] in ("Z", "X") or flags & _PF_EXITING:
        return False
    bit = 1 << (signal.SIGKILL - 1)
    return not (int(fields["SigPnd"], 16) & bit or int(fields["ShdPnd"], 16) & bit)


@pytest.mark.parametrize("spares", [0, 1])
def test_after_destroy_no_process_of_the_sandbox_runs(linux: Any, spares: int) -> None:
    async def test(p: Any) -> None:
        for cmd in (["sleep", "30"], ["sh", "-c", "sleep 30 & sleep 30 & exec sleep 30"]):
            sb = await p.create(make_spec())
            cg = sandbox_cgroup(sb)
            if cg is None:
                pytest.skip("no cgroup to list the sandbox's processes")
            proc = await sb.start_process(cmd, ProcessOpts(stdin=False))
            for _ in range(100):
                if len(cg.pids()) >= (2 if len(cmd) == 2 else 4):
                    break
                await asyncio.sleep(0.01)
            pids = cg.pids()
            assert len(pids) >= 2
            await sb.destroy()
            assert [pid for pid in pids if _runs_user_code(pid)] == []
            assert (await proc.wait()).exit_code != 0
        await p.aclose()
        assert list(mine()) == []

    linux(test, spares=spares)


@pytest.mark.parametrize("spares", [0, 1])
def test_the_sandbox_cgroup_is_the_root_of_its_cgroup_namespace(linux: Any, spares: int
                                                                  ) -> None:
    async def test(p: Any) -> None:
        for _ in range(2):
            async with await p.create(make_spec()) as sb:
                cg = sandbox_cgroup(sb)
                if cg is None:
                    pytest.skip("no cgroups here")
                r = await sb.exec(["cat", "/proc/self/cgroup"])
                inside = {ln.split(":")[1]: ln.split(":", 2)[2]
                          for ln in r.stdout.decode().splitlines()}
                (agent,) = cg.pids()
                with open(f"/proc/{agent}/cgroup") as f:
                    outside = {ln.split(":")[1]: ln.split(":", 2)[2]
                               for ln in f.read().splitlines()}
                for key in cg.dirs:
                    ctrl = {"unified": ""}.get(key, key)
                    ctrl = next(c for c in outside if ctrl in c.split(","))
                    assert inside[ctrl] == "/"
                    assert outside[ctrl].endswith("/" + cg.name)

    linux(test, spares=spares)
