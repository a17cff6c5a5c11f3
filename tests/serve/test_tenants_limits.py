"""Issue 23.3: per tenant, a default and a maximum for every limit; caps count what the
provider actually enforces.

The defects (old main): a tenant asked ``limits.max_processes = 1000000`` and got it; a
sandbox without ``mem_mb`` counted 256 MiB against ``max_memory_mb`` but got the
provider's 512 MiB; an exec without ``timeout_ms`` ran as long as it liked. Here the
tenant's defaults are small, and the sandbox shows from inside that it got them: an
allocation past the default memory is killed by the kernel (the provider reports the
limit it applied), the same allocation under an explicit, larger limit succeeds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from servehelp import ALICE, BOB, Server, running

from strict_tier import host_can_sandbox, needs_strict

pytestmark = [pytest.mark.linux, needs_strict(host_can_sandbox())]

PY = "/usr/bin/python3"
#: inside: hold argv[1] MiB (touched page by page), then say so
ALLOC = ("import sys; b = bytearray(int(sys.argv[1]) << 20); "
         "b[::4096] = b'x' * len(b[::4096]); print('held')")
#: inside: start argv[1] sleeping children (at most), print how many started
FORK = r"""
import subprocess, sys
kids = []
for _ in range(int(sys.argv[1])):
    try:
        kids.append(subprocess.Popen(["/bin/sleep", "30"]))
    except OSError:
        break
print(len(kids))
for k in kids:
    k.kill()
for k in kids:
    k.wait()
"""

CONFIG = f"""
[server]
snippet_workers = 1

[levels]
strict = "linux"

[provider_options.linux]
spares = 0

[[tenants]]
name = "alice"
token = "{ALICE}"
max_memory_mb = 1024
[tenants.limits]
mem_mb = {{ default = 48, max = 200 }}
max_processes = {{ default = 12, max = 64 }}
disk_mb = {{ default = 64, max = 128 }}
cpu_ms = {{ default = 20000, max = 60000 }}
timeout_ms = {{ default = 1500, max = 60000 }}
output_bytes = {{ default = 4096, max = 1048576 }}

[[tenants]]
name = "bob"
token = "{BOB}"
max_memory_mb = 100
[tenants.limits]
mem_mb = {{ default = 40, max = 100 }}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(tmp_path_factory.mktemp("limits"), CONFIG) as s:
        yield s


def _create(c: Any, limits: dict[str, int] | None = None) -> str:
    r = c.post("/v1/sandboxes", json={"spec": {"limits": limits or {}}})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _exec(c: Any, sid: str, argv: list[str], **opts: Any) -> Any:
    return c.post(f"/v1/sandboxes/{sid}/exec", json={"argv": argv,
                                                     "opts": {"timeout_ms": 30_000, **opts}})


@pytest.mark.parametrize(("limits", "kind", "maximum"), [
    ({"max_processes": 1_000_000}, "processes", 64),
    ({"mem_mb": 201}, "memory", 200),
    ({"disk_mb": 129}, "disk", 128),
    ({"cpu_ms": 60_001}, "cpu", 60_000),
])
def test_a_limit_over_the_tenants_maximum_is_refused(server: Server, limits: dict[str, int],
                                                     kind: str, maximum: int) -> None:
    with server.client(ALICE) as c:
        for path, body in (("/v1/runs", {"argv": ["/bin/true"], "limits": limits}),
                           ("/v1/sandboxes", {"spec": {"limits": limits}})):
            r = c.post(path, json=body)
            # on old main: 200 / 201, the sandbox made with the limit asked
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert err["code"] == "limits-exceeded" and err["limit"] == kind
            assert err["limit_value"] == maximum and err["cap"] == f"limits.{next(iter(limits))}"
        assert c.get("/v1/info").json()["usage"] == {"sandboxes": 0, "runs": 0, "memory_mb": 0}


def test_an_omitted_limit_is_the_tenants_default_inside_and_in_the_count(
        server: Server) -> None:
    with server.client(ALICE) as c:
        r = c.post("/v1/sandboxes", json={"spec": {}})
        sid, applied = r.json()["id"], {"mem_mb": 48, "cpu_ms": 20000, "disk_mb": 64,
                                        "max_processes": 12}
        assert r.json()["spec"]["limits"] == applied  # the create answer says it
        got = c.get(f"/v1/sandboxes/{sid}").json()
        assert got["spec"]["limits"] == applied and got["mem_mb"] == 48
        assert c.get("/v1/info").json()["usage"]["memory_mb"] == 48  # counted: applied
        # from inside: 100 MiB does not fit in the default (old main: 512 MiB, it fits)
        r = _exec(c, sid, [PY, "-c", ALLOC, "100"])
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["limit"] == "memory" and err["limit_value"] == 48
        # the default processes limit: 40 children asked, fewer than 12 start
        r = _exec(c, sid, [PY, "-c", FORK, "40"])
        assert r.status_code == 200, r.text
        assert 0 < int(r.json()["result"]["stdout"]) < 12
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        # the control: the same allocation under a limit asked within the maximum
        sid = _create(c, {"mem_mb": 200})
        assert c.get("/v1/info").json()["usage"]["memory_mb"] == 200
        r = _exec(c, sid, [PY, "-c", ALLOC, "100"])
        assert r.status_code == 200 and r.json()["result"]["stdout"].strip() == "held", r.text
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        assert c.get("/v1/info").json()["usage"]["memory_mb"] == 0


def test_the_memory_cap_counts_the_applied_default(server: Server) -> None:
    with server.client(BOB) as c:  # 40 MiB by default, 100 MiB in all
        a, b = _create(c), _create(c)
        r = c.post("/v1/sandboxes", json={"spec": {}})
        assert r.status_code == 422 and r.json()["error"]["cap"] == "memory"
        assert r.json()["error"]["observed"] == 120
        for sid in (a, b):
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204


def test_wall_clock_and_output_defaults(server: Server) -> None:
    with server.client(ALICE) as c:
        sid = _create(c)
        t0 = time.monotonic()
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"argv": ["/bin/sleep", "20"]})
        # no timeout_ms asked: the tenant's 1500 ms (old main: none, it slept 20 s)
        assert r.json()["error"]["code"] == "timeout", r.text
        assert time.monotonic() - t0 < 15
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"argv": ["/bin/sleep", "1"],
                                                     "opts": {"timeout_ms": 60_001}})
        assert r.status_code == 400 and r.json()["error"]["field"] == "timeout_ms"
        # output: the default cap is 4096 bytes, a larger one may be asked up to 1 MiB
        big = [PY, "-c", "print('x' * 10000)"]
        r = _exec(c, sid, big)
        assert r.status_code == 422 and r.json()["error"]["limit"] == "output", r.text
        r = _exec(c, sid, big, max_stdout_bytes=20000)
        assert r.status_code == 200 and len(r.json()["result"]["stdout"]) == 10001
        r = _exec(c, sid, big, max_stdout_bytes=2 << 20)
        assert r.status_code == 422 and r.json()["error"]["cap"] == "limits.output_bytes"
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        # a one-shot run gets the same bounds
        t0 = time.monotonic()
        r = c.post("/v1/runs", json={"argv": ["/bin/sleep", "20"]})
        assert r.status_code == 200 and r.json()["result"]["outcome"] == "timeout", r.text
        assert time.monotonic() - t0 < 15
        r = c.post("/v1/snippets", json={"source": "1", "timeout_ms": 60_001})
        assert r.status_code == 400 and r.json()["error"]["field"] == "timeout_ms"
