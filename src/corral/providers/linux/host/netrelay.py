"""A strict sandbox's way out and way in: its egress proxy and its preview URLs.

**Egress** (network ``allowlist`` / ``unrestricted``). The sandbox keeps its own
network namespace with loopback only: no interface, no route out. At creation,
before any command runs, the host asks the sandbox's agent for a fresh, unbound
TCP socket (``op: socket``): a socket belongs for life to the namespace it was
made in, so the host binds it to ``127.0.0.1:3128`` *inside the sandbox's
namespace*, listens, and serves the :class:`~corral.providers.linux.host.egress.EgressProxy`
on it (``add_listener``). A connection from inside to 127.0.0.1:3128 lands
directly in the host's proxy: no relay process in the sandbox, nothing to kill
or starve there, the same for a root or non-root sandbox. ``HTTP_PROXY``,
``HTTPS_PROXY`` (HTTP CONNECT and plain HTTP) and ``ALL_PROXY`` (SOCKS5 with
host names, ``socks5h://``) and their lower-case forms point there. A program that
ignores them has no route and gets no connection at all. The proxy decides on
the host: names resolved on the host, ranges checked, SNI checked (see
the ``egress`` package and docs/network.md).

**Preview URLs** (``expose``). The host listens on its own loopback
(``127.0.0.1``, a free port), where every local user can connect, so each URL has
its own random token (:class:`~corral.core.preview.PreviewURL`): a connection must
present it first (an HTTP request header ``X-Corral-Preview-Token``, or a
``CORRAL-PREVIEW-TOKEN`` line for other protocols), read within a deadline and a
size bound, or it gets 403 and is closed before the agent is asked for anything.
Then the host asks the agent for another fresh socket, connects it to
``127.0.0.1:PORT`` (the sandbox's loopback: the socket lives there), sends what the
client sent with the token removed, and copies bytes both ways. Every listener and
connection is closed at ``unexpose`` or destroy.

Sockets from the agent are checked before use (a socket, ``AF_INET``, TCP, not
bound, not connected, not listening): the agent is pid 1 of a sandbox and is
read as hostile like every frame from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import re
import secrets
import socket
import ssl
import stat
from collections.abc import Awaitable, Callable
from typing import Final, final

from corral.core.errors import ConfigInvalidError, ProviderError
from corral.core.preview import PREVIEW_PREAMBLE, PreviewURL
from corral.core.result import NetworkDenial
from corral.core.spec import NetworkPolicy
from corral.providers.linux.host.egress import EgressPolicy, EgressProxy, NeverReach, Resolver
from corral.providers.linux.host.egress.forward import first_error
from corral.providers.linux.host.egress.policy import (
    MAX_LOOPBACK_RELAYS,
    PROXY_HOST,
    PROXY_PORT,
    compile_network,
    loopback_relays,
)
from corral.providers.linux.host.egress.tasks import TaskOwner

__all__ = ["MAX_LOOPBACK_RELAYS", "PROXY_HOST", "PROXY_PORT", "SandboxNetwork",
           "check_agent_socket", "check_entries", "loopback_relays", "proxy_env"]

#: preview URLs open at once per sandbox, at most
MAX_EXPOSED: Final = 16
#: connections through one preview URL at once, at most (more wait in the backlog)
MAX_PREVIEW_CONNECTIONS: Final = 64
_CHUNK: Final = 256 * 1024
#: a preview connection's token: the head (or preamble line) it comes in, at most, and
#: the time to send it; connections not yet past the token check at once, per URL
PREVIEW_HEAD_MAX: Final = 16 * 1024
PREVIEW_HEAD_TIMEOUT_S: Final = 10.0
MAX_PREVIEW_PENDING: Final = 64
#: the token's header line (with the CRLF before it: every header line has one)
_TOKEN_LINE: Final = re.compile(
    rb"(?i)\r\nx-corral-preview-token[ \t]*:[ \t]*([^\r\n]*?)[ \t]*(?=\r\n)")
_FORBIDDEN: Final = (b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: 59\r\nConnection: close\r\n\r\n"
                     b"corral preview: this URL needs its X-Corral-Preview-Token\n")

#: asks the sandbox's agent for one fresh unbound TCP socket of its namespace (its fd)
NewSocket = Callable[[], Awaitable[int]]


def check_entries(policy: NetworkPolicy) -> None:
    """Raise ConfigInvalidError (``network.hosts``) for an entry of ``policy`` the egress
    proxy cannot read: :func:`~corral.providers.linux.host.egress.compile_network`, its
    result dropped (the provider's plan keeps it: ``SandboxPlan.egress``)."""
    compile_network(policy)


def proxy_env(ca_bundle: str | None = None) -> dict[str, str]:
    """The variables that point a sandbox's programs at its egress proxy (and, with
    ``ca_bundle``, at the CA bundle that trusts the proxy's per-sandbox CA).

    ``NO_PROXY`` lists the sandbox's own loopback: a client talking to a server
    inside the sandbox must not go through the proxy (which would refuse
    loopback anyway); it opens nothing, since loopback is all the namespace has.
    """
    http = f"http://{PROXY_HOST}:{PROXY_PORT}"
    socks = f"socks5h://{PROXY_HOST}:{PROXY_PORT}"
    env = {"HTTP_PROXY": http, "HTTPS_PROXY": http, "ALL_PROXY": socks,
           "NO_PROXY": "localhost,127.0.0.1,::1"}
    env.update({k.lower(): v for k, v in env.items()})
    if ca_bundle is not None:
        for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS",
                     "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"):
            env[name] = ca_bundle
    return env


