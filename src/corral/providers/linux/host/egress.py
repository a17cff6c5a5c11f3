"""The host-side egress proxy: HTTP CONNECT, plain HTTP and SOCKS5 on the same listeners.

A sandbox with an ``allowlist`` or ``unrestricted`` network policy keeps its own
network namespace with no route out; its only way out is this proxy, which the
provider serves on a TCP socket made inside that namespace
(:meth:`EgressProxy.add_listener`; a unix socket path works too:
:meth:`EgressProxy.start`). Every connection is decided here, on the host, by an
:class:`EgressPolicy`:

* a name is matched against the policy *before* it is resolved (an unlisted
  name is never looked up), then resolved on the host, and each address it
  resolves to is checked against the range table (:data:`SPECIAL_RANGES`:
  loopback, private, link-local, the metadata address, CGNAT, multicast,
  reserved...): such an address is refused unless the policy lists it. The
  proxy then connects to exactly an address it checked, never re-resolving
  (the DNS-rebinding defence);
* an IP literal is allowed only when a listed address or CIDR covers it (or,
  in ``unrestricted`` mode, when it is public);
* a tunnel whose client speaks TLS must name the tunnel's host in its SNI
  (if it sends one): the ClientHello is read and parsed, bounded, before it is
  forwarded; for port 443 before the upstream connection is even opened;
* a host whose entry carries secret headers (:meth:`EgressPolicy.with_secret`)
  is intercepted: the client's TLS is terminated with a leaf from a per-proxy CA
  (``egress_tls``, the ``secrets`` extra), each HTTP/1.1 request gets the headers,
  and the proxy's own verified TLS connection carries it upstream. Every other
  tunnel is untouched, and once decided its bytes are moved with splice(2),
  never entering Python.

Whatever is not allowed fails closed with a clear error to the client (an HTTP
status with a one-line reason, or a SOCKS5 reply code) and is recorded as a
:class:`Denial` in a bounded list the caller reads. Everything is bounded: the
header size, the negotiation time, the connect time, the number of concurrent
connections and the idle time of a tunnel; any error closes both sides.

The parsers (:func:`parse_http_head`, :func:`parse_client_hello`,
:func:`parse_entry`) are pure and raise only :class:`EgressDenied` (or, for a
policy entry, :class:`~corral.core.errors.ConfigInvalidError`) on any input.
See docs/network.md.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import errno
import fcntl
import functools
import ipaddress
import logging
import os
import re
import resource
import socket
import ssl
import struct
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final, Literal, Protocol, final

from corral.core.errors import ConfigInvalidError

if TYPE_CHECKING:
    from corral.providers.linux.host.egress_tls import EgressCA

_log = logging.getLogger(__name__)

__all__ = [
    "DNS_THREADS",
    "FDS_PER_CONNECTION",
    "FD_RESERVE",
    "MAX_CLIENT_HELLO",
    "MAX_LOOKUPS",
    "MAX_HEADER",
    "NeverReach",
    "SPECIAL_RANGES",
    "Denial",
    "EgressDenied",
    "EgressLimits",
    "EgressPolicy",
    "EgressProxy",
    "HttpHead",
    "Resolver",
    "Rule",
    "SecretHeader",
    "classify_address",
    "normalize_host",
    "parse_client_hello",
    "parse_entry",
    "parse_http_head",
    "system_resolver",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: ``resolver(host, port)`` -> the addresses ``host`` resolves to (strings)
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

#: the most bytes of an HTTP request head (request line and headers)
MAX_HEADER: Final = 16 * 1024
#: the most bytes of a TLS ClientHello handshake message the proxy reads
MAX_CLIENT_HELLO: Final = 32 * 1024
#: the most addresses of one name the proxy tries
MAX_ADDRESSES: Final = 16
#: threads that run every proxy's getaddrinfo (:func:`system_resolver`)
DNS_THREADS: Final = 16
#: lookups one proxy runs at once: a lookup keeps its slot until it really ends (not when
#: the proxy stops waiting for it), so one sandbox holds at most this many DNS threads
MAX_LOOKUPS: Final = 4
_CHUNK: Final = 64 * 1024
_TLS_PORTS: Final = frozenset({443})
#: descriptors one proxied connection holds at most: the client's socket (and its dup
#: while it is taken over), the upstream's, and a pipe per direction
FDS_PER_CONNECTION: Final = 7
#: descriptors of the host process that proxies never take (its other work needs them)
FD_RESERVE: Final = 256
#: descriptors held by the connections of every proxy of this process (the estimate
#: FDS_PER_CONNECTION per connection); proxies may run on event loops of several threads
_FDS_IN_USE: list[int] = [0]
_FDS_LOCK: Final = threading.Lock()


def _take_fds(cost: int, own: int) -> bool:
    """Count ``cost`` more descriptors for a proxy holding ``own`` (a negative ``cost``
    gives them back); False, counting nothing, when that would pass the process's
    budget or give the proxy more than half of it."""
    with _FDS_LOCK:
        if cost > 0:
            budget = _fd_budget()
            if _FDS_IN_USE[0] + cost > budget or own + cost > budget // 2:
                return False
        _FDS_IN_USE[0] += cost
        return True


def _fd_budget() -> int:
    """The descriptors every proxy of this process may hold together: the process's
    RLIMIT_NOFILE (soft) less :data:`FD_RESERVE`, read at each connection (a host may
    raise its limit while running)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft > 1 << 24:
        soft = 1 << 24
    return max(soft - FD_RESERVE, 0)
#: the pipe between two spliced sockets (the system's default maximum for unprivileged)
_PIPE_SIZE: Final = 1 << 20
#: the send buffer of a unix-socket client of a tunnel (the kernel doubles it)
_UNIX_SNDBUF: Final = 1 << 20
_F_SETPIPE_SZ: Final = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_SPLICE_FLAGS: Final = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)

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


