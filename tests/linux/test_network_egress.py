"""Network allowlist/unrestricted at strict: the egress proxy wired into the provider.

Every server is one the test starts on the host's loopback (netservers.py); names
resolve through a resolver the test gives the provider, to 127.0.0.1 only. The
clients run inside the sandbox (python, since curl may be absent).
"""

from __future__ import annotations

import asyncio
import errno
import json
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest
from netservers import MapResolver, http_server

from corral.core.errors import ConfigInvalidError
from corral.core.spec import NetworkPolicy, SandboxSpec

pytestmark = pytest.mark.linux
PY = sys.executable
NAMES = {"api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"],
         "rebind.test": ["127.0.0.1"]}


def spec(policy: NetworkPolicy) -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r", network=policy)


#: inside the sandbox: fetch argv[1] with urllib (proxy from the env), print a JSON line
FETCH = r"""
import json, ssl, sys, urllib.request, urllib.error
ctx = ssl.create_default_context(cafile=sys.argv[2]) if len(sys.argv) > 2 else None
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10, context=ctx) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"""

#: inside the sandbox: SOCKS5 CONNECT to (name argv[1], port argv[2]) at the proxy
#: (ALL_PROXY), then one HTTP GET; prints the reply code and the response's first line
SOCKS = r"""
import os, socket, struct, sys, urllib.parse
u = urllib.parse.urlsplit(os.environ["ALL_PROXY"])
assert u.scheme == "socks5h", u
s = socket.create_connection((u.hostname, u.port), timeout=10)
s.sendall(b"\x05\x01\x00")
assert s.recv(2) == b"\x05\x00"
name = sys.argv[1].encode()
s.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", int(sys.argv[2])))
rep = s.recv(10)
print(rep[1])
if rep[1] == 0:
    s.sendall(b"GET /hello HTTP/1.1\r\nHost: " + name + b"\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    print(data.split(b"\r\n")[0].decode())
"""


async def fetch(sb: Any, url: str, cafile: str | None = None) -> dict[str, Any]:
    argv = [PY, "-c", FETCH, url] + ([cafile] if cafile else [])
    r = await sb.exec(argv)
    assert r.exit_code == 0, r.stderr_text
    out: dict[str, Any] = json.loads(r.stdout_text.strip().splitlines()[-1])
    out["denials"] = r.denials
    return out


def test_allowed_host_over_http_connect_and_socks(linux: Any, test_ca: Any) -> None:
    ca = test_ca("api.test")
    with http_server({"/hello": b"hi over http"}) as plain, \
            http_server({"/hello": b"hi over tls"}, ca.server_context()) as tls:
        async def test(p: Any) -> None:
            policy = NetworkPolicy.allowlist(f"api.test:{plain.port}", f"api.test:{tls.port}",
                                             "127.0.0.1/32")
            async with await p.create(spec(policy)) as sb:
                got = await fetch(sb, f"http://api.test:{plain.port}/hello")
                assert got["status"] == 200 and got["body"] == "hi over http"
                assert got["denials"] == ()
                # HTTPS through CONNECT: the client's own TLS, end to end, SNI api.test
                await sb.write_file("ca.pem", ca.ca_pem)
                got = await fetch(sb, f"https://api.test:{tls.port}/hello", "/work/ca.pem")
                assert got["status"] == 200 and got["body"] == "hi over tls", got
                r = await sb.exec([PY, "-c", SOCKS, "api.test", str(plain.port)])
                assert r.exit_code == 0, r.stderr_text
                assert r.stdout_text.split()[:1] == ["0"], r.stdout_text
                assert "200" in r.stdout_text
                assert r.denials == ()
            assert plain.requests[0][2]["host"] == f"api.test:{plain.port}"
            assert [q[1] for q in plain.requests] == ["/hello", "/hello"]
            assert [q[1] for q in tls.requests] == ["/hello"]

        linux(test, egress_resolver=MapResolver(NAMES))


