"""Preview URLs and a live sandbox's network policy over ``corral serve`` (issue 23
item 6): the work behind ``POST /v1/sandboxes/{sid}/expose``, ``.../unexpose`` and
``PUT .../network``. Kept apart from ``service.py`` (the tenants' caps live there).

A URL is on the server's loopback and carries its own token (see
:mod:`corral.core.preview`): only the tenant that asked gets the token, in the answer.
"""

from __future__ import annotations

from typing import Any

from corral.core.contract import SupportsPreviewUrl
from corral.core.errors import ConfigInvalidError, LevelNotSupportedError
from corral.core.preview import PreviewURL
from corral.serve.service import Service
from corral.serve.state import SandboxEntry, TenantState

__all__ = ["change_network", "expose", "unexpose"]

#: entries per PUT .../network, at most
MAX_NETWORK_ENTRIES = 64


def _port(doc: dict[str, Any]) -> int:
    port = doc.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigInvalidError("port", f"must be a TCP port 1..65535, got {port!r}")
    return port


def _preview(entry: SandboxEntry) -> SupportsPreviewUrl:
    sb = entry.sandbox
    if not isinstance(sb, SupportsPreviewUrl):
        raise LevelNotSupportedError(entry.level, (), "this level's provider has no "
                                     "preview URLs", missing="preview-url", field="expose")
    return sb


async def expose(service: Service, tenant: TenantState, sandbox_id: str,
                 doc: dict[str, Any]) -> dict[str, Any]:
    """``{"port"}`` -> ``{"url", "token", "port"}``."""
    entry = service.entry(tenant, sandbox_id)  # another tenant's: 404 before the body
    sb = _preview(entry)
    port = _port(doc)
    url = await sb.expose(port)
    token = url.token if isinstance(url, PreviewURL) else None
    if not token:  # a provider whose URL has no token: never handed out
        raise LevelNotSupportedError(entry.level, (),
                                     "its preview URLs carry no token",
                                     missing="preview-url token", field="expose")
    return {"url": str(url), "token": token, "port": port}


async def unexpose(service: Service, tenant: TenantState, sandbox_id: str,
                   doc: dict[str, Any]) -> None:
    sb = _preview(service.entry(tenant, sandbox_id))
    await sb.unexpose(_port(doc))


def _entries(doc: dict[str, Any], key: str) -> list[str]:
    v = doc.get(key, [])
    if not isinstance(v, list) or not all(isinstance(e, str) for e in v):
        raise ConfigInvalidError(f"network.{key}", "must be a list of host entries")
    if len(v) > MAX_NETWORK_ENTRIES:
        raise ConfigInvalidError(f"network.{key}", f"at most {MAX_NETWORK_ENTRIES} entries")
    return v


def _check_allowed(tenant: TenantState, level: str, entry: str) -> None:
    """What a tenant may add to a live sandbox's policy: the same ceiling a create's
    policy meets (:func:`corral.serve.tenancy.check_network`, the operator's per-tenant
    kinds, public destinations and non-public ranges), for one more allowlist entry."""
    from corral.core.spec import NetworkPolicy
    from corral.serve import tenancy
    from corral.serve.tenancy import is_host_address as _is_host_address
    try:
        tenancy.check_network(tenant.config.policy, level, NetworkPolicy.allowlist(entry),
                              host_address=_is_host_address)
    except ConfigInvalidError as e:
        raise ConfigInvalidError("network.allow", e.reason) from None


async def change_network(service: Service, tenant: TenantState, sandbox_id: str,
                         doc: dict[str, Any]) -> None:
    """``{"allow": [...], "revoke": [...]}``: the sandbox's ``allow_host`` /
    ``revoke_host``, for new connections (all entries checked before any applies)."""
    entry = service.entry(tenant, sandbox_id)  # another tenant's: 404 before the body
    allow, revoke = _entries(doc, "allow"), _entries(doc, "revoke")
    extra = sorted(set(doc) - {"allow", "revoke"})
    if extra:
        raise ConfigInvalidError("network", f"unknown field(s) {extra}")
    sb = entry.sandbox
    allow_host, revoke_host = getattr(sb, "allow_host", None), getattr(sb, "revoke_host", None)
    if not (callable(allow_host) and callable(revoke_host)):
        raise LevelNotSupportedError(entry.level, (), "this level's provider cannot change "
                                     "a live sandbox's network policy",
                                     missing="allow_host/revoke_host", field="network")
    from corral.providers.linux.host.egress import parse_entry
    for e in revoke:
        parse_entry(e)
    for e in allow:
        _check_allowed(tenant, entry.level, e)
    for e in revoke:
        revoke_host(e)
    for e in allow:
        allow_host(e)