def _digits(s: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also accepts characters such as ``²`` (in
    Latin-1) that ``int`` refuses."""
    return s.isascii() and s.isdigit()


def _plain_ip(s: str) -> IPAddress | None:
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
        ip = _plain_ip(h[1:-1])
        if not isinstance(ip, ipaddress.IPv6Address | ipaddress.IPv4Address) or ":" not in h:
            raise EgressDenied("bad-request", f"not an IPv6 literal: {host[:80]!r}")
        return ip
    ip = _plain_ip(h)
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
    if not _digits(s) or not 0 < int(s) < 65536:
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


#: framing and routing headers whose "_" spellings are refused in an intercepted request
_UNDERSCORE_CHECKED: Final = frozenset({"host", "content-length", "transfer-encoding"})
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
            if not key or not set(key) <= _TCHAR or len(key) > 100:
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


# --------------------------------------------------------------------------- HTTP


@dataclass(frozen=True, slots=True)
class HttpHead:
    """A parsed request head: request line parts and headers (names lower-cased, in order)."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    def get_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


_CTL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_TCHAR: Final = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                          "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def parse_http_head(data: bytes) -> HttpHead:
    """Parse a request head ending in CRLF CRLF (at most :data:`MAX_HEADER` bytes).
    Strict: CRLF line ends, token method and header names, no folding, HTTP/1.0 or 1.1."""
    if len(data) > MAX_HEADER:
        raise EgressDenied("too-large", "request header too large")
    if not data.endswith(b"\r\n\r\n"):
        raise EgressDenied("bad-request", "request head is not terminated")
    text = data[:-4].decode("latin-1")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise EgressDenied("bad-request", "malformed request line")
    method, target, version = parts
    if not method or not set(method) <= _TCHAR:
        raise EgressDenied("bad-request", "malformed method")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise EgressDenied("bad-request", "unsupported HTTP version")
    if not target or any(ord(c) <= 0x20 or ord(c) >= 0x7f for c in target):
        raise EgressDenied("bad-request", "malformed request target")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if _CTL.search(line):
            # CR, LF, NUL and every other control but HTAB (RFC 9110 5.5): an upstream
            # may read "\x0bchunked" or a folded line differently from this proxy
            raise EgressDenied("bad-request", "control character in header")
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= _TCHAR:
            raise EgressDenied("bad-request", "malformed header line")
        headers.append((name.lower(), value.strip(" \t")))
    return HttpHead(method, target, version, tuple(headers))


def _split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) -> (host, port); raises EgressDenied."""
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise EgressDenied("bad-request", "malformed authority")
        host, rest = authority[:close + 1], authority[close + 1:]
    else:
        host, sep, p = authority.rpartition(":")
        if not sep:
            host, rest = authority, ""
        else:
            rest = ":" + p
    if rest:
        p = rest[1:]
        if not rest.startswith(":") or not _digits(p) or len(p) > 5 or not 0 < int(p) < 65536:
            raise EgressDenied("bad-request", "malformed port")
        port = int(p)
    elif default_port is None:
        raise EgressDenied("bad-request", "CONNECT target needs a port")
    else:
        port = default_port
    if not host:
        raise EgressDenied("bad-request", "empty host")
    return host, port


def _host_key(host: str) -> str:
    n = normalize_host(host)
    return n if isinstance(n, str) else str(n)


# --------------------------------------------------------------------------- TLS


def _tls_record_length(header: bytes) -> int:
    if len(header) != 5 or header[0] != 0x16 or header[1] != 3:
        raise EgressDenied("bad-request", "not a TLS handshake record")
    length = int.from_bytes(header[3:5], "big")
    if not 0 < length <= 16384 + 256:
        raise EgressDenied("bad-request", "bad TLS record length")
    return length


def parse_client_hello(message: bytes) -> str | None:
    """The SNI host name (normalized) of a ClientHello handshake message (the 4-byte
    handshake header included, record framing removed), or None if it has none.
    Raises :class:`EgressDenied` for anything malformed."""
    bad = EgressDenied("bad-request", "malformed TLS ClientHello")
    if len(message) < 4 or len(message) > MAX_CLIENT_HELLO or message[0] != 1:
        raise bad
    if int.from_bytes(message[1:4], "big") != len(message) - 4:
        raise bad
    body = memoryview(message)[4:]
    pos = 0

    def take(n: int) -> memoryview:
        nonlocal pos
        if n < 0 or pos + n > len(body):
            raise bad
        out = body[pos:pos + n]
        pos += n
        return out

    def u8() -> int:
        return take(1)[0]

    def u16() -> int:
        b = take(2)
        return (b[0] << 8) | b[1]

    take(2 + 32)                       # legacy_version, random
    sid = u8()
    if sid > 32:
        raise bad
    take(sid)
    suites = u16()
    if suites < 2 or suites % 2:
        raise bad
    take(suites)
    comp = u8()
    if comp < 1:
        raise bad
    take(comp)
    if pos == len(body):
        return None                    # no extensions at all
    ext_total = u16()
    if pos + ext_total != len(body):
        raise bad
    sni: str | None = None
    seen: set[int] = set()
    while pos < len(body):
        etype = u16()
        elen = u16()
        data = bytes(take(elen))
        if etype in seen:
            raise bad
        seen.add(etype)
        if etype != 0:
            continue
        if len(data) < 2 or int.from_bytes(data[:2], "big") != len(data) - 2:
            raise bad
        i = 2
        names: list[bytes] = []
        while i < len(data):
            if i + 3 > len(data):
                raise bad
            ntype = data[i]
            nlen = int.from_bytes(data[i + 1:i + 3], "big")
            if i + 3 + nlen > len(data) or nlen == 0:
                raise bad
            if ntype == 0:
                names.append(data[i + 3:i + 3 + nlen])
            i += 3 + nlen
        if len(names) != 1:
            raise bad
        raw = names[0]
        if not raw.isascii():
            raise bad
        try:
            key = normalize_host(raw.decode("ascii"))
        except EgressDenied:
            raise bad from None
        if not isinstance(key, str):
            raise bad                  # RFC 6066: SNI is never an IP literal
        sni = key
    return sni


class _ExactReader(Protocol):
    async def readexactly(self, n: int, /) -> bytes: ...


async def _read_client_hello(reader: _ExactReader) -> tuple[bytes, bytes]:
    """Read TLS records until one whole ClientHello message: (raw records, message)."""
    raw = bytearray()
    msg = bytearray()
    need: int | None = None
    while need is None or len(msg) < need:
        header = await reader.readexactly(5)
        length = _tls_record_length(header)
        payload = await reader.readexactly(length)
        raw += header + payload
        msg += payload
        if need is None and len(msg) >= 4:
            need = 4 + int.from_bytes(msg[1:4], "big")
            if msg[0] != 1 or need > MAX_CLIENT_HELLO:
                raise EgressDenied("bad-request", "malformed TLS ClientHello")
        if len(raw) > MAX_CLIENT_HELLO + 5 * 4:
            raise EgressDenied("too-large", "TLS ClientHello too large")
    if len(msg) != need:
        raise EgressDenied("bad-request", "trailing data after the TLS ClientHello")
    return bytes(raw), bytes(msg)


# --------------------------------------------------------------------------- resolver


_dns_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _dns_executor() -> concurrent.futures.ThreadPoolExecutor:
    global _dns_pool
    if _dns_pool is None:
        _dns_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=DNS_THREADS, thread_name_prefix="corral-egress-dns")
    return _dns_pool


async def system_resolver(host: str, port: int) -> Sequence[str]:
    """Resolve ``host`` on the host with getaddrinfo (TCP, numeric port), in threads of
    the proxies' own (:data:`DNS_THREADS`), not the event loop's default executor: a
    lookup whose name servers never answer holds its thread until the system resolver
    gives up, whatever the proxy's timeout, and the default executor also runs the
    provider's own work (pause, resume, destroy)."""
    loop = asyncio.get_running_loop()
    infos = await loop.run_in_executor(_dns_executor(), functools.partial(
        socket.getaddrinfo, host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP,
        flags=socket.AI_NUMERICSERV))
    return [str(info[4][0]) for info in infos]


# --------------------------------------------------------------------------- proxy


@dataclass(frozen=True, slots=True)
class EgressLimits:
    """The proxy's bounds; every wait and every buffer has one."""

    header_bytes: int = MAX_HEADER
    #: seconds for a client to finish its request (HTTP head, SOCKS negotiation, ClientHello)
    header_timeout_s: float = 10.0
    resolve_timeout_s: float = 5.0
    connect_timeout_s: float = 10.0
    #: a tunnel with no byte in either direction for this long is closed
    idle_timeout_s: float = 300.0
    max_connections: int = 256
    #: the most denials kept (the oldest are dropped; ``denials_dropped`` counts them)
    max_denials: int = 1000
    #: tunnel ports where the client's ClientHello is read and checked *before* the
    #: upstream connection is opened (on other ports a client's TLS is checked too, but
    #: after connecting, so that server-speaks-first protocols work)
    tls_ports: frozenset[int] = _TLS_PORTS


@dataclass(frozen=True, slots=True)
class _Target:
    host: str                       # as asked (for records)
    port: int
    addresses: tuple[str, ...]      # checked addresses, in the order to try
    tls_host: str                   # what an SNI must equal
    #: headers to add (the host is intercepted when there are any)
    secrets: tuple[SecretHeader, ...] = field(default=(), repr=False)


_SOCKS_OK: Final = b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00"
_TLS_ALERT_ACCESS_DENIED: Final = b"\x15\x03\x03\x00\x02\x02\x31"
#: TLS record types other than handshake (change_cipher_spec, alert, application_data,
#: heartbeat): with a version byte 3 after them, a client starts TLS without a ClientHello
_TLS_OTHER_RECORDS: Final = frozenset({0x14, 0x15, 0x17, 0x18})
_HTTP_STATUS: Final[dict[DenialKind, tuple[int, str]]] = {
    "not-allowed": (403, "Forbidden"), "non-public-address": (403, "Forbidden"),
    "sni-mismatch": (403, "Forbidden"), "bad-request": (400, "Bad Request"),
    "unresolvable": (502, "Bad Gateway"), "too-large": (431, "Request Header Fields Too Large"),
    "timeout": (408, "Request Timeout"), "busy": (503, "Service Unavailable"),
    "unsupported": (501, "Not Implemented"),
}
_SOCKS_CODE: Final[dict[DenialKind, int]] = {
    "not-allowed": 0x02, "non-public-address": 0x02, "sni-mismatch": 0x02,
    "bad-request": 0x01, "unresolvable": 0x04, "too-large": 0x01, "timeout": 0x01,
    "busy": 0x01, "unsupported": 0x07,
}
_HOP_BY_HOP: Final = frozenset({"connection", "proxy-connection", "keep-alive",
                                "proxy-authorization", "proxy-authenticate", "te",
                                "trailer", "upgrade"})


