"""Secrets added at egress by the proxy (corral.providers.linux.host.egress, its ca module).

Every server is started here on 127.0.0.1: an HTTPS origin with its own test CA
(passed to the proxy as ``upstream_ssl_context``) and a plain HTTP one. Names are
resolved by the fake resolver of test_egress. The secret value must reach the
origin, and never the client, a repr, or a denial.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings, strategies as st
from test_egress import LOOP, NAMES, FakeResolver, http_connect, http_server, run

from corral.core.errors import ConfigInvalidError
from corral.providers.linux.host.egress import EgressLimits, EgressPolicy, EgressProxy

SECRET = "Bearer s3cr3t-Value-7f1e"
HOSTS = ("api.example.test", "other.test")


@pytest.fixture(scope="module")
def origin_tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, bytes]:
    """(server context for HOSTS, the test CA's PEM): the origin's own CA, not the proxy's."""
    d = tmp_path_factory.mktemp("origin")
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test origin CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in HOSTS]),
                           critical=False)
            # 3.13's default context verifies strictly (VERIFY_X509_STRICT): a leaf
            # without an Authority Key Identifier is refused
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    (d / "chain.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + ca_pem)
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "chain.pem", d / "key.pem")
    return ctx, ca_pem


def client_ctx(ca_pem: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    return ctx


@contextlib.asynccontextmanager
async def https_origin(server_ctx: ssl.SSLContext | None,
                       ) -> AsyncIterator[tuple[int, list[tuple[bytes, bytes]]]]:
    """A keep-alive HTTP/1.1 origin (TLS when ``server_ctx``) recording (head, body) of
    each request; bodies by Content-Length or chunked; replies ``ok <n>``."""
    seen: list[tuple[bytes, bytes]] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await r.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                lower = head.lower()
                body = b""
                if b"transfer-encoding: chunked" in lower:
                    while True:
                        n = int((await r.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                        if n == 0:
                            await r.readuntil(b"\r\n")
                            break
                        body += await r.readexactly(n)
                        await r.readexactly(2)
                else:
                    for line in lower.split(b"\r\n"):
                        if line.startswith(b"content-length:"):
                            body = await r.readexactly(int(line.split(b":")[1]))
                seen.append((head, body))
                reply = b"ok %d" % len(seen)
                if head.startswith(b"GET /chunked"):
                    w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
                else:
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(reply)
                            + reply)
                await w.drain()
                if b"connection: close" in lower:
                    return
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    try:
        yield srv.sockets[0].getsockname()[1], seen
    finally:
        srv.close()
        await srv.wait_closed()


@contextlib.asynccontextmanager
async def secret_proxy(upstream: ssl.SSLContext | None, policy: EgressPolicy | None = None,
                       ) -> AsyncIterator[tuple[EgressProxy, str]]:
    d = tempfile.mkdtemp(prefix="egress-", dir="/tmp")
    path = os.path.join(d, "p.sock")
    if policy is None:
        policy = EgressPolicy.allowlist(*HOSTS, LOOP).with_secret(
            HOSTS[0], {"Authorization": SECRET, "X-Api-Key": "k-123"})
    p = EgressProxy(policy, resolver=FakeResolver(NAMES), limits=EgressLimits(),
                    upstream_ssl_context=upstream)
    await p.start(path)
    try:
        yield p, path
        assert p.internal_errors == 0
    finally:
        await p.aclose()
        shutil.rmtree(d, ignore_errors=True)


async def response(r: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await r.readuntil(b"\r\n\r\n")
    if b"chunked" in head.lower():
        body = b""
        while True:
            line = await r.readuntil(b"\r\n")
            body += line
            if line == b"0\r\n":
                body += await r.readuntil(b"\r\n")
                return head, body
            body += await r.readexactly(int(line[:-2], 16) + 2)
    n = next(int(x.split(b":")[1]) for x in head.lower().split(b"\r\n")
             if x.startswith(b"content-length:"))
    return head, await r.readexactly(n)


def upstream_ctx(ca_pem: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca_pem.decode())


# --------------------------------------------------------------------------- tests


def test_secret_headers_reach_the_origin_and_never_the_client(
        origin_tls: tuple[ssl.SSLContext, bytes]) -> None:
    server_ctx, origin_ca = origin_tls

    async def t() -> None:
        async with https_origin(server_ctx) as (port, seen), \
                secret_proxy(upstream_ctx(origin_ca)) as (p, path):
            ca = p.ca_bundle_pem
            assert ca is not None and ca.startswith(b"-----BEGIN CERTIFICATE-----")
            head, r, w = await http_connect(path, f"api.example.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            await w.start_tls(client_ctx(ca), server_hostname="api.example.test")
            cert = w.get_extra_info("peercert")
            assert ("commonName", "api.example.test") in cert["subject"][0]
            got = b""
            host = f"Host: api.example.test:{port}\r\n".encode()
            # 1: a placeholder the client sends is replaced, not doubled
            w.write(b"GET /one HTTP/1.1\r\n" + host + b"Authorization: placeholder\r\n"
                    b"x-api-key: also-placeholder\r\n\r\n")
            h, b = await response(r)
            got += h + b
            assert b == b"ok 1"
            # 2: a Content-Length body on the same connection
            w.write(b"POST /two HTTP/1.1\r\n" + host + b"Content-Length: 5\r\n\r\nhello")
            h, b = await response(r)
            got += h + b
            # 3: a chunked body, and a chunked response
            w.write(b"POST /three HTTP/1.1\r\n" + host + b"Transfer-Encoding: chunked\r\n\r\n"
                    b"4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n")
            h, b = await response(r)
            got += h + b
            w.write(b"GET /chunked HTTP/1.1\r\n" + host + b"Connection: close\r\n\r\n")
            h, b = await response(r)
            got += h + b
            assert b == b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            assert await r.read() == b""
            w.close()
            assert [x[1] for x in seen] == [b"", b"hello", b"wikipedia", b""]
            for rhead, _ in seen:
                lines = rhead.lower().split(b"\r\n")
                assert lines.count(b"authorization: " + SECRET.lower().encode()) == 1
                assert lines.count(b"x-api-key: k-123") == 1
                assert b"placeholder" not in rhead
            assert SECRET.encode() not in got and b"k-123" not in got
            assert p.denials() == ()
            assert SECRET not in repr(p.policy) and SECRET not in str(p.policy)
            assert "k-123" not in repr(p.policy)
    run(t)


def test_a_client_that_does_not_trust_the_proxy_ca_fails(
        origin_tls: tuple[ssl.SSLContext, bytes]) -> None:
    server_ctx, origin_ca = origin_tls

    async def t() -> None:
        async with https_origin(server_ctx) as (port, seen), \
                secret_proxy(upstream_ctx(origin_ca)) as (_p, path):
            head, _r, w = await http_connect(path, f"api.example.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            with pytest.raises(ssl.SSLCertVerificationError):
                await w.start_tls(client_ctx(origin_ca), server_hostname="api.example.test")
            w.close()
            assert seen == []
    run(t)


def test_hosts_without_secrets_are_tunnelled_untouched(
        origin_tls: tuple[ssl.SSLContext, bytes]) -> None:
    server_ctx, origin_ca = origin_tls

    async def t() -> None:
        async with https_origin(server_ctx) as (port, seen), \
                secret_proxy(upstream_ctx(origin_ca)) as (_p, path):
            head, r, w = await http_connect(path, f"other.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            await w.start_tls(client_ctx(origin_ca), server_hostname="other.test")
            issuer = dict(x[0] for x in w.get_extra_info("peercert")["issuer"])
            assert issuer["commonName"] == "test origin CA"   # the origin's own certificate
            w.write(f"GET / HTTP/1.1\r\nHost: other.test:{port}\r\nConnection: close\r\n\r\n"
                    .encode())
            h, b = await response(r)
            assert h.startswith(b"HTTP/1.1 200") and b == b"ok 1"
            w.close()
            assert b"authorization" not in seen[0][0].lower()
    run(t)


def test_sni_or_host_header_naming_another_host_is_refused(
        origin_tls: tuple[ssl.SSLContext, bytes]) -> None:
    server_ctx, origin_ca = origin_tls

    async def t() -> None:
        async with https_origin(server_ctx) as (port, seen), \
                secret_proxy(upstream_ctx(origin_ca)) as (p, path):
            ca = p.ca_bundle_pem
            assert ca is not None
            _head, _r, w = await http_connect(path, f"api.example.test:{port}")
            ctx = client_ctx(ca)
            ctx.check_hostname = False
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await w.start_tls(ctx, server_hostname="other.test")
            w.close()
            assert [(d.kind, d.port) for d in p.denials()] == [("sni-mismatch", port)]
            _head, r, w = await http_connect(path, f"api.example.test:{port}")
            await w.start_tls(client_ctx(ca), server_hostname="api.example.test")
            w.write(f"GET / HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n".encode())
            reply = await r.read()
            assert reply.startswith(b"HTTP/1.1 403") and b"does not match" in reply
            w.close()
            _head, r, w = await http_connect(path, f"api.example.test:{port}")
            await w.start_tls(client_ctx(ca), server_hostname="api.example.test")
            w.write(f"TRACE / HTTP/1.1\r\nHost: api.example.test:{port}\r\n\r\n".encode())
            assert (await r.read()).startswith(b"HTTP/1.1 403")
            w.close()
            assert [d.kind for d in p.denials()] == ["sni-mismatch", "not-allowed",
                                                     "not-allowed"]
            assert seen == []
            assert not any(SECRET in d.reason for d in p.denials())
    run(t)


def test_the_origin_certificate_is_verified(origin_tls: tuple[ssl.SSLContext, bytes]) -> None:
    """Default upstream context: the system CAs, which do not know the test origin's CA."""
    server_ctx, _ = origin_tls

    async def t() -> None:
        async with https_origin(server_ctx) as (port, seen), secret_proxy(None) as (p, path):
            ca = p.ca_bundle_pem
            assert ca is not None
            _head, r, w = await http_connect(path, f"api.example.test:{port}")
            await w.start_tls(client_ctx(ca), server_hostname="api.example.test")
            w.write(f"GET / HTTP/1.1\r\nHost: api.example.test:{port}\r\n\r\n".encode())
            reply = await r.read()
            assert reply.startswith(b"HTTP/1.1 502") and b"not trusted" in reply
            assert SECRET.encode() not in reply
            w.close()
            assert seen == []
    run(t)


def test_socks5_and_plain_http_to_a_secret_host_get_the_headers(
        origin_tls: tuple[ssl.SSLContext, bytes]) -> None:
    server_ctx, origin_ca = origin_tls

    async def t() -> None:
        async with https_origin(server_ctx) as (port, seen), http_server() as (hport, hseen), \
                secret_proxy(upstream_ctx(origin_ca)) as (p, path):
            ca = p.ca_bundle_pem
            assert ca is not None
            r, w = await asyncio.open_unix_connection(path)
            name = b"api.example.test"
            w.write(b"\x05\x01\x00\x05\x01\x00\x03" + bytes([len(name)]) + name
                    + struct.pack("!H", port))
            assert (await r.readexactly(12))[:4] == b"\x05\x00\x05\x00"
            await w.start_tls(client_ctx(ca), server_hostname="api.example.test")
            w.write(f"GET / HTTP/1.1\r\nHost: api.example.test:{port}\r\n"
                    f"Connection: close\r\n\r\n".encode())
            h, b = await response(r)
            assert b == b"ok 1" and SECRET.encode() not in h
            w.close()
            assert f"authorization: {SECRET}".lower().encode() in seen[0][0].lower()
            # plain HTTP proxy request
            r, w = await asyncio.open_unix_connection(path)
            w.write(f"GET http://api.example.test:{hport}/x HTTP/1.1\r\n"
                    f"Host: api.example.test:{hport}\r\nAuthorization: fake\r\n\r\n".encode())
            reply = await r.read()
            w.close()
            assert reply.startswith(b"HTTP/1.1 200") and SECRET.encode() not in reply
            assert f"authorization: {SECRET}".encode() in hseen[0][0]
            assert b"fake" not in hseen[0][0]
    run(t)


def test_secret_policy_values_are_validated_and_hidden() -> None:
    base = EgressPolicy.allowlist("api.example.test")
    pol = base.with_secret("api.example.test:443", {"Authorization": SECRET})
    assert pol.has_secrets and not base.has_secrets
    assert SECRET not in repr(pol) and SECRET not in str(pol.secrets_for("api.example.test",
                                                                         443)[0])
    assert [h.value for h in pol.secrets_for("api.example.test", 443)] == [SECRET]
    assert pol.secrets_for("api.example.test", 80) == ()
    assert pol.secrets_for("other.test", 443) == ()
    wild = base.with_secret("*.example.test", {"a": "1"}).with_secret("api.example.test",
                                                                      {"A": "2", "b": "3"})
    assert {(h.name, h.value) for h in wild.secrets_for("api.example.test", 1)} == {
        ("a", "2"), ("b", "3")}
    assert wild.allowing("x.test").secrets == wild.secrets
    for entry, headers in (("10.0.0.0/8", {"a": "b"}), ("a.test", {}),
                           ("a.test", {"bad name": "v"}), ("a.test", {"Host": "v"}),
                           ("a.test", {"a": "v\r\nx: y"}), ("a.test", {"a": " v"})):
        with pytest.raises(ConfigInvalidError) as e:
            base.with_secret(entry, headers)
        assert "\r\nx" not in str(e.value)


def test_ca_is_p256_short_lived_and_leaves_are_cached() -> None:
    from corral.providers.linux.host.egress.ca import CA_VALIDITY, EgressCA

    ca = EgressCA()
    cert = x509.load_pem_x509_certificate(ca.ca_pem)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert life <= CA_VALIDITY + datetime.timedelta(hours=1)
    chain, _key, _end = ca.leaf_pem("api.example.test")
    leaf = x509.load_pem_x509_certificates(chain)[0]
    leaf.verify_directly_issued_by(cert)
    assert ca.server_context("api.example.test") is ca.server_context("api.example.test")
    assert "PRIVATE" not in repr(ca)


def test_without_cryptography_a_secret_policy_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['cryptography'] = None\n"
        "from corral.providers.linux.host.egress import EgressPolicy, EgressProxy\n"
        "assert 'cryptography' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n"
        "EgressProxy(EgressPolicy.allowlist('a.test'))\n"
        "try:\n"
        "    EgressProxy(EgressPolicy.allowlist('a.test').with_secret('a.test', {'a': 'v'}))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    env: dict[str, Any] = {**os.environ}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60, check=True)
    assert out.stdout.startswith("ConfigInvalidError") and "corral[secrets]" in out.stdout


def test_a_stock_client_through_a_tcp_listener(origin_tls: tuple[ssl.SSLContext, bytes]) -> None:
    """urllib, as a program inside a sandbox would use it (HTTPS_PROXY to a TCP listener),
    trusting the proxy's CA bundle: a 1 MiB POST, then a keep-alive-less GET."""
    server_ctx, origin_ca = origin_tls

    async def t() -> None:
        async with https_origin(server_ctx) as (port, seen), \
                secret_proxy(upstream_ctx(origin_ca)) as (p, _path):
            lsock = socket.create_server(("127.0.0.1", 0))
            await p.add_listener(lsock)
            proxy_url = f"http://127.0.0.1:{lsock.getsockname()[1]}"
            ca = p.ca_bundle_pem
            assert ca is not None
            body = os.urandom(1 << 20)

            def fetch() -> list[bytes]:
                opener = urllib.request.build_opener(
                    urllib.request.ProxyHandler({"https": proxy_url}),
                    urllib.request.HTTPSHandler(context=client_ctx(ca)))
                out = []
                with opener.open(f"https://api.example.test:{port}/up", data=body,
                                 timeout=10) as resp:
                    out.append(resp.read())
                with opener.open(f"https://api.example.test:{port}/down", timeout=10) as resp:
                    out.append(resp.read())
                return out

            assert await asyncio.to_thread(fetch) == [b"ok 1", b"ok 2"]
            assert seen[0][1] == body
            assert all(f"authorization: {SECRET}".lower().encode() in h.lower()
                       for h, _ in seen)
    run(t)


@contextlib.asynccontextmanager
async def quirky_origin() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A plain HTTP/1.1 origin whose path picks an edge of the protocol: ``/continue``
    (100 Continue before reading the body), ``/nocontent`` (204), ``/silent-close``
    (closes after the response without saying so), ``/eof`` (body framed by close);
    anything else: ``Content-Length`` 10 (no body for HEAD). Records each head."""
    heads: list[bytes] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await r.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                heads.append(head)
                lower = head.lower()
                path = head.split(b" ")[1]
                length = 0
                for line in lower.split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if path == b"/continue" and b"expect: 100-continue" in lower:
                    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await w.drain()
                body = await r.readexactly(length)
                if path == b"/nocontent":
                    w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                elif path == b"/eof":
                    w.write(b"HTTP/1.1 200 OK\r\n\r\nuntil close " + body)
                    await w.drain()
                    return
                else:
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
                    if not head.startswith(b"HEAD "):
                        w.write(b"0123456789")
                await w.drain()
                if path == b"/silent-close":
                    return
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1], heads
    finally:
        srv.close()
        await srv.wait_closed()


def test_intercepted_http_edges() -> None:
    """Plain HTTP inside a CONNECT tunnel to a host with secrets: pipelined requests,
    HEAD and 204 (no body), 100-continue, an upstream that closes between requests
    (reopened), and a body framed by the upstream's close (the client's closes too)."""
    async def t() -> None:
        async with quirky_origin() as (port, heads), secret_proxy(None) as (p, path):
            head, r, w = await http_connect(path, f"api.example.test:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            host = f"Host: api.example.test:{port}\r\n".encode()
            w.write(b"HEAD /a HTTP/1.1\r\n" + host + b"\r\n"
                    b"GET /nocontent HTTP/1.1\r\n" + host + b"\r\n"
                    b"GET /b HTTP/1.1\r\n" + host + b"\r\n")        # pipelined
            assert (await r.readuntil(b"\r\n\r\n")).endswith(b"Content-Length: 10\r\n\r\n")
            assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 204")
            await r.readuntil(b"\r\n\r\n")
            assert await r.readexactly(10) == b"0123456789"
            w.write(b"POST /continue HTTP/1.1\r\n" + host + b"Expect: 100-continue\r\n"
                    b"Content-Length: 4\r\n\r\n")
            assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
            w.write(b"body")
            await r.readuntil(b"\r\n\r\n")
            assert await r.readexactly(10) == b"0123456789"
            w.write(b"GET /silent-close HTTP/1.1\r\n" + host + b"\r\n")
            await r.readuntil(b"\r\n\r\n")
            assert await r.readexactly(10) == b"0123456789"
            await asyncio.sleep(0.2)              # the origin's close reaches the proxy
            w.write(b"POST /eof HTTP/1.1\r\n" + host + b"Content-Length: 2\r\n\r\nok")
            assert await r.read() == b"HTTP/1.1 200 OK\r\n\r\nuntil close ok"
            w.close()
            assert len(heads) == 6
            assert all(SECRET.encode() in h for h in heads)
            assert p.denials() == ()
    run(t)


def test_intercepted_framing_is_strict_and_upgrades_become_a_pipe() -> None:
    """Inside an intercepted tunnel: Transfer-Encoding with Content-Length (smuggling)
    and a coding other than chunked are refused before anything goes upstream; a bad
    chunk ends the connection; 101 Switching Protocols carries bytes both ways."""
    async def upgrading(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\n"
                    b"Connection: Upgrade\r\n\r\n")
            while data := await r.read(1024):
                w.write(data.upper())
                await w.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    async def t() -> None:
        srv = await asyncio.start_server(upgrading, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with secret_proxy(None) as (p, path):
                host = f"Host: api.example.test:{port}\r\n".encode()
                for extra, status in ((b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                                       b"400"),
                                      (b"Transfer-Encoding: gzip, chunked\r\n", b"501")):
                    _h, r, w = await http_connect(path, f"api.example.test:{port}")
                    w.write(b"POST / HTTP/1.1\r\n" + host + extra + b"\r\n")
                    assert (await r.read()).startswith(b"HTTP/1.1 " + status)
                    w.close()
                assert [d.kind for d in p.denials()] == ["bad-request", "unsupported"]
                _h, r, w = await http_connect(path, f"api.example.test:{port}")
                w.write(b"GET / HTTP/1.1\r\n" + host + b"Upgrade: echo\r\n"
                        b"Connection: Upgrade\r\n\r\n")
                assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
                w.write(b"hello pipe")
                assert await r.readexactly(10) == b"HELLO PIPE"
                w.write_eof()
                assert await r.read() == b""
                w.close()
        finally:
            srv.close()
            await srv.wait_closed()
    run(t)


_NAME = st.sampled_from(["Host", "Content-Length", "Transfer-Encoding", "Connection",
                         "Expect", "Authorization", "X-Api-Key", "Upgrade", "X"])
_VALUES = st.sampled_from(["api.example.test:{port}", "other.test", "", "3", "0", "3, 4",
                           "-1", "\u00b2", "0x10", "chunked", "CHUNKED", "gzip, chunked",
                           "close", "upgrade", "100-continue", "\u00e9\u00ff",
                           "99999999999999999999"])
_VALUE = st.one_of(_VALUES, _VALUES,
                   st.text(st.characters(min_codepoint=0x20, max_codepoint=0xff), max_size=20))
_LINE = st.one_of(st.builds(lambda n, v: f"{n}: {v}", _NAME, _VALUE),
                  st.sampled_from(["bad line", ": novalue", "X:\tfolded", " leading"]))
_REQUEST_LINE = st.one_of(   # half of them valid, so that the headers get read
    st.tuples(st.sampled_from(["GET", "POST", "HEAD"]), st.sampled_from(["/", "/a?b"]),
              st.sampled_from(["HTTP/1.1", "HTTP/1.0"])),
    st.tuples(st.sampled_from(["TRACE", "CONNECT", "G\u00c9T", "", "OPTIONS"]),
              st.sampled_from(["*", "http://api.example.test/", "/\u00e9", "x", "/"]),
              st.sampled_from(["HTTP/2", "HTTP/1.1 ", "http/1.1", "HTTP/1.1"])))
_REQUEST = st.builds(lambda line, lines, body: (*line, lines, body),
                     _REQUEST_LINE, st.lists(_LINE, max_size=4), st.binary(max_size=40))


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(_REQUEST, min_size=1, max_size=3), st.booleans())
def test_arbitrary_requests_inside_an_interception_never_crash_it(
        requests: list[tuple[str, str, str, list[str], bytes]], forward: bool) -> None:
    """Random request heads (mostly near-valid, some Latin-1 junk) and bodies, inside a
    tunnel to a host with secrets (plain HTTP) or as plain proxy requests: every one
    ends in a reply or a close, never an internal error, never the secret."""
    async def t() -> None:
        async with quirky_origin() as (port, _heads), secret_proxy(None) as (p, path):
            p.limits = EgressLimits(header_timeout_s=0.5, idle_timeout_s=1.0)
            if forward:
                r, w = await asyncio.open_unix_connection(path)
            else:
                _h, r, w = await http_connect(path, f"api.example.test:{port}")
            data = b""
            for method, target, version, lines, body in requests:
                if forward and target.startswith("/"):
                    target = f"http://api.example.test:{port}{target}"
                head = "\r\n".join([f"{method} {target} {version}",
                                    *(x.replace("{port}", str(port)) for x in lines)])
                data += (head + "\r\n\r\n").encode("latin-1") + body
            w.write(data)
            with contextlib.suppress(ConnectionError):
                w.write_eof()
                async with asyncio.timeout(5):
                    reply = await r.read()
                assert SECRET.encode() not in reply
            w.close()
    run(t, timeout=20)
