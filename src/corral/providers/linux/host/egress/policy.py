"""The egress policy, pure: who may be reached, decided from names, addresses and ports.

No I/O: :func:`parse_entry` reads one policy entry, :class:`EgressPolicy` is an
immutable value with the checks the proxy runs per connection (a name before it is
resolved, each address after), and :func:`compile_network` turns a spec's
:class:`~corral.core.spec.NetworkPolicy` into one, once, when the sandbox's plan is made
(the plan carries it: ``SandboxPlan.egress``). Every parser raises only
:class:`EgressDenied` (bad input from a sandbox) or
:class:`~corral.core.errors.ConfigInvalidError` (a bad entry from the caller).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final, Literal

from corral.core.errors import ConfigInvalidError

if TYPE_CHECKING:
    from corral.core.spec import NetworkPolicy

__all__ = [
    "MAX_LOOPBACK_RELAYS",
    "PROXY_HOST",
    "PROXY_PORT",
    "SPECIAL_RANGES",
    "Denial",
    "DenialKind",
    "EgressDenied",
    "EgressPolicy",
    "IPAddress",
    "IPNetwork",
    "Rule",
    "SecretHeader",
    "Target",
    "UpstreamError",
    "classify_address",
    "compile_network",
    "digits",
    "loopback_relays",
    "normalize_host",
    "parse_entry",
    "plain_ip",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: where the egress proxy listens inside every sandbox with network allowlist/unrestricted
PROXY_HOST: Final = "127.0.0.1"
PROXY_PORT: Final = 3128
#: host-loopback relays per sandbox (:func:`loopback_relays`), at most: each is a
#: listener the host holds for the sandbox's life
MAX_LOOPBACK_RELAYS: Final = 16

DenialKind = Literal["not-allowed", "non-public-address", "sni-mismatch", "bad-request",
                     "unresolvable", "too-large", "timeout", "busy", "unsupported"]


def _net(s: str) -> IPNetwork:
    return ipaddress.ip_network(s)


#: addresses that are not public destinations, most specific first, with why;
#: a name resolving into one of them (or an IP literal in one) is refused unless
#: the policy lists it. Anything else that ``ipaddress`` does not call global is
#: refused as "reserved" too.
SPECIAL_RANGES: Final[tuple[tuple[IPNetwork, str], ...]] = (
    (_net("169.254.169.254/32"), "cloud metadata"),
    (_net("0.0.0.0/8"), "unspecified / this network"),
    (_net("10.0.0.0/8"), "private (RFC 1918)"),
    (_net("100.64.0.0/10"), "carrier-grade NAT (RFC 6598)"),
    (_net("127.0.0.0/8"), "loopback"),
    (_net("169.254.0.0/16"), "link-local"),
    (_net("172.16.0.0/12"), "private (RFC 1918)"),
    (_net("192.0.0.0/24"), "reserved (IETF protocol assignments)"),
    (_net("192.0.2.0/24"), "reserved (documentation)"),
    (_net("192.168.0.0/16"), "private (RFC 1918)"),
    (_net("198.18.0.0/15"), "reserved (benchmarking)"),
    (_net("198.51.100.0/24"), "reserved (documentation)"),
    (_net("203.0.113.0/24"), "reserved (documentation)"),
    (_net("224.0.0.0/4"), "multicast"),
    (_net("240.0.0.0/4"), "reserved (incl. broadcast)"),
    (_net("::/128"), "unspecified"),
    (_net("::1/128"), "loopback"),
    (_net("64:ff9b::/96"), "NAT64 (embeds IPv4)"),
    (_net("100::/64"), "reserved (discard)"),
    (_net("2001::/23"), "reserved (IETF protocol assignments)"),
    (_net("2001:db8::/32"), "reserved (documentation)"),
    (_net("2002::/16"), "6to4 (embeds IPv4)"),
    (_net("fc00::/7"), "private (unique local)"),
    (_net("fe80::/10"), "link-local"),
    (_net("fec0::/10"), "reserved (site-local)"),
    (_net("ff00::/8"), "multicast"),
    (_net("::/8"), "reserved"),
)


class EgressDenied(Exception):
    """A request the proxy refuses: ``kind`` (a :data:`DenialKind`) and a one-line ``reason``.

    The parsers raise only this on bad input; the proxy turns it into a reply
    to the client and a :class:`Denial` record.
    """

    def __init__(self, kind: DenialKind, reason: str) -> None:
        super().__init__(reason)
        self.kind: DenialKind = kind
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Denial:
    """One refused connection: what was asked for, why it was refused, and when (epoch s)."""

    host: str
    port: int
    kind: DenialKind
    reason: str
    time: float


# --------------------------------------------------------------------------- names


def digits(s: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also accepts characters such as ``²`` (in
    Latin-1) that ``int`` refuses."""
    return s.isascii() and s.isdigit()


