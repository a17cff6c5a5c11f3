"""The egress proxy against a direct connection on loopback, side by side.

Usage: .venv/bin/python benchmarks/bench_egress.py [--runs N] [--mib M] [--setups K]

Three processes, as in use: an upstream server (a blocking TCP server on
127.0.0.1, one thread per connection: the client sends an 8-byte length N, the
server sends N bytes from a preallocated buffer and closes), the proxy
(``EgressProxy`` in its own process with its own event loop, policy
``allowlist("bench.test", "127.0.0.0/8")``, names resolved by a table: no DNS),
and the client (this process: blocking sockets, ``recv_into`` a preallocated
1 MiB buffer). Variants, interleaved every round (A B C ..., the order reversed
every other round), N rounds:

- ``direct``: the client connects to the upstream over TCP;
- ``CONNECT (unix)``: HTTP CONNECT over the proxy's unix socket;
- ``SOCKS5 (unix)``: SOCKS5 with a domain name over the same socket;
- ``CONNECT (tcp listener)``: HTTP CONNECT to a TCP listener on 127.0.0.1 given
  to the proxy with ``add_listener`` (how a sandbox's netns reaches it);
- ``CONNECT, ClientHello first``: setup only: the upstream port is one of the
  proxy's ``tls_ports``, so the proxy reads and checks a real ClientHello (SNI
  ``bench.test``) before it connects upstream.

Then HTTPS (TLS in the client, a keep-alive origin answering ``GET /N`` with N
bytes, its own test CA made with ``cryptography``, the ``secrets`` extra): direct,
through a CONNECT tunnel the proxy does not open, and to a name with a secret
header (intercepted: TLS terminated with the proxy's CA, re-encrypted upstream);
M/4 MiB per run, TLS handshake included. Informational: no goal.

Last, the request-head parser alone (h11 behind the strict framing checks), in
microseconds per head: informational.

Bulk: M MiB (default 256) downloaded per run; MB/s and the ratio to ``direct``
(median of the per-round ratios). Setup: from ``socket()`` to the first reply
byte of a 1-byte download, K connections per round (median of each); ms and the
added ms (median of the per-round differences to ``direct``). Goal (issue 13):
bulk within 10% of direct (ratio >= 0.90), at most 1 ms added per connection.
The machine is shared: compare the ratios of one run, not absolute figures
across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import socket
import ssl
import statistics
import struct
import sys
import tempfile
import threading
import time
import timeit
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Final

from corral.providers.linux.host.egress import (
    EgressLimits,
    EgressPolicy,
    EgressProxy,
    parse_http_head,
)

__all__ = ["main"]

HOST = "bench.test"
#: a name whose requests get a secret header: intercepted by the proxy
SECRET_HOST = "secret.test"
BUF = 1 << 20


def _origin_tls(d: str) -> tuple[str, str, bytes]:
    """A test CA and a certificate for HOST and SECRET_HOST: (chain file, key file, CA
    PEM). Files under ``d`` (a benchmark's own origin, not the proxy's CA)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench origin CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - day).not_valid_after(now + day)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - day).not_valid_after(now + day)
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName(HOST), x509.DNSName(SECRET_HOST)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    chain, keyfile = os.path.join(d, "chain.pem"), os.path.join(d, "key.pem")
    with open(chain, "wb") as f:
        f.write(leaf.public_bytes(serialization.Encoding.PEM) + ca_pem)
    with open(keyfile, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return chain, keyfile, ca_pem


# --------------------------------------------------------------------------- upstream


def _upstream(ready: Connection, chain: str, keyfile: str) -> None:
    """Serve: read an 8-byte length, send that many bytes, close (two ports); and HTTPS
    on a third: ``GET /N`` answered with N bytes, keep-alive. Runs in a child."""
    data = memoryview(bytearray(os.urandom(1 << 16) * 64))      # 4 MiB
    servers = [socket.create_server(("127.0.0.1", 0), backlog=512) for _ in range(3)]
    ready.send(tuple(srv.getsockname()[1] for srv in servers))
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(chain, keyfile)

    def https(raw: socket.socket) -> None:
        try:
            with tls.wrap_socket(raw, server_side=True) as c:
                while True:
                    head = b""
                    while not head.endswith(b"\r\n\r\n"):
                        more = c.recv(1)
                        if not more:
                            return
                        head += more
                    n = int(head.split(b" ")[1][1:])
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n)
                    while n > 0:
                        k = min(n, len(data))
                        c.sendall(data[:k])
                        n -= k
        except (OSError, ValueError):
            pass

    def handle(c: socket.socket) -> None:
        with c:
            try:
                first = c.recv(1, socket.MSG_PEEK)
                if first == b"\x16":                   # a ClientHello first: skip it
                    rec = b""
                    while len(rec) < 5:
                        rec += c.recv(5 - len(rec))
                    skip = int.from_bytes(rec[3:5], "big")
                    while skip > 0:
                        skip -= len(c.recv(skip))
                head = b""
                while len(head) < 8:
                    more = c.recv(8 - len(head))
                    if not more:
                        return
                    head += more
                (n,) = struct.unpack("!Q", head)
                while n > 0:
                    k = min(n, len(data))
                    c.sendall(data[:k])
                    n -= k
            except OSError:
                pass

    def accept(srv: socket.socket, serve: Callable[[socket.socket], None]) -> None:
        while True:
            c, _ = srv.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, args=(servers[1], handle), daemon=True).start()
    threading.Thread(target=accept, args=(servers[2], https), daemon=True).start()
    accept(servers[0], handle)


