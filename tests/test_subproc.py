"""The subproc provider: the conformance kit, refusals, and tree cleanup on destroy."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sys
import time
from pathlib import Path

import pytest

from corral import (
    ConfigInvalidError,
    ExecOpts,
    Level,
    LevelNotSupportedError,
    LimitsExceededError,
    NetworkPolicy,
    ProcessOpts,
    SandboxLimits,
    SandboxSpec,
)
from corral.providers import get_provider_class
from corral.providers.subproc import SubprocProvider

UNRESTRICTED = NetworkPolicy.unrestricted()
PY = [sys.executable, "-I", "-S", "-c"]


def _spec(**kw: object) -> SandboxSpec:
    base: dict[str, object] = {"tenant_id": "t", "run_id": "r", "level": "context-isolated",
                               "network": UNRESTRICTED}
    base.update(kw)
    return SandboxSpec(**base)  # type: ignore[arg-type]


def _alive_with(token: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        out.append(int(name))
            except OSError:
                pass
    return out


def test_registered_and_described() -> None:
    assert get_provider_class("subproc") is SubprocProvider
    p = SubprocProvider()
    assert p.name == "subproc" and p.levels == frozenset({Level.CONTEXT_ISOLATED})
    assert p.capabilities == frozenset({"context-isolated", "streaming", "files"})


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
    ({"mode": "in-context"}, "mode"),
])
def test_refuses_what_it_cannot_enforce(kw: dict[str, object], field: str,
                                        tmp_path: Path) -> None:
    error = (LevelNotSupportedError if field.startswith(("limits.", "network"))
             else ConfigInvalidError)
    with pytest.raises(error) as ei:
        asyncio.run(SubprocProvider(temp_dir=str(tmp_path)).create(_spec(**kw)))
    assert ei.value.field == field
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("level", ["strict", "none"])
def test_refuses_other_levels(level: str) -> None:
    with pytest.raises(LevelNotSupportedError):
        asyncio.run(SubprocProvider().create(_spec(level=level)))


def test_exec_output_cap_and_path_lookup(tmp_path: Path) -> None:
    async def main() -> None:
        p = SubprocProvider(temp_dir=str(tmp_path), max_stdout_bytes=1000)
        async with await p.create(_spec()) as sb:
            r = await sb.exec(["sh", "-c", "echo $HOME; pwd"])  # found on PATH
            home, cwd = r.stdout.decode().split()
            assert home == cwd and cwd.startswith(str(tmp_path))
            with pytest.raises(LimitsExceededError) as ei:
                await sb.exec([*PY, "print('x' * 5000)"])
            assert ei.value.limit == "output"
            with pytest.raises(ConfigInvalidError):
                await sb.exec(["no-such-command-" + secrets.token_hex(4)])
            with pytest.raises(ConfigInvalidError):
                await sb.exec([*PY, "pass"], ExecOpts(cwd="../.."))

    asyncio.run(main())


def test_destroy_kills_every_tree_including_setsid_daemons(tmp_path: Path) -> None:
    token = "corral-subproc-test-" + secrets.token_hex(6)
    daemon = ("import os,time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    if os.fork() == 0:\n"
              f"        os.execv({sys.executable!r}, [{sys.executable!r}, '-c', "
              f"'import time; time.sleep(30)', {token!r}])\n"
              "    os._exit(0)\n"
              "os.wait(); print('up', flush=True); time.sleep(30)\n")

    async def main() -> None:
        p = SubprocProvider(temp_dir=str(tmp_path))
        sb = await p.create(_spec())
        proc = await sb.start_process([*PY, daemon], ProcessOpts(stdin=False))
        async for chunk in proc.stdout:
            if b"up" in chunk:
                break
        assert _alive_with(token)
        await sb.destroy()
        st = await proc.wait()
        assert st.exit_code == -signal.SIGKILL

    try:
        asyncio.run(main())
        for _ in range(100):
            if not _alive_with(token):
                break
            time.sleep(0.02)
        assert _alive_with(token) == []
        assert os.listdir(tmp_path) == []
    finally:
        for pid in _alive_with(token):
            os.kill(pid, signal.SIGKILL)
