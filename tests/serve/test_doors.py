"""What E2B users reach for, over ``corral serve`` (issue 27 items 4 and 5): a command as
one shell line beside argv, on every route that runs one; my sandboxes listed and one
found again by id (the remote provider and ``corral.sandbox.Sandbox.connect``); a
result that says its level; one rule for how a run ended, a handler invoke past its
timeout included; ``corral.provider("remote", level=...)`` narrowing the provider."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servehelp import ALICE, BOB, Server, config_text, running

import corral
from corral.core.errors import ProviderError, SandboxTimeoutError
from corral.core.spec import Level, NetworkPolicy, SandboxSpec
from corral.core.sync import close_sync, run_sync
from corral.sandbox import Sandbox
from strict_tier import host_can_sandbox

PY = sys.executable
CI = "context-isolated"
SPEC = {"level": CI, "network": {"kind": "unrestricted"}}
STRICT_REASON = host_can_sandbox()


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server offering context-isolated (subproc) and, where this host can, strict."""
    levels = {CI: "subproc"} if STRICT_REASON else {"strict": "linux", CI: "subproc"}
    images = tmp_path_factory.mktemp("images")
    with running(tmp_path_factory.mktemp("serve"),
                 config_text(levels, image_roots=(str(images),))) as s:
        s.image_root = images
        yield s


@pytest.fixture
def alice(both: Server) -> Iterator[httpx.Client]:
    with both.client(ALICE) as c:
        yield c
        for sb in c.get("/v1/sandboxes").json()["sandboxes"]:
            c.delete(f"/v1/sandboxes/{sb['id']}")