# --------------------------------------------------------------------------- proxy


def _proxy(path: str, tls_ports: tuple[int, ...], origin_ca: bytes,
           ready: Connection) -> None:
    """Run the proxy until the parent sends on ``ready`` (or closes it). Runs in a child."""
    async def resolve(host: str, port: int) -> Sequence[str]:
        if host not in (HOST, SECRET_HOST):
            raise OSError(f"no such name {host}")
        return ["127.0.0.1"]

    async def serve() -> None:
        limits = EgressLimits(tls_ports=frozenset({443, *tls_ports}))
        policy = EgressPolicy.allowlist(HOST, SECRET_HOST, "127.0.0.0/8").with_secret(
            SECRET_HOST, {"Authorization": "Bearer bench-secret"})
        proxy = EgressProxy(policy, resolver=resolve, limits=limits,
                            upstream_ssl_context=ssl.create_default_context(
                                cadata=origin_ca.decode()))
        await proxy.start(path)
        lsock = socket.create_server(("127.0.0.1", 0), backlog=512)
        await proxy.add_listener(lsock)
        ready.send((lsock.getsockname()[1], proxy.ca_bundle_pem))
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def stop() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(ready.fileno(), stop)
        await done
        await proxy.aclose()

    asyncio.run(serve())


# --------------------------------------------------------------------------- client

Opener = Callable[[int], socket.socket]


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        more = s.recv(n - len(out))
        if not more:
            raise ConnectionError("closed early")
        out += more
    return out


def _recv_head(s: socket.socket) -> bytes:
    """The reply head, and not a byte more: peek at what arrived, then take the head (as
    a buffered client reads it: one read, not a system call per byte)."""
    out = b""
    if isinstance(s, ssl.SSLSocket):           # no MSG_PEEK on TLS: a byte at a time
        while not out.endswith(b"\r\n\r\n") and len(out) < 65536:
            more = s.recv(1)
            if not more:
                raise ConnectionError("closed inside the reply head")
            out += more
        return out
    while len(out) < 65536:
        peek = s.recv(4096, socket.MSG_PEEK)
        if not peek:
            raise ConnectionError("closed inside the reply head")
        end = (out[-3:] + peek).find(b"\r\n\r\n")
        if end >= 0:
            return out + _recv_exact(s, end + 4 - len(out[-3:]))
        out += _recv_exact(s, len(peek))
    raise ConnectionError("reply head too long")


def _client_hello() -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=HOST)
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def direct(port: int) -> Opener:
    def open_(n: int) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(struct.pack("!Q", n))
        return s
    return open_