def test_refusals_are_listed_as_the_runs_denials(linux: Any) -> None:
    with http_server({"*": b"should not be seen"}) as srv:
        async def test(p: Any) -> None:
            # rebind.test is allowed by name (any port) but resolves to loopback, whose
            # range is listed on srv's port only; asked on another port, it is refused
            policy = NetworkPolicy.allowlist(f"api.test:{srv.port}", "rebind.test",
                                             f"127.0.0.1/32:{srv.port}")
            async with await p.create(spec(policy)) as sb:
                got = await fetch(sb, f"http://other.test:{srv.port}/")
                assert got["status"] == 403 and "not in the allowlist" in got["body"]
                assert [(d.host, d.port, d.kind) for d in got["denials"]] == [
                    ("other.test", srv.port, "not-allowed")]
                got = await fetch(sb, f"http://127.0.0.2:{srv.port}/")
                assert got["status"] == 403
                assert [(d.host, d.kind) for d in got["denials"]] == [
                    ("127.0.0.2", "non-public-address")]
                got = await fetch(sb, "http://rebind.test:9/")
                assert got["status"] == 403
                assert [(d.host, d.kind) for d in got["denials"]] == [
                    ("rebind.test", "non-public-address")]
                assert "loopback" in got["denials"][0].reason
                r = await sb.exec([PY, "-c", SOCKS, "other.test", str(srv.port)])
                assert r.stdout_text.split()[:1] == ["2"], r.stdout_text  # ruleset
                assert [d.host for d in r.denials] == ["other.test"]
                # a started process's result lists its own too
                proc = await sb.start_process([PY, "-c", FETCH, f"http://other.test:{srv.port}/"])
                assert [d.host for d in (await proc.wait()).denials] == ["other.test"]
                # a run that asks nothing lists nothing; the sandbox keeps them all
                assert (await sb.exec(["true"])).denials == ()
                assert len(sb.network_denials()) == 5
                assert r.to_dict()["denials"][0]["kind"] == "not-allowed"
            assert srv.connections == 0

        linux(test, egress_resolver=MapResolver(NAMES))


#: inside the sandbox: connect straight to argv[1]:argv[2], ignoring the proxy variables
DIRECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    print("connected")
except OSError as e:
    print(type(e).__name__, e.errno)
