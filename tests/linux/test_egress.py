"""The host-side egress proxy (corral.providers.linux.host.egress), without a sandbox.

Every upstream server is started here on 127.0.0.1; names are resolved by an
injected fake resolver (no real DNS). 127.0.0.1 stands for a "public" address
only where a test lists 127.0.0.0/8 (or 127.0.0.1) explicitly; without that
listing a name resolving to it is refused like any loopback address.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import shutil
import socket
import ssl
import stat
import struct
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from corral.core.errors import ConfigInvalidError
from corral.providers.linux.host.egress import (
    EgressDenied,
    EgressLimits,
    EgressPolicy,
    EgressProxy,
    classify_address,
    normalize_host,
    parse_client_hello,
    parse_entry,
    parse_http_head,
)

NAMES: dict[str, list[str]] = {
    "api.example.test": ["127.0.0.1"],
    "a.example.test": ["127.0.0.1"],
    "b.c.example.test": ["127.0.0.1"],
    "example.test": ["127.0.0.1"],
    "other.test": ["127.0.0.1"],
    "meta.example.test": ["169.254.169.254"],
    "private.example.test": ["10.0.0.5"],
    "mixed.example.test": ["10.0.0.5", "127.0.0.1"],
    "v6.example.test": ["::1"],
}
LOOP = "127.0.0.0/8"


class FakeResolver:
    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append(host)
        if host not in self.names:
            raise OSError(f"no such name {host}")
        return self.names[host]


def run(fn: Callable[[], Awaitable[None]], timeout: float = 15.0) -> None:
    """Run ``fn`` in a fresh loop; any exception the loop saw unhandled fails the test."""
    async def main() -> None:
        errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _l, ctx: errors.append(ctx))
        async with asyncio.timeout(timeout):
            await fn()
        assert not errors, errors
    asyncio.run(main())


@contextlib.asynccontextmanager
async def proxy(policy: EgressPolicy, **limits: Any,
                ) -> AsyncIterator[tuple[EgressProxy, str, FakeResolver]]:
    d = tempfile.mkdtemp(prefix="egress-", dir="/tmp")
    path = os.path.join(d, "p.sock")
    resolver = FakeResolver(NAMES)
    p = EgressProxy(policy, resolver=resolver, limits=EgressLimits(**limits))
    await p.start(path)
    try:
        yield p, path, resolver
        assert p.internal_errors == 0
    finally:
        await p.aclose()
        shutil.rmtree(d, ignore_errors=True)


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[tuple[int, list[int]]]:
    """An echo server on 127.0.0.1: (port, list growing by one per accepted connection)."""
    conns: list[int] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(1)
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.write_eof()
        except OSError:
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1], conns
    finally:
        srv.close()
        await srv.wait_closed()


@contextlib.asynccontextmanager
async def http_server() -> AsyncIterator[tuple[int, list[tuple[bytes, bytes]]]]:
    """An HTTP/1.1 origin on 127.0.0.1 recording (head, body) of each request."""
    seen: list[tuple[bytes, bytes]] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = await r.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await r.readexactly(length)
            seen.append((head, body))
            reply = b"got " + head.split(b"\r\n")[0] + b" " + body
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                    % len(reply) + reply)
            await w.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1], seen
    finally:
        srv.close()
        await srv.wait_closed()


async def http_connect(path: str, authority: str,
                       ) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_unix_connection(path)
    w.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = await r.readuntil(b"\r\n\r\n")
    return head, r, w


async def refused(path: str, authority: str) -> bytes:
    """CONNECT that must be refused: the whole reply (head and body)."""
    head, r, w = await http_connect(path, authority)
    body = await r.read()
    w.close()
    return head + body


def client_hello(sni: str | None) -> bytes:
    """A real ClientHello from the ssl module, naming ``sni`` (None: no SNI extension)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=sni)
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def hello_message(records: bytes) -> bytes:
    """The handshake message inside ClientHello records (one record in practice)."""
    out = b""
    i = 0
    while i < len(records):
        (n,) = struct.unpack("!H", records[i + 3:i + 5])
        out += records[i + 5:i + 5 + n]
        i += 5 + n
    return out


# --------------------------------------------------------------------------- policy values


def test_entries_parse_and_normalize() -> None:
    assert parse_entry("API.Example.COM.").text == "api.example.com"
    assert parse_entry("*.Example.com:8443").text == "*.example.com:8443"
    assert parse_entry("bücher.example").name == "xn--bcher-kva.example"
    assert parse_entry("10.0.0.0/8").text == "10.0.0.0/8"
    assert parse_entry("127.0.0.1:80").text == "127.0.0.1:80"
    assert parse_entry("fd00::/8").text == "fd00::/8"
    assert parse_entry("[fd00::/8]:443").text == "[fd00::/8]:443"
    assert parse_entry("::1").text == "::1"
    for bad in ("", " ", "a b", "host:0", "host:70000", "host:x", "10.0.0.1/8", "*.",
                "[::1", "a..b", "-a.example", "2130706433", "0x7f.1", "*.*.x", "x/y"):
        with pytest.raises(ConfigInvalidError):
            parse_entry(bad)


