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
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection

from corral.providers.linux.host.egress import EgressLimits, EgressPolicy, EgressProxy

__all__ = ["main"]

HOST = "bench.test"
BUF = 1 << 20


# --------------------------------------------------------------------------- upstream


def _upstream(ready: Connection) -> None:
    """Serve: read an 8-byte length, send that many bytes, close. Runs in a child."""
    data = memoryview(bytearray(os.urandom(1 << 16) * 64))      # 4 MiB
    servers = [socket.create_server(("127.0.0.1", 0), backlog=512) for _ in range(2)]
    ready.send(tuple(srv.getsockname()[1] for srv in servers))

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

    def accept(srv: socket.socket) -> None:
        while True:
            c, _ = srv.accept()
            threading.Thread(target=handle, args=(c,), daemon=True).start()

    threading.Thread(target=accept, args=(servers[1],), daemon=True).start()
    accept(servers[0])


# --------------------------------------------------------------------------- proxy


def _proxy(path: str, tls_port: int, ready: Connection) -> None:
    """Run the proxy until the parent sends on ``ready`` (or closes it). Runs in a child."""
    async def resolve(host: str, port: int) -> Sequence[str]:
        if host != HOST:
            raise OSError(f"no such name {host}")
        return ["127.0.0.1"]

    async def serve() -> None:
        limits = EgressLimits(tls_ports=frozenset({443, tls_port}))
        proxy = EgressProxy(EgressPolicy.allowlist(HOST, "127.0.0.0/8"),
                            resolver=resolve, limits=limits)
        await proxy.start(path)
        lsock = socket.create_server(("127.0.0.1", 0), backlog=512)
        await proxy.add_listener(lsock)
        ready.send(lsock.getsockname()[1])
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
    out = b""
    while not out.endswith(b"\r\n\r\n"):
        more = s.recv(1)
        if not more:
            raise ConnectionError("closed inside the reply head")
        out += more
    return out


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
    up_ready, up_child = ctx.Pipe()
    up = ctx.Process(target=_upstream, args=(up_child,), daemon=True)
    up.start()
    port, tls_port = up_ready.recv()
    px_ready, px_child = ctx.Pipe()
    px = ctx.Process(target=_proxy, args=(path, tls_port, px_child), daemon=True)
    px.start()
    tcp_port = px_ready.recv()
    try:
        run(args, port, tls_port, path, tcp_port, px.pid)
    finally:
        px_ready.send("stop")
        px_ready.close()
        px.join(10)
        up.terminate()
        up.join(5)
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.rmdir(d)


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (None: this process) so far."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(args: argparse.Namespace, port: int, tls_port: int, path: str, tcp_port: int,
        proxy_pid: int | None) -> None:
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
    load0 = os.getloadavg()[0]
    for r in range(args.runs):
        order = bulk_variants if r % 2 == 0 else bulk_variants[::-1]
        for k, o in order:
            before = _cpu_s(proxy_pid)
            rates[k].append(size / bulk(o, size, buf) / 1e6)
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
    print(f"{'bulk download':<30} {'MB/s med':>9} {'min':>7} {'max':>7} {'ratio':>6}  goal")
    for k, _ in bulk_variants:
        ratio = statistics.median(a / b for a, b in zip(rates[k], rates["direct"], strict=True))
        goal = "" if k == "direct" else ("met" if ratio >= 0.90 else "NOT met") + " (>= 0.90)"
        print(f"{k:<30} {statistics.median(rates[k]):9.0f} {min(rates[k]):7.0f} "
              f"{max(rates[k]):7.0f} {ratio:6.2f}  {goal}")
    gib = size / (1 << 30)
    print(f"the proxy's CPU (user + system) per GiB carried: "
          f"{statistics.median(proxy_cpu) / gib:.2f} s (median of {len(proxy_cpu)} runs)")
    print()
    print(f"{'connection setup':<30} {'ms med':>9} {'+ms':>7}  goal")
    for k, _ in setup_variants:
        added = statistics.median((a - b) * 1e3 for a, b in zip(setups[k], setups["direct"],
                                                                strict=True))
        goal = "" if k == "direct" else ("met" if added <= 1.0 else "NOT met") + " (<= +1 ms)"
        print(f"{k:<30} {statistics.median(setups[k]) * 1e3:9.3f} {added:+7.3f}  {goal}")


if __name__ == "__main__":
    main()
