"""A node that cannot enforce what a spec asks never gets that sandbox: a worker run by an
unprivileged user (uid 65534, no delegated cgroup) joins the cluster; its node actor
reports strict without a memory limit, so a spec with ``mem_mb`` never goes there, while
one without limits may. ``corral doctor --ray`` says so for that node."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import pytest
from raysupport import no_leaks, provider

from corral.core.spec import SandboxLimits, SandboxSpec

WEAK_UID = 65534

#: figures for a reader (shown with -o log_cli=true --log-cli-level=INFO, and on a
#: failure), never printed between pytest's progress dots
LOG = logging.getLogger("corral.tests.ray")


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a node as another user needs root")
def test_a_node_without_a_memory_cgroup_never_gets_a_mem_mb_sandbox(
        ray_cluster: Any) -> None:
    weak = ray_cluster.add_worker(uid=WEAK_UID)
    try:
        async def go() -> None:
            p = provider()
            try:
                views = {n.address: n.view for n in await p.refresh(force=True)}
                assert weak.ip in views, f"the unprivileged node was not attached: " \
                    f"{p.attach_errors}"
                wv = views[weak.ip]
                LOG.info("node run as uid %d: levels %s, limits %s%s", WEAK_UID,
                         sorted(wv.levels), sorted(wv.limits),
                         "; " + wv.why_not if wv.why_not else "")
                assert "mem_mb" not in wv.limits, wv
                others = [v for a, v in views.items() if a != weak.ip]
                assert all("mem_mb" in v.limits for v in others), others
                boxes = [await p.create(SandboxSpec(tenant_id="mem",
                                                    limits=SandboxLimits(mem_mb=128)))
                         for _ in range(4)]
                assert weak.ip not in {b.node.address for b in boxes}, \
                    [b.node.address for b in boxes]
                for b in boxes:
                    await b.destroy()
                if "strict" in wv.levels:  # unprivileged user namespaces work here
                    free = [await p.create(SandboxSpec(tenant_id=f"free-{i}"))
                            for i in range(3)]
                    on_weak = [b for b in free if b.node.address == weak.ip]
                    assert on_weak, "a spec without limits should reach the weak node too"
                    r = await on_weak[0].exec(["/bin/echo", "weak"])
                    assert r.stdout == b"weak\n"
                    for b in free:
                        await b.destroy()
                await no_leaks(p)
            finally:
                await p.aclose()
        asyncio.run(go())
    finally:
        ray_cluster.stop_node(weak)
        ray_cluster.workers.remove(weak)