def check_agent_socket(fd: int) -> socket.socket:
    """``fd`` (from the agent) as a socket object, if it is what was asked for: an
    ``AF_INET`` TCP socket, not bound, not connected, not listening. Otherwise it is
    closed and ProviderError raised."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ProviderError("the sandbox agent passed a descriptor that is not a socket")
        sock = socket.socket(fileno=fd)
    except BaseException:
        os.close(fd)
        raise
    try:
        ok = (sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
              and sock.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == socket.IPPROTO_TCP
              and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0
              and sock.getsockname()[1] == 0)
        if ok:
            try:
                sock.getpeername()
                ok = False
            except OSError:
                pass
        if not ok:
            raise ProviderError("the sandbox agent passed a socket that is not a fresh "
                                "unbound TCP/IPv4 socket")
    except BaseException:
        sock.close()
        raise
    return sock


@final
class SandboxNetwork:
    """One sandbox's egress proxy (when its policy is not ``none``) and preview URLs.

    ``new_socket`` asks the sandbox's agent for a fresh socket of its namespace.
    ``egress``: ``policy`` as the proxy reads it, parsed once when the sandbox's plan was
    made (``SandboxPlan.egress``); parsed here only when not given.
    ``resolver`` replaces the host's resolver (tests map names to loopback).

    Every preview connection is a task of the network's own task group
    (:class:`~corral.providers.linux.host.egress.tasks.TaskOwner`), cancelled and awaited
    by :meth:`unexpose` (its port's) and :meth:`aclose` (all).
    """

    def __init__(self, policy: NetworkPolicy, new_socket: NewSocket, *,
                 egress: EgressPolicy | None = None,
                 resolver: Resolver | None = None,
                 upstream_ssl_context: ssl.SSLContext | None = None,
                 never: NeverReach | None = None) -> None:
        self.policy = policy
        self.egress = egress if egress is not None or policy.kind == "none" \
            else compile_network(policy)
        self._never = never
        self._new_socket = new_socket
        self._resolver = resolver
        self._upstream_ssl = upstream_ssl_context
        self.proxy: EgressProxy | None = None
        #: port inside -> (host listener, its open connections)
        self._exposed: dict[int, tuple[asyncio.Server, set[asyncio.Task[None]]]] = {}
        self._tokens: dict[int, str] = {}  # port inside -> its URL's token
        self._closed = False
        self._owner = TaskOwner("preview URLs")
        self.ca_bundle_pem: bytes | None = None

    async def start(self) -> None:
        """Serve the egress proxy inside the sandbox on 127.0.0.1:3128 (policy not
        ``none``); nothing to do for ``none``."""
        if self.egress is None:
            return
        proxy = EgressProxy(self.egress, resolver=self._resolver,
                            upstream_ssl_context=self._upstream_ssl, never=self._never)
        try:
            sock = check_agent_socket(await self._new_socket())
            try:
                sock.bind((PROXY_HOST, PROXY_PORT))
                sock.listen(128)
            except BaseException:
                sock.close()
                raise
            await proxy.add_listener(sock)
            for host, port in loopback_relays(self.egress):
                relay = check_agent_socket(await self._new_socket())
                try:
                    relay.bind((host, port))
                    relay.listen(128)
                except BaseException:
                    relay.close()
                    raise
                await proxy.add_relay(relay, host, port)
        except BaseException:
            await proxy.aclose()
            raise
        self.proxy = proxy
        #: the proxy's per-sandbox CA (PEM), when the policy has secret headers
        self.ca_bundle_pem = proxy.ca_bundle_pem

    # -- the policy at run time ---------------------------------------------------------
    def _need_proxy(self) -> EgressProxy:
        if self.proxy is None:
            raise ConfigInvalidError(
                "network", "the sandbox's network policy is 'none': it has no egress proxy "
                "whose allowlist could change; create it with 'allowlist' or 'unrestricted'")
        return self.proxy

    def allow(self, entry: str) -> None:
        self._need_proxy().allow(entry)

    def revoke(self, entry: str) -> None:
        self._need_proxy().revoke(entry)

    @property
    def entries(self) -> tuple[str, ...]:
        return () if self.proxy is None else self.proxy.policy.entries

    def denial_mark(self) -> int:
        """How many denials were recorded so far (for :meth:`denials_since`)."""
        if self.proxy is None:
            return 0
        return self.proxy.denials_dropped + len(self.proxy.denials())

    def denials_since(self, mark: int) -> tuple[NetworkDenial, ...]:
        """The denials recorded after :meth:`denial_mark` returned ``mark`` (those
        still kept: the proxy keeps the most recent 1000)."""
        if self.proxy is None:
            return ()
        kept = self.proxy.denials()
        new = self.denial_mark() - mark
        if new <= 0:
            return ()
        return tuple(NetworkDenial(d.host, d.port, d.kind, d.reason)
                     for d in kept[max(len(kept) - new, 0):])

    def all_denials(self) -> tuple[NetworkDenial, ...]:
        """Every denial still kept (the most recent 1000), oldest first."""
        if self.proxy is None:
            return ()
        return tuple(NetworkDenial(d.host, d.port, d.kind, d.reason)
                     for d in self.proxy.denials())

    # -- preview URLs -------------------------------------------------------------------
    async def expose(self, port: int) -> PreviewURL:
        """A URL on the host's loopback forwarding to ``port`` on the sandbox's loopback,
        for connections that present the URL's token first (see module doc)."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ConfigInvalidError("port", f"not a TCP port: {port!r}")
        if self._closed:
            raise ProviderError("the sandbox was destroyed")
        if port == PROXY_PORT and self.proxy is not None:
            # the URL would hand the sandbox's egress (its allowlist, its secrets) to
            # whoever holds the token: the caller has the policy already, nobody needs it
            raise ConfigInvalidError("port", f"port {PROXY_PORT} is the sandbox's egress "
                                     "proxy, not exposed")
        if port in self._exposed:
            return self._preview(port)
        if len(self._exposed) >= MAX_EXPOSED:
            raise ConfigInvalidError("port", f"at most {MAX_EXPOSED} ports exposed at once")
        conns: set[asyncio.Task[None]] = set()
        gate = asyncio.Semaphore(MAX_PREVIEW_CONNECTIONS)
        token = secrets.token_urlsafe(32)
        pending = [0]

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                if pending[0] >= MAX_PREVIEW_PENDING:
                    return  # too many connections without a token yet: closed unread
                pending[0] += 1
                try:
                    first = await _admit(reader, writer, token)
                finally:
                    pending[0] -= 1
                if first is None:
                    return
                async with gate:
                    await self._forward(port, first, reader, writer)
            except (OSError, ProviderError, asyncio.IncompleteReadError, TimeoutError):
                pass
            finally:
                writer.transport.abort()

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # a plain callback, so the server makes no task: the connection is a task of
            # the network's group (closed unread once the sandbox is being destroyed)
            task = self._owner.spawn(serve(reader, writer))
            if task is None:
                writer.transport.abort()
                return
            conns.add(task)
            task.add_done_callback(conns.discard)

        await self._owner.open()
        server = await asyncio.start_server(accept, host="127.0.0.1", port=0,
                                            limit=_CHUNK)
        self._exposed[port] = (server, conns)
        self._tokens[port] = token
        return self._preview(port)

    def _preview(self, port: int) -> PreviewURL:
        return PreviewURL(self._url(self._exposed[port][0]), self._tokens[port], port)

    @staticmethod
    def _url(server: asyncio.Server) -> str:
        host, hport = server.sockets[0].getsockname()[:2]
        return f"http://{host}:{hport}/"

    def exposed(self) -> dict[int, PreviewURL]:
        """Ports exposed now -> their URLs (with their tokens)."""
        return {p: self._preview(p) for p in self._exposed}

    async def unexpose(self, port: int) -> None:
        """Stop the preview URL of ``port`` and cut its open connections (idempotent)."""
        got = self._exposed.pop(port, None)
        self._tokens.pop(port, None)
        if got is None:
            return
        server, conns = got
        server.close()
        for t in list(conns):
            t.cancel()
        if conns:   # the group owns them; this waits for their end, never cancels them
            await asyncio.wait(list(conns))
        await server.wait_closed()

    async def _forward(self, port: int, first: bytes, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        sock = check_agent_socket(await self._new_socket())
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(10):
                await loop.sock_connect(sock, ("127.0.0.1", port))
        except BaseException:
            sock.close()
            raise
        in_r, in_w = await asyncio.open_connection(sock=sock, limit=_CHUNK)
        try:
            if first:
                in_w.write(first)
                await in_w.drain()
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(_copy(reader, in_w))
                    group.create_task(_copy(in_r, writer))
            except ExceptionGroup as eg:
                raise first_error(eg) from None
        finally:
            in_w.transport.abort()

    async def aclose(self) -> None:
        """Close the proxy (its listener inside the sandbox and every tunnel) and every
        preview URL. Idempotent."""
        self._closed = True
        for port in list(self._exposed):
            await self.unexpose(port)
        await self._owner.aclose()
        if self.proxy is not None:
            await self.proxy.aclose()


def _head_complete(buf: bytes) -> bool:
    """Whether ``buf`` holds a whole preamble line, or else a whole HTTP head."""
    if PREVIEW_PREAMBLE.startswith(buf[:len(PREVIEW_PREAMBLE)]):  # the preamble so far
        return len(buf) > len(PREVIEW_PREAMBLE) and b"\r\n" in buf
    return b"\r\n\r\n" in buf


async def _admit(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 token: str) -> bytes | None:
    """Read what a preview connection sends first, up to its token: the bytes to send
    on (token removed), or None when it is refused (403 for what looks like HTTP, else
    closed). Nothing is asked of the sandbox before this returns bytes."""
    buf = b""
    async with asyncio.timeout(PREVIEW_HEAD_TIMEOUT_S):
        while True:
            if _head_complete(buf) or len(buf) >= PREVIEW_HEAD_MAX:
                break
            chunk = await reader.read(PREVIEW_HEAD_MAX - len(buf))
            if not chunk:
                return None
            buf += chunk
    want = token.encode()
    if buf.startswith(PREVIEW_PREAMBLE):
        line, sep, rest = buf.partition(b"\r\n")
        if sep and hmac.compare_digest(line[len(PREVIEW_PREAMBLE):], want):
            return rest
        return None  # not HTTP: no answer, closed
    end = buf.find(b"\r\n\r\n")
    if end >= 0:
        head, rest = buf[:end + 2], buf[end + 2:]
        got = _TOKEN_LINE.findall(head)
        if len(got) == 1 and hmac.compare_digest(got[0], want):
            return _TOKEN_LINE.sub(b"", head, count=1) + rest
    writer.write(_FORBIDDEN)
    with contextlib.suppress(OSError):
        async with asyncio.timeout(1.0):
            await writer.drain()
    return None


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Bytes from ``src`` to ``dst`` until EOF, then half-close ``dst``."""
    try:
        while data := await src.read(_CHUNK):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except (OSError, RuntimeError):
        dst.transport.abort()
