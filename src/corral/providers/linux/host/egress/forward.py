"""HTTP forwarding: plain proxy requests, and the intercepted sessions of hosts with secrets.

:func:`forward_plain` carries one absolute-form request (``GET http://host/...``) per
connection; :func:`intercept` terminates a tunnel's TLS with the proxy's CA (or reads
plain HTTP) and relays HTTP/1.1 requests one by one with the secret headers added.
Each request head is parsed and checked in ``http.py`` (h11, strictly) and written
anew: the upstream never reads the client's own bytes of a head. Bodies are framed by
what was parsed (``Content-Length`` or chunked) and copied exactly.

The two directions of one exchange (the request body up, the response down) run as
tasks of a task group the exchange awaits: the first that fails cancels the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Protocol

from corral.providers.linux.host.egress.http import (
    HOP_BY_HOP,
    HTTP_STATUS,
    RESPONSE_HEAD,
    BadUpstream,
    HttpHead,
    clear_secrets,
    http_reply,
    inner_request,
    parse_http_head,
    parse_response_head,
    wants_close,
)
from corral.providers.linux.host.egress.limits import CHUNK, EgressLimits
from corral.providers.linux.host.egress.policy import (
    EgressDenied,
    Target,
    UpstreamError,
    digits,
)
from corral.providers.linux.host.egress.splice import detach, shutdown, wait_io

__all__ = ["ProxyHost", "first_error", "forward_plain", "intercept"]


class ProxyHost(Protocol):
    """What forwarding needs of its proxy (:class:`~.proxy.EgressProxy` is one)."""

    limits: EgressLimits

    def record(self, host: str, port: int, err: EgressDenied) -> None:
        """Keep a denial."""

    async def connect(self, target: Target) -> socket.socket:
        """A connected socket to one of ``target``'s checked addresses (UpstreamError)."""

    def hold(self, writer: asyncio.StreamWriter) -> None:
        """Count ``writer`` among the connections the proxy aborts when it closes."""

    def release(self, writer: asyncio.StreamWriter) -> None:
        """The reverse of :meth:`hold`."""

    def server_context(self, host: str, port: int) -> ssl.SSLContext:
        """The TLS context presenting the proxy CA's leaf for ``host``."""

    def upstream_context(self) -> ssl.SSLContext:
        """What the proxy trusts when it connects upstream itself."""


def first_error(eg: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception of a task group's failure, unwrapped (the group's others are
    the cancellations it caused)."""
    e: BaseException = eg
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    return e


async def forward_plain(px: ProxyHost, head: HttpHead, origin: str, target: Target,
                   reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request per connection: rewrite to origin-form, send the head and exactly
    Content-Length body bytes, then copy the response until upstream closes."""
    try:
        usock = await px.connect(target)
    except UpstreamError as e:
        writer.write(http_reply(e.status, "Bad Gateway" if e.status == 502
                                 else "Gateway Timeout", e.reason))
        await writer.drain()
        return
    try:
        up_r, up_w = await asyncio.open_connection(sock=usock, limit=CHUNK)
    except BaseException:
        usock.close()
        raise
    px.hold(up_w)
    try:
        connection_listed = {t.strip().lower() for v in head.get_all("connection")
                             for t in v.split(",")}
        lines = [f"{head.method} {origin} {head.version}"]
        has_host = False
        secret_names = {h.name for h in target.secrets}
        for k, v in head.headers:
            if k in HOP_BY_HOP or k in connection_listed or k in secret_names:
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
        idle = px.limits.idle_timeout_s
        while remaining > 0:
            async with asyncio.timeout(idle):
                chunk = await reader.read(min(remaining, CHUNK))
            if not chunk:
                return
            remaining -= len(chunk)
            up_w.write(chunk)
            await up_w.drain()
        await up_w.drain()
        while True:
            async with asyncio.timeout(idle):
                chunk = await up_r.read(CHUNK)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
            await writer.drain()
    finally:
        await shutdown(up_w, px.limits.idle_timeout_s)
        px.release(up_w)


