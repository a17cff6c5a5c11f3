"""``corral mcp --http`` on loopback, driven by the MCP SDK's own client over streamable
HTTP: the sessionless protocol (the client's default) and the handshake protocol with a
session per client (names do not cross sessions; a closed session's sandboxes are
destroyed); SIGTERM destroys every sandbox and exits 0."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from mcp_support import STRICT, cgroup_gone, cgroup_of, cgroups_of_pid, client, doc, http_server


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


@STRICT
def test_tools_over_http_and_sigterm_destroys_every_sandbox() -> None:
    with http_server() as (url, proc):
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")

        async def main() -> str:
            async with client(url) as c:
                t = doc(await c.call_tool("run_in_sandbox", {"source": "x = [1, 2]\nlen(x)"}))
                assert (t["result"], t["facts"]) == ("2", {"x": [1, 2]})
                t = doc(await c.call_tool("run_in_sandbox", {"source": "import socket"}))
                assert t["errors"][0]["code"] == "forbidden-import"
                d = doc(await c.call_tool("run_command", {"argv": ["/bin/echo", "hi"]}))
                assert d["stdout"] == "hi\n"
                made = doc(await c.call_tool("sandbox_create", {"name": "s"}))
                await c.call_tool("sandbox_write_file", {"name": "s", "path": "a", "content": "1"})
            # the sessionless protocol: the sandbox outlives one client's connection
            async with client(url) as c:
                r = await c.call_tool("sandbox_exec", {"name": "s", "argv": ["/bin/cat", "a"]})
                assert doc(r)["stdout"] == "1"
            return str(made["id"])

        kept = run(main())
        assert cgroup_of(kept) is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert cgroup_gone(kept)
    assert cgroups_of_pid(proc.pid) == []


@STRICT
def test_sessions_keep_their_names_apart_and_a_closed_session_ends_its_sandboxes() -> None:
    with http_server() as (url, proc):
        async def main() -> None:
            async with client(url, mode="legacy") as a, client(url, mode="legacy") as b:
                sa = doc(await a.call_tool("sandbox_create", {"name": "mine"}))
                assert doc(await b.call_tool("sandbox_list", {}))["sandboxes"] == []
                r = await b.call_tool("sandbox_exec", {"name": "mine", "argv": ["/bin/true"]})
                assert r.is_error and doc(r)["error"]["code"] == "config-invalid"
                # the same name in another session is another sandbox
                sb = doc(await b.call_tool("sandbox_create", {"name": "mine"}))
                assert sb["id"] != sa["id"]
            # both clients closed their sessions (DELETE): their sandboxes are gone
            assert cgroup_gone(sa["id"]) and cgroup_gone(sb["id"])
            assert proc.poll() is None  # the server lives on

        run(main())