def plain_ip(s: str) -> IPAddress | None:
    try:
        ip = ipaddress.ip_address(s)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id is not None:
            return None
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
    return ip


def normalize_host(host: str) -> str | IPAddress:
    """A host as the policy compares it: an IP address, or a lower-case ASCII (IDNA) name
    without a trailing dot. Raises :class:`EgressDenied` (``bad-request``) if it is neither."""
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        ip = plain_ip(h[1:-1])
        if not isinstance(ip, ipaddress.IPv6Address | ipaddress.IPv4Address) or ":" not in h:
            raise EgressDenied("bad-request", f"not an IPv6 literal: {host[:80]!r}")
        return ip
    ip = plain_ip(h)
    if ip is not None:
        return ip
    if h.endswith("."):
        h = h[:-1]
    if not h or len(h) > 253:
        raise EgressDenied("bad-request", f"not a host name: {host[:80]!r}")
    try:
        name = h.encode("idna").decode("ascii").lower()
    except (UnicodeError, ValueError):
        raise EgressDenied("bad-request", f"not a host name: {host[:80]!r}") from None
    labels = name.split(".")
    for label in labels:
        if not label or len(label) > 63 or label.startswith("-") or label.endswith("-"):
            raise EgressDenied("bad-request", f"not a host name: {host[:80]!r}")
        if not all(c.isascii() and (c.isalnum() or c in "-_") for c in label):
            raise EgressDenied("bad-request", f"not a host name: {host[:80]!r}")
    last = labels[-1]
    if last.isdigit() or (last.startswith("0x") and all(c in "0123456789abcdef"
                                                        for c in last[2:])):
        # inet_aton forms such as 2130706433 or 0x7f.1 would resolve to addresses
        raise EgressDenied("bad-request", f"numeric host name: {host[:80]!r}")
    return name