async def intercept(px: ProxyHost, target: Target, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter, send_ok: bytes) -> None:
    """A tunnel to a host with secrets: terminate the client's TLS with the host's leaf
    (or read plain HTTP if the client does not start TLS), then relay HTTP/1.1
    requests one by one with the secret headers added (:meth:`_http_session`)."""
    loop = asyncio.get_running_loop()
    lim = px.limits
    writer.write(send_ok)
    csock, buffered = await detach(reader, writer)
    c_w: asyncio.StreamWriter | None = None
    try:
        first = buffered[:1]
        if not first:
            try:
                async with asyncio.timeout(lim.header_timeout_s):
                    await wait_io(csock, False, [loop.time()], lim.idle_timeout_s)
            except TimeoutError:
                px.record(target.host, target.port,
                             EgressDenied("timeout", "the client sent nothing in time"))
                return
            first = csock.recv(1, socket.MSG_PEEK)
            if not first:
                return
        tls = first == b"\x16"
        if tls and buffered:
            px.record(target.host, target.port, EgressDenied(
                "unsupported", "TLS started before the tunnel reply (not carried to a "
                "host with secrets)"))
            return
        if not tls and target.port in lim.tls_ports:
            err = clear_secrets(target.port)
            px.record(target.host, target.port, err)
            with contextlib.suppress(OSError):
                csock.send(http_reply(403, "Forbidden", err.reason))
            return
        ctx = px.server_context(target.tls_host, target.port) if tls else None
        c_r = asyncio.StreamReader(limit=max(lim.header_bytes, CHUNK))
        proto = asyncio.StreamReaderProtocol(c_r)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: proto, csock, ssl=ctx,
                ssl_handshake_timeout=lim.header_timeout_s if tls else None)
        except (OSError, ssl.SSLError, TimeoutError):
            return          # e.g. a client that does not trust the CA, or SNI refused
        c_w = asyncio.StreamWriter(transport, proto, c_r, loop)
        px.hold(c_w)
        if buffered:
            c_r.feed_data(buffered)
        await _http_session(px, target, c_r, c_w, tls)
    finally:
        if c_w is not None:
            await shutdown(c_w, lim.idle_timeout_s)
            px.release(c_w)
        else:
            csock.close()

async def _http_session(px: ProxyHost, target: Target, c_r: asyncio.StreamReader,
                        c_w: asyncio.StreamWriter, tls: bool) -> None:
    """Relay HTTP/1.1 requests (keep-alive, Content-Length and chunked bodies streamed)
    from the client to ``target`` over the proxy's own connection (verified TLS when
    the client spoke TLS), each with ``target.secrets`` in place of any header of the
    same names; responses are streamed back unchanged."""
    lim = px.limits
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
            out, body = inner_request(head, target, tls)
            if up is not None and up[0].at_eof():
                await shutdown(up[1], idle)
                px.release(up[1])
                up = None
            if up is None:
                try:
                    up = await _open_upstream(px, target, tls)
                except UpstreamError as e:
                    c_w.write(http_reply(e.status, "Bad Gateway" if e.status == 502
                                          else "Gateway Timeout", e.reason))
                    await c_w.drain()
                    return
                px.hold(up[1])
            up_r, up_w = up
            up_w.write(out)
            sending = receiving = None
            try:
                async with asyncio.TaskGroup() as group:
                    sending = group.create_task(_copy_body(c_r, up_w, body, idle))
                    receiving = group.create_task(
                        _relay_response(head, up_r, up_w, c_r, c_w, idle))
            except ExceptionGroup as eg:
                if sending is not None and sending.done() and not sending.cancelled() \
                        and sending.exception() is not None:
                    return            # a broken request body: end both connections
                raise first_error(eg) from None
            assert receiving is not None
            close = receiving.result()
            if close or wants_close(head):
                if c_w.can_write_eof():
                    c_w.write_eof()
                await c_w.drain()
                return
    except EgressDenied as e:
        px.record(target.host, target.port, e)
        status, text = HTTP_STATUS[e.kind]
        with contextlib.suppress(OSError):
            c_w.write(http_reply(status, text, e.reason))
            await c_w.drain()
    finally:
        if up is not None:
            await shutdown(up[1], idle)
            px.release(up[1])


