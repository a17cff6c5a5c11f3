"""``corral mcp --http`` holds every caller to what the operator allows (issue 23, item 5
and the MCP side of items 1-3), each through a real server started here on loopback:

- no bearer token (or a wrong one): 401 with ``WWW-Authenticate: Bearer``, before the
  SDK makes a session (500 of them leave the server's sessions and memory as they were);
- sessions capped per tenant (429) and in all (503); one that did nothing after its
  handshake is closed after ``--session-start-timeout``;
- tenants never meet: A's named sandbox is not listed, exec'd, read or destroyed by B,
  and B cannot use A's session id;
- the ceilings: limits past the server's maxima, levels not offered, runs in flight and
  memory past the tenant's caps are refused before anything runs;
- SIGTERM with sandboxes alive, a command running and an event stream open ends the
  server within seconds, leaving no process or cgroup behind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from mcp_support import (
    STRICT,
    TOKEN,
    cgroup_gone,
    cgroup_of,
    cgroups_of_pid,
    client,
    doc,
    http_server,
    rss_kib,
)

ALICE = "alice-token-" + "a" * 24
BOB = "bob-token-" + "b" * 24

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream",
          "Content-Type": "application/json"}


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


def config(tmp_path: Path, alice: str = "", levels: str = "") -> str:
    """A corral serve config with tenants alice (plain token) and bob (its digest)."""
    path = tmp_path / "serve.toml"
    bob_digest = hashlib.sha256(BOB.encode()).hexdigest()
    path.write_text(f"{levels}\n[[tenants]]\nname = \"alice\"\ntoken = \"{ALICE}\"\n{alice}\n"
                    f"[[tenants]]\nname = \"bob\"\ntoken_sha256 = \"{bob_digest}\"\n")
    return str(path)


def initialize(http: Any, url: str, token: str | None) -> httpx.Response:
    """A handshake ``initialize`` (``http``: an httpx client, or the module)."""
    headers = dict(ACCEPT)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return http.post(url, json=INIT, headers=headers, timeout=30)


def test_no_token_is_401_before_any_session_is_made() -> None:
    with http_server() as (url, proc), httpx.Client() as http:
        for token in (None, "wrong-" + TOKEN, TOKEN + "x", "x"):
            r = initialize(http, url, token)
            assert r.status_code == 401, (token, r.status_code, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert "mcp-session-id" not in r.headers
            assert r.json()["error"]["code"] == "unauthorized"
        r = http.post(url, json=INIT, headers={**ACCEPT, "Authorization": f"Basic {TOKEN}"})
        assert r.status_code == 401
        before = rss_kib(proc.pid)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: initialize(httpx, url, None).status_code,
                                  range(500)))
        assert codes == [401] * 500
        grown = rss_kib(proc.pid) - before
        print(f"server RSS {before} KiB, +{grown} KiB after 500 refused initializes")
        # a session of the SDK holds ~37 KiB (10,000 took 374 MB): 500 would be ~18 MiB
        assert grown < 6 * 1024, f"the server grew {grown} KiB over 500 refused requests"
        # the tenant itself gets in
        r = initialize(http, url, TOKEN)
        assert r.status_code == 200, r.text
        assert r.headers["mcp-session-id"]


def test_sessions_are_capped_per_tenant_and_in_all_and_idle_handshakes_expire(
        tmp_path: Path) -> None:
    with http_server("--config", config(tmp_path), "--max-sessions", "3",
                     "--max-sessions-per-tenant", "2", "--session-start-timeout", "1s",
                     token=None) as (url, _), httpx.Client() as http:
        a1, a2 = (initialize(http, url, ALICE) for _ in range(2))
        assert a1.status_code == a2.status_code == 200
        refused = initialize(http, url, ALICE)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "max_sessions"
        assert "retry-after" in refused.headers
        assert initialize(http, url, BOB).status_code == 200
        full = initialize(http, url, BOB)  # bob has room, the server has not
        assert full.status_code == 503 and "retry-after" in full.headers
        # a session its client closes frees its place at once
        sid = a1.headers["mcp-session-id"]
        gone = http.delete(url, headers={**ACCEPT, "Authorization": f"Bearer {ALICE}",
                                         "mcp-session-id": sid})
        assert gone.status_code == 200
        assert initialize(http, url, ALICE).status_code == 200
        # sessions that did nothing after their handshake are closed after 1 s
        deadline = time.monotonic() + 30
        while initialize(http, url, BOB).status_code != 200:
            assert time.monotonic() < deadline, "idle handshakes were never closed"
            time.sleep(0.3)
        old = a2.headers["mcp-session-id"]
        r = http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                      headers={**ACCEPT, "Authorization": f"Bearer {ALICE}",
                               "mcp-session-id": old, "mcp-protocol-version": "2025-06-18"})
        assert r.status_code == 404, r.text


@STRICT
def test_a_tenant_never_sees_another_tenants_sandboxes(tmp_path: Path) -> None:
    with http_server("--config", config(tmp_path), token=None) as (url, proc):
        async def main() -> tuple[str, str]:
            async with client(url, ALICE) as a, client(url, BOB) as b:
                made = doc(await a.call_tool("sandbox_create", {"name": "box"}))
                r = await a.call_tool("sandbox_write_file", {"name": "box", "path": "secret",
                                                            "content": "alice's"})
                assert not r.is_error
                assert doc(await b.call_tool("sandbox_list", {}))["sandboxes"] == []
                for tool, args in (
                        ("sandbox_exec", {"name": "box", "argv": ["/bin/cat", "secret"]}),
                        ("sandbox_read_file", {"name": "box", "path": "secret"}),
                        ("sandbox_write_file", {"name": "box", "path": "x", "content": "1"}),
                        ("sandbox_destroy", {"name": "box"})):
                    r = await b.call_tool(tool, args)
                    assert r.is_error, (tool, doc(r))
                    assert doc(r)["error"]["code"] == "config-invalid"
                    assert "secret" not in str(doc(r)) or tool == "sandbox_read_file"
                # bob's "box" is his own
                theirs = doc(await b.call_tool("sandbox_create", {"name": "box"}))
                assert theirs["id"] != made["id"]
                r = await b.call_tool("sandbox_exec", {"name": "box",
                                                       "argv": ["/bin/ls", "/work"]})
                assert "secret" not in doc(r)["stdout"].split()
                r = await a.call_tool("sandbox_exec", {"name": "box",
                                                       "argv": ["/bin/cat", "secret"]})
                assert doc(r)["stdout"] == "alice's"
                assert doc(await a.call_tool("sandbox_list", {}))["sandboxes"] == ["box"]
            return str(made["id"]), str(theirs["id"])

        ids = run(main())
        # and a session id is its tenant's only: bob presenting alice's gets 404
        with httpx.Client() as http:
            sid = initialize(http, url, ALICE).headers["mcp-session-id"]
            r = http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                          headers={**ACCEPT, "Authorization": f"Bearer {BOB}",
                                   "mcp-session-id": sid,
                                   "mcp-protocol-version": "2025-06-18"})
            assert r.status_code == 404, r.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert all(cgroup_gone(i) for i in ids)


@STRICT
def test_ceilings_limits_levels_runs_and_memory(tmp_path: Path) -> None:
    path = config(tmp_path, alice="max_runs = 1\nmax_memory_mb = 768\n[tenants.limits]\n"
                  "max_processes = {default = 64, max = 128}\n"
                  "mem_mb = {default = 256, max = 1024}\ndisk_mb = 512\n")
    # the server's floor is context-isolated, but alice's levels do not name it
    with http_server("--config", path, "--level", "context-isolated", token=None) as (url, _):
        async def main() -> None:
            async with client(url, ALICE) as a:
                # limits past the tenant's maxima: refused before anything is made
                for field, big, kind in (("max_processes", 1_000_000, "processes"),
                                         ("mem_mb", 1 << 20, "memory"),
                                         ("disk_mb", 513, "disk")):
                    r = await a.call_tool("sandbox_create", {"name": "big", field: big})
                    err = doc(r)["error"]
                    assert r.is_error and (err["code"], err["limit"]) == \
                        ("limits-exceeded", kind), err
                assert doc(await a.call_tool("sandbox_list", {}))["sandboxes"] == []
                # context-isolated (no boundary) is offered only to a tenant naming it
                for tool, args in (("run_command", {"argv": ["/bin/true"]}),
                                   ("sandbox_create", {"name": "ci"})):
                    r = await a.call_tool(tool, {**args, "level": "context-isolated"})
                    err = doc(r)["error"]
                    assert r.is_error and err["code"] == "level-not-supported", err
                # a sandbox without limits gets (and counts) the tenant's defaults
                made = doc(await a.call_tool("sandbox_create", {"name": "one"}))
                assert made["level"] == "strict"
                r = await a.call_tool("sandbox_exec", {"name": "one", "argv": [
                    "/bin/cat", "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/pids.max"]})
                if not r.is_error and doc(r)["exit_code"] == 0:  # a cgroup v2 sandbox
                    assert doc(r)["stdout"].split() == [str(256 << 20), "64"]
                # the tenant's memory: 256 held, 600 more passes its 768
                r = await a.call_tool("sandbox_create", {"name": "two", "mem_mb": 600})
                assert r.is_error and doc(r)["error"]["field"] == "max_memory_mb", doc(r)
                r = await a.call_tool("sandbox_create", {"name": "two", "mem_mb": 400})
                assert not r.is_error, doc(r)
                # one run in flight at most: the second is refused while the first runs
                slow = asyncio.ensure_future(a.call_tool("sandbox_exec", {
                    "name": "one", "argv": ["/bin/sleep", "3"]}))
                await asyncio.sleep(1.0)
                r = await a.call_tool("run_command", {"argv": ["/bin/true"]})
                assert r.is_error and doc(r)["error"]["field"] == "max_runs", doc(r)
                assert not (await slow).is_error
                r = await a.call_tool("run_command", {"argv": ["/bin/true"]})
                assert not r.is_error, doc(r)

        run(main())


def test_no_token_no_http_off_loopback() -> None:
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_MCP_TOKEN"}
    # 192.0.2.1 (TEST-NET-1) is never bound: the server refuses before listening
    done = subprocess.run([sys.executable, "-m", "corral", "mcp", "--http", "--host",
                           "192.0.2.1", "--port", "0"], env=env, capture_output=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 64, done.stderr
    assert b"config-invalid" in done.stderr and b"--config" in done.stderr


def test_no_token_on_loopback_generates_one_and_says_it_once() -> None:
    import re
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_MCP_TOKEN"}
    p = subprocess.Popen([sys.executable, "-m", "corral", "mcp", "--http", "--port", "0"],
                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        assert p.stderr is not None
        lines: list[str] = []
        while not lines or "serving streamable HTTP" not in lines[-1]:
            line = p.stderr.readline().decode()
            assert line, f"the server did not start: {lines}"
            lines.append(line.strip())
        served = re.search(r"serving streamable HTTP at (\S+)", lines[-1])
        tokens = [m.group(1) for x in lines
                  if (m := re.search(r"generated a bearer token .*: (\S+)$", x))]
        assert served and len(tokens) == 1, lines
        with httpx.Client() as http:
            assert initialize(http, served.group(1), None).status_code == 401
            assert initialize(http, served.group(1), tokens[0]).status_code == 200
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        assert p.stderr is not None
        p.stderr.close()


def _with_marker(marker: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


@STRICT
def test_sigterm_is_prompt_with_sandboxes_alive_and_leaves_nothing() -> None:
    marker = f"corral-mcp-sigterm-{os.getpid()}-{time.monotonic_ns()}"
    sleeper = ["/bin/sh", "-c", f"sleep 60 # {marker}"]
    ids: list[str] = []
    took: list[float] = []
    with http_server() as (url, proc):
        async def main() -> None:
            try:
                async with client(url, mode="legacy") as legacy, client(url) as modern:
                    # a handshake session (its event stream open), a sessionless scope
                    for c in (legacy, modern):
                        for name in ("a", "b"):
                            ids.append(doc(await c.call_tool("sandbox_create",
                                                             {"name": name}))["id"])
                    running = [asyncio.ensure_future(c.call_tool(
                        "sandbox_exec", {"name": "a", "argv": sleeper, "timeout_ms": 60000}))
                        for c in (legacy, modern)]
                    deadline = time.monotonic() + 30
                    while len(_with_marker(marker)) < 2:
                        assert time.monotonic() < deadline, "the commands did not start"
                        await asyncio.sleep(0.05)
                    assert all(cgroup_of(i) is not None for i in ids)
                    t0 = time.monotonic()
                    proc.send_signal(signal.SIGTERM)
                    await asyncio.get_running_loop().run_in_executor(None, proc.wait, 60)
                    took.append(time.monotonic() - t0)
                    for f in running:
                        f.cancel()
                    await asyncio.gather(*running, return_exceptions=True)
            except Exception:
                if not took:  # the clients may fail as their server goes, not before
                    raise

        run(main())
        assert proc.returncode == 0
    print(f"SIGTERM to exit: {took[0]:.2f} s")
    assert took[0] < 5.0, f"SIGTERM took {took[0]:.1f} s"
    assert all(cgroup_gone(i) for i in ids)
    assert _with_marker(marker) == []
    assert cgroups_of_pid(proc.pid) == []
