"""The proxy's bounds: every wait, every buffer and every count has one.

Also the process-wide descriptor budget every proxy of this process shares
(:func:`take_fds`): a connection that would pass it is closed unread.
"""

from __future__ import annotations

import resource
import threading
from dataclasses import dataclass
from typing import Final

__all__ = ["CHUNK", "DNS_THREADS", "FDS_PER_CONNECTION", "FD_RESERVE", "MAX_ADDRESSES",
           "MAX_CLIENT_HELLO", "MAX_HEADER", "MAX_LOOKUPS", "EgressLimits", "take_fds"]

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
#: the read size of every copy loop (and the least StreamReader limit)
CHUNK: Final = 64 * 1024
TLS_PORTS: Final = frozenset({443})
#: descriptors one proxied connection holds at most: the client's socket (and its dup
#: while it is taken over), the upstream's, and a pipe per direction
FDS_PER_CONNECTION: Final = 7
#: descriptors of the host process that proxies never take (its other work needs them)
FD_RESERVE: Final = 256
#: descriptors held by the connections of every proxy of this process (the estimate
#: FDS_PER_CONNECTION per connection); proxies may run on event loops of several threads
FDS_IN_USE: list[int] = [0]
FDS_LOCK: Final = threading.Lock()


def take_fds(cost: int, own: int) -> bool:
    """Count ``cost`` more descriptors for a proxy holding ``own`` (a negative ``cost``
    gives them back); False, counting nothing, when that would pass the process's
    budget or give the proxy more than half of it."""
    with FDS_LOCK:
        if cost > 0:
            budget = _fd_budget()
            if FDS_IN_USE[0] + cost > budget or own + cost > budget // 2:
                return False
        FDS_IN_USE[0] += cost
        return True


def _fd_budget() -> int:
    """The descriptors every proxy of this process may hold together: the process's
    RLIMIT_NOFILE (soft) less :data:`FD_RESERVE`, read at each connection (a host may
    raise its limit while running)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft > 1 << 24:
        soft = 1 << 24
    return max(soft - FD_RESERVE, 0)


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
    tls_ports: frozenset[int] = TLS_PORTS


