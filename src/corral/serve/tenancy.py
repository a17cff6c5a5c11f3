"""What the operator lets one tenant ask for: the ceiling, and the checks against it.

A tenant is an attacker. Everything it sends (a level, a network policy, limits,
timeouts, a lifetime) is checked against the operator's :class:`TenantPolicy` for that
tenant **before anything runs**, and every value it leaves out gets the operator's
default, so what a provider enforces is what the service counts:

- **levels**: only those named for the tenant; a level that is not a security boundary
  (``context-isolated``, ``none``) is never offered unless named for that tenant.
  Refused: :class:`LevelNotSupportedError` (``field="level"``, ``supported`` the
  tenant's levels).
- **network**: the kinds it may ask, the public destinations its allowlist entries may
  name, and the non-public ranges (loopback, private, link-local, metadata, reserved)
  it may list at all (none by default). Refused: :class:`ConfigInvalidError` naming
  the field (``network.kind``, ``network.hosts[i]``).
- **limits**: for each of ``mem_mb``, ``cpu_ms``, ``max_processes``, ``disk_mb``
  (per sandbox), ``timeout_ms`` (wall clock, per exec, run, snippet or invoke) and
  ``output_bytes`` (stdout and stderr each, per exec) a default and a maximum. Above
  the maximum: :class:`LimitsExceededError` naming the limit (``limit_value`` the
  maximum, ``observed`` what was asked; ``cap`` is ``limits.<name>``), or for
  ``timeout_ms`` (a wall clock is not one of the error's limit kinds)
  :class:`ConfigInvalidError`.
- **lifetime**: an idle timeout and a maximum lifetime for each sandbox, defaults and
  maxima; a request may ask for less (:class:`ConfigInvalidError` above the maximum).

Pure (standard library and ``corral.core`` only): ``corral serve`` and ``corral mcp``
read the same tenant table with :func:`parse_policy`. Per-sandbox limits are applied at
the levels that are boundaries (``strict``): the providers of the other levels enforce
none (``subproc`` refuses them), which is one reason those levels are opt-in.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from corral.core.errors import ConfigInvalidError, LevelNotSupportedError, LimitsExceededError
from corral.core.result import DEFAULT_MAX_STDOUT_BYTES
from corral.core.spec import (
    ExecOpts,
    Level,
    NetworkPolicy,
    ProcessOpts,
    SandboxLimits,
    SandboxSpec,
)
from corral.serve.envbuild import EnvBuildRight, parse_env_build

__all__ = ["BOUNDARY_LEVELS", "LIMIT_NAMES", "NON_PUBLIC_RANGES", "POLICY_KEYS", "Bound",
           "Lifetime", "NetworkCeiling", "TenantPolicy", "admit_exec", "admit_lifetime",
           "admit_process", "admit_spec", "admit_timeout", "check_environment", "check_level",
           "check_network",
           "is_host_address", "not_boundaries", "parse_policy"]

#: the levels that are a security boundary; the others run as the server's user (level
#: ``none``: in its process) and share its network
BOUNDARY_LEVELS: Final = frozenset({Level.STRICT})
#: the keys of a ``[[tenants]]`` table this module reads (the rest are the config's)
POLICY_KEYS: Final = frozenset({"levels", "network", "limits", "lifetime", "environments",
                                 "env_build"})
#: the limits a tenant table bounds, in the order the docs list them
LIMIT_NAMES: Final = ("mem_mb", "cpu_ms", "max_processes", "disk_mb", "timeout_ms",
                      "output_bytes")
_SANDBOX_LIMITS: Final = ("mem_mb", "cpu_ms", "max_processes", "disk_mb")
_LIMIT_KIND: Final[Mapping[str, Literal["memory", "cpu", "disk", "processes", "output"]]] = {
    "mem_mb": "memory", "cpu_ms": "cpu", "max_processes": "processes", "disk_mb": "disk",
    "output_bytes": "output"}
_KINDS: Final = ("none", "allowlist", "unrestricted")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: destinations that are not public: a tenant may list one (or a range touching one)
#: only inside its ``network.private``. The egress proxy's own table
#: (``providers/linux/host/egress/``) refuses the same without a listing entry; this
#: keeps the tenant from writing that entry. IPv6 forms that embed an IPv4 address
#: (mapped, NAT64, 6to4) are counted non-public as a whole.
NON_PUBLIC_RANGES: Final[tuple[tuple[IPNetwork, str], ...]] = tuple(
    (ipaddress.ip_network(n), why) for n, why in (
        ("169.254.169.254/32", "cloud metadata"),
        ("0.0.0.0/8", "this network"), ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "carrier-grade NAT (incl. metadata 100.100.100.200)"),
        ("127.0.0.0/8", "loopback"), ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"), ("192.0.0.0/24", "reserved"),
        ("192.0.2.0/24", "documentation"), ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"), ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"), ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"), ("::/8", "reserved (incl. loopback ::1)"),
        ("::ffff:0:0/96", "IPv4-mapped"), ("64:ff9b::/96", "NAT64"),
        ("100::/64", "discard"), ("2001::/23", "reserved"), ("2001:db8::/32", "documentation"),
        ("2002::/16", "6to4"), ("fc00::/7", "private (unique local, incl. fd00:ec2::254)"),
        ("fe80::/10", "link-local"), ("fec0::/10", "site-local"), ("ff00::/8", "multicast"),
    ))


# -- values ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Bound:
    """A default and a maximum for one limit. ``default`` None: nothing is applied when
    the tenant leaves it out; ``maximum`` None: no maximum."""

    default: int | None
    maximum: int | None

    def admit(self, name: str, asked: int | None) -> int | None:
        """The value to apply: ``asked`` (refused above the maximum: see :func:`_over`)
        or the default."""
        if asked is None:
            return self.default
        if self.maximum is not None and asked > self.maximum:
            raise _over(name, self.maximum, asked)
        return asked


@dataclass(frozen=True, slots=True)
class Lifetime:
    """How long a sandbox may live: ``idle_timeout_s`` without a request on it, and
    ``max_lifetime_s`` from its creation, whichever ends first."""

    idle_timeout_s: float
    max_lifetime_s: float

    def ends_at(self, created: float, last_used: float) -> float:
        """The epoch second the sandbox ends if nothing touches it again."""
        return min(created + self.max_lifetime_s, last_used + self.idle_timeout_s)


@dataclass(frozen=True, slots=True)
class _Entry:
    """One network host entry, parsed as the egress proxy reads it: an exact name, a
    ``*.suffix``, an IP network, or (operator side only) ``*``: every public name and
    address. ``port`` None: every port."""

    kind: Literal["name", "suffix", "net", "any"]
    text: str
    name: str = ""
    net: IPNetwork | None = None
    port: int | None = None

    def within(self, outer: _Entry) -> bool:
        """Whether every destination this entry opens is opened by ``outer`` too."""
        if outer.port is not None and self.port != outer.port:
            return False
        if outer.kind == "any":
            return True
        if outer.kind == "net":
            return (self.kind == "net" and self.net is not None and outer.net is not None
                    and self.net.version == outer.net.version
                    and self.net.subnet_of(outer.net))  # type: ignore[arg-type]
        if outer.kind == "name":
            return self.kind == "name" and self.name == outer.name
        # outer: *.suffix opens names under the suffix, not the suffix itself
        return (self.kind in ("name", "suffix") and self.name.endswith("." + outer.name)) \
            or (self.kind == "suffix" and self.name == outer.name)

    def non_public(self) -> str | None:
        """Why this entry reaches a non-public destination (the first range it touches)."""
        if self.kind != "net" or self.net is None:
            return None
        for rng, why in NON_PUBLIC_RANGES:
            if rng.version == self.net.version and self.net.overlaps(rng):
                return f"{why} ({rng})"
        if not self.net.network_address.is_global or not self.net.broadcast_address.is_global:
            return "not globally routable"
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkCeiling:
    """The most network one tenant may ask for.

    Attributes:
        kinds: the policy kinds it may ask (``none``, ``allowlist``, ``unrestricted``).
        hosts: the public destinations its entries may name (entries as in
            docs/network.md, ``*`` for every public one); an entry is taken when it is
            within one of these (a name, a name under a ``*.suffix``, a sub-network,
            on the same port if one is given).
        private: the non-public networks (loopback, private, link-local, metadata ...)
            it may list, each an address or CIDR with an optional port; empty: none.
    """

    kinds: frozenset[str] = frozenset(_KINDS)
    hosts: tuple[str, ...] = ("*",)
    private: tuple[str, ...] = ()
    _hosts: tuple[_Entry, ...] = field(default=(), init=False, repr=False, compare=False)
    _private: tuple[_Entry, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kinds = frozenset(self.kinds)
        object.__setattr__(self, "kinds", kinds)
        for k in kinds:
            if k not in _KINDS:
                raise ConfigInvalidError("network.kinds", f"unknown kind {k!r}")
        object.__setattr__(self, "hosts", tuple(self.hosts))
        object.__setattr__(self, "private", tuple(self.private))
        hs = tuple(_parse_entry(h, f"network.hosts[{i}]", operator=True)
                   for i, h in enumerate(self.hosts))
        for e in hs:
            if e.non_public() is not None:
                raise ConfigInvalidError("network.hosts", f"{e.text} is not public: list it "
                                         "under network.private")
        ps = tuple(_parse_entry(p, f"network.private[{i}]", operator=True)
                   for i, p in enumerate(self.private))
        for e in ps:
            if e.kind != "net":
                raise ConfigInvalidError("network.private", f"{e.text}: an address or CIDR "
                                         "(with an optional :port), not a name")
        if "unrestricted" in kinds and not any(e.kind == "any" and e.port is None
                                               for e in hs):
            raise ConfigInvalidError("network.kinds", "unrestricted reaches every public "
                                     "destination: it needs hosts = [\"*\"]")
        object.__setattr__(self, "_hosts", hs)
        object.__setattr__(self, "_private", ps)


#: a sandbox nobody touches for 15 minutes ends; none lives past a day
_IDLE: Final = Bound(900, 86_400)
_LIFE: Final = Bound(86_400, 86_400)


def _default_limits(default_mem_mb: int) -> dict[str, Bound]:
    return {
        "mem_mb": Bound(default_mem_mb, max(4096, default_mem_mb)),
        "cpu_ms": Bound(None, None),
        "max_processes": Bound(256, 1024),
        "disk_mb": Bound(256, 4096),
        "timeout_ms": Bound(600_000, 3_600_000),
        "output_bytes": Bound(DEFAULT_MAX_STDOUT_BYTES, 64 * 1024 * 1024),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantPolicy:
    """One tenant's ceiling. Build it with :func:`parse_policy` (or directly).

    Attributes:
        name: the tenant (named in refusals).
        levels: the levels offered to it.
        network: its :class:`NetworkCeiling`.
        limits: a :class:`Bound` for each of :data:`LIMIT_NAMES`.
        idle_timeout_s / max_lifetime_s: a :class:`Bound` (seconds) each.
        environments: the built environments (names or digests, docs/environments.md)
            its sandboxes may name in ``spec.environment``; none by default.
        env_build: the right to build environments of its own (``[tenants.env_build]``,
            :mod:`corral.serve.envbuild`); None: building is the operator's only.
    """

    name: str
    levels: frozenset[Level] = frozenset({Level.STRICT})
    network: NetworkCeiling = field(default_factory=NetworkCeiling)
    limits: Mapping[str, Bound] = field(default_factory=lambda: _default_limits(256))
    idle_timeout_s: Bound = field(default_factory=lambda: _IDLE)
    max_lifetime_s: Bound = field(default_factory=lambda: _LIFE)
    environments: frozenset[str] = frozenset()
    env_build: EnvBuildRight | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", frozenset(Level(lv) for lv in self.levels))
        object.__setattr__(self, "environments", frozenset(self.environments))
        if not self.levels:
            raise ConfigInvalidError("levels", f"tenant {self.name!r}: no level offered")
        missing = [n for n in LIMIT_NAMES if n not in self.limits]
        if missing:
            raise ConfigInvalidError(f"limits.{missing[0]}", "no bound given")
        for n, b in (*self.limits.items(), ("idle_timeout_s", self.idle_timeout_s),
                     ("max_lifetime_s", self.max_lifetime_s)):
            _check_bound(n, b)
        for n, b in (("idle_timeout_s", self.idle_timeout_s),
                     ("max_lifetime_s", self.max_lifetime_s)):
            if b.default is None or b.maximum is None:
                raise ConfigInvalidError(f"lifetime.{n}", "needs a default and a max")

    @property
    def not_boundaries(self) -> tuple[str, ...]:
        """The levels offered to this tenant that are not a security boundary."""
        return not_boundaries(self.levels)

    def describe(self) -> dict[str, Any]:
        """The ceiling as JSON (for ``/v1/info``): what the tenant may ask for."""
        return {
            "levels": sorted(lv.value for lv in self.levels),
            "not_boundaries": list(self.not_boundaries),
            "network": {"kinds": sorted(self.network.kinds), "hosts": list(self.network.hosts),
                        "private": list(self.network.private)},
            "limits": {n: {"default": b.default, "max": b.maximum}
                       for n, b in self.limits.items()},
            "lifetime": {n: {"default": b.default, "max": b.maximum} for n, b in (
                ("idle_timeout_s", self.idle_timeout_s),
                ("max_lifetime_s", self.max_lifetime_s))},
            "environments": sorted(self.environments),
            # the build right's bounds (not the index or its certificate: the operator's)
            "env_build": None if self.env_build is None else {
                k: getattr(self.env_build, k) for k in (
                    "max_environments", "max_concurrent", "max_disk_mb", "build_disk_mb",
                    "mem_mb", "timeout_s")},
        }


def not_boundaries(levels: Iterable[Level | str]) -> tuple[str, ...]:
    """Of ``levels``, those that are not a security boundary (sorted)."""
    return tuple(sorted({Level(lv).value for lv in levels} - {lv.value for lv in BOUNDARY_LEVELS}))


# -- parsing the tenant table ------------------------------------------------------------

def _check_bound(name: str, b: Bound) -> None:
    for what, v in (("default", b.default), ("max", b.maximum)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigInvalidError(f"{name}.{what}", f"must be an integer >= 1, got {v!r}")
    if b.default is not None and b.maximum is not None and b.default > b.maximum:
        raise ConfigInvalidError(f"{name}.default", f"{b.default} is above its max "
                                 f"{b.maximum}")


def _bound(where: str, value: object, fallback: Bound) -> Bound:
    """``N`` (default and max both N) or ``{default = N, max = M}`` (either may be left
    out: the fallback's is kept, moved to meet the one given: a default lowered to a
    smaller max, a max raised to a larger default)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return Bound(value, value)
    if not isinstance(value, Mapping):
        raise ConfigInvalidError(where, "an integer or a table {default, max}")
    extra = sorted(set(value) - {"default", "max"})
    if extra:
        raise ConfigInvalidError(f"{where}.{extra[0]}", "unknown key")
    mx = value.get("max", fallback.maximum)
    df = value.get("default", fallback.default)
    if isinstance(mx, int) and isinstance(df, int) and df > mx:
        if "default" not in value:
            df = mx
        elif "max" not in value:
            mx = df
    b = Bound(df, mx)
    _check_bound(where, b)
    return b


def _table(where: str, value: object, known: Iterable[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigInvalidError(where, "must be a table")
    extra = sorted(set(value) - set(known))
    if extra:
        raise ConfigInvalidError(f"{where}.{extra[0]}", "unknown key")
    return value


def _strings(where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
        raise ConfigInvalidError(where, "must be a list of strings")
    return tuple(value)


def parse_policy(doc: Mapping[str, Any], *, name: str, server_levels: Iterable[str],
                 default_mem_mb: int = 256, where: str = "tenants") -> TenantPolicy:
    """A tenant's policy from its ``[[tenants]]`` table (only :data:`POLICY_KEYS` are
    read; the caller checks the rest). ``server_levels``: the levels the server offers
    (a tenant may be given only those); ``default_mem_mb``: the memory default when
    the table gives none.

    Without ``levels`` a tenant gets the boundary levels the server offers (``strict``);
    a level that is not a boundary is given only when named here."""
    offered = {Level(lv) for lv in server_levels}
    if "levels" in doc:
        names = _strings(f"{where}.levels", doc["levels"])
        levels: set[Level] = set()
        for lv in names:
            try:
                level = Level(lv)
            except ValueError:
                raise ConfigInvalidError(f"{where}.levels", f"not a level: {lv!r}") from None
            if level not in offered:
                raise ConfigInvalidError(f"{where}.levels", f"{lv!r} is not in the server's "
                                         "[levels]")
            levels.add(level)
    else:
        levels = offered & set(BOUNDARY_LEVELS)
    if not levels:
        raise ConfigInvalidError(f"{where}.levels", f"tenant {name!r} is offered no level "
                                 "(without `levels`, only the boundary levels the server "
                                 "offers: strict; name others for the tenant)")
    net_doc = _table(f"{where}.network", doc.get("network", {}), ("kinds", "hosts", "private"))
    net_kw: dict[str, Any] = {}
    if "kinds" in net_doc:
        net_kw["kinds"] = frozenset(_strings(f"{where}.network.kinds", net_doc["kinds"]))
    for k in ("hosts", "private"):
        if k in net_doc:
            net_kw[k] = _strings(f"{where}.network.{k}", net_doc[k])
    try:
        network = NetworkCeiling(**net_kw)
    except ConfigInvalidError as e:
        raise ConfigInvalidError(f"{where}.{e.field}", e.reason) from None
    lim_doc = _table(f"{where}.limits", doc.get("limits", {}), LIMIT_NAMES)
    limits = _default_limits(default_mem_mb)
    for n, v in lim_doc.items():
        limits[n] = _bound(f"{where}.limits.{n}", v, limits[n])
    life_doc = _table(f"{where}.lifetime", doc.get("lifetime", {}),
                      ("idle_timeout_s", "max_lifetime_s"))
    idle = _bound(f"{where}.lifetime.idle_timeout_s", life_doc.get("idle_timeout_s", {}),
                  _IDLE)
    life = _bound(f"{where}.lifetime.max_lifetime_s", life_doc.get("max_lifetime_s", {}),
                  _LIFE)
    envs = frozenset(_strings(f"{where}.environments", doc.get("environments", [])))
    right = (parse_env_build(doc["env_build"], f"{where}.env_build") if "env_build" in doc
             else None)
    return TenantPolicy(name=name, levels=frozenset(levels), network=network, limits=limits,
                        idle_timeout_s=idle, max_lifetime_s=life, environments=envs,
                        env_build=right)


# -- checks ----------------------------------------------------------------------------

def _over(name: str, maximum: int, asked: int) -> Exception:
    kind = _LIMIT_KIND.get(name)
    if kind is None:  # a wall clock or a lifetime: not one of the error's limit kinds
        return ConfigInvalidError(name, f"{asked} is above the most this tenant may ask "
                                  f"({maximum})")
    err = LimitsExceededError(kind, maximum, asked, detail=f"limits.{name} {asked} is above "
                              f"the most this tenant may ask ({maximum})")
    err.cap = f"limits.{name}"  # type: ignore[attr-defined]
    return err


def check_level(policy: TenantPolicy, level: Level | str) -> Level:
    """``level`` if it is offered to the tenant, else :class:`LevelNotSupportedError`."""
    lv = Level(level)
    if lv not in policy.levels:
        raise LevelNotSupportedError(lv.value, tuple(x.value for x in policy.levels),
                                     "not offered to this tenant")
    return lv


def _parse_entry(text: object, where: str, *, operator: bool = False) -> _Entry:
    """Parse a host entry (the egress proxy's syntax: ``name``, ``*.suffix``, an
    address or CIDR, each with an optional ``:port``; IPv6 with a port in brackets)."""
    if not isinstance(text, str) or not text.strip() or len(text) > 300:
        raise ConfigInvalidError(where, f"not a host entry: {text!r}")
    e = text.strip()
    port: int | None = None
    if e.startswith("["):
        close = e.find("]")
        if close < 0:
            raise ConfigInvalidError(where, f"unbalanced brackets in {text!r}")
        rest = e[close + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ConfigInvalidError(where, f"not a host entry: {text!r}")
            port = _port(rest[1:], where, text)
        e = e[1:close]
    elif e.count(":") == 1:
        e, p = e.split(":")
        port = _port(p, where, text)
    if e == "*" and operator:
        return _Entry("any", text, port=port)
    try:
        net = ipaddress.ip_network(e, strict=True)
    except ValueError:
        net = None
    if net is not None:
        return _Entry("net", text, net=net, port=port)
    if "/" in e or ":" in e or "[" in e:
        raise ConfigInvalidError(where, f"not an address or CIDR: {text!r}")
    kind: Literal["name", "suffix"] = "name"
    if e.startswith("*."):
        kind, e = "suffix", e[2:]
    name = e[:-1] if e.endswith(".") else e
    try:
        name = name.encode("idna").decode("ascii").lower()
    except (UnicodeError, ValueError):
        raise ConfigInvalidError(where, f"not a host name: {text!r}") from None
    labels = name.split(".")
    if not name or any(not lb or not all(c.isalnum() or c in "-_" for c in lb)
                       for lb in labels):
        raise ConfigInvalidError(where, f"not a host name: {text!r}")
    last = labels[-1]
    if last.isdigit() or last.startswith("0x"):  # inet_aton spellings of addresses
        raise ConfigInvalidError(where, f"numeric host name: {text!r}")
    return _Entry(kind, text, name=name, port=port)


def _port(s: str, where: str, text: object) -> int:
    if not (s.isascii() and s.isdigit()) or not 0 < int(s) < 65536:
        raise ConfigInvalidError(where, f"bad port in {text!r}")
    return int(s)


def check_network(policy: TenantPolicy, level: Level | str, network: NetworkPolicy, *,
                  host_address: Callable[[str], bool] | None = None) -> NetworkPolicy:
    """``network`` if it is within the tenant's ceiling, else :class:`ConfigInvalidError`
    naming the field. Each entry (``hosts`` and the keys of ``secret_headers``) must be
    within the ceiling's ``hosts``, or, when it touches a non-public range, within its
    ``private``. ``host_address(ip)``: whether ``ip`` is an address of the server's own
    host; a single address that is one needs ``private`` too (the server's services
    bound to all addresses answer on it).

    A level that is not a boundary shares the server's network whatever the policy says:
    nothing to check there (the level itself is opt-in per tenant)."""
    if Level(level) not in BOUNDARY_LEVELS:
        return network
    ceiling = policy.network
    if network.kind not in ceiling.kinds:
        raise ConfigInvalidError("network.kind", f"{network.kind!r} is not allowed for this "
                                 f"tenant (allowed: {', '.join(sorted(ceiling.kinds))})")
    entries = [(f"network.hosts[{i}]", h) for i, h in enumerate(network.hosts)]
    entries += [("network.secret_headers", h) for h in network.secret_headers]
    for where, text in entries:
        e = _parse_entry(text, where)
        why = e.non_public()
        if why is None and host_address is not None and e.net is not None \
                and e.net.num_addresses == 1 and host_address(str(e.net.network_address)):
            why = "an address of the server's host"
        if why is not None:
            if not any(e.within(p) for p in ceiling._private):
                raise ConfigInvalidError(where, f"{text} is {why}: this tenant may not reach "
                                         "it (its non-public destinations: "
                                         f"{', '.join(ceiling.private) or 'none'})")
        elif not any(e.within(h) for h in ceiling._hosts):
            raise ConfigInvalidError(where, f"{text} is not among the destinations this "
                                     f"tenant may name ({', '.join(ceiling.hosts)})")
    return network


def is_host_address(ip: str) -> bool:
    """Whether ``ip`` is an address of this host's own interfaces: a UDP socket
    "connected" to it (which sends nothing) gets it as its own source address."""
    import socket
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect((ip, 9))
            return bool(s.getsockname()[0] == ip)
    except OSError:
        return False


def admit_spec(policy: TenantPolicy, spec: SandboxSpec, *,
               host_address: Callable[[str], bool] | None = None) -> SandboxSpec:
    """``spec`` checked against the tenant's ceiling (level, network, limits), with its
    unset limits given the tenant's defaults at a boundary level. The result is what
    the provider must enforce (and what caps count)."""
    level = check_level(policy, spec.level)
    check_network(policy, level, spec.network, host_address=host_address)
    check_environment(policy, spec.environment)
    asked = spec.limits
    for n in _SANDBOX_LIMITS:
        v = getattr(asked, n)
        mx = policy.limits[n].maximum
        if v is not None and mx is not None and v > mx:
            raise _over(n, mx, v)
    if level not in BOUNDARY_LEVELS:
        return spec
    applied = SandboxLimits(**{n: policy.limits[n].admit(n, getattr(asked, n))
                               for n in _SANDBOX_LIMITS})
    return replace(spec, limits=applied)


def check_environment(policy: TenantPolicy, environment: str | None) -> None:
    """An environment only if the operator lists it for the tenant (by the name or the
    digest the tenant gives)."""
    if environment is None or environment in policy.environments:
        return
    raise ConfigInvalidError(
        "environment", f"tenant {policy.name!r} may not use environment {environment!r}"
        + (f" (its environments: {', '.join(sorted(policy.environments))})"
           if policy.environments else " (the operator lists none for it)"))


def admit_timeout(policy: TenantPolicy, timeout_ms: int | None) -> int:
    """A wall-clock timeout: the one asked (an integer >= 1, refused above the maximum)
    or the default."""
    if timeout_ms is not None and (isinstance(timeout_ms, bool)
                                   or not isinstance(timeout_ms, int) or timeout_ms < 1):
        raise ConfigInvalidError("timeout_ms", f"must be an integer >= 1, got {timeout_ms!r}")
    b = policy.limits["timeout_ms"]
    got = b.admit("timeout_ms", timeout_ms)
    if got is None:
        return b.maximum if b.maximum is not None else 600_000
    return got


def admit_exec(policy: TenantPolicy, opts: ExecOpts) -> ExecOpts:
    """Exec options with the tenant's wall clock and output bounds: asked values are
    checked against the maxima, missing ones get the defaults."""
    out = policy.limits["output_bytes"]
    return replace(
        opts, timeout_ms=admit_timeout(policy, opts.timeout_ms),
        max_stdout_bytes=out.admit("output_bytes", opts.max_stdout_bytes),
        max_stderr_bytes=out.admit("output_bytes", opts.max_stderr_bytes))


def admit_process(policy: TenantPolicy, opts: ProcessOpts) -> ProcessOpts:
    """A started process's options: its ``timeout_ms``, if it asks one, within the
    tenant's maximum (without one it lives as long as its sandbox)."""
    b = policy.limits["timeout_ms"]
    if opts.timeout_ms is not None:
        b.admit("timeout_ms", opts.timeout_ms)
    return opts


def admit_lifetime(policy: TenantPolicy, idle_timeout_s: object = None,
                   max_lifetime_s: object = None) -> Lifetime:
    """A sandbox's lifetime: the values asked (numbers of seconds > 0, refused above the
    tenant's maxima) or its defaults."""
    got: list[float] = []
    for name, v, b in (("idle_timeout_s", idle_timeout_s, policy.idle_timeout_s),
                       ("max_lifetime_s", max_lifetime_s, policy.max_lifetime_s)):
        assert b.default is not None and b.maximum is not None
        if v is None:
            got.append(float(b.default))
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 \
                or v != v or v == float("inf"):
            raise ConfigInvalidError(name, f"must be a number of seconds > 0, got {v!r}")
        if v > b.maximum:
            raise ConfigInvalidError(name, f"{v} is above the most this tenant may ask "
                                     f"({b.maximum})")
        got.append(float(v))
    return Lifetime(got[0], got[1])
