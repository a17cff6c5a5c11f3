"""A host process killed with sandboxes alive: they die, and the next provider reaps the rest."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import corral
from strict_tier import needs_cgroup_limits

SRC = os.path.dirname(os.path.dirname(corral.__file__))

_HOST = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from corral.providers.linux import LinuxProvider
from corral.core.spec import ProcessOpts, SandboxLimits, SandboxSpec

async def main():
    p = LinuxProvider(spares=0)
    sb = await p.create(SandboxSpec(tenant_id="t", run_id="r", limits=SandboxLimits(mem_mb=64)))
    await sb.start_process([sys.argv[2], "-I", "-S", "-c", "import time; time.sleep(60)",
                            sys.argv[3]], ProcessOpts(stdin=False))
    print("ready", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def _with_token(token: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if token.encode() in f.read().split(b"\0"):
                        pids.append(int(d))
            except OSError:
                pass
    return pids


@needs_cgroup_limits()
def test_killed_host_leaves_nothing_running_and_is_reaped(linux: Any) -> None:
    from corral.providers.linux import LinuxProvider

    token = f"corral-orphan-{uuid.uuid4().hex}"
    py = os.path.realpath(sys.executable)
    with subprocess.Popen([sys.executable, "-c", _HOST, SRC, py, token],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as host:
        _kill_host_and_check(host, token)

    async def next_start() -> tuple[str, ...]:
        p = LinuxProvider(spares=0)
        try:
            return p.reaped_orphans
        finally:
            await p.aclose()

    reaped = asyncio.run(next_start())
    assert any(f"-{host.pid}-" in name for name in reaped), reaped
    # and a second start finds nothing left of it
    assert not any(f"-{host.pid}-" in n for n in asyncio.run(next_start()))


def _kill_host_and_check(host: subprocess.Popen[bytes], token: str) -> None:
    try:
        assert host.stdout is not None
        line = host.stdout.readline()
        assert line == b"ready\n", host.stderr.read() if host.stderr else b""
        assert _with_token(token), "the sandboxed sleeper should be running"
        os.kill(host.pid, signal.SIGKILL)  # no destroy, no aclose: the host just dies
        host.wait(10)
        deadline = time.monotonic() + 10
        while _with_token(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _with_token(token) == [], "a sandbox process outlived its killed host"
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        for pid in _with_token(token):  # only if the assertion above failed
            os.kill(pid, signal.SIGKILL)
