"""Sessions through a real ``corral serve`` (strict: the linux provider on the server):
create, cells (JSON and NDJSON streaming), files, interrupt, memory kill, caps, delete."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servehelp import ALICE, BOB, Server, config_text, running

from session_env import CSV, png_size
from strict_tier import cgroup_limits_reason, host_can_sandbox, needs_strict

pytestmark = needs_strict(host_can_sandbox())

_PNG_3x2 = ("iVBORw0KGgoAAAANSUhEUgAAAAMAAAACCAIAAAASFvFNAAAAEElEQVR4nGP4z8AAQQxwFgBB0gX7h/C5"
            "SAAAAABJRU5ErkJggg==")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("sessions")
    cfg = config_text({"strict": "linux"}).replace(
        'name = "bob"', 'name = "bob"\nmax_sessions = 1', 1).replace(
        'name = "alice"', 'name = "alice"\nenvironments = ["sci"]', 1)
    with running(tmp, cfg) as s:
        yield s


def _cell(c: httpx.Client, sid: str, code: str, **kw: Any) -> dict[str, Any]:
    r = c.post(f"/v1/sessions/{sid}/cells", json={"code": code, **kw}, timeout=120)
    assert r.status_code == 200, r.text
    cell: dict[str, Any] = r.json()
    return cell


def test_a_session_keeps_its_globals_across_http_cells(server: Server) -> None:
    with server.client(ALICE) as c:
        r = c.post("/v1/sessions", json={"cell_timeout_s": 2})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            assert c.put(f"/v1/sessions/{sid}/files", params={"path": "data.csv"},
                         content=CSV).status_code == 204
            one = _cell(c, sid, "rows = open('data.csv').read().split()\nprint(len(rows))")
            assert one["ok"] and one["stdout"] == "5\n"
            two = _cell(c, sid, "rows[1]")
            assert two["result"]["data"]["text/plain"] == "'1,2'"
            pic = _cell(c, sid, "import base64\nclass P:\n    def _repr_png_(self):\n"
                        f"        return base64.b64decode({_PNG_3x2!r})\nP()")
            png = base64.b64decode(pic["result"]["data"]["image/png"])
            assert png_size(png) == (3, 2)
            spin = _cell(c, sid, "while True: pass")
            assert spin["timed_out"] and spin["error"]["name"] == "KeyboardInterrupt"
            assert _cell(c, sid, "len(rows)")["result"]["data"]["text/plain"] == "5"
            _cell(c, sid, "open('out.txt', 'w').write('from the cell')")
            r = c.get(f"/v1/sessions/{sid}/files", params={"path": "out.txt"})
            assert r.status_code == 200 and r.content == b"from the cell"
            listed = c.get("/v1/sessions").json()["sessions"]
            assert [s["id"] for s in listed] == [sid] and listed[0]["cells"] == 6
        finally:
            assert c.delete(f"/v1/sessions/{sid}").status_code == 204
        assert c.post(f"/v1/sessions/{sid}/cells", json={"code": "1"}).status_code == 404
        assert c.get(f"/v1/sandboxes/{sid}").status_code == 404  # its sandbox went too


def test_a_cell_streams_its_events_as_ndjson(server: Server) -> None:
    with server.client(ALICE) as c:
        sid = c.post("/v1/sessions").json()["id"]
        try:
            code = ("import sys\nprint('a')\nprint('b', file=sys.stderr)\n"
                    "class H:\n    def _repr_html_(self):\n        return '<b>h</b>'\n"
                    "display(H())\n6 * 7")
            with c.stream("POST", f"/v1/sessions/{sid}/cells",
                          json={"code": code, "stream": True}) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("application/x-ndjson")
                events = [json.loads(line) for line in r.iter_lines() if line]
            kinds = [e["event"] for e in events]
            assert kinds == ["stdout", "stderr", "display", "result", "cell"], kinds
            assert events[0]["text"] == "a\n" and events[1]["text"] == "b\n"
            assert events[2]["data"]["text/html"] == "<b>h</b>"
            assert events[3]["data"]["text/plain"] == "42"
            assert events[4]["cell"]["stdout"] == "a\n"
        finally:
            c.delete(f"/v1/sessions/{sid}")


@pytest.mark.skipif(bool(cgroup_limits_reason()), reason=cgroup_limits_reason() or "-")
def test_a_cell_past_the_memory_limit_ends_the_session_with_422(server: Server) -> None:
    with server.client(ALICE) as c:
        r = c.post("/v1/sessions", json={"limits": {"mem_mb": 128}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        _cell(c, sid, "x = 1")
        r = c.post(f"/v1/sessions/{sid}/cells", timeout=120, json={
            "code": "hog = []\nwhile True:\n    hog.append(bytearray(8 << 20))"})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "limits-exceeded" and err["limit"] == "memory"
        assert err["limit_value"] == 128
        assert c.post(f"/v1/sessions/{sid}/cells", json={"code": "x"}).status_code == 404
        assert c.get(f"/v1/sandboxes/{sid}").status_code == 404


def test_the_tenant_cap_on_sessions(server: Server) -> None:
    with server.client(BOB) as c:
        first = c.post("/v1/sessions")
        assert first.status_code == 201, first.text
        try:
            r = c.post("/v1/sessions")
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert err["cap"] == "sessions" and err["limit_value"] == 1
        finally:
            c.delete(f"/v1/sessions/{first.json()['id']}")
        again = c.post("/v1/sessions")  # room again
        assert again.status_code == 201, again.text
        c.delete(f"/v1/sessions/{again.json()['id']}")


def test_another_tenant_cannot_reach_a_session(server: Server) -> None:
    with server.client(ALICE) as a, server.client(BOB) as b:
        sid = a.post("/v1/sessions").json()["id"]
        try:
            assert b.post(f"/v1/sessions/{sid}/cells", json={"code": "1"}).status_code == 404
            assert b.delete(f"/v1/sessions/{sid}").status_code == 404
        finally:
            a.delete(f"/v1/sessions/{sid}")


def _refused_environment(r: httpx.Response, name: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "config-invalid" and err["field"] == "environment", err
    assert repr(name) in err["message"], err


def test_a_session_names_only_an_environment_its_tenant_lists(server: Server) -> None:
    """As for a sandbox: bob lists no environment, alice lists only ``sci``; the
    refusal is the sandbox route's, and no session (nor sandbox) is left behind."""
    with server.client(BOB) as b, server.client(ALICE) as a:
        _refused_environment(b.post("/v1/sessions", json={"environment": "sci"}), "sci")
        _refused_environment(b.post("/v1/sandboxes", json={"spec": {"environment": "sci"}}),
                             "sci")
        _refused_environment(a.post("/v1/sessions", json={"environment": "other"}), "other")
        assert b.get("/v1/sessions").json()["sessions"] == []
        assert a.get("/v1/sessions").json()["sessions"] == []

    # the remote provider's client gets the typed error
    import asyncio

    from corral.core.errors import ConfigInvalidError
    from corral.providers.remote import RemoteProvider
    from corral.providers.remote.sessions import RemoteSession

    async def main() -> None:
        async with RemoteProvider(server.url, BOB) as p:
            with pytest.raises(ConfigInvalidError) as info:
                await RemoteSession.create(p, environment="sci")
            assert info.value.field == "environment"
    asyncio.run(main())


