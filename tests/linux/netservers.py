"""Servers and certificates for the strict provider's network tests (issue 13).

Every server listens on the host's loopback (127.0.0.1) only, on a port the kernel
picks, in a thread of its own, and records what it received; tests reach them from
inside a sandbox only through the sandbox's egress proxy, with names mapped to
127.0.0.1 by a resolver the test gives the provider (never the host's DNS).
"""

from __future__ import annotations

import datetime
import hashlib
import http.server
import io
import socket
import ssl
import tempfile
import threading
import zipfile
from base64 import urlsafe_b64encode
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class MapResolver:
    """An egress resolver for tests: names in ``names`` resolve to their addresses,
    everything else to nothing (the proxy answers 502 / "unresolvable")."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append(host)
        return list(self.names.get(host, []))


@dataclass
class TestCA:
    """A CA and one server certificate (PEM) made for a test."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    dir: Path

    @property
    def ca_file(self) -> str:
        return str(self.dir / "ca.pem")

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.dir / "cert.pem"), str(self.dir / "key.pem"))
        return ctx


def _san(name: str) -> Any:
    """A DNS name's SAN, or an IP address's (``127.0.0.1``)."""
    import ipaddress

    from cryptography import x509
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def make_ca(*names: str, within: Path) -> TestCA:
    """A fresh CA and a server certificate for ``names`` (DNS SANs; an address's an IP
    SAN), in a new private
    directory under ``within`` (a test's ``tmp_path``: the ``test_ca`` fixture removes
    it, private key and all, when the test ends)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    d = Path(tempfile.mkdtemp(prefix="corral-netca-", dir=within))
    out = TestCA(ca.public_bytes(pem), cert.public_bytes(pem),
                 key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()), d)
    (d / "ca.pem").write_bytes(out.ca_pem)
    (d / "cert.pem").write_bytes(out.cert_pem)
    (d / "key.pem").write_bytes(out.key_pem)
    return out


@dataclass
class Served:
    """A running loopback server: its port and what it saw."""

    port: int
    #: (method, path, headers as a dict with lower-case names) per request
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    connections: int = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Any
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        served: Served = self.server.served
        served.requests.append(("GET", self.path,
                                {k.lower(): v for k, v in self.headers.items()}))
        files: dict[str, bytes] = self.server.files
        body = files.get(self.path)
        if body is None:
            body = files.get("*", b"")
            if not body:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        self.send_response(200)
        ctype = "text/html" if self.path.endswith("/") else "application/octet-stream"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_a: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, files: dict[str, bytes], ctx: ssl.SSLContext | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files = files
        self.ctx = ctx
        self.served = Served(self.server_address[1])

    def get_request(self) -> Any:
        sock, addr = super().get_request()
        self.served.connections += 1
        if self.ctx is not None:
            sock = self.ctx.wrap_socket(sock, server_side=True,
                                         do_handshake_on_connect=False)
        return sock, addr


@contextmanager
def http_server(files: dict[str, bytes], ctx: ssl.SSLContext | None = None
                ) -> Iterator[Served]:
    """An HTTP (or, with ``ctx``, HTTPS) server on 127.0.0.1 serving ``files`` by path
    (``"*"``: any other path)."""
    srv = _Server(files, ctx)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True)
    t.start()
    try:
        yield srv.served
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def build_wheel(name: str, version: str, module_src: str) -> tuple[str, bytes]:
    """A minimal pure-python wheel: (file name, bytes) with ``name/__init__.py``."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": module_src.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                            .encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: corral-test\n"
                         b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


def simple_index(name: str, wheel_name: str, wheel: bytes) -> dict[str, bytes]:
    """A PEP 503 simple index with one project and one wheel, as server files."""
    digest = hashlib.sha256(wheel).hexdigest()
    return {
        "/simple/": f'<html><body><a href="/simple/{name}/">{name}</a></body></html>'
                    .encode(),
        f"/simple/{name}/": (f'<html><body><a href="/files/{wheel_name}#sha256={digest}">'
                             f"{wheel_name}</a></body></html>").encode(),
        f"/files/{wheel_name}": wheel,
    }


@contextmanager
def threaded_accept(srv: socket.socket, conn: Callable[[socket.socket], None]) -> Iterator[None]:
    """Accept on ``srv`` in a thread, each connection served by ``conn`` in a thread of
    its own, until the block ends; then stop accepting and close ``srv``."""
    stop = threading.Event()
    srv.settimeout(0.1)

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=conn, args=(c,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)
        srv.close()
