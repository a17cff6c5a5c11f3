"""The asyncio proxy: HTTP CONNECT, plain HTTP and SOCKS5 on the same listeners.

Each connection is a task of the proxy's own task group (:class:`~.tasks.TaskOwner`):
read the request (bounded), decide it by the policy of the moment (a name checked
before it is resolved, each address after; see ``policy.py`` and ``never.py``),
connect by address, then hand the tunnel to the splice engine (``splice.py``), or
forward HTTP (``forward.py``) for a plain proxy request or a host with secrets.
Whatever is refused is answered (an HTTP status with a one-line reason, a SOCKS5 reply
code, a TLS alert) and recorded as a :class:`~.policy.Denial`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import ipaddress
import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, final

from corral.core.errors import ConfigInvalidError
from corral.providers.linux.host.egress.forward import forward_plain, intercept
from corral.providers.linux.host.egress.http import (
    HTTP_STATUS,
    BadUpstream,
    check_absolute,
    clear_secrets,
    http_reply,
    parse_http_head,
    split_authority,
)
from corral.providers.linux.host.egress.limits import (
    CHUNK,
    FDS_PER_CONNECTION,
    MAX_ADDRESSES,
    MAX_LOOKUPS,
    EgressLimits,
    take_fds,
)
from corral.providers.linux.host.egress.never import NeverReach, check_not_host
from corral.providers.linux.host.egress.policy import (
    Denial,
    DenialKind,
    EgressDenied,
    EgressPolicy,
    Target,
    UpstreamError,
    normalize_host,
    plain_ip,
)
from corral.providers.linux.host.egress.resolve import Resolver, system_resolver
from corral.providers.linux.host.egress.splice import (
    SockReader,
    Splicer,
    Tunnel,
    detach,
    send_all,
    shutdown,
    wait_io,
)
from corral.providers.linux.host.egress.tasks import TaskOwner
from corral.providers.linux.host.egress.tls import (
    TLS_ALERT_ACCESS_DENIED,
    TLS_OTHER_RECORDS,
    ExactReader,
    PrefixedReader,
    parse_client_hello,
    read_client_hello,
)

if TYPE_CHECKING:
    from corral.providers.linux.host.egress.ca import EgressCA

__all__ = ["EgressProxy"]

_log = logging.getLogger("corral.providers.linux.host.egress")

_SOCKS_OK: Final = b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00"
_SOCKS_CODE: Final[dict[DenialKind, int]] = {
    "not-allowed": 0x02, "non-public-address": 0x02, "sni-mismatch": 0x02,
    "bad-request": 0x01, "unresolvable": 0x04, "too-large": 0x01, "timeout": 0x01,
    "busy": 0x01, "unsupported": 0x07,
}


def _printable(text: str) -> str:
    """``text`` with every non-printable character (controls, escapes, line ends, bidi
    overrides) written as a Python escape; ``text`` itself when it has none."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


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
        #: owns every connection's task and every lookup's (see tasks.py)
        self._owner = TaskOwner("egress proxy")
        self._writers: set[asyncio.StreamWriter] = set()
        self.path: str | None = None
        self.active = 0
        self._errors = 0
        self._lookup_slots = asyncio.Semaphore(MAX_LOOKUPS)
        #: descriptors this proxy's connections may hold (FDS_PER_CONNECTION each)
        self._fds = 0

    # ---------------------------------------------------------------- public

    @property
    def policy(self) -> EgressPolicy:
        """The policy new connections are decided by; assign to change it. A policy with
        secrets makes the per-proxy CA on first use (the ``secrets`` extra)."""
        return self._policy

    @policy.setter
    def policy(self, policy: EgressPolicy) -> None:
        if policy.has_secrets and self._ca is None:
            from corral.providers.linux.host.egress.ca import EgressCA  # the secrets extra
            self._ca = EgressCA(self._sni_mismatch)
        self._policy = policy

    @property
    def internal_errors(self) -> int:
        """Connections and lookups ended by an unexpected exception (a bug; logged):
        tests want 0."""
        return self._errors + self._owner.errors

    @property
    def ca_bundle_pem(self) -> bytes | None:
        """The per-proxy CA certificate (PEM) a sandbox must trust for the hosts whose
        traffic carries secrets; None while no policy of this proxy had secrets."""
        return None if self._ca is None else self._ca.ca_pem

    async def start(self, path: str) -> None:
        """Listen on the unix socket ``path`` (created here; it must not exist)."""
        await self._owner.open()
        server = await asyncio.start_unix_server(
            self._accept, path=path, limit=max(self.limits.header_bytes, CHUNK))
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
        await self._owner.open()
        server = await asyncio.start_server(
            self._accept, sock=sock, limit=max(self.limits.header_bytes, CHUNK))
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
        await self._owner.open()
        server = await asyncio.start_server(
            functools.partial(self._accept, relay=(host, port)), sock=sock,
            limit=max(self.limits.header_bytes, CHUNK))
        self._servers.append(server)

    async def aclose(self) -> None:
        """Stop listening (closing every listener), close every connection and wait until
        every task of the proxy (connections, lookups) has ended."""
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        for w in list(self._writers):
            w.transport.abort()
        await self._owner.aclose()
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
        self.record(host, port, EgressDenied(
            "sni-mismatch", f"TLS SNI {sni!r} does not match the tunnel host {host!r}"))

    def record(self, host: str, port: int, err: EgressDenied) -> None:
        """Keep a denial (bounded: the oldest are dropped and counted)."""
        if len(self._denials) == self._denials.maxlen:
            self.denials_dropped += 1
        # the host is as the sandbox sent it (a SOCKS5 name may hold any character) and
        # `corral run` prints denials on the operator's terminal: escapes and line ends
        # are shown escaped, never as themselves
        self._denials.append(Denial(_printable(host[:255]), port, err.kind,
                                    _printable(err.reason), time.time()))

    def hold(self, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)

    def release(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)

    def server_context(self, host: str, port: int) -> ssl.SSLContext:
        assert self._ca is not None
        return self._ca.server_context(host, port)

    def upstream_context(self) -> ssl.SSLContext:
        if self._upstream_ssl is None:
            self._upstream_ssl = ssl.create_default_context()
            self._upstream_ssl.set_alpn_protocols(["http/1.1"])
        return self._upstream_ssl

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                relay: tuple[str, int] | None = None) -> None:
        """Every listener's callback: a plain function, so the server makes no task; the
        connection becomes a task of the proxy's own group (closed unread when the proxy
        is closing)."""
        if self._owner.spawn(self._connection(reader, writer, relay)) is None:
            writer.transport.abort()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          relay: tuple[str, int] | None) -> None:
        self._writers.add(writer)
        busy = self.active >= self.limits.max_connections
        # the host process's descriptors are shared by every proxy (and everything else
        # it does): a connection that would take this proxy past half of what the
        # process may spend on proxies, or all proxies past it, is closed unread
        cost = 1 if busy else FDS_PER_CONNECTION
        over = not take_fds(cost, self._fds)
        if not over:
            self._fds += cost
        if not busy and not over:
            self.active += 1
        try:
            if over:
                self.record("", 0, EgressDenied(
                    "busy", "too many connections for the host's descriptor limit"))
                return
            if busy and len(self._owner) > 2 * self.limits.max_connections:
                self.record("", 0, EgressDenied("busy", "too many connections"))
                return
            if relay is not None:
                await self._relay(relay, reader, writer, busy)
            else:
                await self._serve(reader, writer, busy)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                EgressDenied, BadUpstream):
            pass
        except Exception:
            # a bug, not the client's doing: this connection ends, the proxy goes on
            self._errors += 1
            _log.exception("egress proxy: internal error on a connection")
        finally:
            if not busy and not over:
                self.active -= 1
            try:
                await shutdown(writer, self.limits.idle_timeout_s)
            finally:        # even when cancelled in there (aclose): the budget never leaks
                self._writers.discard(writer)
                if not over:
                    self._fds -= cost
                    take_fds(-cost, 0)

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
            self.record("", 0, err)
            writer.write(b"\x05\xff" if socks else http_reply(503, "Service Unavailable",
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
            self.record(host, port, EgressDenied("busy", "too many connections"))
            return
        try:
            target = await self._decide(self.policy, host, port)
        except EgressDenied as e:
            self.record(host, port, e)
            return
        try:
            usock = await self.connect(target)
        except UpstreamError:
            return
        csock: socket.socket | None = None
        try:
            csock, buffered = await detach(reader, writer)
            await self._pump(target, csock, usock, buffered, sniff=False)
        finally:
            usock.close()
            if csock is not None:
                csock.close()

    async def _lookup(self, key: str, port: int) -> Sequence[str]:
        """``resolver(key, port)`` in one of this proxy's :data:`MAX_LOOKUPS` slots, as a
        task of the proxy's group: a caller that stops waiting (its timeout) leaves the
        lookup running to its end, and only then is the slot free again."""
        await self._lookup_slots.acquire()
        task = self._owner.spawn(self._resolve(key, port))
        if task is None:
            self._lookup_slots.release()
            raise OSError("the proxy is closing")
        got = await asyncio.shield(task)
        if isinstance(got, BaseException):
            raise got
        if got is None:
            raise OSError("the lookup failed")
        return got

    async def _resolve(self, key: str, port: int) -> Sequence[str] | Exception:
        """One lookup; its failure is its value (a task that raised would end the group)."""
        try:
            return await self._resolver(key, port)
        except Exception as e:
            return e
        finally:
            self._lookup_slots.release()

    async def _decide(self, policy: EgressPolicy, host: str, port: int) -> Target:
        """Check ``host:port`` against ``policy``, resolving a name on the host."""
        key = normalize_host(host)
        if not isinstance(key, str):
            policy.check_address(key, port, by_name=False)
            check_not_host(policy, key, port)
            if self.never is not None:
                self.never.check(key, port)
            return Target(host, port, (str(key),), "")
        policy.check_name(key, port)
        try:
            async with asyncio.timeout(self.limits.resolve_timeout_s):
                resolved = await self._lookup(key, port)
        except (TimeoutError, OSError, UnicodeError) as e:
            raise EgressDenied("unresolvable", f"{key} does not resolve ({e})") from None
        ok: list[str] = []
        first_err: EgressDenied | None = None
        for s in list(resolved)[:MAX_ADDRESSES]:
            ip = plain_ip(s)
            if ip is None:
                first_err = first_err or EgressDenied(
                    "non-public-address", f"{key} resolves to an unusable address {s[:60]!r}")
                continue
            try:
                policy.check_address(ip, port, by_name=True)
                check_not_host(policy, ip, port)
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
        return Target(host, port, tuple(ok), key, policy.secrets_for(key, port))

    async def connect(self, target: Target) -> socket.socket:
        """A connected non-blocking TCP socket to one of ``target``'s checked addresses
        (in order), by address: never a name. Raises :class:`UpstreamError`."""
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
            raise UpstreamError(0x05, 502, last)
        raise UpstreamError(0x04, 504 if "timed out" in last else 502, last)

    async def _check_tls(self, target: Target, prefix: bytes, reader: ExactReader) -> bytes:
        """Given the client's first byte(s), read a whole ClientHello if this is TLS and
        check its SNI against the target; return the bytes to forward first."""
        if prefix and prefix[0] in TLS_OTHER_RECORDS:
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
                wrapped = PrefixedReader(prefix + rest, reader)
                raw, msg = await read_client_hello(wrapped)
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

    async def _tunnel(self, target: Target, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, send_ok: bytes,
                      on_upstream_error: Callable[[UpstreamError], bytes]) -> None:
        """Connect and pump; TLS ports read the ClientHello before connecting. Once the
        tunnel stands, the client's socket is taken out of asyncio's transport and both
        sockets are pumped with splice(2) (see :meth:`_pump`). A host with secrets is
        intercepted instead (:meth:`_intercept`)."""
        if target.secrets:
            await intercept(self, target, reader, writer, send_ok)
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
                self.record(target.host, target.port, e)
                writer.write(TLS_ALERT_ACCESS_DENIED)
                await writer.drain()
                return
            try:
                usock = await self.connect(target)
            except UpstreamError:
                return
        else:
            try:
                usock = await self.connect(target)
            except UpstreamError as e:
                writer.write(on_upstream_error(e))
                await writer.drain()
                return
            writer.write(send_ok)
            first = b""
        csock: socket.socket | None = None
        try:
            csock, buffered = await detach(reader, writer)
            await self._pump(target, csock, usock, first + buffered, sniff=not first)
        finally:
            usock.close()
            if csock is not None:
                csock.close()

    async def _pump(self, target: Target, csock: socket.socket, usock: socket.socket,
                    first: bytes, sniff: bool) -> None:
        """Copy both ways until both ends are done (or either fails, or the tunnel is idle
        for ``idle_timeout_s``). ``first``: client bytes already read, sent upstream first;
        ``sniff``: check a TLS ClientHello at the start of the client's bytes first.

        The bytes are moved by :class:`~.splice.Splicer` callbacks run by the event loop itself
        (no coroutine per wakeup); this coroutine only waits for the tunnel's end."""
        loop = asyncio.get_running_loop()
        tunnel = Tunnel(loop, self.limits.idle_timeout_s)
        last = tunnel.last

        async def up() -> None:
            data = first
            if sniff:
                while not data:
                    await wait_io(csock, False, last, self.limits.idle_timeout_s)
                    try:
                        data = csock.recv(CHUNK)
                    except BlockingIOError:
                        continue
                    if not data:
                        usock.shutdown(socket.SHUT_WR)
                        tunnel.start(None)          # this direction is done already
                        return
                sr = SockReader(csock, data)
                data = await self._check_tls(target, await sr.readexactly(1), sr)
                data += sr.take()
            if data:
                await send_all(usock, data, last, self.limits.idle_timeout_s)
            tunnel.start(Splicer(tunnel, csock, usock))

        try:
            tunnel.start(Splicer(tunnel, usock, csock))
            if first and not sniff:
                # checked bytes (a ClientHello, bytes sent with the request): a fresh
                # socket takes them at once, with no task and no loop iteration
                with contextlib.suppress(BlockingIOError):
                    sent = usock.send(first)
                    first = first[sent:]
                    tunnel.last[0] = loop.time()
            if sniff or first:
                exc: Exception | None = None

                async def up_caught() -> None:
                    nonlocal exc
                    try:
                        await up()
                    except Exception as e:
                        exc = e

                async with asyncio.TaskGroup() as group:
                    ups = group.create_task(up_caught())
                    await asyncio.wait({ups, tunnel.done}, return_when=asyncio.FIRST_COMPLETED)
                    ups.cancel()               # (done already, or the tunnel ended first)
                if isinstance(exc, EgressDenied):
                    self.record(target.host, target.port, exc)
                    with contextlib.suppress(OSError):
                        csock.send(TLS_ALERT_ACCESS_DENIED)
                if exc is not None:
                    return
            else:
                tunnel.start(Splicer(tunnel, csock, usock))
            try:
                await tunnel.done
            except (OSError, TimeoutError) as e:  # a reset, an idle tunnel: said, at debug
                _log.debug("egress proxy: a tunnel to %s port %s ended: %r", target.host,
                           target.port, e)
        finally:
            tunnel.close()

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
            self.record(host, port, EgressDenied("timeout", "SOCKS5 negotiation timed out"))
            return
        except EgressDenied as e:
            self.record(host, port, e)
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
                host, port = split_authority(head.target, None)
                target = await self._decide(self.policy, host, port)
            else:
                host, port, origin = check_absolute(head)
                target = await self._decide(self.policy, host, port)
                if target.secrets and port in self.limits.tls_ports:
                    raise clear_secrets(port)
        except EgressDenied as e:
            self.record(host, port, e)
            status, text = HTTP_STATUS[e.kind]
            with contextlib.suppress(OSError):
                writer.write(http_reply(status, text, e.reason))
                await writer.drain()
            return
        if head.method == "CONNECT":
            await self._tunnel(target, reader, writer,
                               b"HTTP/1.1 200 Connection Established\r\n\r\n",
                               lambda e: http_reply(e.status, "Bad Gateway"
                                                     if e.status == 502 else "Gateway Timeout",
                                                     e.reason))
        else:
            await forward_plain(self, head, origin, target, reader, writer)