# -- the walk with pandas and matplotlib (marker env_build) ----------------------
@pytest.mark.env_build
@pytest.mark.skipif(bool(cgroup_limits_reason()), reason=cgroup_limits_reason() or "-")
def test_the_agent_walk_over_http(tmp_path: Path, sci_env: str) -> None:
    """The session runs in the environment ``sci`` (built by corral into the cached
    store the server finds by ``CORRAL_ENV_DIR``), which alice's table lists."""
    cfg = config_text({"strict": "linux"}).replace(
        'name = "alice"', f'name = "alice"\nenvironments = ["{sci_env}"]', 1)
    with running(tmp_path / "srv", cfg) as srv, srv.client(ALICE) as c, \
            srv.client(BOB) as b:
        _refused_environment(b.post("/v1/sessions", json={"environment": sci_env}), sci_env)
        r = c.post("/v1/sessions", json={"limits": {"mem_mb": 400}, "cell_timeout_s": 2,
                                         "environment": sci_env})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert c.put(f"/v1/sessions/{sid}/files", params={"path": "data.csv"},
                     content=CSV).status_code == 204
        one = _cell(c, sid, "import pandas as pd; df = pd.read_csv('data.csv')", timeout_s=60)
        assert one["ok"], one["error"]
        two = _cell(c, sid, "df.describe()")
        assert "<table" in two["result"]["data"]["text/html"]
        assert "mean" in two["result"]["data"]["text/plain"]
        three = _cell(c, sid, "import matplotlib.pyplot as plt\n"
                      "fig, ax = plt.subplots(figsize=(4, 3), dpi=50)\n"
                      "ax.plot(df.a, df.b)\nplt.show()", timeout_s=60)
        [shown] = three["displays"]
        assert png_size(base64.b64decode(shown["data"]["image/png"])) == (200, 150)
        four = _cell(c, sid, "while True: pass")
        assert four["timed_out"] and four["error"]["name"] == "KeyboardInterrupt"
        assert _cell(c, sid, "int(df.b.sum())")["result"]["data"]["text/plain"] == "24"
        r = c.post(f"/v1/sessions/{sid}/cells", timeout=120, json={
            "code": "import numpy as np\nbig = np.ones((1 << 30,), dtype=np.uint8)",
            "timeout_s": 60})
        assert r.status_code == 422 and r.json()["error"]["limit"] == "memory", r.text
        # a session without the environment: the same server, no pandas
        r = c.post("/v1/sessions")
        assert r.status_code == 201, r.text
        plain = _cell(c, r.json()["id"], "import pandas")
        assert plain["error"]["name"] == "ModuleNotFoundError"
        c.delete(f"/v1/sessions/{r.json()['id']}")


