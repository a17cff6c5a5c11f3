"""Issue 23.2 (serve side): the operator bounds, per tenant, the network a tenant may ask.

The attack (old main): a tenant sets its own policy, ``{"kind": "unrestricted",
"hosts": ["127.0.0.0/8"]}``, and its strict sandbox reads a service on the server's
127.0.0.1 (here: one the test starts) and the server's own ``/metrics``, through the
sandbox's egress proxy. Now loopback, private, link-local and metadata ranges are
reachable only when the operator lists them for that tenant, and a policy past the
tenant's ceiling is refused (``config-invalid`` naming the field) before anything runs.
Every connection here goes to 127.0.0.1; the metadata address is refused by policy,
never connected to."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from servehelp import ALICE, BOB, CAROL, Server, running

from strict_tier import host_can_sandbox, needs_strict

pytestmark = [pytest.mark.linux, needs_strict(host_can_sandbox())]

#: inside the sandbox: GET argv[1] through the sandbox's egress proxy (its NO_PROXY names
#: the sandbox's own loopback, so it is dropped here), print the body or the failure
FETCH = r"""
import os, sys, urllib.error, urllib.request
for k in ("NO_PROXY", "no_proxy"):  # urllib would bypass the proxy for 127.0.0.1
    os.environ.pop(k, None)
op = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://127.0.0.1:3128"}))
try:
    print("BODY", op.open(sys.argv[1], timeout=10).read().decode()[:200])
except urllib.error.HTTPError as e:
    print("HTTP", e.code)
except Exception as e:
    print("ERR", type(e).__name__, e)
"""
PY = "/usr/bin/python3"


class _Secret(http.server.BaseHTTPRequestHandler):
    hits: list[str]

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = b"a host service's secret"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def host_service() -> Iterator[tuple[int, list[str]]]:
    """An HTTP service on the host's 127.0.0.1 (as a database or an admin API would be):
    its port and the paths it was asked for."""
    hits: list[str] = []
    handler = type("H", (_Secret,), {"hits": hits})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1], hits
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(10)


def config(port: int) -> str:
    """alice: the defaults (no non-public destination); bob: the one host service,
    by address and port, allowlists only; carol: public names under one suffix only."""
    return f"""
[server]
snippet_workers = 1

[levels]
strict = "linux"

[provider_options.linux]
spares = 0

[[tenants]]
name = "alice"
token = "{ALICE}"

[[tenants]]
name = "bob"
token = "{BOB}"
[tenants.network]
kinds = ["none", "allowlist"]
private = ["127.0.0.1/32:{port}"]