def test_normalize_host() -> None:
    assert normalize_host("API.example.TEST.") == "api.example.test"
    assert normalize_host("[::1]") == ipaddress.ip_address("::1")
    assert normalize_host("::ffff:127.0.0.1") == ipaddress.ip_address("127.0.0.1")
    for bad in ("", "a b", "[nope]", "x" * 300, "1.2.3.4.5", "127.1"):
        with pytest.raises(EgressDenied):
            normalize_host(bad)


@pytest.mark.parametrize(("addr", "word"), [
    ("127.0.0.1", "loopback"), ("10.1.2.3", "private"), ("172.16.0.1", "private"),
    ("192.168.1.1", "private"), ("169.254.169.254", "metadata"), ("169.254.1.1", "link-local"),
    ("100.64.0.1", "carrier-grade NAT"), ("0.0.0.0", "unspecified"), ("224.0.0.1", "multicast"),
    ("255.255.255.255", "broadcast"), ("::1", "loopback"), ("fd00::1", "unique local"),
    ("fe80::1", "link-local"), ("::", "unspecified"), ("ff02::1", "multicast"),
    ("::ffff:10.0.0.1", "private"), ("2001:db8::1", "documentation"),
])
def test_range_table(addr: str, word: str) -> None:
    reason = classify_address(ipaddress.ip_address(addr))
    assert reason is not None and word in reason


@pytest.mark.parametrize("addr", ["93.184.216.34", "1.1.1.1", "2606:4700::1111"])
def test_public_addresses_are_not_special(addr: str) -> None:
    assert classify_address(ipaddress.ip_address(addr)) is None


def test_policy_changes_are_new_values() -> None:
    p = EgressPolicy.allowlist("a.example.test")
    q = p.allowing("b.example.test").revoking("a.example.test")
    assert p.entries == ("a.example.test",)
    assert q.entries == ("b.example.test",)
    with pytest.raises(EgressDenied):
        q.check_name("a.example.test", 443)
    q.check_name("b.example.test", 443)
    # revoking inside a wildcard, or in unrestricted mode, denies that name only
    w = EgressPolicy.allowlist("*.example.test").revoking("a.example.test")
    with pytest.raises(EgressDenied):
        w.check_name("a.example.test", 1)
    w.check_name("b.example.test", 1)
    u = EgressPolicy.unrestricted().revoking("a.example.test")
    with pytest.raises(EgressDenied):
        u.check_name("a.example.test", 1)
    u.allowing("a.example.test").check_name("a.example.test", 1)


def test_unrestricted_allows_public_literals_only() -> None:
    u = EgressPolicy.unrestricted()
    u.check_address(ipaddress.ip_address("93.184.216.34"), 443, by_name=False)
    for a in ("127.0.0.1", "169.254.169.254", "10.0.0.5", "::1"):
        with pytest.raises(EgressDenied):
            u.check_address(ipaddress.ip_address(a), 443, by_name=True)
    EgressPolicy.unrestricted(LOOP).check_address(ipaddress.ip_address("127.0.0.1"), 1,
                                                  by_name=True)


# --------------------------------------------------------------------------- CONNECT