def http_connect(path: str | None, tcp_port: int | None, port: int,
                 hello: bytes = b"") -> Opener:
    req = f"CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()

    def open_(n: int) -> socket.socket:
        if path is not None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
        else:
            assert tcp_port is not None
            s = socket.create_connection(("127.0.0.1", tcp_port))
        s.sendall(req)
        head = _recv_head(s)
        if not head.startswith(b"HTTP/1.1 200"):
            raise ConnectionError(head.decode("latin-1", "replace"))
        s.sendall(hello + struct.pack("!Q", n))
        return s
    return open_


def socks5(path: str, port: int) -> Opener:
    name = HOST.encode()
    req = b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(name)]) + name + \
        struct.pack("!H", port)

    def open_(n: int) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(req)
        reply = _recv_exact(s, 2 + 10)
        if reply[:2] != b"\x05\x00" or reply[3] != 0:
            raise ConnectionError(f"SOCKS5 refused: {reply!r}")
        s.sendall(struct.pack("!Q", n))
        return s
    return open_


HttpsOpener = Callable[[], ssl.SSLSocket]


def https_direct(port: int, ctx: ssl.SSLContext, name: str) -> HttpsOpener:
    def open_() -> ssl.SSLSocket:
        return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)),
                               server_hostname=name)
    return open_


def https_via_proxy(path: str, port: int, ctx: ssl.SSLContext, name: str) -> HttpsOpener:
    req = f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode()

    def open_() -> ssl.SSLSocket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(req)
        head = _recv_head(s)
        if not head.startswith(b"HTTP/1.1 200"):
            raise ConnectionError(head.decode("latin-1", "replace"))
        return ctx.wrap_socket(s, server_hostname=name)
    return open_


def https_get(open_: HttpsOpener, authority: str, size: int, buf: memoryview) -> float:
    """Seconds for an HTTPS GET of ``size`` bytes (TLS handshake included)."""
    t0 = time.perf_counter()
    with open_() as s:
        s.sendall(f"GET /{size} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        head = _recv_head(s)
        if not head.startswith(b"HTTP/1.1 200"):
            raise ConnectionError(head.decode("latin-1", "replace"))
        got = 0
        while got < size:
            k = s.recv_into(buf)
            if not k:
                raise ConnectionError(f"closed after {got} of {size} bytes")
            got += k
    return time.perf_counter() - t0


def bulk(open_: Opener, size: int, buf: memoryview) -> float:
    """Seconds to download ``size`` bytes (connection setup included, negligible)."""
    t0 = time.perf_counter()
    s = open_(size)
    got = 0
    try:
        while got < size:
            k = s.recv_into(buf)
            if not k:
                raise ConnectionError(f"closed after {got} of {size} bytes")
            got += k
    finally:
        s.close()
    return time.perf_counter() - t0


def setup(open_: Opener) -> float:
    """Seconds from socket() to the first byte of a 1-byte download."""
    t0 = time.perf_counter()
    s = open_(1)
    try:
        if not s.recv(1):
            raise ConnectionError("no reply byte")
        return time.perf_counter() - t0
    finally:
        s.close()


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="rounds (default 7)")
    ap.add_argument("--mib", type=int, default=256, help="MiB per bulk download (256)")
    ap.add_argument("--setups", type=int, default=50,
                    help="connections per setup variant per round (50)")
    args = ap.parse_args(argv)
    ctx = multiprocessing.get_context("fork")
    d = tempfile.mkdtemp(prefix="bench-egress-", dir="/tmp")
    path = os.path.join(d, "p.sock")
    chain, keyfile, origin_ca = _origin_tls(d)
    up_ready, up_child = ctx.Pipe()
    up = ctx.Process(target=_upstream, args=(up_child, chain, keyfile), daemon=True)
    up.start()
    port, tls_port, https_port = up_ready.recv()
    px_ready, px_child = ctx.Pipe()
    px = ctx.Process(target=_proxy, args=(path, (tls_port, https_port), origin_ca, px_child),
                     daemon=True)
    px.start()
    tcp_port, proxy_ca = px_ready.recv()
    try:
        run(args, port, tls_port, path, tcp_port, px.pid, up.pid)
        run_https(args, https_port, path, origin_ca, proxy_ca)
        run_parse()
    finally:
        px_ready.send("stop")
        px_ready.close()
        px.join(10)
        up.terminate()
        up.join(5)
        for f in (path, chain, keyfile):
            with contextlib.suppress(OSError):
                os.unlink(f)
        os.rmdir(d)


