"""``corral doctor --ray ADDRESS``: each cluster node's strict capabilities, as its node
actor sees them (the same report ``corral doctor`` gives on that host), and whether the
Ray provider places strict sandboxes there (a node that cannot enforce strict never gets
one)."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["collect", "render"]


def collect(address: str) -> dict[str, Any]:
    """The cluster report as JSON-safe data: one row per alive node."""
    from corral.providers.ray import _wire
    from corral.providers.ray.provider import RayProvider

    async def go() -> dict[str, Any]:
        p = RayProvider(address=address, lease_s=30.0)
        try:
            nodes = await p.refresh(force=True)
            replies = await asyncio.gather(*(n.actor.info.remote() for n in nodes),
                                           return_exceptions=True)
            rows = []
            for n, rep in zip(nodes, replies, strict=True):
                if isinstance(rep, BaseException):
                    rows.append({"address": n.address, "node_id": n.node_id, "strict": False,
                                 "why_not": f"its node actor did not answer: {rep}"})
                    continue
                try:
                    info = _wire.unwrap(rep)
                except Exception as e:
                    rows.append({"address": n.address, "node_id": n.node_id, "strict": False,
                                 "why_not": f"{type(e).__name__}: {e}"})
                    continue
                rows.append({"address": n.address, "node_id": n.node_id,
                             "strict": "strict" in info["levels"], "why_not": info["why_not"],
                             "limits": info["limits"], "capabilities": info["capabilities"],
                             "spares": info["spares"], "live": info["live"],
                             "free_mem_mb": n.view.free_mem_mb, "doctor": info["doctor"]})
            for addr, why in p.attach_errors.items():
                rows.append({"address": addr, "node_id": "", "strict": False,
                             "why_not": f"its node actor could not be made: {why}"})
            return {"ray": address, "capabilities": sorted(p.capabilities), "nodes": rows}
        finally:
            await p.aclose()

    return asyncio.run(go())


def render(report: dict[str, Any]) -> str:
    """The cluster report as plain text."""
    rows = report["nodes"]
    ok = sum(1 for r in rows if r["strict"])
    lines = [f"corral doctor --ray {report['ray']}: {len(rows)} node(s), {ok} can enforce "
             "strict (only those get strict sandboxes)"]
    for r in rows:
        state = "strict: yes" if r["strict"] else f"strict: NO ({r['why_not']})"
        lines += ["", f"  node {r['address']} ({r['node_id'][:12]}): {state}"]
        if r.get("limits") is not None:
            lines.append(f"    limits enforced: {', '.join(r['limits']) or 'none'}; "
                         f"capabilities: {', '.join(r['capabilities'])}; "
                         f"spares {r['spares']}, live {r['live']}"
                         + (f", free memory {r['free_mem_mb']:.0f} MiB"
                            if r.get("free_mem_mb") is not None else ""))
        for prov in (r.get("doctor") or {}).get("providers", []):
            if prov.get("name") != "linux":
                continue
            for row in prov.get("rows", []):
                mark = "yes" if row["enforced"] else "no "
                lines.append(f"    {mark}  {row['what']}: {row['how']}")
    return "\n".join(lines) + "\n"