async def _open_upstream(px: ProxyHost, target: Target, tls: bool,
                         ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The proxy's own connection to ``target``: TLS verified against
    ``upstream_ssl_context`` (default: the system's CAs, host name checked)."""
    usock = await px.connect(target)
    ctx: ssl.SSLContext | None = None
    if tls:
        ctx = px.upstream_context()
    try:
        return await asyncio.open_connection(
            sock=usock, limit=RESPONSE_HEAD, ssl=ctx,
            server_hostname=target.tls_host if tls else None,
            ssl_handshake_timeout=px.limits.connect_timeout_s if tls else None)
    except ssl.SSLCertVerificationError as e:
        usock.close()
        raise UpstreamError(0x05, 502, f"{target.tls_host} port {target.port}: upstream "
                             f"certificate not trusted ({e.verify_message})") from None
    except (OSError, ssl.SSLError, TimeoutError) as e:
        usock.close()
        raise UpstreamError(0x05, 502, f"{target.tls_host} port {target.port}: upstream "
                             f"TLS failed ({type(e).__name__})") from None
    except BaseException:
        usock.close()
        raise


async def _copy_exact(src: asyncio.StreamReader, dst: asyncio.StreamWriter, n: int,
                      idle: float) -> None:
    while n > 0:
        async with asyncio.timeout(idle):
            chunk = await src.read(min(n, CHUNK))
        if not chunk:
            raise BadUpstream("connection closed inside a body")
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
            raise BadUpstream("malformed chunk size")
        dst.write(line)
        n = int(size, 16)
        if n == 0:
            break
        await _copy_exact(src, dst, n, idle)
        async with asyncio.timeout(idle):
            crlf = await src.readexactly(2)
        if crlf != b"\r\n":
            raise BadUpstream("malformed chunk end")
        dst.write(crlf)
        await dst.drain()
    for _ in range(256):                  # trailers, then the empty line
        async with asyncio.timeout(idle):
            line = await src.readuntil(b"\r\n")
        dst.write(line)
        if line == b"\r\n":
            await dst.drain()
            return
    raise BadUpstream("too many trailer lines")


async def _copy_until_eof(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                          idle: float, half_close: bool = False) -> None:
    """Copy until ``src`` ends; ``half_close``: then end ``dst``'s sending side too, where
    its transport can (TLS cannot half-close: the other direction runs until it ends)."""
    while True:
        async with asyncio.timeout(idle):
            chunk = await src.read(CHUNK)
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
                raise BadUpstream("response header too large") from None
            except asyncio.IncompleteReadError:
                raise BadUpstream("connection closed before a response") from None
            version, status, headers = parse_response_head(raw)
            c_w.write(raw)
            sent = True
            if status == 101:
                await c_w.drain()
                try:
                    async with asyncio.TaskGroup() as group:
                        group.create_task(_copy_until_eof(c_r, up_w, idle, half_close=True))
                        group.create_task(_copy_until_eof(up_r, c_w, idle, half_close=True))
                except ExceptionGroup as eg:
                    raise first_error(eg) from None
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
            if len(lengths) > 1 or not all(digits(v) and len(v) <= 18 for v in lengths):
                raise BadUpstream("bad Content-Length in the response")
            await _copy_exact(up_r, c_w, int(lengths.pop()), idle)
        else:
            await _copy_until_eof(up_r, c_w, idle)
            close = True
        await c_w.drain()
        return close
    except (BadUpstream, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        if not sent:
            c_w.write(http_reply(502, "Bad Gateway", f"upstream: {e}"))
            await c_w.drain()
        return True