#: request heads as clients send them: curl's CONNECT, and a GET with ten headers
PARSE_HEADS: Final = {
    "CONNECT (curl)": b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443"
                      b"\r\nUser-Agent: curl/8.5.0\r\nProxy-Connection: Keep-Alive\r\n\r\n",
    "GET, 10 headers": b"GET /simple/corral/ HTTP/1.1\r\nHost: pypi.org\r\n" + b"".join(
        b"X-H%d: value number %d\r\n" % (i, i) for i in range(9)) + b"\r\n",
}


def run_parse(n: int = 20_000) -> None:
    """The request-head parser alone (``parse_http_head``: h11 and the strict framing
    checks), per head: the best of 5 runs of ``n``; informational, for comparing the
    parser across changes (it is a small part of a connection's setup above)."""
    print(f"\nrequest head parse ({n} heads, best of 5)   us/head")
    for name, raw in PARSE_HEADS.items():
        best = min(timeit.repeat(lambda raw=raw: parse_http_head(raw), number=n, repeat=5))
        print(f"{name:<40}{best / n * 1e6:>6.1f}")


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (None: this process) so far."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _three_cpu_s(proxy_pid: int | None, upstream_pid: int | None) -> float:
    """CPU seconds (user + system, kernel work such as softirqs included where it ran in
    their context) of the client (this process), the proxy and the upstream so far: the
    work of one transfer, whatever else the machine runs."""
    return _cpu_s(None) + sum(_cpu_s(p) for p in (proxy_pid, upstream_pid) if p is not None)


def run(args: argparse.Namespace, port: int, tls_port: int, path: str, tcp_port: int,
        proxy_pid: int | None, upstream_pid: int | None = None) -> None:
    size = args.mib << 20
    buf = memoryview(bytearray(BUF))
    bulk_variants: list[tuple[str, Opener]] = [
        ("direct", direct(port)),
        ("CONNECT (unix)", http_connect(path, None, port)),
        ("SOCKS5 (unix)", socks5(path, port)),
        ("CONNECT (tcp listener)", http_connect(None, tcp_port, port)),
    ]
    setup_variants = [*bulk_variants,
                      ("CONNECT, ClientHello first", http_connect(path, None, tls_port,
                                                                  _client_hello()))]
    for _, o in setup_variants:                 # warm up every path once
        setup(o)
    bulk(bulk_variants[1][1], 16 << 20, buf)
    rates: dict[str, list[float]] = {k: [] for k, _ in bulk_variants}
    setups: dict[str, list[float]] = {k: [] for k, _ in setup_variants}
    proxy_cpu: list[float] = []
    busy: dict[str, list[float]] = {k: [] for k, _ in bulk_variants}
    load0 = os.getloadavg()[0]
    for r in range(args.runs):
        order = bulk_variants if r % 2 == 0 else bulk_variants[::-1]
        for k, o in order:
            before = _cpu_s(proxy_pid)
            three = _three_cpu_s(proxy_pid, upstream_pid)
            rates[k].append(size / bulk(o, size, buf) / 1e6)
            busy[k].append(_three_cpu_s(proxy_pid, upstream_pid) - three)
            if k != "direct":
                proxy_cpu.append(_cpu_s(proxy_pid) - before)
        sorder = setup_variants if r % 2 == 0 else setup_variants[::-1]
        for k, o in sorder:
            setups[k].append(statistics.median(setup(o) for _ in range(args.setups)))
    load1 = os.getloadavg()[0]
    print(f"egress proxy vs direct on loopback: {args.runs} rounds, {args.mib} MiB per bulk "
          f"run, {args.setups} connections per setup figure; python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cpus, load {load0:.1f} -> {load1:.1f}")
    print()
    gib = size / (1 << 30)
    cpus = os.cpu_count() or 1
    print(f"{'bulk download':<30} {'MB/s med':>9} {'min':>7} {'max':>7} {'ratio':>6} "
          f"{'cores':>5} {'cpu/GiB':>7}  goal")
    for k, _ in bulk_variants:
        ratio = statistics.median(a / b for a, b in zip(rates[k], rates["direct"], strict=True))
        goal = "" if k == "direct" else ("met" if ratio >= 0.90 else "NOT met") + " (>= 0.90)"
        # cores: the cores client, proxy and upstream kept busy together while it ran (of
        # cpus); cpu/GiB: their CPU seconds per GiB carried
        cores = statistics.median(b / (size / r / 1e6) for b, r in zip(busy[k], rates[k],
                                                                        strict=True))
        print(f"{k:<30} {statistics.median(rates[k]):9.0f} {min(rates[k]):7.0f} "
              f"{max(rates[k]):7.0f} {ratio:6.2f} {cores:5.2f} "
              f"{statistics.median(busy[k]) / gib:7.2f}  {goal}")
    # the CPU floor: when the cores are the limit, a variant that costs c CPU-s per GiB
    # reaches at most c_direct / c of direct's rate (and less while direct leaves a core
    # part idle: direct's "cores" column)
    c_direct = statistics.median(busy["direct"])
    floors = ", ".join(f"{k} {c_direct / max(statistics.median(busy[k]), 1e-9):.2f}"
                       for k, _ in bulk_variants[1:])
    print(f"CPU floor: with the {cpus} cores the limit, the most of direct's rate each "
          f"can reach (direct's CPU per GiB / its own): {floors}")
    print(f"the proxy's CPU (user + system) per GiB carried: "
          f"{statistics.median(proxy_cpu) / gib:.2f} s (median of {len(proxy_cpu)} runs)")
    print()
    print(f"{'connection setup':<30} {'ms med':>9} {'+ms':>7}  goal")
    for k, _ in setup_variants:
        added = statistics.median((a - b) * 1e3 for a, b in zip(setups[k], setups["direct"],
                                                                strict=True))
        goal = "" if k == "direct" else ("met" if added <= 1.0 else "NOT met") + " (<= +1 ms)"
        print(f"{k:<30} {statistics.median(setups[k]) * 1e3:9.3f} {added:+7.3f}  {goal}")



