"""Environments over ``corral serve`` (docs/environments.md, "Over the service"):
``environment`` on ``/v1/snippets`` and ``/v1/runs``, and the tenant build right
(``[tenants.env_build]``, ``POST /v1/environments``).

The builds come from a loopback HTTPS package index the test serves (tests/linux/
netservers.py: a CA of its own, trusted through ``env_build.cert_file``); no PyPI.
The tests that build are ``slow`` (a few sandbox builds: out of the CI tiers); the
refusals that need no build are not.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servehelp import ALICE, BOB, CAROL, Server, running

from corral.envs.store import remove_tree
from strict_tier import host_can_sandbox, unavailable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "linux"))
from netservers import build_wheel, http_server, make_ca

PY = sys.executable
DAVE = "dave-token-0123456789abcdef00"
TOY = build_wheel("corraltoy", "1.0", "ANSWER = 1\n")
TOY2 = build_wheel("corraltoy", "2.0", "ANSWER = 2\n")
# installed it is 3 MB (over a 2 MiB tenant disk cap), as a wheel a few KiB
BIG = build_wheel("corralbig", "1.0", "DATA = '" + "x" * (3 << 20) + "'\n")


def _index(dists: dict[str, list[tuple[str, bytes]]]) -> dict[str, bytes]:
    import hashlib
    files = {"/simple/": "".join(f'<a href="/simple/{n}/">{n}</a>' for n in dists).encode()}
    for name, found in dists.items():
        links = "".join(f'<a href="/files/{fn}#sha256={hashlib.sha256(b).hexdigest()}">'
                        f"{fn}</a>" for fn, b in found)
        files[f"/simple/{name}/"] = f"<html><body>{links}</body></html>".encode()
        for fn, b in found:
            files[f"/files/{fn}"] = b
    return files


def _config(port: int, ca_file: str, store: Path) -> str:
    right = (f'index_url = "https://127.0.0.1:{port}/simple/"\n'
             f'index_hosts = ["127.0.0.1/32:{port}"]\ncert_file = "{ca_file}"\n')
    return f"""
[server]
snippet_workers = 2
[levels]
strict = "linux"
[provider_options.linux]
spares = 0
env_store_dir = "{store}"

[[tenants]]
name = "alice"
token = "{ALICE}"
[tenants.env_build]
max_environments = 1
max_disk_mb = 64
timeout_s = 240
{right}
[[tenants]]
name = "bob"
token = "{BOB}"

[[tenants]]
name = "carol"
token = "{CAROL}"
[tenants.env_build]
max_environments = 4
max_disk_mb = 2
timeout_s = 240
{right}
[[tenants]]
name = "dave"
token = "{DAVE}"
[tenants.env_build]
build_disk_mb = 1
timeout_s = 240
{right}"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    reason = host_can_sandbox()
    if reason:
        unavailable(reason)
    tmp = tmp_path_factory.mktemp("envserve")
    # the CA's private key: in a dir the session checks is gone at its end
    keys = Path(tempfile.mkdtemp(prefix=f"corral-test-ca-{os.getpid()}-"))
    store = tmp / "envs"
    try:
        ca = make_ca("127.0.0.1", within=keys)
        with http_server(_index({"corraltoy": [TOY, TOY2], "corralbig": [BIG]}),
                         ca.server_context()) as index, \
                running(tmp / "srv", _config(index.port, ca.ca_file, store)) as srv:
            yield srv, store
    finally:
        shutil.rmtree(keys, ignore_errors=True)
        remove_tree(store)  # read-only trees