def _is_host_address(ip: IPAddress) -> bool:
    """Whether ``ip`` is an address of this host's own interfaces: a UDP socket
    "connected" to it (which sends nothing) gets it as its own source address."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect((str(ip), 9))
            return bool(s.getsockname()[0] == str(ip))
    except OSError:
        return False


def _check_not_host(policy: EgressPolicy, ip: IPAddress, port: int) -> None:
    """Refuse an address of the host itself (outside loopback, which the range table
    covers) unless the policy lists that one address: a public address of the host would
    reach the services it binds to 0.0.0.0 from inside (a ``corral serve``, a database
    firewalled from outside), and a listed range (``10.0.0.0/8``) should not include
    the host that runs the sandbox."""
    if ip.is_loopback or not _is_host_address(ip):
        return
    for r in policy.allow:
        if r.kind == "net" and r.net is not None and r.net.prefixlen == r.net.max_prefixlen \
                and r.matches_ip(ip, port):
            return
    raise EgressDenied("non-public-address",
                       f"{ip} is an address of this host, not listed by itself in the policy")


@final
class NeverReach:
    """Destinations no policy opens, whatever it lists: checked after a name is
    resolved (and for a literal), before any connect, by every proxy given it. Filled by
    whoever knows them (the Ray node actor: the cluster's node addresses and Ray's ports,
    which have no authentication) and shared by reference, so an update reaches the
    proxies of sandboxes already running.

    ``addresses``: refused on every port. ``local_ports``: refused on every address
    that reaches this host's own sockets (loopback, the unspecified address, any
    address of the host's interfaces), since a service bound to ``*`` answers there.
    """

    def __init__(self, addresses: Iterable[str] = (), local_ports: Iterable[int] = (),
                 *, what: str = "a protected service") -> None:
        self.what = what
        self.addresses: frozenset[IPAddress] = frozenset()
        self.local_ports: frozenset[int] = frozenset()
        self.update(addresses, local_ports)

    def update(self, addresses: Iterable[str], local_ports: Iterable[int]) -> None:
        """Replace both sets (each connection checks the sets current at its decision)."""
        addrs = set()
        for a in addresses:
            ip = ipaddress.ip_address(a)
            addrs.add(_unmapped(ip))
        ports = {int(p) for p in local_ports if 0 < int(p) < 65536}
        self.addresses, self.local_ports = frozenset(addrs), frozenset(ports)

    def check(self, ip: IPAddress, port: int) -> None:
        """Raise :class:`EgressDenied` if ``ip:port`` is never to be reached."""
        ip = _unmapped(ip)
        if ip in self.addresses:
            raise EgressDenied("not-allowed", f"{ip} is {self.what}: never reachable "
                               "from a sandbox, whatever the policy lists")
        if port in self.local_ports and (ip.is_loopback or ip.is_unspecified
                                         or _is_host_address(ip)):
            raise EgressDenied("not-allowed", f"{ip} port {port} is {self.what}: never "
                               "reachable from a sandbox, whatever the policy lists")


def _unmapped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _check_connection_tokens(head: HttpHead, secret_names: frozenset[str]) -> None:
    """Refuse a ``Connection`` header that lists a framing or routing header (or a
    secret's): a hop that honours it drops ``Content-Length`` (the body becomes the next
    request, unchecked, with any ``Host``) or the secret, where this proxy did not."""
    listed = {t.strip(" \t").lower() for v in head.get_all("connection") for t in v.split(",")}
    bad = listed & (_UNDERSCORE_CHECKED | secret_names)
    if bad:
        raise EgressDenied("bad-request", f"Connection lists {sorted(bad)[0][:40]!r}")


def _printable(text: str) -> str:
    """``text`` with every non-printable character (controls, escapes, line ends, bidi
    overrides) written as a Python escape; ``text`` itself when it has none."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _clear_secrets(port: int) -> EgressDenied:
    """The refusal of plain HTTP to a TLS port (443) of a host with secrets: they would
    cross the network in clear, though the entry names the TLS port."""
    return EgressDenied("not-allowed", f"plain HTTP to port {port} of a host with secrets "
                        "(they would cross the network in clear): use TLS")


def _http_reply(status: int, text: str, reason: str) -> bytes:
    body = f"corral egress: {reason}\n".encode("utf-8", "replace")
    return (f"HTTP/1.1 {status} {text}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
            f"X-Corral-Egress: denied\r\n\r\n").encode("latin-1") + body


class _UpstreamError(Exception):
    def __init__(self, socks_code: int, status: int, reason: str) -> None:
        super().__init__(reason)
        self.socks_code = socks_code
        self.status = status
        self.reason = reason