def run_https(args: argparse.Namespace, https_port: int, path: str, origin_ca: bytes,
              proxy_ca: bytes) -> None:
    """HTTPS downloads (TLS in the client, as most traffic is): direct, through a tunnel
    the proxy does not open (the client's TLS end to end), and intercepted (a host with
    a secret: the proxy terminates TLS with its CA, adds the header, re-encrypts)."""
    size = max(1, args.mib // 4) << 20
    buf = memoryview(bytearray(BUF))
    origin = ssl.create_default_context(cadata=origin_ca.decode())
    proxied = ssl.create_default_context(cadata=proxy_ca.decode())
    plain, secret = f"{HOST}:{https_port}", f"{SECRET_HOST}:{https_port}"
    variants: list[tuple[str, str, HttpsOpener]] = [
        ("direct", plain, https_direct(https_port, origin, HOST)),
        ("tunnel (not intercepted)", plain, https_via_proxy(path, https_port, origin, HOST)),
        ("intercepted (secret added)", secret,
         https_via_proxy(path, https_port, proxied, SECRET_HOST)),
    ]
    for _, name, o in variants:
        https_get(o, name, 1 << 20, buf)
    rates: dict[str, list[float]] = {k: [] for k, _, _ in variants}
    for r in range(args.runs):
        for k, name, o in (variants if r % 2 == 0 else variants[::-1]):
            rates[k].append(size / https_get(o, name, size, buf) / 1e6)
    print()
    print(f"{'HTTPS download, ' + str(size >> 20) + ' MiB':<30} {'MB/s med':>9} {'min':>7} "
          f"{'max':>7} {'ratio':>6}")
    for k, _, _ in variants:
        ratio = statistics.median(a / b for a, b in zip(rates[k], rates["direct"], strict=True))
        print(f"{k:<30} {statistics.median(rates[k]):9.0f} {min(rates[k]):7.0f} "
              f"{max(rates[k]):7.0f} {ratio:6.2f}")


if __name__ == "__main__":
    main()