def test_the_remote_provider_client(server: Server) -> None:
    import asyncio

    from corral import LimitsExceededError, SandboxLimits, SessionEndedError
    from corral.providers.remote import RemoteProvider
    from corral.providers.remote.sessions import RemoteSession

    async def main() -> None:
        async with RemoteProvider(server.url, ALICE) as p:
            seen: list[tuple[str, str]] = []
            async with await RemoteSession.create(p, cell_timeout_s=1.5) as s:
                await s.write_file("data.csv", CSV)
                r = await s.run("rows = open('data.csv').read().split()\nprint(len(rows))\n"
                                "rows[0]", on_stdout=lambda t: seen.append(("out", t)),
                                on_display=lambda d: seen.append((d.kind, d.text() or "")))
                assert r.stdout == "5\n" and r.result is not None
                assert r.result.text() == "'a,b'"
                assert seen == [("out", "5\n"), ("result", "'a,b'")]
                r = await s.run("while True: pass")
                assert r.timed_out and r.error is not None
                assert (await s.run("len(rows)")).result.text() == "5"  # type: ignore[union-attr]
                await s.run("open('o.txt', 'w').write('x')")
                assert await s.read_file("o.txt") == b"x"
            with pytest.raises(SessionEndedError):
                await s.run("1")
            if not cgroup_limits_reason():
                s2 = await RemoteSession.create(p, limits=SandboxLimits(mem_mb=128))
                with pytest.raises(LimitsExceededError) as info:
                    await s2.run("hog = []\nwhile True:\n    hog.append(bytearray(8 << 20))")
                assert info.value.limit == "memory" and info.value.limit_value == 128
                await s2.close()
    asyncio.run(main())
