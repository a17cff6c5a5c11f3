"""Destinations that are this host itself, and those no policy opens (:class:`NeverReach`).

Not pure: whether an address is one of the host's own interfaces is asked of the
kernel (a UDP socket "connected" to it, which sends nothing).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import final

from corral.providers.linux.host.egress.policy import (
    EgressDenied,
    EgressPolicy,
    IPAddress,
)

__all__ = ["NeverReach", "check_not_host", "is_host_address"]


def is_host_address(ip: IPAddress) -> bool:
    """Whether ``ip`` is an address of this host's own interfaces: a UDP socket
    "connected" to it (which sends nothing) gets it as its own source address."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect((str(ip), 9))
            return bool(s.getsockname()[0] == str(ip))
    except OSError:
        return False


def check_not_host(policy: EgressPolicy, ip: IPAddress, port: int) -> None:
    """Refuse an address of the host itself (outside loopback, which the range table
    covers) unless the policy lists that one address: a public address of the host would
    reach the services it binds to 0.0.0.0 from inside (a ``corral serve``, a database
    firewalled from outside), and a listed range (``10.0.0.0/8``) should not include
    the host that runs the sandbox."""
    if ip.is_loopback or not is_host_address(ip):
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
                                         or is_host_address(ip)):
            raise EgressDenied("not-allowed", f"{ip} port {port} is {self.what}: never "
                               "reachable from a sandbox, whatever the policy lists")


def _unmapped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip

