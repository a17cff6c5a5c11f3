"""An agent's first hour with ``corral mcp`` (issue 27 item 6), through the MCP SDK's own
client over stdio: the snippet dialect said and its rules discoverable; run_command
resolving names on PATH and taking a shell line; output past 1 MiB cut with a note, the
command not killed; wrong-typed arguments in corral's error shape; a missing file
``not-found``; a network policy within the ceiling; a background process started and
polled; clean descriptions; an ``outputSchema`` on every tool (which the SDK's client
checks every answer against)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mcp import Client
from mcp_support import STRICT, doc, stdio_params

CI = ("--level", "context-isolated")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_tools_declare_output_schemas_and_clean_descriptions() -> None:
    async def main() -> None:
        async with Client(stdio_params(*CI)) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert {"snippet_rules", "process_start", "process_poll", "process_kill"} \
                <= set(tools)
            for t in tools.values():
                assert t.output_schema is not None and t.output_schema["type"] == "object", \
                    t.name
                assert t.description and "\n    " not in t.description, t.name
            d = tools["run_in_sandbox"].description or ""
            assert "restricted dialect" in d and "snippet_rules" in d
            # the rules, as a tool and as a resource
            rules = doc(await c.call_tool("snippet_rules", {}))
            assert "math" in rules["allowed_imports"] and "os" not in rules["allowed_imports"]
            assert {"open", "eval", "getattr"} <= set(rules["forbidden_names"])
            res = await c.read_resource("corral://snippets/rules")
            text = res.contents[0].text  # type: ignore[union-attr]
            assert json.loads(text)["allowed_imports"] == rules["allowed_imports"]
    run(main())


def test_run_command_resolves_names_and_takes_a_shell_line() -> None:
    """Before: ["ls", "/"] was refused (argv[0] had to be absolute) and there was no
    shell string. Now as corral run: a name on PATH; ``command`` through /bin/sh -c."""
    async def main() -> None:
        async with Client(stdio_params(*CI)) as c:
            r = await c.call_tool("run_command", {"argv": ["ls", "/"]})
            d = doc(r)
            assert not r.is_error and d["outcome"] == "exit" and "usr" in d["stdout"].split()
            assert d["level"] == "context-isolated"
            d = doc(await c.call_tool("run_command", {"command": "echo a b c | wc -w"}))
            assert d["stdout"].strip() == "3"
            d = doc(await c.call_tool("run_command", {"argv": ["no-such-cmd-xyz"]}))
            assert d["outcome"] == "spawn-error" and "not found on PATH" in d["detail"]
            r = await c.call_tool("run_command", {"argv": ["ls"], "command": "ls"})
            assert r.is_error and doc(r)["error"]["field"] == "argv"
            # the one rule: a command past its timeout is its result, not a tool error
            r = await c.call_tool("run_command", {"command": "sleep 10", "timeout_ms": 300})
            assert not r.is_error and doc(r)["outcome"] == "timeout"
            # in a named sandbox too
            await c.call_tool("sandbox_create", {"name": "s"})
            d = doc(await c.call_tool("sandbox_exec", {"name": "s",
                                                       "command": "echo x > f && cat f"}))
            assert d["stdout"] == "x\n"
            d = doc(await c.call_tool("sandbox_exec", {"name": "s", "argv": ["cat", "f"]}))
            assert d["stdout"] == "x\n"
    run(main())


def test_output_past_a_mebibyte_is_cut_with_a_note_not_killed() -> None:
    """Before: the command was killed (overflow). Now the answer shows the first MiB,
    says so, and the command ran to its end."""
    async def main() -> None:
        async with Client(stdio_params(*CI)) as c:
            script = "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo finished >&2"
            r = await c.call_tool("run_command", {"command": script})
            d = doc(r)
            assert not r.is_error
            assert (d["outcome"], d["exit_code"]) == ("exit", 0)
            assert d["stderr"] == "finished\n"  # it ran to its end
            assert len(d["stdout"]) == 1 << 20 and d["stdout_truncated"] is True
            assert any("stdout cut to its first 1048576 bytes" in n for n in d["notes"])
    run(main())


def test_wrong_types_are_corral_errors_and_a_missing_file_is_not_found() -> None:
    async def main() -> None:
        async with Client(stdio_params(*CI)) as c:
            r = await c.call_tool("run_command", {"argv": ["true"], "timeout_ms": "soon"})
            assert r.is_error
            e = doc(r)["error"]
            assert (e["code"], e["field"], e["reason"]) == \
                ("config-invalid", "timeout_ms", "must be an integer")
            assert "pydantic" not in r.content[0].text.lower()
            r = await c.call_tool("run_command", {"argv": "ls"})
            assert doc(r)["error"]["field"] == "argv"
            r = await c.call_tool("sandbox_read_file", {"name": 3, "path": "x"})
            assert doc(r)["error"] == {**doc(r)["error"], "code": "config-invalid",
                                       "field": "name"}
            await c.call_tool("sandbox_create", {"name": "s"})
            r = await c.call_tool("sandbox_read_file", {"name": "s", "path": "nope.txt"})
            assert r.is_error
            e = doc(r)["error"]
            assert (e["code"], e["what"]) == ("not-found", "file")
            # context-isolated shares the host's network: any other policy is refused
            r = await c.call_tool("sandbox_create", {"name": "m", "network": {"kind": "none"}})
            assert r.is_error and doc(r)["error"]["code"] == "level-not-supported"
            assert doc(r)["error"]["field"] == "network"
    run(main())


def test_a_background_process_is_started_and_polled() -> None:
    async def main() -> None:
        async with Client(stdio_params(*CI)) as c:
            await c.call_tool("sandbox_create", {"name": "s"})
            started = doc(await c.call_tool("process_start", {
                "name": "s", "command": "echo first; sleep 0.5; echo second; exit 4"}))
            pid = started["process"]
            seen = ""
            result = None
            for _ in range(50):
                d = doc(await c.call_tool("process_poll", {"name": "s", "process": pid,
                                                           "wait_ms": 1000}))
                seen += d["stdout"]
                if not d["running"]:
                    result = d["result"]
                    break
            assert seen == "first\nsecond\n"
            assert result is not None and (result["outcome"], result["exit_code"]) == \
                ("exit", 4)
            # one that runs on, killed
            pid = doc(await c.call_tool("process_start", {"name": "s",
                                                          "argv": ["sleep", "60"]}))["process"]
            d = doc(await c.call_tool("process_poll", {"name": "s", "process": pid}))
            assert d["running"] is True
            d = doc(await c.call_tool("process_kill", {"name": "s", "process": pid}))
            assert d["running"] is False and d["result"]["exit_code"] is not None
            r = await c.call_tool("process_poll", {"name": "s", "process": "p-nope"})
            assert r.is_error and doc(r)["error"]["field"] == "process"
    run(main())


@STRICT
def test_a_name_at_strict_is_found_on_the_sandbox_path() -> None:
    """At strict a name resolves on the sandbox's PATH (the host's /usr), not to a shim
    the sandbox cannot see (a pyenv ``python3`` under ~ gave exit 127)."""
    async def main() -> None:
        async with Client(stdio_params()) as c:
            d = doc(await c.call_tool("run_command", {"argv": ["python3", "-c",
                                                               "print(6 * 7)"]}))
            assert (d["outcome"], d["exit_code"], d["stdout"]) == ("exit", 0, "42\n"), d
            assert d["level"] == "strict"
    run(main())


@STRICT
def test_a_network_policy_within_the_ceiling() -> None:
    """A tool takes a network policy; an entry past the tenant's ceiling (a private
    address the operator did not list) is refused naming it; at context-isolated a
    policy other than unrestricted is refused (never run weaker)."""
    async def main() -> None:
        async with Client(stdio_params()) as c:
            d = doc(await c.call_tool("run_command", {
                "command": "echo $HTTPS_PROXY",
                "network": {"kind": "allowlist", "hosts": ["example.com"]}}))
            assert d["outcome"] == "exit" and d["stdout"].startswith("http://127.0.0.1:")
            d = doc(await c.call_tool("run_command", {"command": "echo ${HTTPS_PROXY:-none}"}))
            assert d["stdout"] == "none\n"  # the default: no network at all
            r = await c.call_tool("run_command", {
                "command": "true", "network": {"kind": "allowlist", "hosts": ["10.1.2.3"]}})
            assert r.is_error and doc(r)["error"]["field"] == "network.hosts[0]"
            made = doc(await c.call_tool("sandbox_create", {
                "name": "n", "network": {"kind": "allowlist", "hosts": ["example.com"]}}))
            assert made["network"] == {"kind": "allowlist", "hosts": ["example.com"]}
    run(main())