def _wait(c: httpx.Client, name: str, seconds: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        r = c.get(f"/v1/environments/{name}")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        if doc["state"] != "building" or time.monotonic() > deadline:
            return doc
        time.sleep(0.2)


def _refused_env(r: httpx.Response, name: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "config-invalid" and err["field"] == "environment", err
    assert name in err["message"]


def test_environment_requests_are_checked(served: tuple[Server, Path]) -> None:
    """No build needed: an environment not listed (nor built) is refused on snippets and
    runs, typed and naming it, never run without; a tenant without the right gets 403;
    requirements that smuggle pip options, URLs or paths are 400."""
    srv, store = served
    with srv.client(BOB) as bob, srv.client(CAROL) as carol:
        _refused_env(bob.post("/v1/snippets", json={"source": "1", "environment": "sci"}),
                     "sci")
        _refused_env(bob.post("/v1/runs", json={"argv": ["true"], "environment": "sci"}),
                     "sci")
        _refused_env(bob.post("/v1/snippets", json={"source": "1", "environment": "0" * 64}),
                     "0" * 64)
        # control: the same requests without an environment run
        assert bob.post("/v1/snippets", json={"source": "1 + 1"}).json()["result"] == "2"
        r = bob.post("/v1/environments", json={"name": "toy", "requirements": ["six"]})
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "forbidden"
        assert bob.get("/v1/environments").json() == {"environments": []}
        bad = ["--index-url=https://evil.test/simple", "-e .", "-r other.txt", "./pkg",
               "/etc/passwd", "pkg @ https://evil.test/pkg.whl", "https://evil.test/x.whl",
               "pkg.whl", "pkg; os_name == 'posix'", "x" * 201, "pkg==1.0 --hash=sha256:0",
               "", "pkg\n--index-url x"]
        for req in bad:
            r = carol.post("/v1/environments", json={"name": "bad",
                                                     "requirements": [req]})
            assert r.status_code == 400, (req, r.text)
            assert r.json()["error"]["code"] == "config-invalid", (req, r.text)
        for body in ({"name": "bad", "requirements": ["six"] * 65},
                     {"name": "../x", "requirements": ["six"]},
                     {"name": "bad", "requirements": []},
                     {"name": "bad", "requirements": ["six"], "index_url": "https://x/"}):
            r = carol.post("/v1/environments", json=body)
            assert r.status_code == 400, (body, r.text)
        assert carol.get("/v1/environments/bad").status_code == 404
    assert not (store / "names").exists() or list((store / "names").iterdir()) == []


@pytest.mark.slow
def test_a_granted_tenant_builds_and_uses_its_own_environment(
        served: tuple[Server, Path]) -> None:
    srv, store = served
    with srv.client(ALICE) as alice, srv.client(CAROL) as carol:
        r = alice.post("/v1/environments", json={"name": "toy",
                                                 "requirements": ["corraltoy==1.0"]})
        assert r.status_code == 202, r.text
        assert r.json()["state"] == "building"
        assert r.headers["location"] == "/v1/environments/toy"
        doc = _wait(alice, "toy")
        assert doc["state"] == "ready", doc
        assert doc["owner"] == "tenant" and doc["modules"] == ["corraltoy"]
        digest = doc["digest"]
        assert [e["name"] for e in alice.get("/v1/environments").json()["environments"]] \
            == ["toy"]
        # a snippet and a run with it
        t = alice.post("/v1/snippets", json={"source": "import corraltoy\ncorraltoy.ANSWER",
                                             "environment": "toy"}).json()
        assert t["result"] == "1" and not t["errors"], t
        r = alice.post("/v1/runs", json={"argv": [PY, "-c", "import corraltoy; "
                                                  "print(corraltoy.ANSWER)"],
                                         "environment": "toy"})
        assert r.status_code == 200, r.text
        assert r.json()["result"]["stdout"] == "1\n", r.text
        # control: without it, the module is not there
        t = alice.post("/v1/snippets", json={"source": "import corraltoy"}).json()
        assert t["errors"] and t["errors"][0]["type"] == "ValidationError", t
        r = alice.post("/v1/runs", json={"argv": [PY, "-c", "import corraltoy"]})
        assert r.json()["result"]["exit_code"] != 0
        # a sandbox and a session take it too
        r = alice.post("/v1/sandboxes", json={"spec": {"environment": "toy"}})
        assert r.status_code == 201, r.text
        assert alice.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204
        # over its count (max_environments = 1): refused typed, before any build
        r = alice.post("/v1/environments", json={"name": "toy2",
                                                 "requirements": ["corraltoy==2.0"]})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["cap"] == "environments"
        # another tenant cannot use it: not by its name, not by its digest
        for ref in ("toy", digest, f"sha256:{digest}"):
            _refused_env(carol.post("/v1/snippets", json={"source": "1", "environment": ref}),
                         ref)
            _refused_env(carol.post("/v1/runs", json={"argv": ["true"], "environment": ref}),
                         ref)
            _refused_env(carol.post("/v1/sandboxes", json={"spec": {"environment": ref}}),
                         ref)
        assert carol.get("/v1/environments/toy").status_code == 404
        assert carol.delete("/v1/environments/toy").status_code == 404
        # not while its own live sandbox uses it (409: the store never removes an
        # environment from under a sandbox); the service's warm snippet pool is no bar
        r = alice.post("/v1/sandboxes", json={"spec": {"environment": "toy"}})
        assert r.status_code == 201, r.text
        busy = alice.delete("/v1/environments/toy")
        assert busy.status_code == 409 and "in use" in busy.text, busy.text
        assert alice.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204
        # removed: gone from the store, and no longer usable
        assert alice.delete("/v1/environments/toy").status_code == 204
        _refused_env(alice.post("/v1/snippets", json={"source": "1", "environment": "toy"}),
                     "toy")
        assert not (store / "objects" / digest).exists()


@pytest.mark.slow
def test_builds_past_a_bound_are_refused_typed_and_leave_nothing(
        served: tuple[Server, Path]) -> None:
    srv, store = served
    before = sorted(p.name for p in (store / "objects").iterdir()) \
        if (store / "objects").exists() else []
    with srv.client(CAROL) as carol:
        # over its disk (max_disk_mb = 2; installed, corralbig is 3 MB)
        r = carol.post("/v1/environments", json={"name": "big",
                                                 "requirements": ["corralbig"]})
        assert r.status_code == 202, r.text
        # one build at a time: another is 429 while it runs
        r2 = carol.post("/v1/environments", json={"name": "other",
                                                  "requirements": ["corraltoy"]})
        if _wait(carol, "big", 0)["state"] == "building":
            assert r2.status_code == 429, r2.text
            assert r2.json()["error"]["code"] == "too-many-requests"
        doc = _wait(carol, "big")
        assert doc["state"] == "failed", doc
        err = doc["error"]
        assert err["code"] == "limits-exceeded" and err["limit"] == "disk", err
        if r2.status_code == 202:
            _wait(carol, "other")
        carol.delete("/v1/environments/other")
        # past its timeout (asked 0.5 s): a typed timeout
        r = carol.post("/v1/environments", json={"name": "slow", "timeout_s": 0.5,
                                                 "requirements": ["corraltoy==2.0"]})
        assert r.status_code == 202, r.text
        doc = _wait(carol, "slow")
        assert doc["state"] == "failed" and doc["error"]["code"] == "timeout", doc
        # above the operator's timeout: refused before it starts
        r = carol.post("/v1/environments", json={"name": "slow", "timeout_s": 999,
                                                 "requirements": ["corraltoy==2.0"]})
        assert r.status_code == 400 and r.json()["error"]["field"] == "timeout_s", r.text
        for name in ("big", "slow"):
            _refused_env(carol.post("/v1/snippets", json={"source": "1",
                                                          "environment": name}), name)
    with srv.client(DAVE) as dave:
        # pip runs out of the build sandbox's own disk (build_disk_mb = 1): typed too
        r = dave.post("/v1/environments", json={"name": "big", "requirements": ["corralbig"]})
        assert r.status_code == 202, r.text
        err = _wait(dave, "big")["error"]
        assert err["code"] == "limits-exceeded" and err["limit"] == "disk", err
        assert err["limit_value"] == 1 and "sandbox's disk" in err["detail"], err
    # nothing left in the store: no name, no object, no build dir
    after = sorted(p.name for p in (store / "objects").iterdir()) \
        if (store / "objects").exists() else []
    assert after == before
    names = [p.name for p in (store / "names").iterdir()] if (store / "names").exists() \
        else []
    assert not [n for n in names if "big" in n or "slow" in n], names
    assert [p for p in (store / "tmp").iterdir()] == [] if (store / "tmp").exists() else True
