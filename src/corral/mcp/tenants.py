"""Who may call ``corral mcp`` and how much: tenants, their bearer tokens and caps.

Over streamable HTTP every request names its tenant by ``Authorization: Bearer
<token>``; the tenants are ``corral serve``'s (the ``[[tenants]]`` tables of its TOML
config, read by :func:`corral.serve.config.load_config`: ``token`` or
``token_sha256``, ``max_sandboxes``, ``max_runs``, ``max_memory_mb``, and the ceiling
of :mod:`corral.serve.tenancy`: ``levels``, ``[tenants.limits]`` ...), or, without a
config, one tenant ``default`` whose token is ``$CORRAL_MCP_TOKEN`` or generated, with
the built-in ceiling. Over
stdio there is one tenant, :data:`LOCAL`, with no token (the client started the server
as its own user) and the server's caps.

Tokens are compared by their SHA-256 digests in constant time, against every tenant
(no early exit), so the time of a refusal says nothing about which tenant came close.

Pure standard library (plus corral): importing it needs neither the SDK nor starlette.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Final

from corral.core.errors import ConfigInvalidError
from corral.core.spec import Level
from corral.serve.tenancy import TenantPolicy

__all__ = ["LOCAL", "McpTenant", "TenantTable", "generated_token"]

#: the one tenant of a stdio server
LOCAL: Final = "local"


@dataclass(frozen=True, slots=True, kw_only=True)
class McpTenant:
    """One tenant of ``corral mcp``.

    Attributes:
        name: its name (the ``tenant_id`` of its sandboxes, its scope's first half).
        token_sha256: SHA-256 of its bearer token; None for :data:`LOCAL` (stdio).
        max_sandboxes: named sandboxes alive at once over all its sessions.
        max_runs: tool calls that run something (a snippet, a command, an exec) in
            flight at once; one more is refused with ``config-invalid`` (``max_runs``).
        max_memory_mb: the sum of ``mem_mb`` of its live named sandboxes (each has one:
            the server fills in its default), or None for no tenant-wide bound.
        max_sessions: MCP sessions (the handshake protocol's ``mcp-session-id``) open at
            once; one more is answered 429 before the SDK makes anything.
        policy: its ceiling (:class:`corral.serve.tenancy.TenantPolicy`, as ``corral
            serve``'s): the levels it may run at (``strict`` unless the operator names
            more), limit defaults and maxima, timeouts, output.
    """

    name: str
    token_sha256: bytes | None
    max_sandboxes: int = 8
    max_runs: int = 4
    max_memory_mb: int | None = 4096
    max_sessions: int = 8
    policy: TenantPolicy = field(default_factory=lambda: TenantPolicy(name="-"))

    def __post_init__(self) -> None:
        if self.token_sha256 is not None and len(self.token_sha256) != 32:
            raise ConfigInvalidError("tenants.token_sha256", "must be a SHA-256 digest")
        if Level.NONE in self.policy.levels:
            raise ConfigInvalidError("levels", "corral mcp never runs at 'none'")
        if self.policy.name != self.name:
            object.__setattr__(self, "policy", replace(self.policy, name=self.name))

    @property
    def levels(self) -> frozenset[Level]:
        """The levels this tenant may run at."""
        return self.policy.levels
        for k in ("max_sandboxes", "max_runs", "max_sessions"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigInvalidError(f"tenants.{k}", "must be a positive integer")


class TenantTable:
    """The tenants of one server, found by bearer token or by name."""

    def __init__(self, tenants: Iterable[McpTenant]) -> None:
        self._all = tuple(tenants)
        self._by_name = {t.name: t for t in self._all}
        if len(self._by_name) != len(self._all):
            raise ConfigInvalidError("tenants.name", "tenant names must be unique")

    def __iter__(self) -> Iterator[McpTenant]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def get(self, name: str) -> McpTenant:
        return self._by_name[name]

    def find(self, authorization: str | None) -> McpTenant | None:
        """The tenant whose token an ``Authorization`` header value carries
        (``Bearer <token>``), or None. Constant time in the token: its digest is
        compared with every tenant's."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > 4096:
            return None
        from corral.serve.config import token_digest
        digest = token_digest(token)
        found: McpTenant | None = None
        for t in self._all:
            if t.token_sha256 is not None and hmac.compare_digest(digest, t.token_sha256):
                found = t
        return found


def generated_token() -> str:
    """A fresh bearer token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to listen on) is loopback only."""
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """What ``corral mcp --config FILE`` takes from ``corral serve``'s config."""

    tenants: TenantTable
    #: level -> provider name (the file's ``[levels]``, when it has one)
    providers: dict[str, str]
    provider_options: dict[str, dict[str, object]]


def load_tenants(path: str, floor: Level, *, max_sessions: int) -> LoadedConfig:
    """The tenants of ``corral serve``'s TOML config at ``path`` (checked by serve's own
    rules: ``token`` or ``token_sha256``, unique names and tokens, known keys) for
    ``corral mcp``.

    Each tenant's ceiling is its ``policy`` (:mod:`corral.serve.tenancy`): ``strict``
    only unless its ``levels`` name ``context-isolated`` (which ``[levels]`` must offer;
    and ``floor``, the server's ``--level``, must allow it); the providers ``[levels]``
    names (with ``[provider_options]``) serve those levels. ``[server]`` is not read
    (host, port and TLS are ``corral mcp``'s own options).
    """
    import tomllib

    from corral.mcp.config import offered_levels
    from corral.serve.config import config_from_dict
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigInvalidError("config", f"no such file: {path}") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigInvalidError("config", f"{path}: {e}") from None
    serve = config_from_dict(doc)
    served = offered_levels(floor)
    tenants = []
    for t in serve.tenants:
        levels = t.policy.levels & served
        if not levels:
            raise ConfigInvalidError(
                "tenants.levels", f"{path}: tenant {t.name!r} is offered no level corral "
                f"mcp serves at --level {floor.value} (its levels: "
                f"{', '.join(sorted(lv.value for lv in t.policy.levels))})")
        tenants.append(McpTenant(
            name=t.name, token_sha256=t.token_sha256, max_sandboxes=t.max_sandboxes,
            max_runs=t.max_runs, max_memory_mb=t.max_memory_mb, max_sessions=max_sessions,
            policy=replace(t.policy, levels=levels)))
    providers = {k: v for k, v in serve.levels.items() if Level(k) in served}
    options = {k: dict(v) for k, v in serve.provider_options.items()}
    return LoadedConfig(tenants=TenantTable(tenants), providers=providers,
                        provider_options=options)


__all__ += ["LoadedConfig", "is_loopback", "load_tenants"]
