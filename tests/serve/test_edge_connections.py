"""The server's edge, connections (issue 23.4): half heads without a token cannot starve
tenants, a head that does not come in time is closed, a body that does not come in time is
cut. Through the real server (a subprocess on 127.0.0.1), with raw sockets for what an
HTTP client would not do."""

from __future__ import annotations

import contextlib
import http.client
import socket
import time
from collections.abc import Iterator

import pytest
from servehelp import ALICE, Server, config_text, metric, running

HALF_HEAD = b"GET /v1/info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """max_connections = 100: before the fix, 100 token-less sockets filled the one pool
    every tenant's requests were counted in."""
    tmp = tmp_path_factory.mktemp("edge")
    with running(tmp, config_text({"context-isolated": "subproc"},
                                  extra="max_connections = 100")) as s:
        yield s


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The same server with 2 s head and body timeouts (10 s by default): the two tests
    that wait for them take 2 s, not 10 (what is cut, and how, is the same)."""
    tmp = tmp_path_factory.mktemp("edge-quick")
    with running(tmp, config_text({"context-isolated": "subproc"}, extra=(
            "max_connections = 100\nhead_timeout_s = 2\nbody_timeout_s = 2"))) as s:
        yield s


def _connect(server: Server, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def _answer(sock: socket.socket, seconds: float) -> bytes:
    """Everything the server sends until it closes the connection (or ``seconds``)."""
    sock.settimeout(seconds)
    out = b""
    with contextlib.suppress(TimeoutError, ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
        return out + b"<EOF>"
    return out


def _info(server: Server, conn: http.client.HTTPConnection | None = None) -> int:
    c = conn or http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        c.request("GET", "/v1/info", headers={"authorization": f"Bearer {ALICE}"})
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        if conn is None:
            c.close()


def test_half_heads_without_a_token_do_not_starve_a_tenant(server: Server) -> None:
    """200 sockets holding half a request head and no token (twice max_connections): the
    tenant's requests on new connections and on its open keep-alive one are still
    answered 200 (before: 503 'Exceeded concurrency limit' for every tenant). The
    token-less ones are held to max_unauthenticated_connections (64 by default)."""
    kept = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    assert _info(server, kept) == 200  # authenticated before the flood
    socks: list[socket.socket] = []
    try:
        for _ in range(200):
            s = _connect(server)
            socks.append(s)
            with contextlib.suppress(OSError):  # an evicted one may be closed already
                s.sendall(HALF_HEAD)
        time.sleep(0.3)
        statuses = [_info(server) for _ in range(20)]
        assert statuses == [200] * 20, statuses
        assert _info(server, kept) == 200
        unauth = metric(server, 'corral_connections{auth="unauthenticated"}')
        assert unauth is not None and unauth <= 64, unauth
        evicted = metric(server, 'corral_edge_closed{reason="evicted"}')
        assert evicted is not None and evicted >= 200 - 64
    finally:
        kept.close()
        for s in socks:
            s.close()


def test_a_half_head_is_closed_after_the_head_timeout(quick: Server) -> None:
    """A connection that sends part of a head and then nothing is answered 408 and closed
    after head_timeout_s (10 s by default, 2 s here); so is one that sends nothing at
    all. Before, uvicorn waited for the rest forever."""
    half, silent = _connect(quick, 60), _connect(quick, 60)
    try:
        half.sendall(HALF_HEAD)
        t0 = time.monotonic()
        got = _answer(half, 30)
        took = time.monotonic() - t0
        assert got.startswith(b"HTTP/1.1 408 "), got[:200]
        assert got.endswith(b"<EOF>")
        assert 1.6 <= took <= 25, took
        assert _answer(silent, 10).endswith(b"<EOF>")
    finally:
        half.close()
        silent.close()


def test_a_body_that_does_not_come_is_cut(quick: Server) -> None:
    """A tenant's body that stops after a few bytes is cut with 408 and the connection
    closed once body_timeout_s (10 s by default, 2 s here) has passed and the least pace
    is not met. Before, the request waited for its body forever, holding its connection
    and its slot."""
    s = _connect(quick, 60)
    try:
        s.sendall(b"POST /v1/snippets HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Authorization: Bearer " + ALICE.encode() + b"\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                  b'{"source": "')
        t0 = time.monotonic()
        got = _answer(s, 40)
        took = time.monotonic() - t0
        assert got.startswith(b"HTTP/1.1 408 "), got[:300]
        assert b"request-timeout" in got
        assert got.endswith(b"<EOF>")
        assert 1.6 <= took <= 30, took
    finally:
        s.close()


def _kib(server: Server, field: str) -> int:
    with open(f"/proc/{server.pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{server.pid}/status")


def test_a_head_past_max_head_bytes_is_refused(server: Server) -> None:
    """A head of endless short header lines, no token: 431 and closed once it passes
    max_head_bytes (64 KiB), the server's peak resident size grows by less than 16 MiB.
    Before: httptools kept every line (64 MiB of them in 10 s took a server to 1.9 GiB)."""
    before = _kib(server, "VmHWM")
    s = _connect(server, 30)
    sent = 0
    try:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(64):  # 64 x 1.5 MiB at most
                s.sendall(b"a: b\r\n" * (1 << 18))
                sent += 1
        got = _answer(s, 20)
        assert got.startswith(b"HTTP/1.1 431 "), got[:200]
        assert sent < 16, f"the server took {sent * 1.5} MiB of head"
        grown = (_kib(server, "VmHWM") - before) / 1024
        assert grown < 16, f"the server's peak grew by {grown:.0f} MiB"
    finally:
        s.close()