def test_allowed_connect_tunnels_bytes_both_ways() -> None:
    async def t() -> None:
        async with echo_server() as (port, conns), \
                proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (p, path, res):
            head, r, w = await http_connect(path, f"API.example.test.:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            w.write(b"ping" * 10000)
            assert await r.readexactly(40000) == b"ping" * 10000
            w.write_eof()
            assert await r.read() == b""
            w.close()
            assert conns == [1] and p.denials() == () and res.asked == ["api.example.test"]
    run(t)


def test_unlisted_host_gets_403_and_a_denial_and_is_not_resolved() -> None:
    async def t() -> None:
        async with echo_server() as (port, conns), \
                proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (p, path, res):
            reply = await refused(path, f"other.test:{port}")
            assert reply.startswith(b"HTTP/1.1 403 Forbidden\r\n")
            assert reply.endswith(b"\r\n\r\ncorral egress: other.test:%d is not in the "
                                  b"allowlist\n" % port)
            [d] = p.denials()
            assert (d.host, d.port, d.kind) == ("other.test", port, "not-allowed")
            assert d.time > 0 and res.asked == [] and conns == []
    run(t)


def test_wildcard_and_port_rules() -> None:
    async def t() -> None:
        async with echo_server() as (port, _), echo_server() as (port2, _c):
            policy = EgressPolicy.allowlist(f"*.example.test:{port}", LOOP)
            async with proxy(policy) as (p, path, _r):
                for name in ("a.example.test", "b.c.example.test"):
                    head, _rd, w = await http_connect(path, f"{name}:{port}")
                    assert head.startswith(b"HTTP/1.1 200"), name
                    w.close()
                assert (await refused(path, f"example.test:{port}")).startswith(b"HTTP/1.1 403")
                assert (await refused(path, f"a.example.test:{port2}")).startswith(
                    b"HTTP/1.1 403")
                assert [d.host for d in p.denials()] == ["example.test", "a.example.test"]
    run(t)


def test_ip_literal_refused_unless_listed() -> None:
    async def t() -> None:
        async with echo_server() as (port, conns):
            async with proxy(EgressPolicy.allowlist("api.example.test")) as (p, path, _r):
                assert (await refused(path, f"127.0.0.1:{port}")).startswith(b"HTTP/1.1 403")
                assert (await refused(path, f"[::1]:{port}")).startswith(b"HTTP/1.1 403")
                # a public literal is refused without any connection attempt
                assert (await refused(path, "93.184.216.34:443")).startswith(b"HTTP/1.1 403")
                assert [d.kind for d in p.denials()] == ["non-public-address",
                                                          "non-public-address", "not-allowed"]
            async with proxy(EgressPolicy.allowlist(f"127.0.0.1:{port}")) as (p, path, _r):
                head, _rd, w = await http_connect(path, f"127.0.0.1:{port}")
                assert head.startswith(b"HTTP/1.1 200")
                w.close()
                assert (await refused(path, f"127.0.0.2:{port}")).startswith(b"HTTP/1.1 403")
            assert conns == [1]
    run(t)


def test_allowed_name_resolving_to_special_ranges_is_refused() -> None:
    async def t() -> None:
        async with echo_server() as (port, conns):
            policy = EgressPolicy.allowlist("*.example.test", "api.example.test")
            async with proxy(policy) as (p, path, _r):
                for name, word in (("meta.example.test", b"metadata"),
                                   ("private.example.test", b"private"),
                                   ("api.example.test", b"loopback"),
                                   ("v6.example.test", b"loopback")):
                    reply = await refused(path, f"{name}:{port}")
                    assert reply.startswith(b"HTTP/1.1 403") and word in reply, reply
                assert {d.kind for d in p.denials()} == {"non-public-address"}
            # listing loopback does not open the metadata address or 10/8
            async with proxy(policy.allowing(LOOP)) as (p, path, _r):
                assert b"metadata" in await refused(path, f"meta.example.test:{port}")
                # a mixed answer connects only to the address that passed the check
                head, r, w = await http_connect(path, f"mixed.example.test:{port}")
                assert head.startswith(b"HTTP/1.1 200")
                w.write(b"x")
                assert await r.readexactly(1) == b"x"
                w.close()
            assert conns == [1]
    run(t)


def test_unresolvable_name_is_502_and_recorded() -> None:
    async def t() -> None:
        async with proxy(EgressPolicy.allowlist("*.test")) as (p, path, _r):
            assert (await refused(path, "nx.test:80")).startswith(b"HTTP/1.1 502")
            assert p.denials()[0].kind == "unresolvable"
    run(t)


def test_upstream_refusal_is_502() -> None:
    async def t() -> None:
        async with echo_server() as (port, _):
            pass            # the port is now closed
        async with proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (p, path, _r):
            reply = await refused(path, f"api.example.test:{port}")
            assert reply.startswith(b"HTTP/1.1 502") and b"refused" in reply
            assert p.denials() == ()
    run(t)


# --------------------------------------------------------------------------- TLS SNI


def test_client_hello_parser_reads_the_sni() -> None:
    assert parse_client_hello(hello_message(client_hello("API.example.test"))) == \
        "api.example.test"
    assert parse_client_hello(hello_message(client_hello(None))) is None


@pytest.mark.parametrize("tls_port", [False, True])
def test_sni_must_match_the_tunnel_host(tls_port: bool) -> None:
    async def t() -> None:
        async with echo_server() as (port, conns):
            limits: dict[str, Any] = {"tls_ports": frozenset({port})} if tls_port else {}
            policy = EgressPolicy.allowlist("*.example.test", LOOP)
            async with proxy(policy, **limits) as (p, path, _r):
                hello = client_hello("a.example.test")
                head, r, w = await http_connect(path, f"a.example.test:{port}")
                assert head.startswith(b"HTTP/1.1 200")
                w.write(hello)
                assert await r.readexactly(len(hello)) == hello   # forwarded untouched
                w.close()
                # fronting: the tunnel names one allowed host, the SNI another
                head, r, w = await http_connect(path, f"b.c.example.test:{port}")
                assert head.startswith(b"HTTP/1.1 200")
                w.write(client_hello("a.example.test"))
                assert await r.read() == b"\x15\x03\x03\x00\x02\x02\x31"   # access_denied
                w.close()
                [d] = p.denials()
                assert d.kind == "sni-mismatch" and "a.example.test" in d.reason
                # a malformed ClientHello is a denial too
                head, r, w = await http_connect(path, f"a.example.test:{port}")
                w.write(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\xff")
                await r.read()
                w.close()
                assert p.denials()[-1].kind == "bad-request"
            # on a TLS port the refused tunnels never reached the upstream
            assert len(conns) == (1 if tls_port else 3)
    run(t)


def test_a_client_hello_split_over_records_is_checked_whole() -> None:
    async def t() -> None:
        async with echo_server() as (port, conns), \
                proxy(EgressPolicy.allowlist("*.example.test", LOOP),
                      tls_ports=frozenset({port})) as (p, path, _r):
            msg = hello_message(client_hello("b.c.example.test"))
            cut = len(msg) // 2
            records = b"".join(b"\x16\x03\x01" + struct.pack("!H", len(part)) + part
                               for part in (msg[:cut], msg[cut:]))
            for host, ok in (("b.c.example.test", True), ("a.example.test", False)):
                head, r, w = await http_connect(path, f"{host}:{port}")
                assert head.startswith(b"HTTP/1.1 200")
                w.write(records[:7])
                await asyncio.sleep(0.01)
                w.write(records[7:])
                if ok:
                    assert await r.readexactly(len(records)) == records
                else:
                    assert await r.read() == b"\x15\x03\x03\x00\x02\x02\x31"
                w.close()
            assert conns == [1] and [d.kind for d in p.denials()] == ["sni-mismatch"]
    run(t)


def test_bulk_data_is_delivered_whole_when_the_upstream_closes_at_once() -> None:
    blob = os.urandom(1 << 20) * 4

    async def t() -> None:
        async def send_all(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            # read what the client sent first: closing a socket with unread bytes sends a
            # reset, which drops the reply's unsent tail (a race the test must not have)
            with contextlib.suppress(asyncio.IncompleteReadError):
                await r.readuntil(b"\r\n\r\n")
            w.write(blob)
            await w.drain()
            w.close()

        srv = await asyncio.start_server(send_all, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (_p, path,
                                                                                  _r):
                head, r, w = await http_connect(path, f"api.example.test:{port}")
                assert head.startswith(b"HTTP/1.1 200")
                w.write_eof()                     # both directions end: the tunnel is done
                await asyncio.sleep(0.3)          # with its last bytes still in flight
                got = b""
                while chunk := await r.read(1 << 16):
                    got += chunk
                assert len(got) == len(blob) and got == blob
                w.close()
                # and the plain HTTP path
                r, w = await asyncio.open_unix_connection(path)
                w.write(f"GET http://api.example.test:{port}/ HTTP/1.1\r\n\r\n".encode())
                await asyncio.sleep(0.2)
                got = b""
                while chunk := await r.read(1 << 16):
                    got += chunk
                assert got == blob
                w.close()
        finally:
            srv.close()
            await srv.wait_closed()
    run(t)


def _echo_through_a_tunnel(blob: bytes) -> None:
    """Send ``blob`` through a CONNECT tunnel to an echo server (then half-close) and
    check every byte comes back, in order. The stream starts with plain text: one random
    first byte in 256 is 0x16, a TLS handshake record, and then the proxy checks a
    ClientHello, as it does on every port, and refuses the random bytes that follow
    (this made these tests fail now and then: the client's send got EPIPE)."""
    blob = b"plain text first: " + blob

    async def t() -> None:
        async with echo_server() as (port, _), \
                proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (_p, path, _r):
            head, r, w = await http_connect(path, f"api.example.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")

            async def send() -> None:
                w.write(blob)
                await w.drain()
                w.write_eof()

            sender = asyncio.ensure_future(send())
            got = b""
            while chunk := await r.read(1 << 16):
                got += chunk
            await sender
            assert got == blob
            w.close()
    run(t)


def test_tunnels_copy_without_splice_when_the_kernel_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """splice(2) refused (EINVAL, as for a socket type without splice support): the
    tunnel falls back to recv/send and still carries every byte both ways."""
    def no_splice(*_a: object, **_k: object) -> int:
        raise OSError(errno.EINVAL, "splice refused")

    monkeypatch.setattr(os, "splice", no_splice)
    _echo_through_a_tunnel(os.urandom(1 << 20) * 3)


def test_tunnels_copy_when_splice_into_the_destination_is_refused(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """splice(2) from a socket into the pipe works but out of the pipe into the
    destination is refused on the first move: what the pipe holds is sent first, then
    recv/send carries the rest, every byte in order, both ways."""
    caplog.set_level(logging.DEBUG, logger="corral.providers.linux.host.egress")  # why
    real = os.splice

    def refuse_out(fd_in: int, fd_out: int, count: int, *a: object, **k: Any) -> int:
        if stat.S_ISFIFO(os.fstat(fd_in).st_mode):
            raise OSError(errno.EINVAL, "splice refused")
        return real(fd_in, fd_out, count, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "splice", refuse_out)
    _echo_through_a_tunnel(os.urandom(1 << 20) * 2)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_tunnels_leave_no_descriptor_or_callback_behind() -> None:
    """Tunnels ended every way (both ends done, the client reset mid-transfer, idle,
    the proxy closed mid-transfer) leave no descriptor open and no reader or writer
    registered with the event loop."""
    async def t() -> None:
        loop = asyncio.get_running_loop()

        async def flood(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while True:
                    w.write(b"x" * (1 << 16))
                    await w.drain()

        srv = await asyncio.start_server(flood, "127.0.0.1", 0)
        fport = srv.sockets[0].getsockname()[1]
        try:
            async with echo_server() as (port, _):
                before = _open_fds()
                watched = len(loop._selector.get_map())  # type: ignore[attr-defined]
                async with proxy(EgressPolicy.allowlist("api.example.test", LOOP),
                                 idle_timeout_s=0.3) as (p, path, _r):
                    # both ends done
                    head, r, w = await http_connect(path, f"api.example.test:{port}")
                    assert head.startswith(b"HTTP/1.1 200")
                    w.write(b"ping")
                    w.write_eof()
                    assert await r.read() == b"ping"
                    w.close()
                    # the client resets while the upstream floods it
                    head, r, w = await http_connect(path, f"api.example.test:{fport}")
                    assert head.startswith(b"HTTP/1.1 200")
                    await r.readexactly(1 << 20)
                    w.transport.abort()
                    # idle
                    head, r, w = await http_connect(path, f"api.example.test:{port}")
                    assert head.startswith(b"HTTP/1.1 200")
                    async with asyncio.timeout(3):
                        assert await r.read() == b""
                    w.close()
                    # open at aclose, mid-transfer
                    head, r, w = await http_connect(path, f"api.example.test:{fport}")
                    assert head.startswith(b"HTTP/1.1 200")
                    await r.readexactly(1 << 16)
                    for _ in range(100):
                        if p.active == 1:
                            break
                        await asyncio.sleep(0.01)
                    await p.aclose()
                    assert await r.read(1 << 30) is not None
                    w.close()
                    assert p.active == 0
                await asyncio.sleep(0.05)
                assert _open_fds() <= before
                assert len(loop._selector.get_map()) <= watched  # type: ignore[attr-defined]
        finally:
            srv.close()
            await srv.wait_closed()
    run(t)


def test_a_trickling_tunnel_is_not_idle_and_a_stalled_reader_costs_no_cpu() -> None:
    """Bytes one way keep a tunnel alive past the idle time; a client that stops
    reading while the upstream floods it makes the proxy wait, not spin."""
    async def t() -> None:
        async def slow(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                for _ in range(6):
                    w.write(b"t")
                    await w.drain()
                    await asyncio.sleep(0.1)
                while True:
                    w.write(b"x" * (1 << 16))
                    await w.drain()

        srv = await asyncio.start_server(slow, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            for idle in (0.3, 300.0):
                async with proxy(EgressPolicy.allowlist("api.example.test", LOOP),
                                 idle_timeout_s=idle) as (p, path, _r):
                    head, r, w = await http_connect(path, f"api.example.test:{port}")
                    assert head.startswith(b"HTTP/1.1 200")
                    assert await r.readexactly(6) == b"tttttt"    # 0.6 s > 0.3 s idle
                    await r.readexactly(1 << 16)
                    if idle > 1:
                        # stop reading: the proxy's pipe and both sockets' buffers fill up
                        await asyncio.sleep(0.2)
                        cpu = time.process_time()
                        await asyncio.sleep(0.5)
                        assert time.process_time() - cpu < 0.15
                        assert p.active == 1
                    w.close()
        finally:
            srv.close()
            await srv.wait_closed()
    run(t)


def test_bytes_sent_with_the_request_are_not_lost() -> None:
    """A client that sends its first bytes in the same write as the CONNECT head (or
    the SOCKS request): what the proxy read ahead goes upstream first."""
    async def t() -> None:
        async with echo_server() as (port, _), \
                proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (_p, path, _r):
            r, w = await asyncio.open_unix_connection(path)
            w.write(f"CONNECT api.example.test:{port} HTTP/1.1\r\n\r\nearly bytes".encode())
            assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            assert await r.readexactly(11) == b"early bytes"
            w.close()
            r, w = await asyncio.open_unix_connection(path)
            name = b"api.example.test"
            w.write(b"\x05\x01\x00\x05\x01\x00\x03" + bytes([len(name)]) + name
                    + struct.pack("!H", port) + b"socks early")
            assert (await r.readexactly(12))[:4] == b"\x05\x00\x05\x00"
            assert await r.readexactly(11) == b"socks early"
            w.close()
    run(t)


def test_non_ascii_digits_are_a_bad_request_not_a_crash() -> None:
    """``'²'.isdigit()`` is true and ``int('²')`` fails: ports and lengths take ASCII
    digits only, and the client gets a 400."""
    async def t() -> None:
        async with proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (p, path, _r):
            for header in ("Host: api.example.test:\u00b2", "Content-Length: \u00b2"):
                r, w = await asyncio.open_unix_connection(path)
                w.write(f"GET http://api.example.test:80/ HTTP/1.1\r\n{header}\r\n\r\n"
                        .encode("latin-1"))
                assert (await r.read()).startswith(b"HTTP/1.1 400")
                w.close()
            assert [d.kind for d in p.denials()] == ["bad-request", "bad-request"]
    run(t)
    with pytest.raises(ConfigInvalidError):
        parse_entry("a.example:\u00b2")


def test_server_first_protocols_work_on_other_ports() -> None:
    async def t() -> None:
        async def banner(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(b"220 hello\r\n")
            await w.drain()
            w.close()

        srv = await asyncio.start_server(banner, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (_p, path,
                                                                                  _r):
                head, r, w = await http_connect(path, f"api.example.test:{port}")
                assert head.startswith(b"HTTP/1.1 200")
                assert await r.read() == b"220 hello\r\n"
                w.close()
        finally:
            srv.close()
            await srv.wait_closed()
    run(t)


# --------------------------------------------------------------------------- plain HTTP


def test_plain_http_is_forwarded_in_origin_form() -> None:
    async def t() -> None:
        async with http_server() as (port, seen), \
                proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (p, path, _r):
            r, w = await asyncio.open_unix_connection(path)
            w.write(f"POST http://api.example.test:{port}/p/a?x=1 HTTP/1.1\r\n"
                    f"Host: api.example.test:{port}\r\nProxy-Connection: keep-alive\r\n"
                    f"Content-Length: 5\r\n\r\nhello".encode())
            reply = await r.read()
            w.close()
            assert reply.startswith(b"HTTP/1.1 200 OK")
            assert reply.endswith(b"got POST /p/a?x=1 HTTP/1.1 hello")
            [(head, body)] = seen
            lower = head.lower()
            assert head.startswith(b"POST /p/a?x=1 HTTP/1.1\r\n") and body == b"hello"
            assert b"proxy-connection" not in lower and b"connection: close" in lower
            # the Host header must name the URI's host
            r, w = await asyncio.open_unix_connection(path)
            w.write(f"GET http://api.example.test:{port}/ HTTP/1.1\r\n"
                    f"Host: evil.test\r\n\r\n".encode())
            reply = await r.read()
            w.close()
            assert reply.startswith(b"HTTP/1.1 403") and b"Host header" in reply
            # an unlisted host over plain HTTP
            r, w = await asyncio.open_unix_connection(path)
            w.write(f"GET http://other.test:{port}/ HTTP/1.1\r\n\r\n".encode())
            assert (await r.read()).startswith(b"HTTP/1.1 403")
            w.close()
            assert len(seen) == 1
            assert [d.kind for d in p.denials()] == ["not-allowed", "not-allowed"]
    run(t)


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /relative HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
    (b"GET https://api.example.test/ HTTP/1.1\r\n\r\n", b"501"),
    (b"GET http://u@api.example.test/ HTTP/1.1\r\n\r\n", b"400"),
    (b"POST http://api.example.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"501"),
    (b"GET http://api.example.test/ HTTP/1.1\r\n folded\r\n\r\n", b"400"),
    (b"GET http://api.example.test/ HTTP/2.0\r\n\r\n", b"400"),
    (b"CONNECT api.example.test HTTP/1.1\r\n\r\n", b"400"),
])
def test_malformed_http_requests(request_bytes: bytes, status: bytes) -> None:
    async def t() -> None:
        async with proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (p, path, _r):
            r, w = await asyncio.open_unix_connection(path)
            w.write(request_bytes)
            reply = await r.read()
            w.close()
            assert reply.startswith(b"HTTP/1.1 " + status), reply
            assert len(p.denials()) == 1
    run(t)


# --------------------------------------------------------------------------- SOCKS5


async def socks(path: str, atyp: int, addr: bytes, port: int, cmd: int = 1,
                ) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_unix_connection(path)
    w.write(b"\x05\x01\x00")
    assert await r.readexactly(2) == b"\x05\x00"
    if atyp == 3:
        addr = bytes([len(addr)]) + addr
    w.write(bytes([5, cmd, 0, atyp]) + addr + struct.pack("!H", port))
    return await r.readexactly(10), r, w


def test_socks5_connect_allowed_and_refused() -> None:
    async def t() -> None:
        async with echo_server() as (port, conns), \
                proxy(EgressPolicy.allowlist("api.example.test", f"127.0.0.1:{port}")
                      ) as (p, path, _r):
            reply, r, w = await socks(path, 3, b"api.example.test", port)
            assert reply[:2] == b"\x05\x00"
            w.write(b"over socks")
            assert await r.readexactly(10) == b"over socks"
            w.close()
            reply, r, w = await socks(path, 1, bytes([127, 0, 0, 1]), port)
            assert reply[:2] == b"\x05\x00"
            w.close()
            codes = {}
            for label, args in {
                "unlisted": (3, b"other.test", port),
                "metadata": (3, b"meta.example.test", port),  # not listed anyway
                "v6 loopback": (4, ipaddress.IPv6Address("::1").packed, port),
                "v4 other port": (1, bytes([127, 0, 0, 1]), port + 1 if port < 65535 else 1),
            }.items():
                reply, r, w = await socks(path, *args)
                codes[label] = reply[1]
                w.close()
            assert codes == dict.fromkeys(codes, 0x02)
            reply, r, w = await socks(path, 3, b"api.example.test", port, cmd=2)   # BIND
            assert reply[1] == 0x07
            w.close()
            assert conns == [1, 1]
            assert len(p.denials()) == 5
    run(t)


def test_socks5_unreachable_and_refused_codes() -> None:
    async def t() -> None:
        async with echo_server() as (port, _):
            pass
        async with proxy(EgressPolicy.allowlist("*.test", "api.example.test", LOOP)
                         ) as (p, path, _r):
            reply, _rd, w = await socks(path, 3, b"nx.test", 80)
            assert reply[1] == 0x04
            w.close()
            reply, _rd, w = await socks(path, 3, b"api.example.test", port)
            assert reply[1] == 0x05
            w.close()
            # no acceptable method
            r, w = await asyncio.open_unix_connection(path)
            w.write(b"\x05\x01\x02")
            assert await r.read() == b"\x05\xff"
            w.close()
            # an upstream that refuses is a failure, not a policy denial
            assert [d.kind for d in p.denials()] == ["unresolvable", "unsupported"]
    run(t)


# --------------------------------------------------------------------------- run-time changes


def test_revoke_refuses_new_connections() -> None:
    async def t() -> None:
        async with echo_server() as (port, _), \
                proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (p, path, _r):
            head, r, w = await http_connect(path, f"api.example.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            p.revoke("api.example.test")
            assert (await refused(path, f"api.example.test:{port}")).startswith(
                b"HTTP/1.1 403")
            # a tunnel opened before the change is not cut
            w.write(b"still")
            assert await r.readexactly(5) == b"still"
            w.close()
            p.allow("api.example.test")
            head, _rd, w = await http_connect(path, f"api.example.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            w.close()
    run(t)


def test_unrestricted_mode_through_the_proxy() -> None:
    async def t() -> None:
        async with echo_server() as (port, conns), \
                proxy(EgressPolicy.unrestricted(LOOP)) as (p, path, _r):
            head, _rd, w = await http_connect(path, f"other.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            w.close()
            assert b"metadata" in await refused(path, f"meta.example.test:{port}")
            assert b"private" in await refused(path, "10.0.0.5:80")
            p.revoke("other.test")
            assert (await refused(path, f"other.test:{port}")).startswith(b"HTTP/1.1 403")
            assert conns == [1]
    run(t)


def test_add_listener_serves_a_tcp_socket_and_closes_it_at_aclose() -> None:
    """A listening TCP socket (as a sandbox's netns would hand over by fd) is served
    like the unix socket, with the same policy and denial list, and closed at aclose."""
    async def t() -> None:
        async with echo_server() as (port, conns), \
                proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (p, _path, _r):
            lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lsock.bind(("127.0.0.1", 0))
            lsock.listen(16)
            lport = lsock.getsockname()[1]
            await p.add_listener(lsock)
            r, w = await asyncio.open_connection("127.0.0.1", lport)
            w.write(f"CONNECT api.example.test:{port} HTTP/1.1\r\n\r\n".encode())
            assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            w.write(b"over tcp")
            assert await r.readexactly(8) == b"over tcp"
            w.close()
            r, w = await asyncio.open_connection("127.0.0.1", lport)
            w.write(f"CONNECT other.test:{port} HTTP/1.1\r\n\r\n".encode())
            assert (await r.read()).startswith(b"HTTP/1.1 403")
            w.close()
            assert [d.host for d in p.denials()] == ["other.test"] and conns == [1]
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            with pytest.raises(ConfigInvalidError):
                await p.add_listener(udp)
            udp.close()
            await p.aclose()
            assert lsock.fileno() == -1
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", lport)
    run(t)


def test_aclose_ends_open_tunnels() -> None:
    async def t() -> None:
        async with echo_server() as (port, _), \
                proxy(EgressPolicy.allowlist("api.example.test", LOOP)) as (p, path, _r):
            head, r, w = await http_connect(path, f"api.example.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            await p.aclose()
            assert await r.read() == b""
            w.close()
            assert p.active == 0
    run(t)


# --------------------------------------------------------------------------- limits


def test_oversized_header_is_431() -> None:
    async def t() -> None:
        async with proxy(EgressPolicy.allowlist("api.example.test")) as (p, path, _r):
            r, w = await asyncio.open_unix_connection(path)
            w.write(b"GET http://api.example.test/ HTTP/1.1\r\nX: " + b"a" * 70000)
            with contextlib.suppress(ConnectionError):
                await w.drain()
            reply = await r.read()
            w.close()
            assert reply.startswith(b"HTTP/1.1 431")
            assert p.denials()[0].kind == "too-large"
    run(t)


def test_slow_header_times_out() -> None:
    async def t() -> None:
        async with proxy(EgressPolicy.allowlist("api.example.test"),
                         header_timeout_s=0.2) as (p, path, _r):
            r, w = await asyncio.open_unix_connection(path)
            w.write(b"GET http://api.example")
            assert (await r.read()).startswith(b"HTTP/1.1 408")
            w.close()
            r, w = await asyncio.open_unix_connection(path)   # SOCKS, stalls mid-greeting
            w.write(b"\x05\x02")
            assert await r.read() == b""
            w.close()
            assert [d.kind for d in p.denials()] == ["timeout", "timeout"]
    run(t)


def test_too_many_connections_are_refused() -> None:
    async def t() -> None:
        async with echo_server() as (port, _), \
                proxy(EgressPolicy.allowlist("api.example.test", LOOP),
                      max_connections=1) as (p, path, _r):
            head, r1, w1 = await http_connect(path, f"api.example.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            reply = await refused(path, f"api.example.test:{port}")
            assert reply.startswith(b"HTTP/1.1 503")
            r, w = await asyncio.open_unix_connection(path)
            w.write(b"\x05\x01\x00")
            assert await r.read() == b"\x05\xff"
            w.close()
            w1.close()
            await r1.read()
            await asyncio.sleep(0.05)
            head, _rd, w = await http_connect(path, f"api.example.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            w.close()
            assert [d.kind for d in p.denials()] == ["busy", "busy"]
    run(t)


def test_idle_tunnel_is_closed() -> None:
    async def t() -> None:
        async with echo_server() as (port, _), \
                proxy(EgressPolicy.allowlist("api.example.test", LOOP),
                      idle_timeout_s=0.3) as (_p, path, _r):
            head, r, w = await http_connect(path, f"api.example.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            w.write(b"a")
            assert await r.readexactly(1) == b"a"
            async with asyncio.timeout(3):
                assert await r.read() == b""
            w.close()
    run(t)


def test_denials_are_bounded() -> None:
    async def t() -> None:
        async with proxy(EgressPolicy.allowlist("api.example.test"),
                         max_denials=3) as (p, path, _r):
            for i in range(5):
                await refused(path, f"h{i}.test:80")
            assert [d.host for d in p.denials()] == ["h2.test", "h3.test", "h4.test"]
            assert p.denials_dropped == 2
    run(t)


# --------------------------------------------------------------------------- fuzz


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_http_head_parser_raises_only_denials(data: bytes) -> None:
    with contextlib.suppress(EgressDenied):
        parse_http_head(data + b"\r\n\r\n")
    with contextlib.suppress(EgressDenied):
        parse_http_head(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_client_hello_parser_raises_only_denials(data: bytes) -> None:
    with contextlib.suppress(EgressDenied):
        parse_client_hello(data)
    with contextlib.suppress(EgressDenied):
        parse_client_hello(b"\x01" + len(data).to_bytes(3, "big") + data)


_HELLO = hello_message(client_hello("api.example.test"))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(_HELLO) - 1), st.integers(0, 255), st.integers(0, len(_HELLO)))
def test_mutated_client_hello_raises_only_denials(pos: int, byte: int, cut: int) -> None:
    mutated = _HELLO[:pos] + bytes([byte]) + _HELLO[pos + 1:]
    for m in (mutated, mutated[:cut]):
        with contextlib.suppress(EgressDenied):
            sni = parse_client_hello(m)
            assert sni is None or isinstance(sni, str)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_entry_and_host_parsers_raise_only_typed_errors(text: str) -> None:
    with contextlib.suppress(ConfigInvalidError):
        parse_entry(text)
    with contextlib.suppress(EgressDenied):
        normalize_host(text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([b"", b"\x05", b"CONNECT ", b"\x05\x01\x00\x05\x01\x00",
                        b"CONNECT api.example.test:1 HTTP/1.1\r\n\r\n\x16\x03\x01"]),
       st.binary(max_size=300))
def test_arbitrary_bytes_on_the_socket_never_hang_or_crash(prefix: bytes, data: bytes) -> None:
    async def t() -> None:
        async with proxy(EgressPolicy.allowlist("api.example.test"),
                         header_timeout_s=0.3, connect_timeout_s=0.3) as (_p, path, _r):
            r, w = await asyncio.open_unix_connection(path)
            w.write(prefix + data)
            w.write_eof()
            async with asyncio.timeout(3):
                while await r.read(65536):
                    pass
            w.close()
    run(t, timeout=5)