def _create(c: httpx.Client) -> str:
    r = c.post("/v1/sandboxes", json={"spec": SPEC})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_cmd_is_a_shell_line_on_exec_runs_and_processes(alice: httpx.Client) -> None:
    sid = _create(alice)
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo a b | wc -w > n; cat n"})
    assert r.status_code == 200, r.text
    res = r.json()["result"]
    assert (res["outcome"], res["stdout"].strip(), res["level"]) == ("exit", "2", CI)
    # argv stays argv: no shell sees "|"
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={"argv": ["/bin/echo", "x | y"]})
    assert r.json()["result"]["stdout"] == "x | y\n"
    # streamed too
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo s1; echo s2 >&2",
                                                      "stream": True})
    events = [json.loads(x) for x in r.text.splitlines() if x]
    assert events[-1]["event"] == "result" and events[-1]["result"]["level"] == CI
    r = alice.post("/v1/runs", json={"cmd": "printf %s $((6*7))", "level": CI})
    assert r.status_code == 200, r.text
    assert r.json()["result"]["stdout"] == "42" and r.json()["result"]["level"] == CI
    pid = alice.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": "echo p | tr p q"}
                     ).json()["id"]
    r = alice.get(f"/v1/sandboxes/{sid}/processes/{pid}/wait")
    assert r.json()["result"]["exit_code"] == 0
    # exactly one of the two
    for body in ({"argv": ["/bin/true"], "cmd": "true"}, {}, {"cmd": ""}):
        r = alice.post(f"/v1/sandboxes/{sid}/exec", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "config-invalid", body
    # the document says so
    doc = alice.get("/v1/openapi.json").json()
    schema = doc["components"]["schemas"]["ExecRequest"]
    assert "cmd" in schema["properties"] and schema["oneOf"]


def test_unknown_keys_are_refused_on_runs(alice: httpx.Client) -> None:
    r = alice.post("/v1/runs", json={"argv": ["/bin/true"], "level": CI, "timeout_ms": 200})
    assert r.status_code == 400 and r.json()["error"]["field"] == "timeout_ms"


_SLOW = "import time\ndef handler(payload, ctx):\n    time.sleep(30)\n    return 1\n"


def test_a_handler_past_its_timeout_is_a_result_not_a_504(both: Server,
                                                         alice: httpx.Client) -> None:
    """Before: 504 timeout. The one rule: the handler ran, so 200 with how it ended."""
    assert both.image_root is not None
    img = both.image_root / "slow"
    img.mkdir(exist_ok=True)
    (img / "h.py").write_text(_SLOW)
    handler = {"artifact_id": "a", "version": "1", "module_path": "h.py"}
    r = alice.post("/v1/invoke", json={"spec": {**SPEC, "mode": "json-stdio",
                                                "image": str(img)},
                                       "handler": handler, "input": {}, "timeout_ms": 500})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["kind"] == "ended"
    assert doc["result"]["outcome"] == "timeout" and doc["result"]["limit_value"] == 500
    assert doc["result"]["level"] == CI


def test_list_and_connect_by_id(both: Server) -> None:
    """A sandbox made by one client, found and driven by another (sync and async)."""
    made = Sandbox.create(level=CI, url=both.url, token=ALICE)
    try:
        made.files.write("note.txt", "kept")
        ids = [s.id for s in Sandbox.list(url=both.url, token=ALICE)]
        assert made.id in ids
        assert made.id not in [s.id for s in Sandbox.list(url=both.url, token=BOB)]
        again = Sandbox.connect(made.id, url=both.url, token=ALICE)
        assert again.level == CI
        r = again.commands.run("cat note.txt; echo; echo $((1+1))")
        assert r.stdout_text == "kept\n2\n" and r.level == CI
        r = again.commands.run("sleep 30", timeout_ms=300)
        assert r.outcome == "timeout"
        again.detach()  # lets it go on living
        assert made.commands.run("cat note.txt").stdout_text == "kept"
        with pytest.raises(ProviderError):  # another tenant's id is not found
            Sandbox.connect(made.id, url=both.url, token=BOB)
    finally:
        made.kill()
    assert made.id not in [s.id for s in Sandbox.list(url=both.url, token=ALICE)]

    # the async provider: connect gives the contract's sandbox, exec raises as ever
    p = corral.provider("remote", url=both.url, token=ALICE)
    try:
        async def go() -> None:
            sb = await p.create(SandboxSpec(level=Level.CONTEXT_ISOLATED,
                                            network=NetworkPolicy.unrestricted()))
            other = corral.provider("remote", url=both.url, token=ALICE)
            try:
                same: Any = await other.connect(sb.id)  # type: ignore[attr-defined]
                assert (await same.exec(["/bin/sh", "-c", "echo hi"])).stdout == b"hi\n"
                with pytest.raises(SandboxTimeoutError) as ei:
                    await same.exec(["/bin/sleep", "30"], corral.ExecOpts(timeout_ms=300))
                assert ei.value.result is not None and ei.value.result.level == CI
            finally:
                await other.aclose()  # not its sandbox: left alive
            assert sb.id in [d["id"] for d in await p.list_sandboxes()]  # type: ignore[attr-defined]
            await sb.destroy()
        run_sync(go())
    finally:
        close_sync(p)


def test_provider_level_narrows_the_remote_provider(both: Server) -> None:
    """docs/service.md: level= narrows it to one level and that level's capabilities.
    Before: corral.provider kept ``level`` to itself; the provider offered every level."""
    p = corral.provider("remote", url=both.url, token=ALICE, level=CI)
    try:
        assert p.levels == frozenset({Level.CONTEXT_ISOLATED})
        assert "context-isolated" in p.capabilities and "strict" not in p.capabilities
    finally:
        close_sync(p)
    if STRICT_REASON:
        return
    p = corral.provider("remote", url=both.url, token=ALICE, level="strict")
    try:
        assert p.levels == frozenset({Level.STRICT})
        assert {"strict", "streaming-exec"} <= p.capabilities
    finally:
        close_sync(p)
    wide = corral.provider("remote", url=both.url, token=ALICE)
    try:
        assert wide.levels == frozenset({Level.STRICT, Level.CONTEXT_ISOLATED})
    finally:
        close_sync(wide)


def test_sync_create_over_serve_at_strict(both: Server, tmp_path: Path) -> None:
    if STRICT_REASON:
        pytest.skip(STRICT_REASON)
    with Sandbox.create(url=both.url, token=ALICE) as sb:
        assert sb.level == "strict"
        r = sb.commands.run("echo in > f; cat f; id -u")
        assert r.level == "strict" and r.stdout_text.startswith("in\n")


def test_an_exec_on_a_paused_sandbox_honours_its_timeout(both: Server,
                                                         alice: httpx.Client) -> None:
    """Before: an exec sent to a paused sandbox waited until resume, whatever its
    timeout_ms. Now it ends as a ``timeout`` result at its deadline (it never started)."""
    if STRICT_REASON:
        pytest.skip(STRICT_REASON)
    r = alice.post("/v1/sandboxes", json={"spec": {"level": "strict"}})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert alice.post(f"/v1/sandboxes/{sid}/pause").status_code == 204
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo ran > f",
                                                      "opts": {"timeout_ms": 400}},
                   timeout=30)
    assert r.status_code == 200, r.text
    res = r.json()["result"]
    assert (res["outcome"], res["limit_value"], res["level"]) == ("timeout", 400, "strict")
    assert "paused" in res["detail"]
    # streamed the same
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true", "stream": True,
                                                      "opts": {"timeout_ms": 300}},
                   timeout=30)
    last = json.loads(r.text.splitlines()[-1])
    assert last["event"] == "result" and last["result"]["outcome"] == "timeout"
    assert alice.post(f"/v1/sandboxes/{sid}/resume").status_code == 204
    r = alice.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "ls f 2>&1; echo now",
                                                      "opts": {"timeout_ms": 5000}})
    res = r.json()["result"]
    assert res["outcome"] == "exit" and res["stdout"].endswith("now\n")
    assert "No such file" in res["stdout"]  # the timed-out command never ran


def test_every_field_of_a_result_is_documented() -> None:
    """docs/service.md's "The result's fields" names every key of a result as the API
    sends it, the internal ones (cwd_owned, node_heap_mb_applied, strays_killed,
    spawn_errno) included; the OpenAPI model has each one too."""
    from pathlib import Path as P

    from corral.core.result import RunResult
    from corral.providers.remote import wire
    from corral.serve import models as m
    text = (P(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    part = text.split("**The result's fields.**", 1)[1].split("\n\n", 1)[0]
    keys = set(wire.result_to_json(RunResult(level="strict", stdout=b"\xff")))
    prefixes = {k.split("_")[0] for k in keys if k.startswith(("stdout", "stderr"))}
    missing = [k for k in sorted(keys) if f"`{k}`" not in part
               and not (k.split("_")[0] in prefixes and f"`*_{k.split('_', 1)[1]}`" in part)]
    assert missing == [], f"not documented in docs/service.md: {missing}"
    assert keys <= set(m.RunResult.__struct_fields__)
