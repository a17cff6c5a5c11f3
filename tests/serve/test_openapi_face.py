"""The HTTP face of ``corral serve`` against a real server: the document and the server
refuse the same requests (unknown keys everywhere, empty argv, non-positive timeouts,
``{}`` for snippets and restore), one rule for how a run ended (an exec past its timeout
is 200 with ``outcome: timeout``, as ``/v1/runs``), 405 with ``Allow``, every status an
operation gives is in the document, the sandboxes cap named as a cap, and error texts in
JSON's words. Each of these failed on the code before the typed models (415554f)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
import jsonschema
import pytest
from servehelp import ALICE, BOB, Server

from corral.core.errors import SandboxTimeoutError
from corral.serve.app import ROUTES

PY = sys.executable
SPEC = {"level": "context-isolated", "network": {"kind": "unrestricted"}}


@pytest.fixture(scope="module")
def doc(server: Server) -> dict[str, Any]:
    with server.client(None) as c:
        d: dict[str, Any] = c.get("/v1/openapi.json").json()
    return d


@pytest.fixture
def alice(server: Server) -> Any:
    with server.client(ALICE) as c:
        yield c
        for sb in c.get("/v1/sandboxes").json()["sandboxes"]:
            c.delete(f"/v1/sandboxes/{sb['id']}")


def _sid(c: httpx.Client) -> str:
    r = c.post("/v1/sandboxes", json={"spec": SPEC})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _body_schema(doc: dict[str, Any], method: str, path: str) -> Any:
    schema = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**schema, "components": doc["components"]})


def _admits(doc: dict[str, Any], method: str, path: str, body: Any) -> bool:
    return bool(_body_schema(doc, method, path).is_valid(body))


#: (path, body) the server must refuse with 400 naming the field, and the document too
_BAD: list[tuple[str, Any, str]] = [
    ("/v1/runs", {"argv": ["/bin/true"], "timeout_ms": 200}, "timeout_ms"),  # belongs in opts
    ("/v1/runs", {"argv": []}, "argv"),
    ("/v1/runs", {"argv": ["/bin/true"], "opts": {"timeout_ms": -5}}, "opts.timeout_ms"),
    ("/v1/runs", {"argv": ["/bin/true"], "opts": {"timeout_ms": 0}}, "opts.timeout_ms"),
    ("/v1/runs", {"argv": ["/bin/true"], "opts": {"timout_ms": 5}}, "opts.timout_ms"),
    ("/v1/runs", {"argv": ["/bin/true"], "limits": {"mem_mb": -1}}, "limits.mem_mb"),
    ("/v1/runs", {"argv": [1]}, "argv[0]"),
    ("/v1/snippets", {}, "source"),
    ("/v1/snippets", {"source": "1", "files": {"main.py": "1"}}, "source"),
    ("/v1/snippets", {"source": "1", "timeout_ms": -1}, "timeout_ms"),
    ("/v1/snippets", {"source": "1", "colour": "red"}, "colour"),
    ("/v1/sandboxes", {"spec": {**SPEC, "nope": 1}}, "spec.nope"),
    ("/v1/sandboxes", {"spec": SPEC, "extra": True}, "extra"),
    ("/v1/invoke", {"handler": {"artifact_id": "a", "version": "1", "x": 1}}, "handler.x"),
]


@pytest.mark.parametrize(("path", "body", "field"), _BAD, ids=[f"{p}:{f}" for p, _, f in _BAD])
def test_server_and_document_refuse_the_same_bodies(alice: httpx.Client, doc: dict[str, Any],
                                                    path: str, body: Any, field: str) -> None:
    r = alice.post(path, json=body)
    assert r.status_code == 400, (body, r.status_code, r.text)
    err = r.json()["error"]
    assert err["code"] == "config-invalid" and err["field"] == field, err
    assert not _admits(doc, "post", path, body), f"the document admits {body}"


def test_a_sandbox_routes_bodies_are_refused_alike(alice: httpx.Client,
                                                   doc: dict[str, Any]) -> None:
    sid = _sid(alice)
    cases = [("exec", {"argv": []}, "argv"),
             ("exec", {"argv": ["/bin/true"], "stream": False, "env": {}}, "env"),
             ("processes", {"argv": ["/bin/true"], "opts": {"stdin": "yes"}}, "opts.stdin"),
             ("restore", {}, "handle"),
             ("restore", {"handle": {"v": 1, "adapterId": "x", "doc": {}, "y": 2}},
              "handle.y"),
             ("pause", {"anything": 1}, "anything")]  # a route without a body takes none
    for tail, body, field in cases:
        r = alice.post(f"/v1/sandboxes/{sid}/{tail}", json=body)
        assert r.status_code == 400, (tail, body, r.text)
        assert r.json()["error"]["field"] == field, (tail, r.json())
        path = f"/v1/sandboxes/{{sid}}/{tail}"
        if "requestBody" in doc["paths"][path]["post"]:
            assert not _admits(doc, "post", path, body), (tail, body)


def test_decode_errors_name_the_json_field_in_jsons_words(alice: httpx.Client) -> None:
    r = alice.post("/v1/runs", json={"argv": ["/bin/true"], "opts": {"env": {"A": 1}}})
    err = r.json()["error"]
    assert r.status_code == 400 and err["field"].startswith("opts.env"), err
    assert "string" in err["message"] and "`" not in err["message"]
    r = alice.post("/v1/runs", json={"argv": "/bin/true"})
    assert r.json()["error"]["field"] == "argv"
    assert "array" in r.json()["error"]["message"]
    for text in (r.text, alice.post("/v1/runs", content=b"[1, 2").text):
        assert "<class" not in text and "int`" not in text and "str`" not in text


def test_a_deeply_nested_body_is_a_400_not_a_crash(alice: httpx.Client) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    for path, body in (("/v1/invoke", b'{"handler": {"artifact_id": "a", "version": "1"}, '
                        b'"input": ' + deep + b"}"), ("/v1/runs", b'{"argv": ' + deep + b"}")):
        r = alice.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, r.status_code, r.text[:300])
        assert r.json()["error"]["code"] == "config-invalid"


def test_a_sandbox_create_without_a_body_is_a_default_spec_in_both(
        server: Server, alice: httpx.Client, doc: dict[str, Any]) -> None:
    """Decided: no body is ``{}`` (a strict sandbox with the defaults): the document
    says the body is optional, and the server answers it as it answers ``{}``."""
    assert doc["paths"]["/v1/sandboxes"]["post"]["requestBody"]["required"] is False
    empty, braces = alice.post("/v1/sandboxes"), alice.post("/v1/sandboxes", json={})
    assert (empty.status_code, empty.json()) == (braces.status_code, braces.json())
    # this server offers no strict: the default spec is refused for its level, not as a
    # missing body
    assert empty.status_code == 501 and empty.json()["error"]["field"] == "level"


def test_an_exec_past_its_timeout_is_200_with_the_outcome(alice: httpx.Client) -> None:
    """One rule, every door: the status says the request was served; ``outcome`` says
    how the command ended (as /v1/runs)."""
    sid = _sid(alice)
    slow = [PY, "-c", "import time; print('partial', flush=True); time.sleep(30)"]
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={"argv": slow,
                                                      "opts": {"timeout_ms": 300}})
    assert r.status_code == 200, r.text
    res = r.json()["result"]
    assert res["outcome"] == "timeout" and res["stdout"] == "partial\n"
    r = alice.post("/v1/runs", json={"argv": slow, "level": "context-isolated",
                                     "network": {"kind": "unrestricted"},
                                     "opts": {"timeout_ms": 300}})
    assert r.status_code == 200 and r.json()["result"]["outcome"] == "timeout"
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={"argv": slow, "stream": True,
                                                      "opts": {"timeout_ms": 300}})
    last = json.loads(r.text.splitlines()[-1])
    assert last["event"] == "result" and last["result"]["outcome"] == "timeout", last


def test_the_remote_provider_raises_the_timeout_as_the_library_does(server: Server) -> None:
    from corral.core.spec import Level, NetworkPolicy, SandboxSpec
    from corral.providers.remote import RemoteProvider

    async def go() -> None:
        p = RemoteProvider(server.url, ALICE)
        try:
            spec = SandboxSpec(level=Level.CONTEXT_ISOLATED,
                               network=NetworkPolicy.unrestricted())
            async with await p.create(spec) as sb:
                from corral.core.spec import ExecOpts
                with pytest.raises(SandboxTimeoutError) as ei:
                    await sb.exec([PY, "-c", "import time; print('p', flush=True); "
                                   "time.sleep(30)"], ExecOpts(timeout_ms=300))
                assert ei.value.result is not None
                assert ei.value.result.outcome == "timeout"
                assert ei.value.stdout == b"p\n" and ei.value.timeout_ms == 300
        finally:
            await p.aclose()

    asyncio.run(go())


def test_405_names_the_allowed_methods(alice: httpx.Client) -> None:
    r = alice.patch("/v1/sandboxes")
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, HEAD, POST"
    r = alice.request("PUT", "/v1/info")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    r = alice.post("/v1/sandboxes/x/files")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, PUT"


def test_every_401_and_404_an_operation_gives_is_documented(server: Server,
                                                           doc: dict[str, Any]) -> None:
    with server.client(None) as anon, server.client(ALICE) as alice:
        for method, path, _name, needs in ROUTES:
            url = path.replace("{sid}", "sb-nope").replace("{pid}", "p-nope")
            op = doc["paths"][path][method.lower()]
            if needs:
                r = anon.request(method, url)
                assert r.status_code == 401, (method, path)
                assert "401" in op["responses"], (method, path)
            if "{sid}" in path:
                body = {"exec": {"argv": ["/bin/true"]}, "start_process": {"argv": ["x"]},
                        "invoke_in": {"handler": {"artifact_id": "a", "version": "1"}},
                        "restore": {"handle": {"v": 1, "adapterId": "x", "doc": {}}},
                        "expose": {"port": 8000}, "unexpose": {"port": 8000},
                        "change_network": {"allow": []}}.get(_name)
                r = alice.request(method, url, params={"path": "f"}, json=body)
                assert r.status_code == 404, (method, path, r.text)
                assert "404" in op["responses"], (method, path)
        assert "503" in doc["paths"]["/v1/health"]["get"]["responses"]
        assert "401" in doc["paths"]["/metrics"]["get"]["responses"]


def test_the_sandboxes_cap_is_named_as_a_cap(server: Server) -> None:
    with server.client(BOB) as bob:  # max_sandboxes = 2
        made = [bob.post("/v1/sandboxes", json={"spec": SPEC}) for _ in range(3)]
        try:
            assert [r.status_code for r in made] == [201, 201, 422]
            err = made[2].json()["error"]
            assert err["cap"] == "sandboxes"
            assert err["message"].startswith("sandboxes cap reached (2 sandboxes"), err
            assert "processes" not in err["message"]
        finally:
            for r in made[:2]:
                bob.delete(f"/v1/sandboxes/{r.json()['id']}")


def test_error_texts_speak_json_not_python(alice: httpx.Client) -> None:
    r = alice.post("/v1/sandboxes", json={"spec": {"level": "context-isolated",
                                                   "network": {"kind": "none"}}})
    assert r.status_code == 501, r.text
    text = json.dumps(r.json())
    assert "NetworkPolicy" not in text and "()" not in text, text
    assert '{\\"kind\\": \\"unrestricted\\"}' in text or "unrestricted" in text


def test_the_document_is_generated_from_the_models(doc: dict[str, Any]) -> None:
    """The schemas served are msgspec's own for the models that decode the bodies, and
    each operation's body is its handler's model: they cannot drift apart."""
    import msgspec

    from corral.serve import models as m
    from corral.serve.openapi import operations
    _, comps = msgspec.json.schema_components(
        [m.RunRequest, m.ExecRequest, m.SnippetRequest], ref_template="#/components/schemas/{name}")
    for name in ("RunRequest", "ExecRequest", "ExecOpts", "Limits"):
        # plus what a model adds that msgspec cannot say (argv or cmd: one of them)
        extra = getattr(getattr(m, name), "__extra_schema__", {})
        assert doc["components"]["schemas"][name] == {**comps[name], **extra}, name
    for method, path, name, _needs, op in operations():
        body = doc["paths"][path][method.lower()].get("requestBody")
        if isinstance(op.body, type):
            ref = body["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/" + op.body.__name__), (name, ref)
        elif op.body is None:
            assert body is None, name
