"""Every endpoint of ``/v1`` against a real server on 127.0.0.1 (context-isolated, the
subproc provider on the server): auth, the sandbox life cycle, streamed exec, files,
processes, runs, snippets, handler invoke, lifecycle refusals, tenant isolation (another
tenant's id is 404 on every route), caps (422, ``cap`` named), body caps (413), metrics,
logs and the OpenAPI document."""

from __future__ import annotations

import concurrent.futures
import json
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from servehelp import ALICE, BOB, CAROL, Server, wait_metric

from corral.core.errors import LimitsExceededError
from corral.serve.app import ROUTES

PY = sys.executable
SPEC = {"level": "context-isolated", "network": {"kind": "unrestricted"}}


def _create(c: httpx.Client, **spec: Any) -> str:
    r = c.post("/v1/sandboxes", json={"spec": {**SPEC, **spec}})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


@pytest.fixture
def alice(server: Server) -> Iterator[httpx.Client]:
    with server.client(ALICE) as c:
        yield c
        for sb in c.get("/v1/sandboxes").json()["sandboxes"]:
            c.delete(f"/v1/sandboxes/{sb['id']}")


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in r.text.splitlines() if line]


def test_health_openapi_metrics_are_public(server: Server) -> None:
    with server.client(None) as c:
        assert c.get("/v1/health").json() == {"status": "ok"}
        doc = c.get("/v1/openapi.json").json()
        assert doc["openapi"].startswith("3.")
        m = c.get("/metrics")
        assert m.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "# TYPE corral_requests_total counter" in m.text
        assert "corral_sandboxes_alive{tenant=\"alice\"}" in m.text
        assert "# TYPE corral_request_duration_seconds histogram" in m.text
        assert 'corral_request_duration_seconds_bucket{route="GET /v1/health",le="+Inf"}' \
            in m.text


def test_openapi_names_every_route_and_nothing_else(server: Server) -> None:
    with server.client(None) as c:
        doc = c.get("/v1/openapi.json").json()
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == {(m, p) for m, p, _name, _auth in ROUTES}
    for method, path, _name, needs_tenant in ROUTES:
        op = doc["paths"][path][method.lower()]
        assert op["responses"] and op["summary"], (method, path)
        assert (op.get("security") == []) == (not needs_tenant), (method, path)


def test_auth_is_required_and_checked(server: Server) -> None:
    for token in (None, "wrong-token-0123456789abcdef"):
        with server.client(token) as c:
            r = c.get("/v1/info")
            assert r.status_code == 401
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "unauthorized"
            assert c.post("/v1/sandboxes", json={"spec": SPEC}).status_code == 401


def test_info_names_levels_capabilities_caps(alice: httpx.Client) -> None:
    info = alice.get("/v1/info").json()
    assert info["tenant"] == "alice"
    assert info["levels"] == ["context-isolated"]
    assert info["providers"]["context-isolated"]["name"] == "subproc"
    assert set(info["caps"]) == {"max_sandboxes", "max_runs", "max_memory_mb",
                                 "max_processes"}


def test_sandbox_life_cycle(alice: httpx.Client) -> None:
    sid = _create(alice)
    listed = [s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]]
    assert sid in listed
    got = alice.get(f"/v1/sandboxes/{sid}").json()
    assert got["spec"]["tenant_id"] == "alice" and got["level"] == "context-isolated"
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={
        "argv": [PY, "-c", "import sys; print(sys.stdin.read()[::-1]); sys.exit(3)"],
        "opts": {"stdin_b64": "YWJj"}})
    assert r.status_code == 200
    assert r.json()["result"]["exit_code"] == 3 and r.json()["result"]["stdout"] == "cba\n"
    assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204
    assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 404  # gone
    assert alice.get(f"/v1/sandboxes/{sid}").status_code == 404


