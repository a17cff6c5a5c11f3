"""``corral serve``'s configuration: frozen values, read from a TOML file (``tomllib``).

::

    [server]
    host = "127.0.0.1"          # loopback by default; another address only when asked
    port = 8580
    max_body_bytes = 16777216   # larger request bodies get 413
    grace_s = 10.0              # SIGTERM: how long in-flight requests may finish
    snippet_workers = 3         # snippet runs at once (the pool's bound; default: cores + 1)
    default_sandbox_mem_mb = 256  # tenants' default limits.mem_mb (unless theirs says)
    tls_certfile = ""           # both set: HTTPS
    tls_keyfile = ""
    image_roots = []            # dirs whose images tenants may name (spec.image)
    metrics_token = ""          # set (or metrics_token_sha256): /metrics asks for it

    [levels]                    # level -> provider name; a level left out is not offered
    strict = "linux"            # the default: strict only
    context-isolated = "subproc"  # not a boundary: offered only to tenants naming it

    [provider_options.linux]    # keyword arguments of a provider's class
    spares = 1

    [[tenants]]
    name = "alice"
    token_sha256 = "<hex sha-256 of the bearer token>"   # or token = "..." (plain)
    max_sandboxes = 8           # sandboxes alive at once
    max_runs = 4                # runs, execs, snippets and invokes in flight at once
    max_memory_mb = 4096        # the sum of the memory of the tenant's live sandboxes
    max_processes = 64          # started processes not yet ended, per sandbox
    max_sessions = 4            # live sessions (interpreters, docs/sessions.md) at once
    levels = ["strict"]         # and the tenant's ceiling: levels, [tenants.network],
                                # [tenants.limits], [tenants.lifetime] (see .tenancy),
                                # environments, [tenants.env_build] (see .envbuild)

Only the standard library here, so the CLI can read a config without starlette.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from corral.core.errors import ConfigInvalidError
from corral.core.spec import Level
from corral.serve.tenancy import POLICY_KEYS, TenantPolicy, parse_policy

__all__ = ["DEFAULT_LEVELS", "DEFAULT_PORT", "ServeConfig", "TenantConfig", "load_config",
           "token_digest"]

DEFAULT_PORT: Final = 8580
#: the levels offered unless the config says otherwise: strict only. A level that is not
#: a security boundary (context-isolated, none) is offered only when the config names it,
#: and then only to the tenants whose ``levels`` name it (see :mod:`.tenancy`)
DEFAULT_LEVELS: Final[Mapping[str, str]] = {"strict": "linux"}
_DEFAULT_SANDBOX_MEM_MB: Final = 256
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def token_digest(token: str) -> bytes:
    """The SHA-256 digest tokens are compared by (in constant time)."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def _count(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigInvalidError(name, f"must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantConfig:
    """One tenant: a name, the digest of its bearer token, and its caps.

    Attributes:
        name: shown in logs and metrics, and the ``tenant_id`` of its sandboxes.
        token_sha256: SHA-256 of the bearer token (the token itself is never kept).
        max_sandboxes: sandboxes alive at once (a ``/v1/runs`` run holds one while it runs).
        max_runs: runs in flight at once: execs, ``/v1/runs`` runs, snippets, invokes.
        max_memory_mb: the sum of ``limits.mem_mb`` of its live sandboxes (a sandbox
            without one counts ``ServeConfig.default_sandbox_mem_mb``).
        max_processes: processes started (``start_process``) and not yet ended, per
            sandbox (each holds a stream and its buffer on the server). Not the
            sandbox's own ``limits.max_processes``: that one is bounded by ``policy``.
        max_sessions: sessions (:mod:`corral.serve.sessions`) alive at once; each is
            also one of its sandboxes.
        policy: the tenant's ceiling (levels, network, limits, lifetimes): see
            :mod:`corral.serve.tenancy`. Default: strict only, the built-in bounds.
    """

    name: str
    token_sha256: bytes
    max_sandboxes: int = 8
    max_runs: int = 4
    max_memory_mb: int = 4096
    max_processes: int = 64
    max_sessions: int = 4
    policy: TenantPolicy = field(default_factory=lambda: TenantPolicy(name="-"))

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigInvalidError("tenants.name", f"not a tenant name: {self.name!r} "
                                     "(letters, digits, _ . -; at most 64)")
        if len(self.token_sha256) != 32:
            raise ConfigInvalidError("tenants.token_sha256", "must be a SHA-256 digest")
        _count("tenants.max_sandboxes", self.max_sandboxes)
        _count("tenants.max_runs", self.max_runs)
        _count("tenants.max_memory_mb", self.max_memory_mb)
        _count("tenants.max_processes", self.max_processes)
        _count("tenants.max_sessions", self.max_sessions)
        if not isinstance(self.policy, TenantPolicy):
            raise ConfigInvalidError("tenants.policy", "must be a TenantPolicy")
        if self.policy.name != self.name:
            object.__setattr__(self, "policy", replace(self.policy, name=self.name))
        mem = self.policy.limits["mem_mb"].default
        if mem is not None and mem > self.max_memory_mb:
            raise ConfigInvalidError("tenants.limits.mem_mb", f"tenant {self.name!r}: its "
                                     f"default ({mem} MiB) is above its max_memory_mb "
                                     f"({self.max_memory_mb}): no sandbox would fit")

    def matches(self, token: str) -> bool:
        """Whether ``token`` is this tenant's (constant-time comparison of digests)."""
        return hmac.compare_digest(token_digest(token), self.token_sha256)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """Everything ``corral serve`` runs with. See the module docstring for the file."""

    tenants: tuple[TenantConfig, ...]
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_body_bytes: int = 16 * 1024 * 1024
    grace_s: float = 10.0
    #: snippet runs at once: the cores plus one by default. A run waits on its sandbox for
    #: part of its time (the agent's fork, the records, its exit); one more run than
    #: cores fills those gaps (``bench_serve.py`` on 2 cores, 8 clients: 3 beat 2 in 7 of
    #: 7 interleaved pairs, by 1.04-1.35x, p99 still under 45 ms)
    snippet_workers: int = field(default_factory=lambda: (os.cpu_count() or 1) + 1)
    #: the default of each tenant's ``limits.mem_mb`` (its ``[tenants.limits]`` may set
    #: another); what a sandbox at a level enforcing no memory limit counts against a cap
    default_sandbox_mem_mb: int = 256
    levels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_LEVELS))
    provider_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    #: JSON-lines logs of every request (on stderr)
    access_log: bool = True
    #: authenticated connections at once (those a request passed auth on; see
    #: ``max_unauthenticated_connections`` for the others); past it 503 and closed
    max_connections: int = 1000
    #: SHA-256 of the bearer token ``/metrics`` asks for; None: ``/metrics`` is open
    #: (it names tenants and counts their work, nothing of their sandboxes' content)
    metrics_token_sha256: bytes | None = None
    #: directories whose images (``spec.image``: a handler directory, an OCI layout or
    #: tar, a rootfs) tenants may name; empty: no images. An image is a path on the
    #: server's host, so without this a tenant could copy any host directory in.
    image_roots: tuple[str, ...] = ()

    # -- the edge: connections and request bodies (issue 23.4; serve/edge.py) --------------
    #: seconds a connection has to send a whole request head (from its opening, or from
    #: the end of the previous answer on it); then 408 and closed
    head_timeout_s: float = 10.0
    #: the largest request head (request line and headers); past it 431 and closed
    max_head_bytes: int = 65536
    #: seconds a request body may take before ``min_body_bytes_per_s`` applies to it
    body_timeout_s: float = 10.0
    #: the least pace of a body past its first ``body_timeout_s``: by t seconds at least
    #: (t - body_timeout_s) * this many bytes must have come, else 408 and closed
    min_body_bytes_per_s: int = 65536
    #: connections no request has yet passed auth on: their own budget, apart from
    #: ``max_connections`` (at it, a new one evicts the oldest such connection)
    max_unauthenticated_connections: int = 64
    #: request-body bytes held at once per tenant (0: 4 x max_body_bytes)
    max_body_bytes_in_flight: int = 0
    #: request-body bytes held at once, all tenants together (0: 16 x max_body_bytes)
    max_body_bytes_in_flight_total: int = 0

    def __post_init__(self) -> None:
        self._check_edge()
        if not self.tenants:
            raise ConfigInvalidError("tenants", "at least one tenant is needed")
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ConfigInvalidError("tenants.name", "tenant names must be unique")
        digests = [t.token_sha256 for t in self.tenants]
        if len(set(digests)) != len(digests):
            raise ConfigInvalidError("tenants.token", "two tenants share a token")
        _count("port", self.port, 0)
        if self.port > 65535:
            raise ConfigInvalidError("port", "must be <= 65535")
        _count("max_body_bytes", self.max_body_bytes, 1024)
        _count("snippet_workers", self.snippet_workers)
        _count("default_sandbox_mem_mb", self.default_sandbox_mem_mb)
        _count("max_connections", self.max_connections)
        if isinstance(self.grace_s, bool) or not isinstance(self.grace_s, int | float) \
                or self.grace_s < 0:
            raise ConfigInvalidError("grace_s", "must be a number of seconds >= 0")
        for lv, name in self.levels.items():
            try:
                Level(lv)
            except ValueError:
                raise ConfigInvalidError(f"levels.{lv}", "not a level") from None
            if not isinstance(name, str) or not name:
                raise ConfigInvalidError(f"levels.{lv}", "must name a provider")
        if not self.levels:
            raise ConfigInvalidError("levels", "at least one level must be offered")
        for t in self.tenants:
            extra = sorted(lv.value for lv in t.policy.levels if lv.value not in self.levels)
            if extra:
                raise ConfigInvalidError("tenants.levels", f"tenant {t.name!r} is given "
                                         f"{extra[0]!r}, which [levels] does not offer")
        roots = tuple(self.image_roots)
        object.__setattr__(self, "image_roots", roots)
        for r in roots:
            if not isinstance(r, str) or not r.startswith("/"):
                raise ConfigInvalidError("image_roots", f"must be absolute paths: {r!r}")
        if self.metrics_token_sha256 is not None and len(self.metrics_token_sha256) != 32:
            raise ConfigInvalidError("metrics_token_sha256", "must be a SHA-256 digest")
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ConfigInvalidError("tls_certfile", "TLS needs both tls_certfile and "
                                     "tls_keyfile")

    def _check_edge(self) -> None:
        _count("max_body_bytes", self.max_body_bytes, 1024)
        for name in ("head_timeout_s", "body_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 3600:
                raise ConfigInvalidError(name, "must be a number of seconds in (0, 3600]")
        _count("min_body_bytes_per_s", self.min_body_bytes_per_s)
        _count("max_head_bytes", self.max_head_bytes, 1024)
        _count("max_unauthenticated_connections", self.max_unauthenticated_connections)
        _count("max_body_bytes_in_flight", self.max_body_bytes_in_flight, 0)
        _count("max_body_bytes_in_flight_total", self.max_body_bytes_in_flight_total, 0)
        if not self.max_body_bytes_in_flight:
            object.__setattr__(self, "max_body_bytes_in_flight", 4 * self.max_body_bytes)
        if not self.max_body_bytes_in_flight_total:
            object.__setattr__(self, "max_body_bytes_in_flight_total",
                               max(16 * self.max_body_bytes, self.max_body_bytes_in_flight))
        if self.max_body_bytes_in_flight < self.max_body_bytes:
            raise ConfigInvalidError("max_body_bytes_in_flight", "must be >= max_body_bytes")
        if self.max_body_bytes_in_flight_total < self.max_body_bytes_in_flight:
            raise ConfigInvalidError("max_body_bytes_in_flight_total",
                                     "must be >= max_body_bytes_in_flight")

    @property
    def tls(self) -> bool:
        return self.tls_certfile is not None


def _tenant(doc: Mapping[str, Any], i: int, levels: Mapping[str, str],
            default_mem_mb: int) -> TenantConfig:
    known = {"name", "token", "token_sha256", "max_sandboxes", "max_runs", "max_memory_mb",
             "max_processes", "max_sessions"} | POLICY_KEYS
    extra = sorted(set(doc) - known)
    if extra:
        raise ConfigInvalidError(f"tenants[{i}].{extra[0]}", "unknown key")
    token, hexd = doc.get("token"), doc.get("token_sha256")
    if (token is None) == (hexd is None):
        raise ConfigInvalidError(f"tenants[{i}]", "give exactly one of token or token_sha256")
    if token is not None:
        if not isinstance(token, str) or len(token) < 16:
            raise ConfigInvalidError(f"tenants[{i}].token", "must be a string of 16+ chars")
        digest = token_digest(token)
    else:
        try:
            digest = bytes.fromhex(str(hexd))
        except ValueError:
            raise ConfigInvalidError(f"tenants[{i}].token_sha256", "not hex") from None
    caps = {k: doc[k] for k in ("max_sandboxes", "max_runs", "max_memory_mb",
                                "max_processes", "max_sessions") if k in doc}
    policy = parse_policy({k: doc[k] for k in POLICY_KEYS if k in doc},
                          name=str(doc.get("name", "")), server_levels=levels,
                          default_mem_mb=default_mem_mb, where=f"tenants[{i}]")
    return TenantConfig(name=doc.get("name", ""), token_sha256=digest, policy=policy, **caps)


def _levels(doc: Mapping[str, Any]) -> dict[str, str]:
    """The ``[levels]`` table (checked first: the tenants' levels are checked against it)."""
    levels = dict(doc["levels"]) if "levels" in doc else dict(DEFAULT_LEVELS)
    for lv in levels:
        try:
            Level(lv)
        except ValueError:
            raise ConfigInvalidError(f"levels.{lv}", "not a level") from None
    return levels


#: [server] keys of the edge block (connections and bodies)
_EDGE_KEYS: Final = frozenset({
    "head_timeout_s", "max_head_bytes", "body_timeout_s", "min_body_bytes_per_s",
    "max_unauthenticated_connections", "max_body_bytes_in_flight",
    "max_body_bytes_in_flight_total"})


def config_from_dict(doc: Mapping[str, Any]) -> ServeConfig:
    """A config from the parsed TOML document."""
    extra = sorted(set(doc) - {"server", "levels", "provider_options", "tenants"})
    if extra:
        raise ConfigInvalidError(extra[0], "unknown table")
    server = dict(doc.get("server", {}))
    known = {"host", "port", "max_body_bytes", "grace_s", "snippet_workers",
             "default_sandbox_mem_mb", "tls_certfile", "tls_keyfile", "access_log",
             "image_roots", "max_connections", "metrics_token", "metrics_token_sha256"}
    known |= _EDGE_KEYS
    bad = sorted(set(server) - known)
    if bad:
        raise ConfigInvalidError(f"server.{bad[0]}", "unknown key")
    for k in ("tls_certfile", "tls_keyfile"):
        if not server.get(k):
            server.pop(k, None)
    mt, mh = server.pop("metrics_token", None), server.pop("metrics_token_sha256", None)
    if mt is not None and mh is not None:
        raise ConfigInvalidError("server.metrics_token", "give metrics_token or "
                                 "metrics_token_sha256, not both")
    if mt is not None:
        if not isinstance(mt, str) or len(mt) < 16:
            raise ConfigInvalidError("server.metrics_token", "must be a string of 16+ chars")
        server["metrics_token_sha256"] = token_digest(mt)
    elif mh is not None:
        try:
            server["metrics_token_sha256"] = bytes.fromhex(str(mh))
        except ValueError:
            raise ConfigInvalidError("server.metrics_token_sha256", "not hex") from None
    levels = _levels(doc)
    mem = server.get("default_sandbox_mem_mb", _DEFAULT_SANDBOX_MEM_MB)
    mem = _count("default_sandbox_mem_mb", mem)
    tenants = tuple(_tenant(t, i, levels, mem) for i, t in enumerate(doc.get("tenants", ())))
    kw: dict[str, Any] = dict(server)
    kw["levels"] = levels
    if "provider_options" in doc:
        kw["provider_options"] = {k: dict(v) for k, v in doc["provider_options"].items()}
    return ServeConfig(tenants=tenants, **kw)


def load_config(path: str) -> ServeConfig:
    """Read and check the TOML config at ``path``."""
    import tomllib
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigInvalidError("config", f"no such file: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigInvalidError("config", f"{path}: {e}") from None
    return config_from_dict(doc)


__all__ += ["config_from_dict"]
