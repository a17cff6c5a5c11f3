"""Preview URLs need their token (issue 23 item 6). Before, a URL from ``expose(port)``
was open to every local user of the host: a sandbox with secret headers that relayed
its port 8000 to its own egress proxy handed any local client the origin, secret
included, once 8000 was exposed. Each test has its control: the owner, with the token,
gets through."""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import pytest
from netservers import MapResolver, http_server

from corral.core.preview import PREVIEW_TOKEN_HEADER, PreviewURL
from corral.core.spec import NetworkPolicy, SandboxSpec
from corral.providers.linux.host import netrelay

pytestmark = pytest.mark.linux
PY = sys.executable

#: inside: a server on 127.0.0.1:8000 counting its connections in /work/conns and
#: answering each with what it received (the request as the sandbox sees it)
ECHO = r"""
import socket
srv = socket.create_server(("127.0.0.1", 8000))
n = 0
while True:
    c, _ = srv.accept()
    n += 1
    open("/work/conns", "w").write(str(n))
    data = b""
    c.settimeout(5)
    try:
        while b"\r\n\r\n" not in data and len(data) < 65536:
            d = c.recv(65536)
            if not d:
                break
            data += d
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                  % len(data) + data)
    except OSError:
        pass
    c.close()
"""

#: inside: the attack's two-line relay, port 8000 to the sandbox's own egress proxy
RELAY = r"""
import socket, threading
def pipe(a, b):
    try:
        while d := a.recv(65536):
            b.sendall(d)
    except OSError:
        pass
    finally:
        b.close()
srv = socket.create_server(("127.0.0.1", 8000))
while True:
    c, _ = srv.accept()
    u = socket.create_connection(("127.0.0.1", 3128))
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
"""


#: inside: wait until something listens on 127.0.0.1:8000 (10 s)
UP = r"""
import socket, time
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", 8000), timeout=1).close()
        break
    except OSError:
        time.sleep(0.05)
else:
    raise SystemExit("nothing listens on 8000")
"""


def _talk(url: str, data: bytes, until: bytes | None = None) -> bytes:
    """One connection to the URL's host port: send ``data``, read to EOF (10 s), or
    until what came ends with ``until``."""
    port = int(url.rsplit(":", 1)[1].strip("/"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        try:
            while d := s.recv(65536):
                out += d
                if until is not None and out.endswith(until):
                    break
        except (ConnectionResetError, TimeoutError):
            pass
        return out


def _get(path: str, headers: dict[str, str] | None = None, host: str = "x") -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _until_up(url: PreviewURL) -> None:
    for _ in range(200):
        got = await asyncio.to_thread(_talk, url, _get("/up", url.headers))
        if got.startswith(b"HTTP/1.1 200"):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the server inside never answered")


def test_a_preview_url_needs_its_token(linux: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # "half a head" below is closed at the relay's head deadline: 2 s here, not 10 (the
    # refusal is the same at any deadline; the test waited 8 s for nothing on each tier)
    monkeypatch.setattr(netrelay, "PREVIEW_HEAD_TIMEOUT_S", 2.0)

    async def test(p: Any) -> None:
        async with await p.create(SandboxSpec(tenant_id="t", run_id="r")) as sb:
            await sb.write_file("srv.py", ECHO)
            proc = await sb.start_process([PY, "/work/srv.py"])
            url = await sb.expose(8000)
            assert isinstance(url, PreviewURL) and len(url.token) >= 40
            assert url.token not in url and url.token not in repr(url)
            assert (await sb.expose(8000)).token == url.token  # the same URL again
            await _until_up(url)
            before = await sb.read_file("conns")
            wrong = {PREVIEW_TOKEN_HEADER: "x" * len(url.token)}
            twice = (_get("/", url.headers)[:-2]
                     + f"{PREVIEW_TOKEN_HEADER}: {url.token}\r\n\r\n".encode())
            in_value = _get("/", {"X-Other": f"{PREVIEW_TOKEN_HEADER}: {url.token}"})
            for label, req in (("none", _get("/")), ("wrong", _get("/", wrong)),
                               ("twice", twice), ("inside another header", in_value),
                               ("wrong preamble", b"CORRAL-PREVIEW-TOKEN nope\r\nPING\r\n\r\n"),
                               ("half a head", b"GET / HTTP/1.1\r\nHost: x\r\n")):
                got = await asyncio.to_thread(_talk, url, req)
                if label in ("wrong preamble",):
                    assert got == b"", (label, got)  # not HTTP: closed, no answer
                elif label == "half a head":
                    pass  # (closed at the deadline; checked below that nothing went in)
                else:
                    assert got.startswith(b"HTTP/1.1 403"), (label, got)
            # nothing reached the sandbox's server: its connection count is unchanged
            assert await sb.read_file("conns") == before
            # the control: with the header, through; the sandbox never sees the token
            got = await asyncio.to_thread(_talk, url, _get("/page", url.headers))
            assert got.startswith(b"HTTP/1.1 200") and b"GET /page HTTP/1.1" in got, got
            assert url.token.encode() not in got and b"preview-token" not in got.lower()
            # raw TCP: the preamble line first, then the protocol's own bytes
            got = await asyncio.to_thread(_talk, url, url.preamble() + b"PING\r\n\r\n")
            assert got.endswith(b"\r\n\r\nPING\r\n\r\n"), got
            await proc.kill()

    linux(test)


def test_another_local_client_cannot_use_the_relay_to_egress_trick(linux: Any) -> None:
    """The issue's attack: the sandbox relays its port 8000 to its own egress proxy,
    whose policy adds a secret header for api.test; 8000 is exposed. A local client
    without the token sends a proxy request through the URL: 403, the origin sees
    nothing. The owner with the token (the control) reaches the origin with the
    secret: the trick itself works, only not for others."""
    with http_server({"*": b"origin"}) as origin:
        names = {"api.test": ["127.0.0.1"]}
        entry = f"api.test:{origin.port}"
        policy = NetworkPolicy(kind="allowlist", hosts=(entry, f"127.0.0.1/32:{origin.port}"),
                               secret_headers={entry: {"X-Api-Key": "s3cret-value"}})

        async def test(p: Any) -> None:
            async with await p.create(SandboxSpec(tenant_id="t", run_id="r",
                                                  network=policy)) as sb:
                await sb.write_file("relay.py", RELAY)
                proc = await sb.start_process([PY, "/work/relay.py"])
                r = await sb.exec([PY, "-c", UP])  # the relay listens (seen from inside)
                assert r.exit_code == 0, r
                url = await sb.expose(8000)
                req = _get(f"http://{entry}/secret", host=entry)
                for _ in range(3):
                    got = await asyncio.to_thread(_talk, url, req)
                    assert got.startswith(b"HTTP/1.1 403"), got
                    assert b"preview" in got
                assert origin.requests == [] and origin.connections == 0
                # the owner (the egress proxy keeps the connection open after the
                # answer: read to the origin's body, not to EOF, which took 10 s)
                got = await asyncio.to_thread(_talk, url, _get(
                    f"http://{entry}/secret", url.headers, host=entry), b"origin")
                assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"origin"), got
                assert len(origin.requests) == 1
                assert origin.requests[0][2].get("x-api-key") == "s3cret-value"
                assert "x-corral-preview-token" not in origin.requests[0][2]
                await proc.kill()

        linux(test, egress_resolver=MapResolver(names))
