"""Issue 23.8: sandboxes get an idle timeout and a maximum lifetime (operator defaults
and maxima, per-request values within them); the create answer says when the sandbox
will end; an expired sandbox is destroyed by the server and stops counting.

The defect (old main): a client that crashes leaks its sandboxes until DELETE or a
restart, and they keep counting against its caps. Short values (seconds) here; the
sandboxes are context-isolated (given to the tenant by name), which is quick to make."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from servehelp import ALICE, BOB, Server, metric, running

CONFIG = f"""
[server]
snippet_workers = 1

[levels]
context-isolated = "subproc"

[[tenants]]
name = "alice"
token = "{ALICE}"
levels = ["context-isolated"]
max_sandboxes = 1
[tenants.lifetime]
idle_timeout_s = {{ default = 2, max = 30 }}
max_lifetime_s = {{ default = 60, max = 120 }}

[[tenants]]
name = "bob"
token = "{BOB}"
levels = ["context-isolated"]
"""
SPEC = {"level": "context-isolated", "network": {"kind": "unrestricted"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(tmp_path_factory.mktemp("life"), CONFIG) as s:
        yield s


def _gone(server: Server, sid: str, seconds: float) -> float:
    """Wait until the sandbox is gone (404); the seconds it took. Looking at a sandbox
    does not count as using it."""
    t0 = time.monotonic()
    with server.client(ALICE) as c:
        while time.monotonic() - t0 < seconds:
            if c.get(f"/v1/sandboxes/{sid}").status_code == 404:
                return time.monotonic() - t0
            time.sleep(0.2)
    raise AssertionError(f"sandbox {sid} still alive after {seconds} s")


def test_the_answer_says_when_the_sandbox_ends_and_it_does(server: Server,
                                                           tmp_path: Path) -> None:
    with server.client(ALICE) as c:
        t0 = time.time()
        r = c.post("/v1/sandboxes", json={"spec": SPEC})
        assert r.status_code == 201, r.text
        doc = r.json()
        sid = doc["id"]
        assert doc["idle_timeout_s"] == 2 and doc["max_lifetime_s"] == 60
        end = datetime.fromisoformat(doc["ends_at"])  # RFC 3339, UTC
        assert doc["ends_at"].endswith("Z")
        assert abs(end.timestamp() - doc["ends_at_s"]) < 0.01
        assert t0 + 1 < doc["ends_at_s"] < time.time() + 2.5
        # a file the sandbox holds, to see it go with it
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"argv": ["/bin/sh", "-c", "pwd"]})
        workdir = Path(r.json()["result"]["stdout"].strip())
        assert workdir.is_dir()
        # the cap is full while it lives ...
        r = c.post("/v1/sandboxes", json={"spec": SPEC})
        assert r.status_code == 422 and r.json()["error"]["cap"] == "sandboxes"
    # ... the client goes away (crashes) without DELETE: the server ends it
    _gone(server, sid, 15)
    # out of the tenant's caps (404) the moment it is taken out; its destroy (the work
    # dir removed) finishes just after: bounded, not instant
    deadline = time.monotonic() + 10
    while workdir.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not workdir.exists()
    with server.client(ALICE) as c:
        assert c.get("/v1/info").json()["usage"]["sandboxes"] == 0
        r = c.post("/v1/sandboxes", json={"spec": SPEC})  # the slot is free again
        assert r.status_code == 201, r.text
        assert c.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204
    assert (metric(server, 'corral_sandboxes_expired_total{why="idle"}') or 0) >= 1
    assert any(e["event"] == "sandbox-expired" and e["id"] == sid for e in server.logs())


def test_use_keeps_a_sandbox_alive_until_its_maximum_lifetime(server: Server) -> None:
    with server.client(ALICE) as c:
        r = c.post("/v1/sandboxes", json={"spec": SPEC, "idle_timeout_s": 3,
                                          "max_lifetime_s": 7})
        assert r.status_code == 201, r.text
        sid, created = r.json()["id"], time.monotonic()
        # an exec longer than the idle timeout: a request on it is not idleness
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"argv": ["/bin/sleep", "4"]})
        assert r.status_code == 200, r.text
        # used every half second: never idle, yet it ends at its maximum lifetime
        while c.post(f"/v1/sandboxes/{sid}/exec",
                     json={"argv": ["/bin/true"]}).status_code == 200:
            assert time.monotonic() - created < 20
            time.sleep(0.5)
        assert time.monotonic() - created > 6.5
    assert (metric(server, 'corral_sandboxes_expired_total{why="lifetime"}') or 0) >= 1


def test_asked_lifetimes_are_bounded(server: Server) -> None:
    with server.client(ALICE) as c:
        for body, field in (({"idle_timeout_s": 31}, "idle_timeout_s"),
                            ({"max_lifetime_s": 121}, "max_lifetime_s"),
                            ({"max_lifetime_s": 0}, "max_lifetime_s"),
                            ({"idle_timeout_s": "10"}, "idle_timeout_s")):
            r = c.post("/v1/sandboxes", json={"spec": SPEC, **body})
            assert r.status_code == 400 and r.json()["error"]["field"] == field, r.text
        assert c.get("/v1/info").json()["usage"]["sandboxes"] == 0
    with server.client(BOB) as c:  # the built-in bounds: 15 minutes idle, a day at most
        r = c.post("/v1/sandboxes", json={"spec": SPEC})
        assert (r.json()["idle_timeout_s"], r.json()["max_lifetime_s"]) == (900, 86400)
        assert c.get("/v1/info").json()["ceiling"]["lifetime"] == {
            "idle_timeout_s": {"default": 900, "max": 86400},
            "max_lifetime_s": {"default": 86400, "max": 86400}}
        assert c.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204