def test_exec_answers_how_the_command_ended_and_refusals_by_status(alice: httpx.Client
                                                                   ) -> None:
    """One rule: 200 with the result's outcome for a run that ran (exit, timeout, a limit),
    an error status only for a request that was not served."""
    sid = _create(alice)
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={
        "argv": [PY, "-c", "import time; print('partial', flush=True); time.sleep(30)"],
        "opts": {"timeout_ms": 300}})
    assert r.status_code == 200, r.text
    res = r.json()["result"]
    assert res["outcome"] == "timeout" and res["limit_value"] == 300
    assert res["stdout"] == "partial\n"
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={"argv": []})
    assert r.status_code == 400 and r.json()["error"]["code"] == "config-invalid"
    assert r.json()["error"]["field"] == "argv"
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={
        "argv": [PY, "-c", "print('x' * 100)"], "opts": {"max_stdout_bytes": 10}})
    assert r.status_code == 200 and r.json()["result"]["outcome"] == "overflow-stdout"
    r = alice.post("/v1/sandboxes", json={"spec": {"level": "strict"}})
    assert r.status_code == 501 and r.json()["error"]["code"] == "level-not-supported"
    r = alice.post("/v1/sandboxes", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["field"] == "body"


def test_exec_streams_output_then_the_result(alice: httpx.Client) -> None:
    sid = _create(alice)
    code = "import sys; print('one', flush=True); sys.stderr.write('two'); sys.exit(5)"
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={"argv": [PY, "-c", code],
                                                      "stream": True})
    assert r.headers["content-type"] == "application/x-ndjson"
    evs = _events(r)
    assert {(e["fd"], e["text"]) for e in evs if e["event"] == "output"} == {
        (1, "one\n"), (2, "two")}
    assert evs[-1]["event"] == "result" and evs[-1]["result"]["exit_code"] == 5
    r = alice.post(f"/v1/sandboxes/{sid}/exec", headers={"accept": "application/x-ndjson"},
                   json={"argv": [PY, "-c", "import time; time.sleep(5)"],
                         "opts": {"timeout_ms": 200}})
    last = _events(r)[-1]
    assert last["event"] == "result" and last["result"]["outcome"] == "timeout"