"""


@pytest.mark.parametrize("kind", ["allowlist", "unrestricted"])
def test_a_program_ignoring_the_proxy_gets_no_connection(linux: Any, kind: str) -> None:
    with http_server({"*": b"x"}) as srv:
        async def test(p: Any) -> None:
            policy = (NetworkPolicy.allowlist("api.test", f"127.0.0.1/32:{srv.port}")
                      if kind == "allowlist"
                      else NetworkPolicy.unrestricted("127.0.0.1/32"))
            refused = f"ConnectionRefusedError {errno.ECONNREFUSED}"
            async with await p.create(spec(policy)) as sb:
                for host, port, err in (
                        # a listed port on the host's loopback (allowlist: one address and
                        # its port) has a relay on the sandbox's own (issue 27); another
                        # port there is the sandbox's own loopback, refused
                        ("127.0.0.1", srv.port, "connected" if kind == "allowlist"
                         else refused),
                        ("127.0.0.1", srv.port + 1 if srv.port < 65535 else srv.port - 1,
                         refused),
                        ("10.1.2.3", srv.port, f"OSError {errno.ENETUNREACH}"),
                        ("192.0.2.1", srv.port, f"OSError {errno.ENETUNREACH}")):
                    r = await sb.exec([PY, "-c", DIRECT, host, str(port)])
                    assert r.stdout_text.strip() == err, (host, port, r.stdout_text)
                r = await sb.exec([PY, "-c", "import socket; print(socket.if_nameindex())"])
                assert r.stdout_text.strip() == "[(1, 'lo')]"
                # through the proxy the same server is reachable (the policy lists it;
                # 127.0.0.1 itself is in NO_PROXY: the sandbox's own loopback)
                got = await fetch(sb, f"http://api.test:{srv.port}/x")
                assert got["status"] == 200
            assert srv.connections == (2 if kind == "allowlist" else 1)

        linux(test, egress_resolver=MapResolver(NAMES))


def test_unrestricted_refuses_the_hosts_loopback_unless_listed(linux: Any) -> None:
    with http_server({"*": b"x"}) as srv:
        async def test(p: Any) -> None:
            async with await p.create(spec(NetworkPolicy.unrestricted())) as sb:
                got = await fetch(sb, f"http://api.test:{srv.port}/")
                assert got["status"] == 403
                assert [d.kind for d in got["denials"]] == ["non-public-address"]
                got = await fetch(sb, "http://169.254.169.254/latest/meta-data/")
                assert got["status"] == 403 and "metadata" in got["body"]
            assert srv.connections == 0

        linux(test, egress_resolver=MapResolver(NAMES))


def test_live_allow_and_revoke_take_effect_for_new_connections(linux: Any) -> None:
    with http_server({"*": b"ok"}) as srv:
        async def test(p: Any) -> None:
            policy = NetworkPolicy.allowlist("api.test", f"127.0.0.1/32:{srv.port}")
            async with await p.create(spec(policy)) as sb:
                url = f"http://other.test:{srv.port}/"
                assert (await fetch(sb, url))["status"] == 403
                sb.allow_host("other.test")
                got = await fetch(sb, url)
                assert got["status"] == 200 and got["denials"] == ()
                sb.revoke_host("other.test")
                assert (await fetch(sb, url))["status"] == 403
                sb.revoke_host("api.test")
                assert (await fetch(sb, f"http://api.test:{srv.port}/"))["status"] == 403
                with pytest.raises(ConfigInvalidError):
                    sb.allow_host("bad host name")
            assert srv.connections == 1
            async with await p.create(spec(NetworkPolicy.none())) as sb:
                with pytest.raises(ConfigInvalidError, match="none"):
                    sb.allow_host("api.test")

        linux(test, egress_resolver=MapResolver(NAMES))


def test_none_has_no_proxy_and_no_way_out(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(spec(NetworkPolicy.none())) as sb:
            r = await sb.exec([PY, "-c", "import os; print(sorted(k for k in os.environ "
                                         "if 'proxy' in k.lower()))"])
            assert r.stdout_text.strip() == "[]"
            r = await sb.exec([PY, "-c", DIRECT, "127.0.0.1", "3128"])
            assert "ConnectionRefusedError" in r.stdout_text
            assert r.denials == ()

    linux(test)


def test_the_proxy_goes_with_the_sandbox(linux: Any) -> None:
    with http_server({"*": b"ok"}) as srv:
        async def test(p: Any) -> None:
            sb = await p.create(spec(NetworkPolicy.allowlist(
                "other.test", f"127.0.0.1/32:{srv.port}")))
            proxy = sb.network.proxy
            assert proxy is not None
            await sb.destroy()
            assert proxy._servers == []
            # a fresh sandbox (maybe from a spare) gets its own proxy and policy
            async with await p.create(spec(NetworkPolicy.allowlist("api.test"))) as sb2:
                assert sb2.network.proxy is not proxy
                got = await fetch(sb2, f"http://other.test:{srv.port}/")
                assert got["status"] == 403

        linux(test, egress_resolver=MapResolver(NAMES))


def test_bad_entries_are_refused_at_create(linux: Any) -> None:
    async def test(p: Any) -> None:
        for bad in ("a.test:0", "10.0.0.1/8", "[::1"):
            with pytest.raises(ConfigInvalidError):
                await p.create(spec(NetworkPolicy.allowlist(bad)))

    linux(test)


def test_preview_url_reaches_a_server_inside_and_stops_at_destroy(linux: Any) -> None:
    server = ("import http.server, socketserver\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              "        b = ('inside ' + self.path).encode()\n"
              "        self.send_response(200); self.send_header('Content-Length', str(len(b)))\n"
              "        self.end_headers(); self.wfile.write(b)\n"
              "    def log_message(self, *a): pass\n"
              "http.server.ThreadingHTTPServer(('127.0.0.1', 8000), H).serve_forever()\n")

    tokens: dict[str, str] = {}  # host port -> the URL's token

    def get(url: str) -> bytes:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        hport = url.split("/")[2]
        req = urllib.request.Request(url, headers={"X-Corral-Preview-Token":
                                                   tokens.get(hport, "")})
        with opener.open(req, timeout=5) as r:
            data: bytes = r.read()
            return data

    def remember(url: Any) -> None:
        tokens[url.split("/")[2]] = url.token

    async def test(p: Any) -> None:
        assert "preview-url" in p.capabilities
        sb = await p.create(spec(NetworkPolicy.none()))
        await sb.write_file("srv.py", server)
        proc = await sb.start_process([PY, "/work/srv.py"])
        url = await sb.expose(8000)
        remember(url)
        assert url.startswith("http://127.0.0.1:")
        assert await sb.expose(8000) == url
        for _ in range(100):
            try:
                body = await asyncio.to_thread(get, url + "page")
                break
            except (urllib.error.URLError, ConnectionError):
                await asyncio.sleep(0.05)
        assert body == b"inside /page"
        bodies = await asyncio.gather(*(asyncio.to_thread(get, f"{url}{i}") for i in range(8)))
        assert sorted(bodies) == sorted(f"inside /{i}".encode() for i in range(8))
        # a port where nothing listens: the connection is closed, no answer
        url2 = await sb.expose(8001)
        remember(url2)
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            await asyncio.to_thread(get, url2)
        await sb.unexpose(8001)
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            await asyncio.to_thread(get, url2)
        with pytest.raises(ConfigInvalidError):
            await sb.expose(0)
        await proc.kill()
        await sb.destroy()
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            await asyncio.to_thread(get, url)

    linux(test)
