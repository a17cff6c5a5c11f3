"""A real registry on loopback for the image tests: Debian's ``docker-registry``
(distribution v2) started per test session with its own config, port and storage
dir; images written as OCI layouts by the tests themselves and pushed through
the distribution API; a small forwarding proxy that can cut or tamper with a
blob; a tiny bearer-token server. Everything listens on 127.0.0.1 only."""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import http.client
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

REGISTRY_BIN = shutil.which("docker-registry")
HTPASSWD_BIN = shutil.which("htpasswd")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- images


@dataclass
class Image:
    """An image as blobs: config, layers (gzip), manifest; ``blobs`` digest -> bytes."""

    manifest: bytes
    config: bytes
    layers: list[bytes]
    blobs: dict[str, bytes] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return sha(self.manifest)


def layer(files: dict[str, bytes | str], *, symlinks: dict[str, str] | None = None,
          mtime: int = 0) -> tuple[bytes, str]:
    """A gzip layer of ``files`` (path -> content) plus ``symlinks`` (path -> target).
    Returns (blob, diff_id)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({os.path.dirname(p) for p in [*files, *(symlinks or {})]} - {""})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(info)
        for path, data in sorted(files.items()):
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(raw), 0o755, mtime
            tar.addfile(info, io.BytesIO(raw))
        for path, target in sorted((symlinks or {}).items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, mtime
            tar.addfile(info)
    raw = buf.getvalue()
    return gzip.compress(raw, compresslevel=1, mtime=0), sha(raw)


def image(layers: list[tuple[bytes, str]], config: dict[str, Any] | None = None) -> Image:
    cfg = json.dumps({"architecture": ARCH, "os": "linux", "config": config or {},
                      "rootfs": {"type": "layers", "diff_ids": [d for _, d in layers]}}
                     ).encode()
    blobs = {sha(cfg): cfg} | {sha(b): b for b, _ in layers}
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha(cfg), "size": len(cfg)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": sha(b), "size": len(b)} for b, _ in layers]}).encode()
    return Image(manifest, cfg, [b for b, _ in layers], blobs)


def busybox_image(extra: dict[str, bytes | str] | None = None) -> Image:
    """An image of the host's busybox (``busybox-static``) with a few applets linked,
    plus ``extra`` files in a second layer; a small script when there is no busybox."""
    bb = shutil.which("busybox")
    files: dict[str, bytes | str] = {}
    links: dict[str, str] = {}
    if bb:
        with open(bb, "rb") as f:
            files["bin/busybox"] = f.read()
        links = {f"bin/{a}": "busybox" for a in ("sh", "ls", "cat", "echo", "true")}
    else:
        files["bin/sh"] = "#!/bin/sh\necho no busybox here\n"
    files["etc/passwd"] = "root:x:0:0:root:/root:/bin/sh\n"
    layers = [layer(files, symlinks=links)]
    if extra:
        layers.append(layer(extra))
    return image(layers, {"Entrypoint": ["/bin/sh"], "Cmd": ["-c", "echo hi"],
                          "Env": ["PATH=/bin"], "WorkingDir": "/app"})


def index_of(manifests: list[tuple[Image, str]]) -> bytes:
    """An OCI image index of (image, architecture) entries."""
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": img.digest, "size": len(img.manifest),
         "platform": {"architecture": arch, "os": "linux"}} for img, arch in manifests]}
    ).encode()


def write_layout(root: str, tagged: dict[str, Image]) -> str:
    """An OCI image layout at ``root`` holding each image under its tag (several
    manifests in one ``index.json``, each with ``org.opencontainers.image.ref.name``)."""
    blobs = os.path.join(root, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    entries = []
    for tag, img in tagged.items():
        for data in [*img.blobs.values(), img.manifest]:
            with open(os.path.join(blobs, sha(data)[7:]), "wb") as f:
                f.write(data)
        entries.append({"mediaType": OCI_MANIFEST, "digest": img.digest,
                        "size": len(img.manifest),
                        "annotations": {"org.opencontainers.image.ref.name": tag}})
    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": entries}, f)
    with open(os.path.join(root, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return root


# ---------------------------------------------------------------- the registry


@dataclass
class Registry:
    """A running ``docker-registry serve`` on 127.0.0.1:``port``."""

    port: int
    proc: subprocess.Popen[bytes]
    dir: str
    auth: httpx.Auth | None = None
    token_auth: tuple[str, str] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, auth=self.auth, timeout=30, trust_env=False)

    def push(self, repo: str, tag: str, img: Image) -> str:
        """Push an image's blobs and manifest (monolithic uploads); its digest."""
        with self._client() as c:
            for digest, data in img.blobs.items():
                self._blob(c, repo, digest, data)
            return self.put_manifest(repo, tag, img.manifest, OCI_MANIFEST, c)

    def _blob(self, c: httpx.Client, repo: str, digest: str, data: bytes) -> None:
        if c.head(f"/v2/{repo}/blobs/{digest}").status_code == 200:
            return
        r = c.post(f"/v2/{repo}/blobs/uploads/")
        assert r.status_code == 202, r.text
        loc = r.headers["location"]
        sep = "&" if "?" in loc else "?"
        r = c.put(f"{loc}{sep}digest={digest}", content=data,
                  headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 201, r.text

    def put_manifest(self, repo: str, tag: str, body: bytes, media_type: str,
                     c: httpx.Client | None = None) -> str:
        with contextlib.ExitStack() as stack:
            if c is None:
                c = stack.enter_context(self._client())
            r = c.put(f"/v2/{repo}/manifests/{tag}", content=body,
                      headers={"Content-Type": media_type})
            assert r.status_code == 201, r.text
            return str(r.headers["docker-content-digest"])


def _config(root: str, port: int, auth: str = "", data: str | None = None) -> str:
    data = data or os.path.join(root, "data")
    os.makedirs(data, exist_ok=True)
    path = os.path.join(root, "config.yml")
    with open(path, "w") as f:
        f.write("version: 0.1\nlog:\n  level: error\n  accesslog: {disabled: true}\n"
                f"storage:\n  filesystem: {{rootdirectory: {data}}}\n  delete: {{enabled: true}}\n"
                f"http:\n  addr: 127.0.0.1:{port}\n  secret: corral-test-secret\n"
                "health: {storagedriver: {enabled: false}}\n" + auth)
    return path


@contextlib.contextmanager
def registry(root: str, auth: str = "", client_auth: httpx.Auth | None = None,
             data: str | None = None) -> Iterator[Registry]:
    """``docker-registry serve`` on a free loopback port, stopped (by its pid) after;
    ``data`` another registry's storage dir to serve (its images, read-only use)."""
    assert REGISTRY_BIN is not None
    os.makedirs(root, exist_ok=True)
    port = free_port()
    cfg = _config(root, port, auth, data)
    log = open(os.path.join(root, "registry.log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen([REGISTRY_BIN, "serve", cfg], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1, trust_env=False)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    with open(os.path.join(root, "registry.log"), "rb") as f:
                        raise RuntimeError(f"docker-registry did not start: {f.read()[-2000:]!r}"
                                           ) from None
                time.sleep(0.02)
        yield Registry(port, proc, root, client_auth)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def htpasswd_auth(root: str, user: str, password: str) -> str:
    """The registry config's auth section for an htpasswd file (bcrypt) of one user."""
    assert HTPASSWD_BIN is not None
    path = os.path.join(root, "htpasswd")
    os.makedirs(root, exist_ok=True)
    line = subprocess.run([HTPASSWD_BIN, "-Bbn", user, password], check=True,
                          capture_output=True).stdout
    with open(path, "wb") as f:
        f.write(line)
    return f"auth:\n  htpasswd:\n    realm: corral-test\n    path: {path}\n"


# ---------------------------------------------------------------- helper servers


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


@contextlib.contextmanager
def serve(handler: type[http.server.BaseHTTPRequestHandler], **attrs: Any) -> Iterator[Any]:
    """Run ``handler`` on a loopback port in a thread; yields the server (``.port``)."""
    srv = _Server(("127.0.0.1", 0), handler)
    for k, v in attrs.items():
        setattr(srv, k, v)
    srv.port = srv.server_address[1]  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


class Proxy(http.server.BaseHTTPRequestHandler):
    """Forwards GETs to ``server.upstream`` (host:port). ``server.mode``: ``pass``,
    ``cut`` (a blob answer stops after ``server.cut_at`` bytes and the connection
    closes), ``flip`` (one byte of every blob changed), ``manifest`` (a space before
    every manifest: valid JSON, other bytes; the registry's digest header kept),
    ``slow`` (blobs trickle, 64 KiB per 50 ms), ``redirect`` (blobs: 307 to upstream).
    ``server.seen`` records (path, Range header) of each request."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a: Any) -> None:
        pass

    def do_GET(self) -> None:
        try:
            self._forward()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (a test's point, often)

    def _forward(self) -> None:
        srv: Any = self.server
        srv.seen.append((self.path, self.headers.get("Range")))
        if srv.mode == "redirect" and "/blobs/" in self.path:  # as registries send to CDNs
            self.send_response(307)
            self.send_header("Location", f"http://{srv.upstream}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        conn = http.client.HTTPConnection(srv.upstream, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        conn.request("GET", self.path, headers=headers)
        up = conn.getresponse()
        body = up.read()
        conn.close()
        blob = "/blobs/" in self.path and up.status in (200, 206)
        if blob and srv.mode == "flip" and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        if "/manifests/" in self.path and up.status == 200 and srv.mode == "manifest":
            body = b" " + body  # the same JSON, other bytes: another digest
        self.send_response(up.status)
        for k, v in up.getheaders():
            if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        if blob and srv.mode == "cut":
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[:srv.cut_at])
            self.wfile.flush()
            self.close_connection = True
            return
        self.end_headers()
        if blob and srv.mode == "slow":  # a trickle: 64 KiB every 50 ms
            for i in range(0, len(body), 1 << 16):
                self.wfile.write(body[i:i + (1 << 16)])
                self.wfile.flush()
                time.sleep(0.05)
            return
        self.wfile.write(body)


@contextlib.contextmanager
def proxy(upstream: str, mode: str = "pass", cut_at: int = 0) -> Iterator[Any]:
    with serve(Proxy, upstream=upstream, mode=mode, cut_at=cut_at, seen=[]) as srv:
        yield srv


# ---------------------------------------------------------------- bearer tokens


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenIssuer:
    """An ES256 key and self-signed cert; signs registry tokens distribution accepts."""

    key: Any
    cert_pem: bytes
    kid: str

    @classmethod
    def make(cls) -> TokenIssuer:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral-token")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .sign(key, hashes.SHA256()))
        der = key.public_key().public_bytes(serialization.Encoding.DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
        b32 = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode()
        kid = ":".join(b32[i:i + 4] for i in range(0, 48, 4))
        return cls(key, cert.public_bytes(serialization.Encoding.PEM), kid)

    def token(self, sub: str, service: str, access: list[dict[str, Any]]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
        now = int(time.time())
        head = {"alg": "ES256", "typ": "JWT", "kid": self.kid}
        claims = {"iss": "corral-test-issuer", "sub": sub, "aud": service, "exp": now + 300,
                  "nbf": now - 5, "iat": now, "jti": os.urandom(8).hex(), "access": access}
        signing = f"{_b64(json.dumps(head).encode())}.{_b64(json.dumps(claims).encode())}"
        der = self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return f"{signing}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


class TokenServer(http.server.BaseHTTPRequestHandler):
    """GET /token?service=..&scope=repository:NAME:ACTIONS: with Basic auth matching
    ``server.users`` the token grants the scope's actions; anonymous requests get
    nothing (an empty access list). ``server.requests`` counts requests."""

    def log_message(self, *a: Any) -> None:
        pass

    def do_GET(self) -> None:
        srv: Any = self.server
        srv.requests += 1
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        user = None
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            u, _, p = base64.b64decode(auth[6:]).decode().partition(":")
            if srv.users.get(u) != p:
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            user = u
        access = []
        for scope in q.get("scope", []):
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            if user is not None and kind == "repository":
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
        tok = srv.issuer.token(user or "", q.get("service", [""])[0], access)
        body = json.dumps({"token": tok, "access_token": tok}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def token_auth_config(root: str, issuer: TokenIssuer, realm: str) -> str:
    os.makedirs(root, exist_ok=True)
    cert = os.path.join(root, "token-cert.pem")
    with open(cert, "wb") as f:
        f.write(issuer.cert_pem)
    return (f"auth:\n  token:\n    realm: {realm}\n    service: corral-registry\n"
            f"    issuer: corral-test-issuer\n    rootcertbundle: {cert}\n")