def test_files_round_trip_and_refusals(alice: httpx.Client) -> None:
    sid = _create(alice)
    data = bytes(range(256)) * 100
    assert alice.put(f"/v1/sandboxes/{sid}/files", params={"path": "d/x.bin"},
                     content=data).status_code == 204
    r = alice.get(f"/v1/sandboxes/{sid}/files", params={"path": "d/x.bin"})
    assert r.status_code == 200 and r.content == data
    r = alice.get(f"/v1/sandboxes/{sid}/files", params={"path": "nope.txt"})
    assert r.status_code == 404 and r.json()["error"]["what"] == "file"
    r = alice.get(f"/v1/sandboxes/{sid}/files", params={"path": "../../etc/passwd"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "config-invalid"
    assert alice.get(f"/v1/sandboxes/{sid}/files").status_code == 400


def test_processes(alice: httpx.Client) -> None:
    sid = _create(alice)
    code = ("import sys\nprint('ready', flush=True)\nline = sys.stdin.readline()\n"
            "print('echo:' + line, end='', flush=True)\nsys.stderr.write('bye')\n"
            "sys.exit(7)\n")
    r = alice.post(f"/v1/sandboxes/{sid}/processes", json={"argv": [PY, "-c", code],
                                                           "opts": {"stdin": True}})
    assert r.status_code == 201
    base = f"/v1/sandboxes/{sid}/processes/{r.json()['id']}"
    with alice.stream("GET", f"{base}/output") as out:
        lines = out.iter_lines()
        first = json.loads(next(lines))
        assert first == {"event": "output", "fd": 1, "text": "ready\n"}
        assert alice.post(f"{base}/stdin", content=b"hello\n").status_code == 204
        assert alice.post(f"{base}/stdin/close").status_code == 204
        rest = [json.loads(x) for x in lines if x]
    text = "".join(e.get("text", "") for e in rest if e.get("fd") == 1)
    assert text == "echo:hello\n"
    assert "".join(e.get("text", "") for e in rest if e.get("fd") == 2) == "bye"
    assert rest[-1]["event"] == "exit" and rest[-1]["result"]["exit_code"] == 7
    assert alice.get(f"{base}/wait").json()["result"]["exit_code"] == 7
    r = alice.post(f"/v1/sandboxes/{sid}/processes", json={
        "argv": [PY, "-c", "import time; time.sleep(30)"], "opts": {"stdin": False}})
    base = f"/v1/sandboxes/{sid}/processes/{r.json()['id']}"
    assert alice.post(f"{base}/kill").status_code == 204
    assert alice.get(f"{base}/wait").json()["result"]["exit_code"] != 0
    assert alice.get(f"/v1/sandboxes/{sid}/processes/p-nope/wait").status_code == 404


def test_lifecycle_refused_where_the_provider_has_none(alice: httpx.Client) -> None:
    sid = _create(alice)
    for op, code in (("pause", "pause-not-supported"), ("resume", "pause-not-supported"),
                     ("snapshot", "snapshot-not-supported")):
        r = alice.post(f"/v1/sandboxes/{sid}/{op}")
        assert r.status_code == 501 and r.json()["error"]["code"] == code
    r = alice.post(f"/v1/sandboxes/{sid}/restore", json={
        "handle": {"v": 1, "adapterId": "x", "doc": {}}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid-snapshot-handle"


def test_runs(alice: httpx.Client) -> None:
    body = {"argv": [PY, "-c", "import sys; print(open('in.txt').read()); sys.exit(2)"],
            "level": "context-isolated", "files": {"in.txt": "from the request"}}
    r = alice.post("/v1/runs", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["result"]["exit_code"] == 2
    assert r.json()["result"]["stdout"] == "from the request\n"
    r = alice.post("/v1/runs", json={**body, "stream": True})
    evs = _events(r)
    assert evs[0] == {"event": "output", "fd": 1, "text": "from the request\n"}
    assert evs[-1]["event"] == "result"
    r = alice.post("/v1/runs", json={"argv": [PY, "-c", "import time; time.sleep(9)"],
                                     "level": "context-isolated", "opts": {"timeout_ms": 200}})
    assert r.status_code == 200 and r.json()["result"]["outcome"] == "timeout"
    r = alice.post("/v1/runs", json={"argv": ["/bin/true"], "level": "context-isolated",
                                     "limits": {"mem_mb": 64}})
    assert r.status_code == 501 and r.json()["error"]["field"] == "limits.mem_mb"
    assert alice.get("/v1/sandboxes").json()["sandboxes"] == []  # a run leaves none


def test_snippets(alice: httpx.Client) -> None:
    r = alice.post("/v1/snippets", json={"source": "import math\nprint('hi')\nx = 3\nx * x"})
    assert r.status_code == 200, r.text
    t = r.json()
    assert t["result"] == "9" and t["facts"] == {"x": 3}
    assert t["logs"] == [{"stream": "stdout", "text": "hi"}] and t["errors"] == []
    assert t["level"] == "context-isolated"
    r = alice.post("/v1/snippets", json={"files": {"main.py": "import helper\nhelper.f()",
                                                   "helper.py": "def f():\n    return 4"},
                                         "stream": True})
    evs = _events(r)
    assert evs[-1]["event"] == "transcript" and evs[-1]["transcript"]["result"] == "4"
    r = alice.post("/v1/snippets", json={"source": "import os\nos.system('id')"})
    errs = r.json()["errors"]
    assert r.status_code == 200 and errs[0]["type"] == "ValidationError"
    r = alice.post("/v1/snippets", json={"source": "1", "level": "strict"})
    assert r.status_code == 501


_HANDLER = "def handler(payload, ctx):\n    return {'doubled': payload['n'] * 2}\n"


def test_invoke(server: Server, alice: httpx.Client) -> None:
    assert server.image_root is not None
    img = server.image_root / "handler-img"
    img.mkdir()
    (img / "h.py").write_text(_HANDLER)
    spec = {**SPEC, "mode": "json-stdio", "image": str(img)}
    handler = {"artifact_id": "a", "version": "1", "module_path": "h.py"}
    r = alice.post("/v1/invoke", json={"spec": spec, "handler": handler, "input": {"n": 21}})
    assert r.status_code == 200, r.text
    assert r.json() == {"kind": "output", "value": {"doubled": 42}}
    sid = _create(alice, mode="json-stdio", image=str(img))
    r = alice.post(f"/v1/sandboxes/{sid}/invoke", json={"handler": handler, "input": {"n": 5}})
    assert r.json() == {"kind": "output", "value": {"doubled": 10}}, r.text
    r = alice.post(f"/v1/sandboxes/{sid}/invoke", json={"handler": handler, "input": {},
                                                        "mode": "in-context"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "mode"


def test_another_tenants_sandbox_is_not_found_on_every_route(server: Server,
                                                             alice: httpx.Client) -> None:
    sid = _create(alice)
    pid = alice.post(f"/v1/sandboxes/{sid}/processes", json={
        "argv": [PY, "-c", "import time; time.sleep(30)"]}).json()["id"]
    alice.put(f"/v1/sandboxes/{sid}/files", params={"path": "secret.txt"}, content=b"s3")
    with server.client(CAROL) as carol:
        assert carol.get("/v1/sandboxes").json()["sandboxes"] == []
        for method, path, _name, _needs in ROUTES:
            if "{sid}" not in path:
                continue
            url = path.replace("{sid}", sid).replace("{pid}", pid)
            kw: dict[str, Any] = {"params": {"path": "secret.txt"}}
            body = {"exec": {"argv": ["/bin/true"]},
                    "start_process": {"argv": ["/bin/true"]},
                    "expose": {"port": 8000}, "unexpose": {"port": 8000},
                    "change_network": {"allow": []},
                    "invoke_in": {"handler": {"artifact_id": "a", "version": "1"}},
                    "restore": {"handle": {"v": 1, "adapterId": "x", "doc": {}}},
                    "write_file": b"x", "process_stdin": b"x"}.get(_name)
            if isinstance(body, bytes):
                kw["content"] = body
            elif body is not None:  # each route's own shape: a wrong one is 400 first
                kw["json"] = body
            r = carol.request(method, url, **kw)
            assert r.status_code == 404, (method, path, r.status_code, r.text)
            assert r.json()["error"]["code"] == "not-found"
            assert "s3" not in r.text
    # carol's DELETE did not destroy it, her reads did not see it
    r = alice.get(f"/v1/sandboxes/{sid}/files", params={"path": "secret.txt"})
    assert r.content == b"s3"
    assert pid in alice.get(f"/v1/sandboxes/{sid}").json()["processes"]


def test_caps_are_refused_with_the_error_tables_status(server: Server) -> None:
    with server.client(BOB) as bob:
        a, b = _create(bob), _create(bob)
        r = bob.post("/v1/sandboxes", json={"spec": SPEC})
        err = r.json()["error"]
        assert r.status_code == LimitsExceededError.http_status == 422
        assert err["code"] == "limits-exceeded" and err["cap"] == "sandboxes"
        assert err["limit_value"] == 2
        r = bob.post("/v1/runs", json={"argv": ["/bin/true"], "level": "context-isolated"})
        assert r.status_code == 422 and r.json()["error"]["cap"] == "sandboxes"
        bob.delete(f"/v1/sandboxes/{b}")
        # max_runs = 1: a run in flight makes the next one refused
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(bob.post, f"/v1/sandboxes/{a}/exec", json={
                "argv": [PY, "-c", "import time; time.sleep(3)"]})
            wait_metric(server, 'corral_runs_in_flight{tenant="bob"}', 1)
            r = bob.post(f"/v1/sandboxes/{a}/exec", json={"argv": ["/bin/true"]})
            assert r.status_code == 422 and r.json()["error"]["cap"] == "runs"
            r = bob.post("/v1/snippets", json={"source": "1"})
            assert r.status_code == 422 and r.json()["error"]["cap"] == "runs"
            assert slow.result().status_code == 200
        r = bob.post(f"/v1/sandboxes/{a}/exec", json={"argv": ["/bin/true"]})
        assert r.status_code == 200
        # max_processes = 2 per sandbox: processes not yet ended (and seen ended)
        sleeper = {"argv": [PY, "-c", "import time; time.sleep(30)"]}
        p1 = bob.post(f"/v1/sandboxes/{a}/processes", json=sleeper).json()["id"]
        assert bob.post(f"/v1/sandboxes/{a}/processes", json=sleeper).status_code == 201
        r = bob.post(f"/v1/sandboxes/{a}/processes", json=sleeper)
        assert r.status_code == 422 and r.json()["error"]["cap"] == "processes"
        bob.post(f"/v1/sandboxes/{a}/processes/{p1}/kill")
        bob.get(f"/v1/sandboxes/{a}/processes/{p1}/wait")
        assert bob.post(f"/v1/sandboxes/{a}/processes", json=sleeper).status_code == 201
        bob.delete(f"/v1/sandboxes/{a}")
    with server.client(CAROL) as carol:  # max_memory_mb = 600; 256 MiB each without mem_mb
        x, y = _create(carol), _create(carol)
        r = carol.post("/v1/sandboxes", json={"spec": SPEC})
        assert r.status_code == 422 and r.json()["error"]["cap"] == "memory"
        assert r.json()["error"]["limit"] == "memory"
        carol.delete(f"/v1/sandboxes/{x}")
        carol.delete(f"/v1/sandboxes/{y}")
    with server.client(None) as c:
        m = c.get("/metrics").text
    assert 'corral_refused_total{cap="sandboxes"}' in m
    assert 'corral_refused_total{cap="memory"}' in m


def test_body_cap_is_413(alice: httpx.Client) -> None:
    sid = _create(alice)
    big = b"x" * ((12 << 20) + 1)
    r = alice.put(f"/v1/sandboxes/{sid}/files", params={"path": "big"}, content=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body-too-large"

    def chunks() -> Iterator[bytes]:  # no content-length: counted as it comes
        for _ in range(13):
            yield b"y" * (1 << 20)

    r = alice.put(f"/v1/sandboxes/{sid}/files", params={"path": "big"}, content=chunks())
    assert r.status_code == 413


def test_unknown_route_and_method(alice: httpx.Client) -> None:
    r = alice.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["what"] == "route"
    r = alice.patch("/v1/sandboxes")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method-not-allowed"


def test_logs_are_json_lines_without_tokens(server: Server, alice: httpx.Client) -> None:
    alice.get("/v1/info")
    text = server.log_path.read_text()
    for line in text.splitlines():
        json.loads(line)
    assert ALICE not in text and BOB not in text
    reqs = [e for e in server.logs() if e["event"] == "request"]
    assert any(e["path"] == "/v1/info" and e["tenant"] == "alice" and e["status"] == 200
               for e in reqs)


def test_keep_alive_answers_are_not_held_by_nagle(server: Server) -> None:
    """An answer goes out in two writes (head, body): without TCP_NODELAY on the accepted
    socket the body waits for the client's delayed ACK, 40 ms per request."""
    import http.client
    import statistics
    import time
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    took = []
    try:
        for _ in range(20):
            t0 = time.perf_counter()
            conn.request("GET", "/v1/info", headers={"Authorization": f"Bearer {ALICE}"})
            assert conn.getresponse().read()
            took.append(time.perf_counter() - t0)
    finally:
        conn.close()
    assert statistics.median(took) < 0.02, f"median {statistics.median(took) * 1000:.1f} ms"


def test_images_only_under_the_image_roots(server: Server, alice: httpx.Client,
                                           tmp_path: Any) -> None:
    """spec.image is a path on the server's host: a tenant names only what the config
    allows (else it could copy any host directory into its sandbox)."""
    assert server.image_root is not None
    (tmp_path / "h.py").write_text(_HANDLER)
    link = server.image_root / "escape"
    link.symlink_to(tmp_path)
    handler = {"artifact_id": "a", "version": "1", "module_path": "h.py"}
    for image in ("/etc", str(tmp_path), str(link), str(server.image_root) + "/../x"):
        spec = {**SPEC, "mode": "json-stdio", "image": image}
        r = alice.post("/v1/sandboxes", json={"spec": spec})
        assert r.status_code == 400 and r.json()["error"]["field"] == "image", (image, r.text)
        r = alice.post("/v1/invoke", json={"spec": spec, "handler": handler, "input": 1})
        assert r.status_code == 400 and r.json()["error"]["field"] == "image", (image, r.text)


def test_snippet_log_lines_stream_while_it_runs(alice: httpx.Client) -> None:
    """The NDJSON stream gives each log line as the snippet writes it: the first line
    is read while the snippet still sleeps (it would not be there if lines came with
    the transcript), then the rest, then the transcript with the same lines."""
    src = "import time\nprint('one', flush=True)\ntime.sleep(1.5)\nprint('two')\n'end'"
    with alice.stream("POST", "/v1/snippets", json={"source": src, "stream": True},
                      timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = json.loads(next(lines))
        assert first == {"event": "log", "stream": "stdout", "text": "one"}
        # the run has not ended: its pool slot is still taken
        assert alice.get("/metrics").text.count('corral_runs_in_flight{tenant="alice"} 1') == 1
        rest = [json.loads(x) for x in lines if x]
    assert rest[0] == {"event": "log", "stream": "stdout", "text": "two"}
    t = rest[-1]["transcript"]
    assert rest[-1]["event"] == "transcript" and t["result"] == "'end'"
    assert t["logs"] == [{"stream": "stdout", "text": "one"}, {"stream": "stdout", "text": "two"}]


def test_snippet_stream_refused_before_it_starts_keeps_its_status(alice: httpx.Client) -> None:
    r = alice.post("/v1/snippets", json={"source": "1", "level": "strict", "stream": True})
    assert r.status_code == 501 and r.json()["error"]["code"] == "level-not-supported"
