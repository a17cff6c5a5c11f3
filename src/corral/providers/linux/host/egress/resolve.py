"""Name resolution on the host, in threads of the proxies' own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import socket
from collections.abc import Awaitable, Callable, Sequence

from corral.providers.linux.host.egress.limits import DNS_THREADS

__all__ = ["Resolver", "system_resolver"]

#: ``resolver(host, port)`` -> the addresses ``host`` resolves to (strings)
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

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


