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
  (``ca``, the ``secrets`` extra), each HTTP/1.1 request gets the headers,
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

The package's parts, each importable alone:

========== ==============================================================================
policy     the pure policy: entries, rules, :class:`EgressPolicy`, the range table, and
           :func:`compile_network` (a spec's network policy parsed once, at plan time)
http       sans-I/O HTTP/1.1: request heads parsed by h11 behind strict framing checks
tls        sans-I/O TLS: the ClientHello's SNI
never      this host's own addresses and :class:`NeverReach`
resolve    name resolution on the host (:func:`system_resolver`)
limits     :class:`EgressLimits` and the process-wide descriptor budget
proxy      :class:`EgressProxy`: listeners, SOCKS5, CONNECT, decisions, tunnels
forward    HTTP forwarding: plain proxy requests and intercepted sessions (secrets)
splice     the splice(2) engine that moves a decided tunnel's bytes
tasks      :class:`~.tasks.TaskOwner`, the task group every connection's task is in
ca         the per-proxy CA for hosts with secrets (the ``secrets`` extra)
========== ==============================================================================
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.providers.linux.host.egress.http import HttpHead, parse_http_head
    from corral.providers.linux.host.egress.limits import (
        DNS_THREADS,
        FD_RESERVE,
        FDS_PER_CONNECTION,
        MAX_CLIENT_HELLO,
        MAX_HEADER,
        MAX_LOOKUPS,
        EgressLimits,
    )
    from corral.providers.linux.host.egress.never import NeverReach
    from corral.providers.linux.host.egress.policy import (
        SPECIAL_RANGES,
        Denial,
        EgressDenied,
        EgressPolicy,
        Rule,
        SecretHeader,
        classify_address,
        compile_network,
        normalize_host,
        parse_entry,
    )
    from corral.providers.linux.host.egress.proxy import EgressProxy
    from corral.providers.linux.host.egress.resolve import Resolver, system_resolver
    from corral.providers.linux.host.egress.tls import parse_client_hello

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
    "compile_network",
    "normalize_host",
    "parse_client_hello",
    "parse_entry",
    "parse_http_head",
    "system_resolver",
]

#: where each public name lives: the package loads a part on first use, so importing the
#: pure ``policy`` (as the plan does) loads neither asyncio nor ssl nor h11
_WHERE: dict[str, str] = {
    "DNS_THREADS": "limits", "FDS_PER_CONNECTION": "limits", "FD_RESERVE": "limits",
    "MAX_CLIENT_HELLO": "limits", "MAX_LOOKUPS": "limits", "MAX_HEADER": "limits",
    "EgressLimits": "limits", "NeverReach": "never", "SPECIAL_RANGES": "policy",
    "Denial": "policy", "EgressDenied": "policy", "EgressPolicy": "policy", "Rule": "policy",
    "SecretHeader": "policy", "classify_address": "policy", "compile_network": "policy",
    "normalize_host": "policy", "parse_entry": "policy", "EgressProxy": "proxy",
    "HttpHead": "http", "parse_http_head": "http", "Resolver": "resolve",
    "system_resolver": "resolve", "parse_client_hello": "tls",
}


def __getattr__(name: str) -> object:
    part = _WHERE.get(name)
    if part is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{part}"), name)
    globals()[name] = value
    return value
