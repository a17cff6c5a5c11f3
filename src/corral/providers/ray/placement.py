"""Where a sandbox goes: the driver's view of each node and the pure ranking over it.

A node is a candidate for a spec when its provider gives the spec's level (a node
whose strict provider cannot run there reports no ``strict`` and never gets a strict
sandbox), enforces every limit the spec sets, and has the memory the sandbox reserves
free as Ray's ``memory`` resource. Candidates are ordered by, in turn:

1. fewest live sandboxes of the spec's tenant (tenants spread over the nodes);
2. a warm spare ready (its sandbox is claimed, not built);
3. fewest live sandboxes in all;
4. the node id (a stable tie-break).

Pure: no Ray import, no I/O; ``rank`` is unit-tested on plain values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from corral.core.errors import LevelNotSupportedError, ProviderError
from corral.core.spec import SandboxSpec

__all__ = ["NodeView", "no_candidate", "rank", "reserve_mb"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """What the driver knows of one node (from its actor's report and Ray's resources).

    Attributes:
        node_id / address: Ray's node id and the node's IP address.
        levels: the levels its provider gives there (empty: it can give none).
        why_not: why it cannot give strict ("" when it can).
        limits: the limit fields its provider enforces there.
        default_mem_mb: the memory limit its provider applies when a spec sets none.
        capabilities: its provider's capability strings.
        free_mem_mb: Ray's available ``memory`` resource there, MiB (None: unknown).
        spares: idle warm spares it reported last.
        live: live sandboxes on it (every driver's), as last reported.
        tenants: live sandboxes per tenant there, as last reported.
    """

    node_id: str
    address: str
    levels: frozenset[str] = frozenset()
    why_not: str = ""
    limits: frozenset[str] = frozenset()
    default_mem_mb: int | None = None
    capabilities: frozenset[str] = frozenset()
    free_mem_mb: float | None = None
    spares: int = 0
    live: int = 0
    tenants: Mapping[str, int] = field(default_factory=dict)


def reserve_mb(spec: SandboxSpec, node: NodeView) -> int:
    """The memory a sandbox of ``spec`` reserves on ``node`` (MiB): its limit, else the
    node's default limit, else 0 (nothing caps it, so nothing is reserved)."""
    return spec.limits.mem_mb or node.default_mem_mb or 0


def _fits(spec: SandboxSpec, node: NodeView) -> bool:
    if spec.level.value not in node.levels:
        return False
    if not set(spec.limits.asked()) <= node.limits:
        return False
    return node.free_mem_mb is None or node.free_mem_mb >= reserve_mb(spec, node)


def rank(nodes: Iterable[NodeView], spec: SandboxSpec, *,
         extra_tenant: Mapping[str, int] | None = None,
         extra_live: Mapping[str, int] | None = None) -> list[NodeView]:
    """The nodes that can take ``spec``, best first (see the module doc).

    ``extra_tenant`` / ``extra_live`` (node id -> count) add what this driver placed since
    the nodes last reported."""
    et, el = extra_tenant or {}, extra_live or {}

    def key(n: NodeView) -> tuple[int, int, int, str]:
        return (n.tenants.get(spec.tenant_id, 0) + et.get(n.node_id, 0),
                0 if n.spares > 0 else 1, n.live + el.get(n.node_id, 0), n.node_id)

    return sorted((n for n in nodes if _fits(spec, n)), key=key)


def no_candidate(nodes: Sequence[NodeView], spec: SandboxSpec) -> Exception:
    """The error for a spec no node can take: a level or limit no node gives is
    ``LevelNotSupportedError`` (as a single provider would refuse it), a full cluster
    ``ProviderError``."""
    lv = spec.level.value
    levels = {x for n in nodes for x in n.levels}
    if lv not in levels:
        why = "; ".join(f"{n.address}: {n.why_not}" for n in nodes if n.why_not)
        return LevelNotSupportedError(
            lv, tuple(sorted(levels)), why or "no live node",
            missing=f"a node whose provider gives {lv!r}")
    able = [n for n in nodes if lv in n.levels]
    for name in spec.limits.asked():
        if not any(name in n.limits for n in able):
            return LevelNotSupportedError(
                lv, (), f"no node enforces {name}", missing=f"{name} on any node",
                field=f"limits.{name}")
    free = ", ".join(f"{n.address}: {n.free_mem_mb:.0f} MiB" for n in able
                     if n.free_mem_mb is not None)
    return ProviderError(f"no node has room for this sandbox (it reserves "
                         f"{max((reserve_mb(spec, n) for n in able), default=0)} MiB of memory;"
                         f" free: {free or 'unknown'})")
