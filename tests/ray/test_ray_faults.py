"""Faults on a real local cluster: a node whose raylet is killed, and a driver that dies.

* Node loss: the runs in flight on the node fail with a typed error (ProviderError naming
  the node) within seconds, never a hang; new sandboxes go to the surviving node; the
  node started again is used again; nothing is left on the surviving nodes.
* Driver loss: a driver is SIGKILLed holding a sandbox; the node actor destroys it once
  the driver's lease has expired, and its processes are gone from the host.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from typing import Any

import pytest
from raysupport import no_leaks, node_infos, provider

import corral
from corral.core.errors import ProviderError
from corral.core.spec import ProcessOpts, SandboxSpec

PY = sys.executable

#: figures for a reader (shown with -o log_cli=true --log-cli-level=INFO, and on a
#: failure), never printed between pytest's progress dots
LOG = logging.getLogger("corral.tests.ray")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


async def _gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        await asyncio.sleep(0.2)
    return [p for p in pids if _alive(p)]


def test_node_loss(ray_cluster: Any) -> None:
    cluster = ray_cluster
    victim_node = cluster.workers[-1]

    async def go() -> None:
        p = provider(lease_s=2.0)
        try:
            a = await p.create(SandboxSpec(tenant_id="t1"))
            b = await p.create(SandboxSpec(tenant_id="t1"))
            assert {a.node.address, b.node.address} == {w.ip for w in cluster.workers}, \
                "one tenant's two sandboxes must be spread over the two workers"
            victim, survivor = (a, b) if a.node.address == victim_node.ip else (b, a)
            pids = (await node_infos(p))[victim_node.ip]["host_pids"][victim.id]
            assert pids, "the victim sandbox shows no host processes"
            run = asyncio.ensure_future(victim.exec([PY, "-c", "import time; time.sleep(60)"]))
            proc = await victim.start_process([PY, "-c", "import time; print('up', flush=True);"
                                               " time.sleep(60)"], ProcessOpts(stdin=False))
            assert await anext(proc.stdout) == b"up\n"
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            cluster.kill_raylet(victim_node)
            with pytest.raises(ProviderError) as ei:
                await asyncio.wait_for(run, 30.0)
            took = time.monotonic() - t0
            with pytest.raises(ProviderError):
                await asyncio.wait_for(proc.wait(), 10.0)
            took_proc = time.monotonic() - t0
            assert victim_node.ip in str(ei.value), ei.value
            assert took < 10.0, f"the typed error came after {took:.1f} s"
            how = str(ei.value).rsplit(": ", 1)[-1]
            LOG.info("node loss: exec in flight failed with %s after %.2f s, a started "
                     "process's wait() after %.2f s (%s)", type(ei.value).__name__, took,
                     took_proc, how)
            # new sandboxes go to the survivor; the survivor's sandbox still serves
            r = await survivor.exec([PY, "-c", "print('still here')"])
            assert r.stdout == b"still here\n"
            c = await p.create(SandboxSpec(tenant_id="t1"))
            assert c.node.address == survivor.node.address
            with pytest.raises(ProviderError):
                await victim.exec([PY, "-c", "pass"])
            await victim.destroy()
            left = await _gone(pids, 10.0)
            assert not left, f"the lost node's sandbox processes are still alive: {left}"
            # the node comes back (a new raylet on the same address) and is used again
            await asyncio.to_thread(cluster.restart_worker, victim_node)
            deadline = time.monotonic() + 30.0
            while victim_node.ip not in {n.address for n in await p.refresh(force=True)}:
                assert time.monotonic() < deadline, "the restarted node was never attached"
                await asyncio.sleep(0.5)
            d = await p.create(SandboxSpec(tenant_id="t1"))
            assert d.node.address == victim_node.ip, \
                "a tenant with two sandboxes on the survivor must get the returned node"
            r = await d.exec([PY, "-c", "print('back')"])
            assert r.stdout == b"back\n"
            # leases were renewed all along (lease 2 s; this took longer)
            r = await survivor.exec([PY, "-c", "print('renewed')"])
            assert r.stdout == b"renewed\n"
            for sb in (survivor, c, d):
                await sb.destroy()
            await no_leaks(p)
        finally:
            await p.aclose()
    asyncio.run(go())


_DRIVER = """
import asyncio, os, sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
from corral.core.spec import ProcessOpts, SandboxSpec
from corral.providers.ray import _wire
from corral.providers.ray.provider import RayProvider

async def main():
    p = RayProvider(node_resource="corral", lease_s=2.0)
    sb = await p.create(SandboxSpec(tenant_id="doomed"))
    await sb.start_process([sys.executable, "-c", "import time; time.sleep(120)"],
                           ProcessOpts(stdin=False))
    info = _wire.unwrap(await sb.node.actor.info.remote())
    print("SANDBOX", sb.id, sb.node.address, *info["host_pids"][sb.id], flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_dead_driver_sandboxes_reaped(ray_cluster: Any) -> None:
    env = {**ray_cluster.env, "PYTHONWARNINGS": "ignore"}
    drv = subprocess.Popen([PY, "-c", _DRIVER, ray_cluster.address], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        seen = []
        for line in drv.stdout or ():  # Ray may print lines of its own first
            seen.append(line)
            if line.startswith("SANDBOX "):
                break
        parts = seen[-1].split() if seen else []
        assert len(parts) >= 4 and parts[0] == "SANDBOX", \
            f"the driver did not report its sandbox: {seen!r}"
        sid, address, pids = parts[1], parts[2], [int(x) for x in parts[3:]]
        assert all(_alive(x) for x in pids)
    finally:
        drv.kill()
        drv.wait()
        if drv.stdout is not None:
            drv.stdout.close()
    t0 = time.monotonic()

    async def go() -> float:
        p = provider()
        try:
            while True:
                infos = await node_infos(p)
                if sid not in infos[address]["host_pids"]:
                    break
                assert time.monotonic() - t0 < 15.0, "the dead driver's sandbox was not reaped"
                await asyncio.sleep(0.2)
            took = time.monotonic() - t0
            left = await _gone(pids, 10.0)
            assert not left, f"the reaped sandbox's processes are alive: {left}"
            await no_leaks(p)
            return took
        finally:
            await p.aclose()

    took = asyncio.run(go())
    assert took >= 1.0, f"reaped after {took:.1f} s, before its 2 s lease could expire"
    LOG.info("dead driver: its sandbox was destroyed %.2f s after the kill (lease 2 s)", took)



def _created_pgs() -> list[dict[str, Any]]:
    from ray.util import placement_group_table
    return [pg for pg in placement_group_table().values() if pg.get("state") == "CREATED"]


def test_memory_is_reserved_as_a_ray_resource(ray_cluster: Any) -> None:
    async def go() -> None:
        p = provider()
        try:
            before = len(_created_pgs())
            sb = await p.create(SandboxSpec(limits=corral.SandboxLimits(mem_mb=300)))
            pgs = _created_pgs()
            assert len(pgs) == before + 1, pgs
            bundle = next(iter(pgs[-1]["bundles"].values()))
            assert bundle["memory"] == 300 * 1024 * 1024, bundle
            assert bundle.get(f"node:{sb.node.address}"), bundle
            # more memory than any worker has is refused before anything runs
            with pytest.raises(ProviderError, match="no node has room"):
                await p.create(SandboxSpec(limits=corral.SandboxLimits(mem_mb=1 << 30)))
            await sb.destroy()
            assert len(_created_pgs()) == before
            await no_leaks(p)
        finally:
            await p.aclose()
    asyncio.run(go())
