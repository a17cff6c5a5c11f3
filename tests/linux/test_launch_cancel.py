"""A cancelled launch whose fork server never answers: the fork request is cancelled and
awaited (no task of the launch is left pending), its cgroup removed, no fd left open."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace
from typing import Any

import pytest

from corral.core.spec import SandboxLimits
from corral.providers.linux.host import launch as launch_mod


class _Cgroup:
    join_files = ("/nonexistent/cgroup.procs",)

    def __init__(self) -> None:
        self.killed = self.removed = False

    def kill_all(self) -> None:
        self.killed = True

    def remove(self) -> None:
        self.removed = True


class _Cgroups:
    support = SimpleNamespace(version="v2")

    def __init__(self) -> None:
        self.made: list[_Cgroup] = []

    def create(self, sid: str, limits: SandboxLimits) -> _Cgroup:
        cg = _Cgroup()
        self.made.append(cg)
        return cg


class _HangingZygote:
    """A fork server that takes the request and never answers."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.cancelled = False

    async def create(self, plan: Any, procs: list[str], fd: int) -> tuple[int, int]:
        self.asked.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError


def test_a_cancelled_launch_leaves_no_fork_request_pending(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_mod, "FORK_SETTLE_S", 0.05, raising=False)

    async def main() -> tuple[set[asyncio.Task[Any]], _HangingZygote, _Cgroups, int, int]:
        before = asyncio.all_tasks()
        fds = len(os.listdir("/proc/self/fd"))
        zygote = _HangingZygote()
        cgroups = _Cgroups()

        async def zygote_for(prog: bytes) -> Any:
            return zygote

        task = asyncio.ensure_future(launch_mod.launch(
            SimpleNamespace(wire={}), b"", None,  # type: ignore[arg-type]
            limits=SandboxLimits(), cgroups=cgroups,  # type: ignore[arg-type]
            zygote_for=zygote_for))
        await zygote.asked.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        left = {t for t in asyncio.all_tasks() - before if not t.done()}
        return left, zygote, cgroups, fds, len(os.listdir("/proc/self/fd"))

    left, zygote, cgroups, fds_before, fds_after = asyncio.run(main())
    assert left == set()  # before: the fork request ran on, owned by nobody
    assert zygote.cancelled
    assert [(cg.killed, cg.removed) for cg in cgroups.made] == [(True, True)]
    assert fds_after == fds_before  # both ends of the agent's socket pair closed