def classify_address(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public destination (a row of :data:`SPECIAL_RANGES`), or None."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for net, label in SPECIAL_RANGES:
        if ip.version == net.version and ip in net:
            return f"{label}, {net}"
    if not ip.is_global:
        return "reserved (not globally routable)"
    return None


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True, slots=True)
class Rule:
    """One policy entry: ``kind`` ``host`` (exact name), ``suffix`` (``*.suffix``: any name
    ending in ``.suffix``, not ``suffix`` itself) or ``net`` (an IP address or CIDR);
    ``port`` None matches every port. ``text`` is the entry as normalized."""

    kind: Literal["host", "suffix", "net"]
    name: str = ""
    net: IPNetwork | None = None
    port: int | None = None

    @property
    def text(self) -> str:
        if self.kind == "net":
            assert self.net is not None
            core = str(self.net.network_address) if self.net.prefixlen == \
                self.net.max_prefixlen else str(self.net)
            if self.port is not None and self.net.version == 6:
                core = f"[{core}]"
        else:
            core = ("*." if self.kind == "suffix" else "") + self.name
        return core if self.port is None else f"{core}:{self.port}"

    def matches_name(self, name: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.kind == "host":
            return name == self.name
        if self.kind == "suffix":
            return name.endswith("." + self.name)
        return False

    def matches_ip(self, ip: IPAddress, port: int) -> bool:
        if self.kind != "net" or self.net is None:
            return False
        if self.port is not None and self.port != port:
            return False
        return ip.version == self.net.version and ip in self.net


def _port(s: str, entry: str) -> int:
    if not digits(s) or not 0 < int(s) < 65536:
        raise ConfigInvalidError("network.hosts", f"bad port in {entry!r}")
    return int(s)


def parse_entry(entry: str) -> Rule:
    """Parse one policy entry: ``name``, ``*.suffix``, an IPv4/IPv6 address or CIDR, each
    with an optional ``:port`` (an IPv6 address or CIDR with a port goes in brackets:
    ``[fd00::/8]:443``). Raises :class:`ConfigInvalidError` for anything else."""
    if not isinstance(entry, str) or not entry.strip() or len(entry) > 300:
        raise ConfigInvalidError("network.hosts", f"not a host entry: {entry!r}")
    e = entry.strip()
    port: int | None = None
    if e.startswith("["):
        close = e.find("]")
        if close < 0:
            raise ConfigInvalidError("network.hosts", f"unbalanced brackets in {entry!r}")
        rest = e[close + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ConfigInvalidError("network.hosts", f"not a host entry: {entry!r}")
            port = _port(rest[1:], entry)
        e = e[1:close]
    elif e.count(":") == 1:
        e, p = e.split(":")
        port = _port(p, entry)
    try:
        net = ipaddress.ip_network(e, strict=True)
    except ValueError:
        net = None
    if net is not None:
        return Rule("net", net=net, port=port)
    if "/" in e or ":" in e:
        raise ConfigInvalidError("network.hosts", f"not an address or CIDR: {entry!r}")
    kind: Literal["host", "suffix"] = "host"
    if e.startswith("*."):
        kind, e = "suffix", e[2:]
    try:
        name = normalize_host(e)
    except EgressDenied:
        raise ConfigInvalidError("network.hosts", f"not a host name: {entry!r}") from None
    if not isinstance(name, str):
        raise ConfigInvalidError("network.hosts", f"not a host entry: {entry!r}")
    return Rule(kind, name=name, port=port)


@dataclass(frozen=True, slots=True)
class SecretHeader:
    """One header the proxy adds at egress: ``name`` (lower case) and ``value``, which no
    repr, str, denial reason or log line shows."""

    name: str
    value: str = field(repr=False)

    def __str__(self) -> str:
        return f"{self.name}: <secret>"


def _is_latin1(s: str) -> bool:
    try:
        s.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


#: the characters of an HTTP token (RFC 9110 5.6.2): header names, methods
TCHAR: Final = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                         "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
#: framing and routing headers whose "_" spellings are refused in an intercepted request
UNDERSCORE_CHECKED: Final = frozenset({"host", "content-length", "transfer-encoding"})
#: headers a secret may not set: framing, routing and hop-by-hop ones
_UNSETTABLE: Final = frozenset({"host", "content-length", "transfer-encoding", "connection",
                                "proxy-connection", "keep-alive", "te", "trailer", "upgrade",
                                "expect"})


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Who may be reached: an immutable value; :meth:`allowing` and :meth:`revoking` give
    changed copies (the proxy reads its current policy once per new connection).

    ``allowlist`` mode: a name must match a ``host`` or ``suffix`` rule, an IP literal
    a ``net`` rule. ``unrestricted`` mode: every public destination. In both, an
    address in :data:`SPECIAL_RANGES` is reachable only when a ``net`` rule lists it,
    and ``deny`` rules win over everything.
    """

    mode: Literal["allowlist", "unrestricted"] = "allowlist"
    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()
    #: (name rule, headers) pairs from :meth:`with_secret`; the values are not in the repr
    secrets: tuple[tuple[Rule, tuple[SecretHeader, ...]], ...] = ()

    @classmethod
    def allowlist(cls, *entries: str) -> EgressPolicy:
        return cls("allowlist", tuple(parse_entry(e) for e in entries))

    @classmethod
    def unrestricted(cls, *listed: str) -> EgressPolicy:
        """Every public destination, plus the addresses/ranges ``listed``."""
        return cls("unrestricted", tuple(parse_entry(e) for e in listed))

    def allowing(self, entry: str) -> EgressPolicy:
        rule = parse_entry(entry)
        allow = self.allow if rule in self.allow else (*self.allow, rule)
        return replace(self, allow=allow, deny=tuple(r for r in self.deny if r != rule))

    def revoking(self, entry: str) -> EgressPolicy:
        """Remove ``entry`` from the allowed rules and add it to ``deny``, so neither a
        wider rule (``*.suffix``) nor ``unrestricted`` mode still lets it through;
        :meth:`allowing` the same entry lifts the deny again."""
        rule = parse_entry(entry)
        allow = tuple(r for r in self.allow if r != rule)
        deny = self.deny if rule in self.deny else (*self.deny, rule)
        return replace(self, allow=allow, deny=deny)

    def with_secret(self, entry: str, headers: Mapping[str, str]) -> EgressPolicy:
        """A copy that adds ``headers`` to every request to a host matching ``entry`` (a
        name or ``*.suffix``, optionally ``:port``), replacing any header of the same name
        the client sent; such hosts are intercepted (see docs/network.md). This does not
        allow the entry: list it with :meth:`allowing` too. Calling it again for the same
        entry replaces that entry's headers. The values are never in a repr or a reason."""
        rule = parse_entry(entry)
        if rule.kind == "net":
            raise ConfigInvalidError("network.secrets",
                                     f"secrets need a host name entry, not {rule.text!r}")
        if not headers:
            raise ConfigInvalidError("network.secrets", f"no headers for {rule.text!r}")
        out: dict[str, SecretHeader] = {}
        for name, value in headers.items():
            key = name.lower() if isinstance(name, str) else ""
            if not key or not set(key) <= TCHAR or len(key) > 100:
                raise ConfigInvalidError("network.secrets", f"bad header name {name!r}")
            if key in _UNSETTABLE:
                raise ConfigInvalidError("network.secrets",
                                         f"header {name!r} cannot be set at egress")
            if not isinstance(value, str) or len(value) > 8192 or \
                    any(c in value for c in "\r\n\0") or not _is_latin1(value) or \
                    value != value.strip(" \t"):
                # the value itself is never quoted back
                raise ConfigInvalidError("network.secrets",
                                         f"bad value for header {name!r} (CR, LF, NUL, "
                                         "non-Latin-1, edge spaces or over 8 KiB)")
            out[key] = SecretHeader(key, value)
        kept = tuple((r, h) for r, h in self.secrets if r != rule)
        return replace(self, secrets=(*kept, (rule, tuple(out.values()))))

    def secrets_for(self, name: str, port: int) -> tuple[SecretHeader, ...]:
        """The headers to add for ``name:port`` (a normalized name); a later entry wins
        over an earlier one for the same header name."""
        out: dict[str, SecretHeader] = {}
        for rule, headers in self.secrets:
            if rule.matches_name(name, port):
                out.update((h.name, h) for h in headers)
        return tuple(out.values())

    @property
    def has_secrets(self) -> bool:
        return bool(self.secrets)

    @property
    def entries(self) -> tuple[str, ...]:
        return tuple(r.text for r in self.allow)

    def check_name(self, name: str, port: int) -> None:
        """Raise :class:`EgressDenied` unless ``name:port`` may be resolved and tried."""
        for r in self.deny:
            if r.matches_name(name, port):
                raise EgressDenied("not-allowed", f"{name}:{port} is denied ({r.text})")
        if self.mode == "unrestricted":
            return
        if not any(r.matches_name(name, port) for r in self.allow):
            raise EgressDenied("not-allowed", f"{name}:{port} is not in the allowlist")

    def check_address(self, ip: IPAddress, port: int, *, by_name: bool) -> None:
        """Raise :class:`EgressDenied` unless the proxy may connect to ``ip:port``
        (``by_name``: ``ip`` came from resolving a name that passed :meth:`check_name`)."""
        for r in self.deny:
            if r.matches_ip(ip, port):
                raise EgressDenied("not-allowed", f"{ip} port {port} is denied ({r.text})")
        if any(r.matches_ip(ip, port) for r in self.allow):
            return
        special = classify_address(ip)
        if special is not None:
            raise EgressDenied("non-public-address",
                               f"{ip} is {special}, not listed in the policy")
        if not by_name and self.mode == "allowlist":
            raise EgressDenied("not-allowed",
                               f"IP literal {ip} port {port} is not in the allowlist")


@dataclass(frozen=True, slots=True)
class Target:
    """A decided destination: what the proxy may connect to, and how."""

    host: str                       # as asked (for records)
    port: int
    addresses: tuple[str, ...]      # checked addresses, in the order to try
    tls_host: str                   # what an SNI must equal
    #: headers to add (the host is intercepted when there are any)
    secrets: tuple[SecretHeader, ...] = field(default=(), repr=False)


class UpstreamError(Exception):
    """An allowed destination that could not be reached: the SOCKS5 reply code and the
    HTTP status to answer with, and a one-line reason."""

    def __init__(self, socks_code: int, status: int, reason: str) -> None:
        super().__init__(reason)
        self.socks_code = socks_code
        self.status = status
        self.reason = reason


def loopback_relays(policy: EgressPolicy) -> list[tuple[str, int]]:
    """The listed destinations on the host's IPv4 loopback that get a relay inside the
    sandbox: each allowed rule that is one IPv4 loopback address with a port
    (``127.0.0.1:8080``), in order, without repeats.

    A client inside the sandbox connects to such an address directly (``NO_PROXY`` names
    loopback, and a raw socket client knows no proxy), and the sandbox's loopback is its
    own: without a relay the connection is refused there and the proxy never hears of
    it. So the host listens on the same address and port inside the sandbox's namespace
    and hands each connection to the egress proxy, which decides it by the policy of the
    moment like any proxied request (``EgressProxy.add_relay``). An entry without a port,
    a CIDR or ``::1`` gets no relay (a listener needs one address and one port): those
    destinations are reachable through the proxy only (``curl -x``, ``NO_PROXY`` unset)."""
    out: list[tuple[str, int]] = []
    for rule in policy.allow:
        net = rule.net
        if (rule.kind == "net" and net is not None and rule.port is not None
                and net.version == 4 and net.prefixlen == 32 and net.network_address.is_loopback):
            pair = (str(net.network_address), rule.port)
            if pair not in out:
                out.append(pair)
    return out


def compile_network(network: NetworkPolicy) -> EgressPolicy | None:
    """The proxy's policy for a spec's network policy, parsed once (None for ``none``,
    which has no proxy). Raises :class:`ConfigInvalidError` for an entry the proxy cannot
    read (hosts, secret-header entries and their headers), more host-loopback relays than
    :data:`MAX_LOOPBACK_RELAYS`, or a host-loopback entry on the proxy's own port (its
    relay could not listen there: see :func:`loopback_relays`)."""
    if network.kind == "none":
        for entry in (*network.hosts, *network.secret_headers):
            parse_entry(entry)
        return None
    if network.kind == "allowlist":
        out = EgressPolicy.allowlist(*network.hosts)
    else:
        out = EgressPolicy.unrestricted(*network.hosts)
    for entry, headers in network.secret_headers.items():
        out = out.with_secret(entry, dict(headers))
    relays = loopback_relays(out)
    if len(relays) > MAX_LOOPBACK_RELAYS:
        raise ConfigInvalidError(
            "network.hosts", f"{len(relays)} host-loopback entries with a port: at most "
            f"{MAX_LOOPBACK_RELAYS} per sandbox (each is a relay the host keeps open)")
    if any(p == PROXY_PORT for _, p in relays):
        raise ConfigInvalidError(
            "network.hosts", f"a host-loopback entry on port {PROXY_PORT}: inside the "
            f"sandbox, {PROXY_HOST}:{PROXY_PORT} is its egress proxy, so no relay to the "
            f"host's port {PROXY_PORT} can listen there; serve it on another port")
    return out
