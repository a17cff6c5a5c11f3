"""Scale-out on Ray: strict sandboxes placed across a cluster (``pip install corral[ray]``).

``RayProvider`` (registry name ``ray``) runs one long-lived actor per cluster node
(:mod:`.node`), each hosting that node's strict provider and its warm spares; ``create``
places a sandbox on a node (:mod:`.placement`) and the :class:`RaySandbox` it returns
forwards the contract to that node. ``LocalCluster`` (:mod:`.cluster`) starts a head and
worker nodes on loopback for tests, benchmarks and trying it out. See docs/scale-out.md.

Ray itself is imported only when a provider is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["PROVIDER_CLASS", "LocalCluster", "RayProvider", "RaySandbox"]

if TYPE_CHECKING:
    from corral.providers.ray.cluster import LocalCluster
    from corral.providers.ray.provider import RayProvider, RaySandbox

    PROVIDER_CLASS = RayProvider


def __getattr__(name: str) -> Any:
    if name in ("RayProvider", "PROVIDER_CLASS"):
        from corral.providers.ray.provider import RayProvider
        return RayProvider
    if name == "RaySandbox":
        from corral.providers.ray.provider import RaySandbox
        return RaySandbox
    if name == "LocalCluster":
        from corral.providers.ray.cluster import LocalCluster
        return LocalCluster
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