@final
class EgressProxy:
    """The proxy for one sandbox: ``await start(path)`` (a unix socket) and/or ``await
    add_listener(sock)`` (any listening socket), then clients connect there.

    ``policy`` may be replaced at any time (or use :meth:`allow` / :meth:`revoke`);
    a connection uses the policy current when its request was read. ``resolver``
    defaults to :func:`system_resolver`; tests inject one. ``upstream_ssl_context``:
    what the proxy trusts when it connects upstream itself for a host with secrets
    (default: the system's CAs, verified, host name checked).
    """

    def __init__(self, policy: EgressPolicy, *, resolver: Resolver | None = None,
                 limits: EgressLimits | None = None,
                 upstream_ssl_context: ssl.SSLContext | None = None,
                 never: NeverReach | None = None) -> None:
        self._ca: EgressCA | None = None
        #: destinations refused whatever the policy says (see :class:`NeverReach`)
        self.never = never
        self._policy = policy
        self.policy = policy
        self.limits = limits or EgressLimits()
        self._upstream_ssl = upstream_ssl_context
        self._resolver: Resolver = resolver or system_resolver
        self._denials: collections.deque[Denial] = collections.deque(
            maxlen=self.limits.max_denials)
        self.denials_dropped = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.path: str | None = None
        self.active = 0
        #: connections ended by an unexpected exception (a bug; logged): tests want 0
        self.internal_errors = 0
        self._lookup_slots = asyncio.Semaphore(MAX_LOOKUPS)
        #: descriptors this proxy's connections may hold (FDS_PER_CONNECTION each)
        self._fds = 0
        self._lookups: set[asyncio.Future[Sequence[str]]] = set()

    # ---------------------------------------------------------------- public

    @property
    def policy(self) -> EgressPolicy:
        """The policy new connections are decided by; assign to change it. A policy with
        secrets makes the per-proxy CA on first use (the ``secrets`` extra)."""
        return self._policy

    @policy.setter
    def policy(self, policy: EgressPolicy) -> None:
        if policy.has_secrets and self._ca is None:
            from corral.providers.linux.host.egress_tls import EgressCA  # the secrets extra
            self._ca = EgressCA(self._sni_mismatch)
        self._policy = policy

    @property
    def ca_bundle_pem(self) -> bytes | None:
        """The per-proxy CA certificate (PEM) a sandbox must trust for the hosts whose
        traffic carries secrets; None while no policy of this proxy had secrets."""
        return None if self._ca is None else self._ca.ca_pem

    async def start(self, path: str) -> None:
        """Listen on the unix socket ``path`` (created here; it must not exist)."""
        server = await asyncio.start_unix_server(
            self._accept, path=path, limit=max(self.limits.header_bytes, _CHUNK))
        self._servers.append(server)
        self.path = path

    async def add_listener(self, sock: socket.socket) -> None:
        """Also serve connections accepted on ``sock``, an already-listening stream socket
        of any family (e.g. a TCP socket on 127.0.0.1 made inside a sandbox's network
        namespace and passed to the host by fd). The proxy owns ``sock`` from now on and
        closes it at :meth:`aclose`. Clients on every listener share one policy, one
        denial list and one connection limit."""
        if sock.type != socket.SOCK_STREAM:
            raise ConfigInvalidError("egress.listener", "not a stream socket")
        sock.setblocking(False)
        server = await asyncio.start_server(
            self._accept, sock=sock, limit=max(self.limits.header_bytes, _CHUNK))
        self._servers.append(server)

    async def add_relay(self, sock: socket.socket, host: str, port: int) -> None:
        """Also serve ``sock`` (a listening stream socket) as a fixed relay to ``host:port``,
        an IP literal: each connection accepted there is decided by the policy current
        then, as a proxy request for ``host:port`` would be (refused and recorded as a
        :class:`Denial` unless allowed; ``never`` and the host-address check included),
        connected by address and pumped both ways. For a listed destination on the
        host's loopback, which a client inside reaches directly (``NO_PROXY`` names
        loopback; the sandbox's loopback is its own): the provider binds ``sock`` to the
        same address and port inside the sandbox. Same limits, connection count and
        denial list as the proxy's other listeners; the proxy owns ``sock`` from now on."""
        if sock.type != socket.SOCK_STREAM:
            raise ConfigInvalidError("egress.listener", "not a stream socket")
        if not isinstance(normalize_host(host), (ipaddress.IPv4Address, ipaddress.IPv6Address)):
            raise ConfigInvalidError("egress.relay", f"not an IP literal: {host!r}")
        sock.setblocking(False)
        server = await asyncio.start_server(
            functools.partial(self._accept, relay=(host, port)), sock=sock,
            limit=max(self.limits.header_bytes, _CHUNK))
        self._servers.append(server)

    async def aclose(self) -> None:
        """Stop listening (closing every listener) and close every connection."""
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        for lookup in list(self._lookups):
            lookup.cancel()
        for w in list(self._writers):
            w.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in servers:
            await server.wait_closed()

    async def __aenter__(self) -> EgressProxy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def allow(self, entry: str) -> None:
        self.policy = self.policy.allowing(entry)

    def revoke(self, entry: str) -> None:
        self.policy = self.policy.revoking(entry)

    def denials(self) -> tuple[Denial, ...]:
        return tuple(self._denials)

    # ---------------------------------------------------------------- internals

    def _sni_mismatch(self, host: str, port: int, sni: str) -> None:
        self._record(host, port, EgressDenied(
            "sni-mismatch", f"TLS SNI {sni!r} does not match the tunnel host {host!r}"))

    def _record(self, host: str, port: int, err: EgressDenied) -> None:
        if len(self._denials) == self._denials.maxlen:
            self.denials_dropped += 1
        # the host is as the sandbox sent it (a SOCKS5 name may hold any character) and
        # `corral run` prints denials on the operator's terminal: escapes and line ends
        # are shown escaped, never as themselves
        self._denials.append(Denial(_printable(host[:255]), port, err.kind,
                                    _printable(err.reason), time.time()))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      relay: tuple[str, int] | None = None) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        busy = self.active >= self.limits.max_connections
        # the host process's descriptors are shared by every proxy (and everything else
        # it does): a connection that would take this proxy past half of what the
        # process may spend on proxies, or all proxies past it, is closed unread
        cost = 1 if busy else FDS_PER_CONNECTION
        over = not _take_fds(cost, self._fds)
        if not over:
            self._fds += cost
        if not busy and not over:
            self.active += 1
        try:
            if over:
                self._record("", 0, EgressDenied(
                    "busy", "too many connections for the host's descriptor limit"))
                return
            if busy and len(self._tasks) > 2 * self.limits.max_connections:
                self._record("", 0, EgressDenied("busy", "too many connections"))
                return
            if relay is not None:
                await self._relay(relay, reader, writer, busy)
            else:
                await self._serve(reader, writer, busy)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                EgressDenied, _BadUpstream):
            pass
        except Exception:
            # a bug, not the client's doing: this connection ends, the proxy goes on
            self.internal_errors += 1
            _log.exception("egress proxy: internal error on a connection")
        finally:
            if not busy and not over:
                self.active -= 1
            try:
                await _shutdown(writer, self.limits.idle_timeout_s)
            finally:        # even when cancelled in there (aclose): the budget never leaks
                self._writers.discard(writer)
                self._tasks.discard(task)
                if not over:
                    self._fds -= cost
                    _take_fds(-cost, 0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     busy: bool) -> None:
        lim = self.limits
        try:
            async with asyncio.timeout(lim.header_timeout_s):
                first = await reader.readexactly(1)
        except TimeoutError:
            return
        socks = first == b"\x05"
        if busy:
            err = EgressDenied("busy", "too many connections")
            self._record("", 0, err)
            writer.write(b"\x05\xff" if socks else _http_reply(503, "Service Unavailable",
                                                               err.reason))
            await writer.drain()
            return
        if socks:
            await self._socks(reader, writer)
        else:
            await self._http(first, reader, writer)

    async def _relay(self, relay: tuple[str, int], reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter, busy: bool) -> None:
        """One connection on a relay listener (:meth:`add_relay`): no request to read,
        the destination is the relay's; decided by the current policy, then pumped.
        A refusal closes the connection (nothing to answer in: the client speaks its
        own protocol) and is recorded."""
        host, port = relay
        if busy:
            self._record(host, port, EgressDenied("busy", "too many connections"))
            return
        try:
            target = await self._decide(self.policy, host, port)
        except EgressDenied as e:
            self._record(host, port, e)
            return
        try:
            usock = await self._connect(target)
        except _UpstreamError:
            return
        csock: socket.socket | None = None
        try:
            csock, buffered = await _detach(reader, writer)
            await self._pump(target, csock, usock, buffered, sniff=False)
        finally:
            usock.close()
            if csock is not None:
                csock.close()

    async def _lookup(self, key: str, port: int) -> Sequence[str]:
        """``resolver(key, port)`` in one of this proxy's :data:`MAX_LOOKUPS` slots; a
        caller that stops waiting (its timeout) leaves the lookup running to its end, and
        only then is the slot free again."""
        await self._lookup_slots.acquire()
        task = asyncio.ensure_future(self._resolver(key, port))
        self._lookups.add(task)

        def done(t: asyncio.Future[Sequence[str]]) -> None:
            self._lookups.discard(t)
            self._lookup_slots.release()
            if not t.cancelled():
                t.exception()          # retrieved: a lookup nobody waits for any more

        task.add_done_callback(done)
        return await asyncio.shield(task)

    async def _decide(self, policy: EgressPolicy, host: str, port: int) -> _Target:
        """Check ``host:port`` against ``policy``, resolving a name on the host."""
        key = normalize_host(host)
        if not isinstance(key, str):
            policy.check_address(key, port, by_name=False)
            _check_not_host(policy, key, port)
            if self.never is not None:
                self.never.check(key, port)
            return _Target(host, port, (str(key),), "")
        policy.check_name(key, port)
        try:
            async with asyncio.timeout(self.limits.resolve_timeout_s):
                resolved = await self._lookup(key, port)
        except (TimeoutError, OSError, UnicodeError) as e:
            raise EgressDenied("unresolvable", f"{key} does not resolve ({e})") from None
        ok: list[str] = []
        first_err: EgressDenied | None = None
        for s in list(resolved)[:MAX_ADDRESSES]:
            ip = _plain_ip(s)
            if ip is None:
                first_err = first_err or EgressDenied(
                    "non-public-address", f"{key} resolves to an unusable address {s[:60]!r}")
                continue
            try:
                policy.check_address(ip, port, by_name=True)
                _check_not_host(policy, ip, port)
                if self.never is not None:
                    self.never.check(ip, port)
            except EgressDenied as e:
                first_err = first_err or EgressDenied(
                    e.kind, f"{key} resolves to {e.reason}")
                continue
            if str(ip) not in ok:
                ok.append(str(ip))
        if not ok:
            raise first_err or EgressDenied("unresolvable", f"{key} resolves to no address")
        return _Target(host, port, tuple(ok), key, policy.secrets_for(key, port))

    async def _connect(self, target: _Target) -> socket.socket:
        """A connected non-blocking TCP socket to one of ``target``'s checked addresses
        (in order), by address: never a name. Raises :class:`_UpstreamError`."""
        loop = asyncio.get_running_loop()
        last = "no address"
        refused = False
        for addr in target.addresses:
            family = socket.AF_INET6 if ":" in addr else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                async with asyncio.timeout(self.limits.connect_timeout_s):
                    await loop.sock_connect(sock, (addr, target.port))
                return sock
            except TimeoutError:
                last = f"connecting to {addr} port {target.port} timed out"
            except ConnectionRefusedError:
                refused = True
                last = f"{addr} port {target.port} refused the connection"
            except OSError as e:
                last = f"cannot reach {addr} port {target.port}: {e.strerror or e}"
            except BaseException:
                sock.close()
                raise
            sock.close()
        if refused:
            raise _UpstreamError(0x05, 502, last)
        raise _UpstreamError(0x04, 504 if "timed out" in last else 502, last)

    async def _check_tls(self, target: _Target, prefix: bytes, reader: _ExactReader) -> bytes:
        """Given the client's first byte(s), read a whole ClientHello if this is TLS and
        check its SNI against the target; return the bytes to forward first."""
        if prefix and prefix[0] in _TLS_OTHER_RECORDS:
            # another TLS record first (a warning alert, which some stacks such as Go's
            # skip before the ClientHello): the ClientHello after it would go unchecked
            try:
                async with asyncio.timeout(self.limits.header_timeout_s):
                    more = await reader.readexactly(1) if len(prefix) < 2 else b""
            except asyncio.IncompleteReadError as e:
                return prefix + e.partial
            except TimeoutError:
                return prefix
            prefix += more
            if prefix[1] == 3:
                raise EgressDenied("bad-request", "a TLS record other than a handshake "
                                   "before the ClientHello")
            return prefix
        if not prefix or prefix[0] != 0x16:
            return prefix
        try:
            async with asyncio.timeout(self.limits.header_timeout_s):
                rest = await reader.readexactly(5 - len(prefix)) if len(prefix) < 5 else b""
                wrapped = _PrefixedReader(prefix + rest, reader)
                raw, msg = await _read_client_hello(wrapped)
        except TimeoutError:
            raise EgressDenied("timeout", "TLS ClientHello not received in time") from None
        except asyncio.IncompleteReadError:
            raise EgressDenied("bad-request", "connection closed inside the TLS ClientHello") \
                from None
        sni = parse_client_hello(msg)
        if sni is not None and sni != target.tls_host:
            raise EgressDenied("sni-mismatch",
                               f"TLS SNI {sni!r} does not match the tunnel host "
                               f"{target.tls_host or target.host!r}")
        return raw

    async def _tunnel(self, target: _Target, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, send_ok: bytes,
                      on_upstream_error: Callable[[_UpstreamError], bytes]) -> None:
        """Connect and pump; TLS ports read the ClientHello before connecting. Once the
        tunnel stands, the client's socket is taken out of asyncio's transport and both
        sockets are pumped with splice(2) (see :meth:`_pump`). A host with secrets is
        intercepted instead (:meth:`_intercept`)."""
        if target.secrets:
            await self._intercept(target, reader, writer, send_ok)
            return
        if target.port in self.limits.tls_ports:
            writer.write(send_ok)
            await writer.drain()
            try:
                try:
                    async with asyncio.timeout(self.limits.header_timeout_s):
                        prefix = await reader.read(1)
                except TimeoutError:
                    raise EgressDenied("timeout", "the client sent nothing in time") from None
                if not prefix:
                    return
                first = await self._check_tls(target, prefix, reader)
            except EgressDenied as e:
                self._record(target.host, target.port, e)
                writer.write(_TLS_ALERT_ACCESS_DENIED)
                await writer.drain()
                return
            try:
                usock = await self._connect(target)
            except _UpstreamError:
                return
        else:
            try:
                usock = await self._connect(target)
            except _UpstreamError as e:
                writer.write(on_upstream_error(e))
                await writer.drain()
                return
            writer.write(send_ok)
            first = b""
        csock: socket.socket | None = None
        try:
            csock, buffered = await _detach(reader, writer)
            await self._pump(target, csock, usock, first + buffered, sniff=not first)
        finally:
            usock.close()
            if csock is not None:
                csock.close()

    async def _pump(self, target: _Target, csock: socket.socket, usock: socket.socket,
                    first: bytes, sniff: bool) -> None:
        """Copy both ways until both ends are done (or either fails, or the tunnel is idle
        for ``idle_timeout_s``). ``first``: client bytes already read, sent upstream first;
        ``sniff``: check a TLS ClientHello at the start of the client's bytes first.

        The bytes are moved by :class:`_Splicer` callbacks run by the event loop itself
        (no coroutine per wakeup); this coroutine only waits for the tunnel's end."""
        loop = asyncio.get_running_loop()
        tunnel = _Tunnel(loop, self.limits.idle_timeout_s)
        last = tunnel.last

        async def up() -> None:
            data = first
            if sniff:
                while not data:
                    await self._wait_io(csock, False, last)
                    try:
                        data = csock.recv(_CHUNK)
                    except BlockingIOError:
                        continue
                    if not data:
                        usock.shutdown(socket.SHUT_WR)
                        tunnel.start(None)          # this direction is done already
                        return
                sr = _SockReader(csock, data)
                data = await self._check_tls(target, await sr.readexactly(1), sr)
                data += sr.take()
            if data:
                await self._send_all(usock, data, last)
            tunnel.start(_Splicer(tunnel, csock, usock))

        try:
            tunnel.start(_Splicer(tunnel, usock, csock))
            if first and not sniff:
                # checked bytes (a ClientHello, bytes sent with the request): a fresh
                # socket takes them at once, with no task and no loop iteration
                with contextlib.suppress(BlockingIOError):
                    sent = usock.send(first)
                    first = first[sent:]
                    tunnel.last[0] = loop.time()
            if sniff or first:
                ups = asyncio.ensure_future(up())
                try:
                    await asyncio.wait({ups, tunnel.done}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not ups.done():
                        ups.cancel()
                    await asyncio.gather(ups, return_exceptions=True)
                exc = None if ups.cancelled() else ups.exception()
                if isinstance(exc, EgressDenied):
                    self._record(target.host, target.port, exc)
                    with contextlib.suppress(OSError):
                        csock.send(_TLS_ALERT_ACCESS_DENIED)
                if exc is not None:
                    return
            else:
                tunnel.start(_Splicer(tunnel, csock, usock))
            try:
                await tunnel.done
            except (OSError, TimeoutError) as e:  # a reset, an idle tunnel: said, at debug
                _log.debug("egress proxy: a tunnel to %s port %s ended: %r", target.host,
                           target.port, e)
        finally:
            tunnel.close()

    async def _wait_io(self, sock: socket.socket, write: bool, last: list[float]) -> None:
        """Wait until ``sock`` is readable (writable); TimeoutError once neither direction
        of the tunnel (``last``: its latest progress) has moved for ``idle_timeout_s``."""
        loop = asyncio.get_running_loop()
        idle = self.limits.idle_timeout_s
        fd = sock.fileno()
        while True:
            fut: asyncio.Future[None] = loop.create_future()

            def ready(f: asyncio.Future[None] = fut) -> None:
                if not f.done():
                    f.set_result(None)

            if write:
                loop.add_writer(fd, ready)
            else:
                loop.add_reader(fd, ready)
            handle = loop.call_at(last[0] + idle, ready)
            try:
                await fut
            finally:
                handle.cancel()
                if write:
                    loop.remove_writer(fd)
                else:
                    loop.remove_reader(fd)
            if loop.time() - last[0] < idle:
                return
            raise TimeoutError

    async def _send_all(self, sock: socket.socket, data: bytes | memoryview,
                        last: list[float]) -> None:
        view = memoryview(data)
        while view:
            try:
                n = sock.send(view)
            except BlockingIOError:
                await self._wait_io(sock, True, last)
                continue
            view = view[n:]
            last[0] = asyncio.get_running_loop().time()

    # ---------------------------------------------------------------- secrets

    async def _intercept(self, target: _Target, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter, send_ok: bytes) -> None:
        """A tunnel to a host with secrets: terminate the client's TLS with the host's leaf
        (or read plain HTTP if the client does not start TLS), then relay HTTP/1.1
        requests one by one with the secret headers added (:meth:`_http_session`)."""
        loop = asyncio.get_running_loop()
        lim = self.limits
        writer.write(send_ok)
        csock, buffered = await _detach(reader, writer)
        c_w: asyncio.StreamWriter | None = None
        try:
            first = buffered[:1]
            if not first:
                try:
                    async with asyncio.timeout(lim.header_timeout_s):
                        await self._wait_io(csock, False, [loop.time()])
                except TimeoutError:
                    self._record(target.host, target.port,
                                 EgressDenied("timeout", "the client sent nothing in time"))
                    return
                first = csock.recv(1, socket.MSG_PEEK)
                if not first:
                    return
            tls = first == b"\x16"
            if tls and buffered:
                self._record(target.host, target.port, EgressDenied(
                    "unsupported", "TLS started before the tunnel reply (not carried to a "
                    "host with secrets)"))
                return
            if not tls and target.port in lim.tls_ports:
                err = _clear_secrets(target.port)
                self._record(target.host, target.port, err)
                with contextlib.suppress(OSError):
                    csock.send(_http_reply(403, "Forbidden", err.reason))
                return
            assert self._ca is not None
            ctx = self._ca.server_context(target.tls_host, target.port) if tls else None
            c_r = asyncio.StreamReader(limit=max(lim.header_bytes, _CHUNK))
            proto = asyncio.StreamReaderProtocol(c_r)
            try:
                transport, _ = await loop.connect_accepted_socket(
                    lambda: proto, csock, ssl=ctx,
                    ssl_handshake_timeout=lim.header_timeout_s if tls else None)
            except (OSError, ssl.SSLError, TimeoutError):
                return          # e.g. a client that does not trust the CA, or SNI refused
            c_w = asyncio.StreamWriter(transport, proto, c_r, loop)
            self._writers.add(c_w)
            if buffered:
                c_r.feed_data(buffered)
            await self._http_session(target, c_r, c_w, tls)
        finally:
            if c_w is not None:
                await _shutdown(c_w, lim.idle_timeout_s)
                self._writers.discard(c_w)
            else:
                csock.close()

    async def _http_session(self, target: _Target, c_r: asyncio.StreamReader,
                            c_w: asyncio.StreamWriter, tls: bool) -> None:
        """Relay HTTP/1.1 requests (keep-alive, Content-Length and chunked bodies streamed)
        from the client to ``target`` over the proxy's own connection (verified TLS when
        the client spoke TLS), each with ``target.secrets`` in place of any header of the
        same names; responses are streamed back unchanged."""
        lim = self.limits
        idle = lim.idle_timeout_s
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        first = True
        try:
            while True:
                try:
                    async with asyncio.timeout(lim.header_timeout_s if first else idle):
                        raw = await c_r.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as e:
                    if e.partial:
                        raise EgressDenied("bad-request",
                                           "connection closed inside the header") from None
                    return
                except asyncio.LimitOverrunError:
                    raise EgressDenied("too-large", "request header too large") from None
                except TimeoutError:
                    return
                first = False
                if len(raw) > lim.header_bytes:
                    raise EgressDenied("too-large", "request header too large")
                head = parse_http_head(raw)
                out, body = self._inner_request(head, target, tls)
                if up is not None and up[0].at_eof():
                    await _shutdown(up[1], idle)
                    self._writers.discard(up[1])
                    up = None
                if up is None:
                    try:
                        up = await self._open_upstream(target, tls)
                    except _UpstreamError as e:
                        c_w.write(_http_reply(e.status, "Bad Gateway" if e.status == 502
                                              else "Gateway Timeout", e.reason))
                        await c_w.drain()
                        return
                    self._writers.add(up[1])
                up_r, up_w = up
                up_w.write(out)
                sending = asyncio.ensure_future(_copy_body(c_r, up_w, body, idle))
                receiving = asyncio.ensure_future(
                    _relay_response(head, up_r, up_w, c_r, c_w, idle))
                try:
                    await asyncio.wait({sending, receiving},
                                       return_when=asyncio.FIRST_EXCEPTION)
                    if sending.done() and sending.exception() is not None:
                        return            # a broken request body: end both connections
                    close = await receiving
                    if not sending.done():
                        close = True      # answered before the whole body was sent
                finally:
                    for t in (sending, receiving):
                        t.cancel()
                    await asyncio.gather(sending, receiving, return_exceptions=True)
                if close or _wants_close(head):
                    if c_w.can_write_eof():
                        c_w.write_eof()
                    await c_w.drain()
                    return
        except EgressDenied as e:
            self._record(target.host, target.port, e)
            status, text = _HTTP_STATUS[e.kind]
            with contextlib.suppress(OSError):
                c_w.write(_http_reply(status, text, e.reason))
                await c_w.drain()
        finally:
            if up is not None:
                await _shutdown(up[1], idle)
                self._writers.discard(up[1])

    def _inner_request(self, head: HttpHead, target: _Target,
                       tls: bool) -> tuple[bytes, int | None]:
        """Check one request inside an intercepted tunnel; return the head to send upstream
        and its body (a Content-Length, 0 for none, or None for chunked)."""
        if head.method in ("CONNECT", "TRACE"):
            raise EgressDenied("not-allowed" if head.method == "TRACE" else "unsupported",
                               f"{head.method} is not carried to a host with secrets")
        if not (head.target.startswith("/") or (head.target == "*"
                                                 and head.method == "OPTIONS")):
            raise EgressDenied("bad-request", "requests inside a tunnel use origin form "
                               "(/path)")
        hosts = head.get_all("host")
        if len(hosts) > 1:
            raise EgressDenied("bad-request", "more than one Host header")
        if hosts:
            h_host, h_port = _split_authority(hosts[0], 443 if tls else 80)
            if _host_key(h_host) != target.tls_host or h_port != target.port:
                raise EgressDenied("not-allowed", f"Host header {hosts[0][:80]!r} does not "
                                   f"match the tunnel host {target.tls_host}:{target.port}")
        secret_names = {h.name for h in target.secrets}
        _check_connection_tokens(head, frozenset(secret_names))
        for k, _v in head.headers:
            # an upstream that reads "_" as "-" (CGI-style) would frame or authorize by a
            # header this proxy does not treat as such: refused, not forwarded
            if "_" in k and k.replace("_", "-") in _UNDERSCORE_CHECKED | secret_names:
                raise EgressDenied("bad-request", f"header {k[:40]!r} looks like "
                                   f"{k.replace('_', '-')[:40]!r}")
        # strip(" \t") only: str.strip() also drops "\xa0" and "\x85", which an upstream
        # keeps ("chunked\xa0" is not chunked to it)
        te = [t.strip(" \t").lower() for v in head.get_all("transfer-encoding")
              for t in v.split(",")]
        lengths = head.get_all("content-length")
        body: int | None
        if te:
            if te != ["chunked"]:
                raise EgressDenied("unsupported", "request Transfer-Encoding other than "
                                   "chunked")
            if lengths:
                raise EgressDenied("bad-request", "both Transfer-Encoding and Content-Length")
            body = None
        else:
            if len(set(lengths)) > 1 or any(not _digits(v) or len(v) > 18 for v in lengths):
                raise EgressDenied("bad-request", "bad Content-Length")
            body = int(lengths[0]) if lengths else 0
        lines = [f"{head.method} {head.target} {head.version}"]
        if not hosts:
            default = 443 if tls else 80
            lines.append(f"host: {target.tls_host}" + ("" if target.port == default
                                                       else f":{target.port}"))
        for k, v in head.headers:
            if k in secret_names or k in ("proxy-connection", "proxy-authorization"):
                continue
            lines.append(f"{k}: {v}")
        lines.extend(f"{h.name}: {h.value}" for h in target.secrets)
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), body

    async def _open_upstream(self, target: _Target, tls: bool,
                             ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The proxy's own connection to ``target``: TLS verified against
        ``upstream_ssl_context`` (default: the system's CAs, host name checked)."""
        usock = await self._connect(target)
        ctx: ssl.SSLContext | None = None
        if tls:
            if self._upstream_ssl is None:
                self._upstream_ssl = ssl.create_default_context()
                self._upstream_ssl.set_alpn_protocols(["http/1.1"])
            ctx = self._upstream_ssl
        try:
            return await asyncio.open_connection(
                sock=usock, limit=_RESPONSE_HEAD, ssl=ctx,
                server_hostname=target.tls_host if tls else None,
                ssl_handshake_timeout=self.limits.connect_timeout_s if tls else None)
        except ssl.SSLCertVerificationError as e:
            usock.close()
            raise _UpstreamError(0x05, 502, f"{target.tls_host} port {target.port}: upstream "
                                 f"certificate not trusted ({e.verify_message})") from None
        except (OSError, ssl.SSLError, TimeoutError) as e:
            usock.close()
            raise _UpstreamError(0x05, 502, f"{target.tls_host} port {target.port}: upstream "
                                 f"TLS failed ({type(e).__name__})") from None
        except BaseException:
            usock.close()
            raise

    # ---------------------------------------------------------------- SOCKS5

    async def _socks(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = "", 0
        replied = False
        try:
            async with asyncio.timeout(self.limits.header_timeout_s):
                (n,) = await reader.readexactly(1)
                methods = await reader.readexactly(n)
                if 0 not in methods:
                    writer.write(b"\x05\xff")
                    replied = True
                    raise EgressDenied("unsupported", "SOCKS5 client offers no 'no auth'")
                writer.write(b"\x05\x00")
                await writer.drain()
                ver, cmd, _rsv, atyp = await reader.readexactly(4)
                if ver != 5:
                    raise EgressDenied("bad-request", "bad SOCKS version")
                if atyp == 1:
                    host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
                elif atyp == 4:
                    host = "[" + str(ipaddress.IPv6Address(await reader.readexactly(16))) + "]"
                elif atyp == 3:
                    (ln,) = await reader.readexactly(1)
                    raw = await reader.readexactly(ln)
                    if not raw.isascii() and not _is_utf8(raw):
                        raise EgressDenied("bad-request", "SOCKS5 host name is not text")
                    host = raw.decode("utf-8")
                else:
                    writer.write(b"\x05\x08\x00\x01" + bytes(6))
                    replied = True
                    raise EgressDenied("unsupported", "SOCKS5 address type not supported")
                (port,) = struct.unpack("!H", await reader.readexactly(2))
                if cmd != 1:
                    raise EgressDenied("unsupported",
                                       f"SOCKS5 command {cmd} not supported (CONNECT only)")
                if port == 0:
                    raise EgressDenied("bad-request", "port 0")
            target = await self._decide(self.policy, host, port)
        except TimeoutError:
            self._record(host, port, EgressDenied("timeout", "SOCKS5 negotiation timed out"))
            return
        except EgressDenied as e:
            self._record(host, port, e)
            code = _SOCKS_CODE[e.kind]
            with contextlib.suppress(OSError):
                if not replied:
                    writer.write(bytes([5, code, 0, 1]) + bytes(6))
                await writer.drain()
            return
        await self._tunnel(target, reader, writer, _SOCKS_OK,
                           lambda e: bytes([5, e.socks_code, 0, 1]) + bytes(6))

    # ---------------------------------------------------------------- HTTP

    async def _http(self, first: bytes, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        host, port = "", 0
        try:
            try:
                async with asyncio.timeout(self.limits.header_timeout_s):
                    rest = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                raise EgressDenied("too-large", "request header too large") from None
            except asyncio.IncompleteReadError:
                raise EgressDenied("bad-request", "connection closed inside the header") \
                    from None
            except TimeoutError:
                raise EgressDenied("timeout", "request header not received in time") from None
            data = first + rest
            if len(data) > self.limits.header_bytes:
                raise EgressDenied("too-large", "request header too large")
            head = parse_http_head(data)
            if head.method == "CONNECT":
                host, port = _split_authority(head.target, None)
                target = await self._decide(self.policy, host, port)
            else:
                host, port, origin = self._absolute(head)
                target = await self._decide(self.policy, host, port)
                if target.secrets and port in self.limits.tls_ports:
                    raise _clear_secrets(port)
        except EgressDenied as e:
            self._record(host, port, e)
            status, text = _HTTP_STATUS[e.kind]
            with contextlib.suppress(OSError):
                writer.write(_http_reply(status, text, e.reason))
                await writer.drain()
            return
        if head.method == "CONNECT":
            await self._tunnel(target, reader, writer,
                               b"HTTP/1.1 200 Connection Established\r\n\r\n",
                               lambda e: _http_reply(e.status, "Bad Gateway"
                                                     if e.status == 502 else "Gateway Timeout",
                                                     e.reason))
        else:
            await self._forward(head, origin, target, reader, writer)

    def _absolute(self, head: HttpHead) -> tuple[str, int, str]:
        """Check an absolute-form request; return (host, port, origin-form target)."""
        t = head.target
        if not t.lower().startswith("http://"):
            if t.lower().startswith("https://"):
                raise EgressDenied("unsupported", "https:// through a plain proxy request; "
                                   "use CONNECT")
            raise EgressDenied("bad-request", "a proxy request needs an absolute http:// URI")
        try:
            u = urllib.parse.urlsplit(t)
        except ValueError:
            raise EgressDenied("bad-request", "malformed URI") from None
        netloc = u.netloc
        if "@" in netloc:
            raise EgressDenied("bad-request", "user info in the URI is not allowed")
        host, port = _split_authority(netloc, 80)
        origin = u.path or "/"
        if not origin.startswith("/"):
            raise EgressDenied("bad-request", "malformed URI path")
        if u.query:
            origin += "?" + u.query
        hosts = head.get_all("host")
        if len(hosts) > 1:
            raise EgressDenied("bad-request", "more than one Host header")
        if hosts:
            h_host, h_port = _split_authority(hosts[0], 80)
            if _host_key(h_host) != _host_key(host) or h_port != port:
                raise EgressDenied("not-allowed",
                                   f"Host header {hosts[0][:80]!r} does not match the URI")
        te = head.get_all("transfer-encoding")
        if te:
            raise EgressDenied("unsupported", "request bodies with Transfer-Encoding are not "
                               "carried; send Content-Length")
        lengths = head.get_all("content-length")
        if len(set(lengths)) > 1 or any(not _digits(v) or len(v) > 18 for v in lengths):
            raise EgressDenied("bad-request", "bad Content-Length")
        _check_connection_tokens(head, frozenset())
        return host, port, origin

    async def _forward(self, head: HttpHead, origin: str, target: _Target,
                       reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request per connection: rewrite to origin-form, send the head and exactly
        Content-Length body bytes, then copy the response until upstream closes."""
        try:
            usock = await self._connect(target)
        except _UpstreamError as e:
            writer.write(_http_reply(e.status, "Bad Gateway" if e.status == 502
                                     else "Gateway Timeout", e.reason))
            await writer.drain()
            return
        try:
            up_r, up_w = await asyncio.open_connection(sock=usock, limit=_CHUNK)
        except BaseException:
            usock.close()
            raise
        self._writers.add(up_w)
        try:
            connection_listed = {t.strip().lower() for v in head.get_all("connection")
                                 for t in v.split(",")}
            lines = [f"{head.method} {origin} {head.version}"]
            has_host = False
            secret_names = {h.name for h in target.secrets}
            for k, v in head.headers:
                if k in _HOP_BY_HOP or k in connection_listed or k in secret_names:
                    continue
                has_host = has_host or k == "host"
                lines.append(f"{k}: {v}")
            if not has_host:
                lines.insert(1, f"host: {head.target.split('/')[2]}")
            lines.extend(f"{h.name}: {h.value}" for h in target.secrets)
            lines.append("connection: close")
            up_w.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            remaining = int(head.get_all("content-length")[0]) if head.get_all(
                "content-length") else 0
            idle = self.limits.idle_timeout_s
            while remaining > 0:
                async with asyncio.timeout(idle):
                    chunk = await reader.read(min(remaining, _CHUNK))
                if not chunk:
                    return
                remaining -= len(chunk)
                up_w.write(chunk)
                await up_w.drain()
            await up_w.drain()
            while True:
                async with asyncio.timeout(idle):
                    chunk = await up_r.read(_CHUNK)
                if not chunk:
                    break
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
                await writer.drain()
        finally:
            await _shutdown(up_w, self.limits.idle_timeout_s)
            self._writers.discard(up_w)

#: the most bytes of a response head, and of a chunk-size or trailer line
_RESPONSE_HEAD: Final = 64 * 1024


class _BadUpstream(Exception):
    """The upstream broke HTTP/1.1 framing: the client connection is closed."""


def _wants_close(head: HttpHead) -> bool:
    tokens = {t.strip().lower() for v in head.get_all("connection") for t in v.split(",")}
    if head.version == "HTTP/1.0":
        return "keep-alive" not in tokens
    return "close" in tokens


def _parse_response_head(data: bytes) -> tuple[str, int, list[tuple[str, str]]]:
    """(version, status, headers with lower-case names) of a response head."""
    lines = data[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or parts[0] not in ("HTTP/1.0", "HTTP/1.1") or \
            not _digits(parts[1]) or len(parts[1]) != 3:
        raise _BadUpstream("malformed status line")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= _TCHAR:
            raise _BadUpstream("malformed response header")
        headers.append((name.lower(), value.strip(" \t")))
    return parts[0], int(parts[1]), headers


async def _copy_exact(src: asyncio.StreamReader, dst: asyncio.StreamWriter, n: int,
                      idle: float) -> None:
    while n > 0:
        async with asyncio.timeout(idle):
            chunk = await src.read(min(n, _CHUNK))
        if not chunk:
            raise _BadUpstream("connection closed inside a body")
        n -= len(chunk)
        dst.write(chunk)
        await dst.drain()


async def _copy_chunked(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                        idle: float) -> None:
    """Copy one chunked body (RFC 9112 7.1) byte for byte, trailers included."""
    while True:
        async with asyncio.timeout(idle):
            line = await src.readuntil(b"\r\n")
        size = line[:-2].split(b";", 1)[0].strip()
        if not size or len(size) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size):
            raise _BadUpstream("malformed chunk size")
        dst.write(line)
        n = int(size, 16)
        if n == 0:
            break
        await _copy_exact(src, dst, n, idle)
        async with asyncio.timeout(idle):
            crlf = await src.readexactly(2)
        if crlf != b"\r\n":
            raise _BadUpstream("malformed chunk end")
        dst.write(crlf)
        await dst.drain()
    for _ in range(256):                  # trailers, then the empty line
        async with asyncio.timeout(idle):
            line = await src.readuntil(b"\r\n")
        dst.write(line)
        if line == b"\r\n":
            await dst.drain()
            return
    raise _BadUpstream("too many trailer lines")


async def _copy_until_eof(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                          idle: float, half_close: bool = False) -> None:
    """Copy until ``src`` ends; ``half_close``: then end ``dst``'s sending side too, where
    its transport can (TLS cannot half-close: the other direction runs until it ends)."""
    while True:
        async with asyncio.timeout(idle):
            chunk = await src.read(_CHUNK)
        if not chunk:
            if half_close and dst.can_write_eof():
                dst.write_eof()
            return
        dst.write(chunk)
        await dst.drain()


async def _copy_body(src: asyncio.StreamReader, dst: asyncio.StreamWriter, body: int | None,
                     idle: float) -> None:
    """A request body: ``body`` bytes, or chunked when None."""
    await dst.drain()
    if body is None:
        await _copy_chunked(src, dst, idle)
    elif body:
        await _copy_exact(src, dst, body, idle)


async def _relay_response(req: HttpHead, up_r: asyncio.StreamReader,
                          up_w: asyncio.StreamWriter, c_r: asyncio.StreamReader,
                          c_w: asyncio.StreamWriter, idle: float) -> bool:
    """Stream the response(s) to ``req`` (1xx interim ones, then the final one) back to the
    client; after ``101 Switching Protocols`` carry bytes both ways until both end.
    Returns whether the connection must close afterwards."""
    sent = False
    try:
        while True:
            try:
                async with asyncio.timeout(idle):
                    raw = await up_r.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                raise _BadUpstream("response header too large") from None
            except asyncio.IncompleteReadError:
                raise _BadUpstream("connection closed before a response") from None
            version, status, headers = _parse_response_head(raw)
            c_w.write(raw)
            sent = True
            if status == 101:
                await c_w.drain()
                await asyncio.gather(_copy_until_eof(c_r, up_w, idle, half_close=True),
                                     _copy_until_eof(up_r, c_w, idle, half_close=True))
                return True
            if 100 <= status < 200:
                await c_w.drain()
                continue
            break
        conn = {t.strip().lower() for k, v in headers if k == "connection"
                for t in v.split(",")}
        close = "close" in conn or (version == "HTTP/1.0" and "keep-alive" not in conn)
        te = [t.strip().lower() for k, v in headers if k == "transfer-encoding"
              for t in v.split(",")]
        lengths = {v for k, v in headers if k == "content-length"}
        if req.method == "HEAD" or status in (204, 304):
            pass
        elif te:
            if te[-1] == "chunked":
                await _copy_chunked(up_r, c_w, idle)
            else:
                await _copy_until_eof(up_r, c_w, idle)
                close = True
        elif lengths:
            if len(lengths) > 1 or not all(_digits(v) and len(v) <= 18 for v in lengths):
                raise _BadUpstream("bad Content-Length in the response")
            await _copy_exact(up_r, c_w, int(lengths.pop()), idle)
        else:
            await _copy_until_eof(up_r, c_w, idle)
            close = True
        await c_w.drain()
        return close
    except (_BadUpstream, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        if not sent:
            c_w.write(_http_reply(502, "Bad Gateway", f"upstream: {e}"))
            await c_w.drain()
        return True


async def _shutdown(writer: asyncio.StreamWriter, timeout: float) -> None:
    """Close ``writer`` after what it buffered is sent, waiting at most ``timeout``
    (a peer that does not read); then (or on any error) drop the connection."""
    try:
        if not writer.transport.is_closing():
            writer.close()
        async with asyncio.timeout(min(timeout, 30.0)):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        pass
    finally:
        writer.transport.abort()


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def _detach(reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> tuple[socket.socket, bytes]:
    """Take the client's socket out of its asyncio transport: what the writer buffered is
    sent first, the bytes the reader buffered are returned; the transport is dropped and
    the caller owns the returned socket (a dup of the transport's)."""
    transport = writer.transport
    if transport.get_write_buffer_size():
        transport.set_write_buffer_limits(high=0)     # drain() now waits until all is sent
        await writer.drain()
    tsock = transport.get_extra_info("socket")
    sock = socket.socket(fileno=os.dup(tsock.fileno()))
    try:
        sock.setblocking(False)
        if sock.family == socket.AF_UNIX:
            # a unix socket's send buffer (208 KiB by default) bounds what is in flight
            # to the client; TCP sockets tune theirs (up to tcp_wmem's maximum)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _UNIX_SNDBUF)
        # StreamReader keeps what it read ahead in its (private) buffer (a KeyError here,
        # not lost bytes, if that ever changes); no await between taking it and dropping
        # the transport, so nothing more can arrive in between
        buffered = bytes(reader.__dict__["_buffer"])
    except BaseException:
        sock.close()
        raise
    transport.abort()
    return sock, buffered


#: splice(2) calls one wakeup of a direction makes at most before it lets the event
#: loop run other callbacks (other tunnels, the proxy's handshakes)
_MOVES_PER_WAKEUP: Final = 4


@final
class _Tunnel:
    """The two :class:`_Splicer` directions of one tunnel: their shared idle clock (one
    timer per tunnel, re-armed from the latest progress, not one per wait) and ``done``,
    a future that ends when both directions reached EOF (result), when either failed
    (its exception) or when the tunnel was idle for ``idle`` seconds (TimeoutError)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, idle: float) -> None:
        self.loop = loop
        self.idle = idle
        #: the loop time of the latest byte moved either way (a list: shared with
        #: :meth:`EgressProxy._wait_io` and :meth:`EgressProxy._send_all`)
        self.last = [loop.time()]
        self.done: asyncio.Future[None] = loop.create_future()
        self._dirs: list[_Splicer] = []
        self._started = 0
        self._timer: asyncio.TimerHandle | None = loop.call_at(self.last[0] + idle,
                                                               self._check_idle)

    def start(self, direction: _Splicer | None) -> None:
        """Start one direction (None: one that is done before it started)."""
        self._started += 1
        if direction is not None:
            self._dirs.append(direction)
            direction.start()
        else:
            self.finished()

    def _check_idle(self) -> None:
        self._timer = None
        if self.done.done():
            return
        if self.loop.time() - self.last[0] >= self.idle:
            self.fail(TimeoutError("tunnel idle"))
        else:
            self._timer = self.loop.call_at(self.last[0] + self.idle, self._check_idle)

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        for d in self._dirs:
            d.stop()

    def finished(self) -> None:
        """A direction reached EOF (and half-closed its destination)."""
        if self._started == 2 and all(d.eof for d in self._dirs) and not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        """Stop both directions: no callback of this tunnel runs afterwards, its pipes are
        closed; the sockets are the caller's."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for d in self._dirs:
            d.stop()
        if not self.done.done():
            self.done.cancel()
        elif not self.done.cancelled():
            self.done.exception()           # retrieved


@final
class _Splicer:
    """One direction of a tunnel, ``src`` to ``dst`` until EOF, then ``dst`` half-closed:
    splice(2) through a pipe of its own (the bytes never enter this process), or
    recv_into/send through one buffer if the kernel refuses splice for these sockets.

    Driven by event-loop callbacks, not a coroutine: a reader callback on ``src`` stays
    registered while the direction waits for input (no add/remove per chunk), a writer
    callback on ``dst`` only while the destination is full; each wakeup moves at most
    :data:`_MOVES_PER_WAKEUP` chunks, then yields to the loop."""

    def __init__(self, tunnel: _Tunnel, src: socket.socket, dst: socket.socket) -> None:
        self._t = tunnel
        self._loop = tunnel.loop
        self._src, self._dst = src, dst
        self._sfd, self._dfd = src.fileno(), dst.fileno()
        self._pipe: tuple[int, int] | None = None
        self._buf: memoryview | None = None
        self._pending = 0                     # bytes in the pipe (or buffer) not yet sent
        self._off = 0                         # (buffer mode) where the unsent bytes start
        self._moves = 0
        self._reading = False
        self._writing = False
        self._soon: asyncio.Handle | None = None
        self.eof = False
        self.stopped = False

    def start(self) -> None:
        try:
            rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self._buf = memoryview(bytearray(_CHUNK))
        else:
            self._pipe = (rfd, wfd)
            with contextlib.suppress(OSError):
                fcntl.fcntl(wfd, _F_SETPIPE_SZ, _PIPE_SIZE)
        self._run()

    def stop(self) -> None:
        """Unregister every callback and close the pipe (idempotent)."""
        if self.stopped:
            return
        self.stopped = True
        self._watch(read=False, write=False)
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    def _watch(self, *, read: bool, write: bool) -> None:
        if read != self._reading:
            if read:
                self._loop.add_reader(self._sfd, self._run)
            else:
                self._loop.remove_reader(self._sfd)
            self._reading = read
        if write != self._writing:
            if write:
                self._loop.add_writer(self._dfd, self._run)
            else:
                self._loop.remove_writer(self._dfd)
            self._writing = write

    def _run(self) -> None:
        self._soon = None
        if self.stopped:
            return
        try:
            if self._pipe is not None:
                self._splice()
            else:
                self._plain()
        except OSError as e:
            self._t.fail(e)
        except Exception as e:               # a bug: end the tunnel, never the loop
            self._t.fail(e)

    def _splice(self) -> None:
        assert self._pipe is not None
        rfd, wfd = self._pipe
        for _ in range(_MOVES_PER_WAKEUP):
            if not self._pending:
                n = self._splice_once(self._sfd, wfd, _PIPE_SIZE, reading=True)
                if n is None:
                    return
                if not n:
                    self._end()
                    return
                self._pending = n
            n = self._splice_once(rfd, self._dfd, self._pending, reading=False)
            if n is None:
                return
            self._pending -= n
            self._t.last[0] = self._loop.time()
            self._moves += 1
        self._again()

    def _splice_once(self, src: int, dst: int, n: int, *, reading: bool) -> int | None:
        """One splice(2) of at most ``n`` bytes (socket to pipe when ``reading``, pipe to
        socket else); None when it would block (the wait is armed) or splice is refused
        for these sockets before anything moved (the tunnel goes on with recv/send)."""
        try:
            return os.splice(src, dst, n, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            self._watch(read=reading, write=not reading)
            return None
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.ENOSYS) and self._moves == 0:
                self._to_plain()
                return None
            raise

    def _to_plain(self) -> None:
        """splice refused for these sockets: what the pipe holds moves to the buffer,
        then recv/send."""
        assert self._pipe is not None
        rfd, _wfd = self._pipe
        data = b""
        while len(data) < self._pending:
            data += os.read(rfd, self._pending - len(data))
        for fd in self._pipe:
            os.close(fd)
        self._pipe = None
        buf = bytearray(max(_CHUNK, len(data)))
        buf[:len(data)] = data
        self._buf = memoryview(buf)
        self._pending, self._off = len(data), 0
        self._plain()

    def _plain(self) -> None:
        assert self._buf is not None
        buf = self._buf
        for _ in range(_MOVES_PER_WAKEUP):
            if not self._pending:
                try:
                    n = self._src.recv_into(buf)
                except BlockingIOError:
                    self._watch(read=True, write=False)
                    return
                if not n:
                    self._end()
                    return
                self._pending, self._off = n, 0
            try:
                n = self._dst.send(buf[self._off:self._off + self._pending])
            except BlockingIOError:
                self._watch(read=False, write=True)
                return
            self._pending -= n
            self._off += n
            self._t.last[0] = self._loop.time()
            self._moves += 1
        self._again()

    def _again(self) -> None:
        """Budget used with bytes still flowing: run again after the loop's other ready
        callbacks (the reader stays registered; a duplicate wakeup is harmless)."""
        if self._soon is None:
            self._soon = self._loop.call_soon(self._run)

    def _end(self) -> None:
        self._watch(read=False, write=False)
        self._dst.shutdown(socket.SHUT_WR)
        self.eof = True
        self.stop()
        self._t.finished()


@dataclass(slots=True)
class _SockReader:
    """``readexactly`` on a non-blocking socket, starting with bytes already read."""

    sock: socket.socket
    buf: bytes

    async def readexactly(self, n: int) -> bytes:
        loop = asyncio.get_running_loop()
        while len(self.buf) < n:
            more = await loop.sock_recv(self.sock, max(n - len(self.buf), _CHUNK))
            if not more:
                raise asyncio.IncompleteReadError(self.buf, n)
            self.buf += more
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def take(self) -> bytes:
        """The bytes read ahead and not returned yet."""
        out, self.buf = self.buf, b""
        return out


@dataclass(slots=True)
class _PrefixedReader:
    """A StreamReader that first returns ``prefix`` (for bytes already read)."""

    prefix: bytes
    inner: _ExactReader
    _pos: int = field(default=0)

    async def readexactly(self, n: int) -> bytes:
        take = self.prefix[self._pos:self._pos + n]
        self._pos += len(take)
        if len(take) == n:
            return take
        return take + await self.inner.readexactly(n - len(take))
