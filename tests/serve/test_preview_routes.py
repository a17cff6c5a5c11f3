"""Preview URLs, a live sandbox's network policy and the snapshot store's bounds over a
real ``corral serve`` (strict: the linux provider on the server) and the remote
provider (issue 23 items 6 and 7). Before: no route for expose or for changing a live
sandbox's policy; snapshots unbounded in the server's memory."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import httpx
import pytest
from servehelp import ALICE, BOB, config_text, running

from corral.core.errors import ConfigInvalidError, LimitsExceededError
from corral.core.preview import PreviewURL
from corral.core.spec import NetworkPolicy, SandboxSpec
from corral.providers.remote import RemoteProvider
from strict_tier import host_can_sandbox, needs_strict

pytestmark = [pytest.mark.slow, pytest.mark.linux]
PY = sys.executable

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
        while b"\r\n\r\n" not in data:
            d = c.recv(65536)
            if not d:
                break
            data += d
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\ninside")
    except OSError:
        pass
    c.close()
"""


def _talk(url: str, headers: dict[str, str]) -> bytes:
    port = int(url.rsplit(":", 1)[1].strip("/"))
    head = "GET / HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in
                                                      headers.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode())
        out = b""
        while d := s.recv(65536):
            out += d
        return out


@needs_strict(host_can_sandbox())
def test_expose_network_and_snapshot_bounds_over_serve(tmp_path: Path) -> None:
    cfg = config_text({"strict": "linux"}).replace(
        "[[tenants]]", "[provider_options.linux.snapshots]\ntenant_max_count = 1\n\n"
        "[[tenants]]", 1)
    with running(tmp_path, cfg) as server:
        p = RemoteProvider(server.url, ALICE, level="strict")
        assert "preview-url" in p.capabilities

        async def go() -> None:
            try:
                sb = await p.create(SandboxSpec(network=NetworkPolicy.allowlist("a.example")))
                await sb.write_file("srv.py", ECHO)
                proc = await sb.start_process([PY, "/work/srv.py"])
                url = await sb.expose(8000)  # type: ignore[attr-defined]
                assert isinstance(url, PreviewURL) and url.token
                got = b""
                for _ in range(200):
                    got = await asyncio.to_thread(_talk, url, url.headers)
                    if got.endswith(b"inside"):
                        break
                    await asyncio.sleep(0.05)
                assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"inside"), got
                n = await sb.read_file("conns")
                got = await asyncio.to_thread(_talk, url, {})
                assert got.startswith(b"HTTP/1.1 403"), got
                assert await sb.read_file("conns") == n  # nothing reached the server
                # another tenant, and no token: the sandbox is not theirs
                with server.client(BOB) as c:
                    r = c.post(f"/v1/sandboxes/{sb.id}/expose", json={"port": 8000})
                    assert r.status_code == 404, r.text
                with httpx.Client(base_url=server.url) as c:
                    r = c.post(f"/v1/sandboxes/{sb.id}/expose", json={"port": 8000})
                    assert r.status_code == 401
                with server.client(ALICE) as c:
                    for bad in ({"port": 0}, {"port": "8000"}, {}):
                        r = c.post(f"/v1/sandboxes/{sb.id}/expose", json=bad)
                        assert r.status_code == 400, (bad, r.text)
                await sb.unexpose(8000)  # type: ignore[attr-defined]
                with pytest.raises(ConnectionRefusedError):
                    await asyncio.to_thread(_talk, url, url.headers)
                # the live policy: a public address may be added; loopback may not
                await sb.change_network(allow=["93.184.216.34:443"],  # type: ignore[attr-defined]
                                        revoke=["a.example"])
                for bad in (["127.0.0.1/32:80"], ["10.0.0.0/8"], ["8.0.0.0/4"],
                            ["169.254.169.254"], ["not a host"]):
                    with pytest.raises(ConfigInvalidError):
                        await sb.change_network(allow=bad)  # type: ignore[attr-defined]
                # snapshots: the operator's per-tenant bound, 422 naming it
                await sb.snapshot()  # type: ignore[attr-defined]
                with pytest.raises(LimitsExceededError) as e:
                    await sb.snapshot()  # type: ignore[attr-defined]
                assert e.value.limit == "snapshots" and e.value.limit_value == 1
                await proc.kill()
                await sb.destroy()
                none_sb = await p.create(SandboxSpec())
                with pytest.raises(ConfigInvalidError):  # network none: no proxy to change
                    await none_sb.change_network(allow=["93.184.216.34"])  # type: ignore[attr-defined]
                await none_sb.destroy()
            finally:
                await p.aclose()

        asyncio.run(go())