[[tenants]]
name = "carol"
token = "{CAROL}"
[tenants.network]
kinds = ["none", "allowlist"]
hosts = ["*.example.org:443"]
"""


def run(server: Server, token: str, url: str, network: dict[str, Any]) -> Any:
    with server.client(token) as c:
        return c.post("/v1/runs", json={"argv": [PY, "-c", FETCH, url], "network": network,
                                        "opts": {"timeout_ms": 30_000}})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int, list[str]]]:
    with host_service() as (port, hits), \
            running(tmp_path_factory.mktemp("net"), config(port)) as server:
        yield server, port, hits


@pytest.mark.parametrize("hosts", [["127.0.0.0/8"], ["127.0.0.1"], ["0.0.0.0/0"],
                                   ["::ffff:127.0.0.1"], ["127.0.0.1/32:{port}"]])
def test_a_tenant_cannot_open_the_servers_loopback(
        served: tuple[Server, int, list[str]], hosts: list[str]) -> None:
    server, port, hits = served
    before = len(hits)
    listed = [h.format(port=port) for h in hosts]
    for kind in ("unrestricted", "allowlist"):
        for url in (f"http://127.0.0.1:{port}/secret", f"http://127.0.0.1:{server.port}/metrics"):
            r = run(server, ALICE, url, {"kind": kind, "hosts": listed})
            # on old main: 200, and the body of the host service or the server's metrics
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["code"] == "config-invalid" and err["field"] == "network.hosts[0]"
            assert "may not reach" in err["reason"]
    assert len(hits) == before  # nothing ran, nothing connected


def test_metadata_and_private_ranges_are_refused_by_policy(
        served: tuple[Server, int, list[str]]) -> None:
    server, _port, _hits = served
    for hosts in (["169.254.169.254"], ["169.254.0.0/16:80"], ["10.0.0.0/8"],
                  ["192.168.1.1"], ["fd00:ec2::254"], ["[::1]:80"]):
        r = run(server, ALICE, "http://169.254.169.254/latest/meta-data/",
                {"kind": "unrestricted", "hosts": hosts})
        assert r.status_code == 400 and r.json()["error"]["field"] == "network.hosts[0]", r.text


def test_what_the_operator_lists_for_a_tenant_works_and_only_that(
        served: tuple[Server, int, list[str]]) -> None:
    server, port, hits = served
    before = len(hits)
    # bob may reach the one service it was given, through its sandbox's egress proxy
    r = run(server, BOB, f"http://127.0.0.1:{port}/for-bob",
            {"kind": "allowlist", "hosts": [f"127.0.0.1:{port}"]})
    assert r.status_code == 200, r.text
    assert r.json()["result"]["stdout"].strip() == "BODY a host service's secret"
    assert hits[before:] == ["/for-bob"]
    # ... and nothing around it: another port (the server's own), the whole range, a
    # kind it was not given
    for net in ({"kind": "allowlist", "hosts": [f"127.0.0.1:{server.port}"]},
                {"kind": "allowlist", "hosts": ["127.0.0.0/8"]},
                {"kind": "allowlist", "hosts": ["127.0.0.1"]}):
        r = run(server, BOB, f"http://127.0.0.1:{server.port}/metrics", net)
        assert r.status_code == 400 and r.json()["error"]["field"] == "network.hosts[0]"
    r = run(server, BOB, f"http://127.0.0.1:{port}/", {"kind": "unrestricted",
                                                       "hosts": [f"127.0.0.1/32:{port}"]})
    assert r.status_code == 400 and r.json()["error"]["field"] == "network.kind"
    # alice, without the listing, is refused the very policy that works for bob
    r = run(server, ALICE, f"http://127.0.0.1:{port}/",
            {"kind": "allowlist", "hosts": [f"127.0.0.1:{port}"]})
    assert r.status_code == 400
    assert hits[before:] == ["/for-bob"]


def test_public_destinations_are_bounded_too(served: tuple[Server, int, list[str]]) -> None:
    server, _port, _hits = served
    with server.client(CAROL) as c:
        ok = c.post("/v1/sandboxes", json={"spec": {"network": {
            "kind": "allowlist", "hosts": ["api.example.org:443"]}}})
        assert ok.status_code == 201, ok.text
        assert c.delete(f"/v1/sandboxes/{ok.json()['id']}").status_code == 204
        for net, field in (({"kind": "allowlist", "hosts": ["evil.example.com"]},
                            "network.hosts[0]"),
                           ({"kind": "allowlist", "hosts": ["api.example.org:80"]},
                            "network.hosts[0]"),
                           ({"kind": "unrestricted"}, "network.kind")):
            r = c.post("/v1/sandboxes", json={"spec": {"network": net}})
            assert r.status_code == 400 and r.json()["error"]["field"] == field, r.text
        info = c.get("/v1/info").json()
        assert info["ceiling"]["network"] == {"kinds": ["allowlist", "none"],
                                              "hosts": ["*.example.org:443"], "private": []}
        assert info["usage"]["sandboxes"] == 0


def test_refusals_are_counted(served: tuple[Server, int, list[str]]) -> None:
    from servehelp import metric
    server, _port, _hits = served
    before = metric(server, 'corral_refused_total{cap="ceiling"}') or 0
    r = run(server, ALICE, "http://127.0.0.1/", {"kind": "unrestricted",
                                                 "hosts": ["127.0.0.0/8"]})
    assert r.status_code == 400
    assert metric(server, 'corral_refused_total{cap="ceiling"}') == before + 1


def test_the_default_ceiling_has_no_private_range(tmp_path: Path) -> None:
    from corral.serve.config import config_from_dict
    cfg = config_from_dict({"tenants": [{"name": "a", "token": "x" * 20}]})
    assert cfg.tenants[0].policy.network.private == ()
