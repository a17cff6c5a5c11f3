"""The in-process provider: passes the conformance kit, and its own promises hold."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from corral.core.errors import (
    ConfigInvalidError,
    LevelNotSupportedError,
    ProviderError,
    SandboxTimeoutError,
)
from corral.core.spec import ExecOpts, Level, NetworkPolicy, ProcessOpts, SandboxLimits, SandboxSpec
from corral.providers import get_provider_class
from corral.providers.inprocess import InProcessProvider, InProcessSandbox

PY = sys.executable
UNRESTRICTED = NetworkPolicy.unrestricted()


def spec(**kw: object) -> SandboxSpec:
    base: dict[str, object] = {"tenant_id": "t", "run_id": "r", "level": Level.NONE,
                               "network": UNRESTRICTED}
    base.update(kw)
    return SandboxSpec(**base)  # type: ignore[arg-type]


def py(code: str) -> list[str]:
    return [PY, "-I", "-S", "-c", code]


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_dead(pid: int, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if _dead(pid):
            return True
        time.sleep(0.02)
    return False


def test_registered() -> None:
    assert get_provider_class("inprocess") is InProcessProvider


# what the provider cannot enforce is level-not-supported, what it does not run is
# config-invalid (the contract's refusal table); both name the field
@pytest.mark.parametrize(("kw", "field"), [
    ({"limits": SandboxLimits(mem_mb=64)}, "limits.mem_mb"),
    ({"limits": SandboxLimits(cpu_ms=10)}, "limits.cpu_ms"),
    ({"limits": SandboxLimits(disk_mb=1)}, "limits.disk_mb"),
    ({"limits": SandboxLimits(max_processes=4)}, "limits.max_processes"),
    ({"network": NetworkPolicy.none()}, "network"),
    ({"network": NetworkPolicy.allowlist("example.org")}, "network"),
    ({"image": "img:1"}, "image"),
    ({"image": "img:1", "mode": "json-stdio"}, "image"),
])
def test_refuses_what_it_cannot_enforce(kw: dict[str, object], field: str,
                                        tmp_path: Path) -> None:
    error = (LevelNotSupportedError if field.startswith(("limits.", "network"))
             else ConfigInvalidError)
    with pytest.raises(error) as ei:
        asyncio.run(InProcessProvider(temp_dir=str(tmp_path)).create(spec(**kw)))
    assert ei.value.field == field
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("level", [Level.CONTEXT_ISOLATED, Level.STRICT])
def test_refuses_higher_levels(level: Level) -> None:
    with pytest.raises(LevelNotSupportedError) as ei:
        asyncio.run(InProcessProvider().create(spec(level=level)))
    assert ei.value.requested == level.value
    assert ei.value.supported == ("none",)


def test_private_temp_dir_removed_on_destroy(tmp_path: Path) -> None:
    async def go() -> None:
        sb = await InProcessProvider(temp_dir=str(tmp_path)).create(spec())
        assert isinstance(sb, InProcessSandbox)
        assert stat.S_IMODE(os.stat(sb.base).st_mode) == 0o700
        r = await sb.exec(py("import os; os.makedirs('d/e'); open('d/e/f','w').write('x');"
                             "os.chmod('d/e', 0); os.chmod('d', 0o500); print(os.getcwd())"))
        assert r.stdout.decode().strip() == os.path.realpath(sb.work_dir)
        await sb.destroy()
        assert not os.path.exists(sb.base)
        assert os.listdir(tmp_path) == []

    asyncio.run(go())


def test_destroy_kills_the_process_group_with_grandchild() -> None:
    code = ("import os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    time.sleep(30); os._exit(0)\n"
            "print(os.getpid(), pid, flush=True)\n"
            "time.sleep(30)\n")

    async def go() -> tuple[int, int]:
        sb = await InProcessProvider().create(spec())
        p = await sb.start_process(py(code), ProcessOpts(stdin=False))
        line = await anext(p.stdout)
        child, grandchild = (int(x) for x in line.split())
        assert not _dead(grandchild)
        await sb.destroy()
        st = await p.wait()
        assert st.exit_code == -9
        return child, grandchild

    child, grandchild = asyncio.run(go())
    assert wait_dead(child)
    assert wait_dead(grandchild), "the grandchild survived destroy()"


def test_exec_timeout_kills_grandchild_and_keeps_partial_output() -> None:
    code = ("import os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    time.sleep(30); os._exit(0)\n"
            "print(pid, flush=True)\n"
            "time.sleep(30)\n")

    async def go() -> int:
        async with await InProcessProvider().create(spec()) as sb:
            with pytest.raises(SandboxTimeoutError) as ei:
                await sb.exec(py(code), ExecOpts(timeout_ms=500))
            return int(ei.value.stdout)

    assert wait_dead(asyncio.run(go()))


def test_exec_leftovers_killed_when_it_returns() -> None:
    code = ("import os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    os.close(1); os.close(2); time.sleep(30); os._exit(0)\n"
            "print(pid)\n")

    async def go() -> int:
        async with await InProcessProvider().create(spec()) as sb:
            r = await sb.exec(py(code))
            return int(r.stdout)

    assert wait_dead(asyncio.run(go()))


def test_asyncio_cancel_of_exec_kills_the_command() -> None:
    async def go() -> int:
        async with await InProcessProvider().create(spec()) as sb:
            task = asyncio.ensure_future(sb.exec(py(
                "import os, time; open('pid','w').write(str(os.getpid())); time.sleep(30)")))
            for _ in range(250):
                await asyncio.sleep(0.02)
                if os.path.exists(os.path.join(sb.work_dir, "pid")):
                    break
            pid = int(await sb.read_file("pid"))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return pid

    assert wait_dead(asyncio.run(go()))


def test_host_environment_not_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_HOST_SECRET", "s3cret")

    async def go() -> None:
        async with await InProcessProvider().create(spec()) as sb:
            assert isinstance(sb, InProcessSandbox)
            code = "import os, json; print(json.dumps(dict(os.environ)))"
            env = json.loads((await sb.exec(py(code))).stdout)
            assert "CORRAL_HOST_SECRET" not in env
            assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_CTYPE"}
            assert env["HOME"] == sb.work_dir
            assert env["TMPDIR"] == sb.tmp_dir
            r = await sb.exec(py(code), ExecOpts(env={"ONLY": "1", "HOME": "/nowhere"}))
            env = json.loads(r.stdout)
            assert env["ONLY"] == "1" and env["HOME"] == "/nowhere"
            assert "CORRAL_HOST_SECRET" not in env

    asyncio.run(go())


def test_cwd_must_stay_inside() -> None:
    async def go() -> None:
        async with await InProcessProvider().create(spec()) as sb:
            await sb.exec(py("import os; os.symlink('/', 'out'); os.mkdir('in')"))
            r = await sb.exec(py("import os; print(os.path.basename(os.getcwd()))"),
                              ExecOpts(cwd="in"))
            assert r.stdout == b"in\n"
            for bad in ("out", "..", "/tmp", "missing"):
                with pytest.raises(ConfigInvalidError) as ei:
                    await sb.exec(py("pass"), ExecOpts(cwd=bad))
                assert ei.value.field == "cwd"

    asyncio.run(go())


def test_bad_argv_and_missing_program() -> None:
    async def go() -> None:
        async with await InProcessProvider().create(spec()) as sb:
            with pytest.raises(ConfigInvalidError):
                await sb.exec([])
            with pytest.raises(ConfigInvalidError):
                await sb.exec("python")  # type: ignore[arg-type]
            with pytest.raises(ProviderError):
                await sb.exec(["/nonexistent/corral-no-such-program"])

    asyncio.run(go())


def test_call_runs_in_context_handlers() -> None:
    seen: list[int] = []

    async def twice(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    async def go() -> None:
        sb = await InProcessProvider().create(spec(mode="in-context"))
        assert isinstance(sb, InProcessSandbox)
        assert await sb.call(seen.append, 1) is None
        assert await sb.call(twice, 21) == 42
        await sb.destroy()
        with pytest.raises(ProviderError):
            await sb.call(seen.append, 2)

    asyncio.run(go())
    assert seen == [1]
