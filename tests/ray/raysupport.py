"""What the Ray tests share: a provider on the test cluster and a leak check."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.providers.ray import _wire
from corral.providers.ray.provider import RayProvider


def provider(**kw: Any) -> RayProvider:
    """A provider placing on the worker nodes only (the head offers no ``corral``)."""
    kw.setdefault("node_resource", "corral")
    kw.setdefault("lease_s", 10.0)
    return RayProvider(**kw)


async def node_infos(p: RayProvider) -> dict[str, dict[str, Any]]:
    """Every attached node's report, by address."""
    nodes = await p.refresh(force=True)
    infos = await asyncio.gather(*(n.actor.info.remote() for n in nodes))
    return {n.address: _wire.unwrap(i) for n, i in zip(nodes, infos, strict=True)}


async def no_leaks(p: RayProvider, seconds: float = 10.0) -> None:
    """Wait until no node holds a sandbox or a process record and no memory reservation
    (placement group) is left; fail after ``seconds``."""
    from ray.util import placement_group_table
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        infos = await node_infos(p)
        left: dict[str, Any] = {a: (i["live"], i["procs"]) for a, i in infos.items()
                                if i["live"] or i["procs"]}
        pgs = [g for g in placement_group_table().values() if g.get("state") == "CREATED"]
        if pgs:
            left["placement groups"] = len(pgs)
        if not left:
            return
        if loop.time() > deadline:
            raise AssertionError(f"sandboxes or processes left on nodes: {left}")
        await asyncio.sleep(0.2)
