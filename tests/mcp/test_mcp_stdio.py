"""``corral mcp`` over stdio, driven by the MCP SDK's own client (``mcp.Client`` starting
``python -m corral mcp`` as a subprocess): every tool, typed errors, named sandboxes
across calls, and their end with the session or after the idle timeout."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mcp import Client
from mcp_support import STRICT, cgroup_gone, cgroup_of, cgroups_of_pid, doc, stdio_params

from corral.mcp.server import playground_link

TOOLS = {"run_in_sandbox", "snippet_rules", "run_command", "sandbox_create", "sandbox_exec",
         "sandbox_write_file", "sandbox_read_file", "sandbox_list", "sandbox_destroy",
         "process_start", "process_poll", "process_kill",
         "session_create", "session_run", "session_close",
         # the file operations (mcp/files.py)
         "sandbox_list_files", "sandbox_file_info", "sandbox_file_exists",
         "sandbox_make_dir", "sandbox_remove"}


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


@STRICT
def test_tools_and_a_snippet_transcript() -> None:
    async def main() -> None:
        page = "http://127.0.0.1:8580/playground/"
        async with Client(stdio_params("--playground-url", page)) as c:
            listed = await c.list_tools()
            assert {t.name for t in listed.tools} == TOOLS
            schema = next(t for t in listed.tools if t.name == "run_in_sandbox").input_schema
            assert {"source", "files", "timeout_ms"} <= set(schema["properties"])

            r = await c.call_tool("run_in_sandbox", {"source": "x = 6 * 7\nprint('hi')\nx"})
            t = doc(r)
            assert not r.is_error
            assert t["result"] == "42" and t["facts"] == {"x": 42} and t["errors"] == []
            assert t["logs"] == [{"stream": "stdout", "text": "hi"}]
            assert t["level"] == "strict" and t["timed_out"] is False
            # seed 02's playgroundUrl: the page with this snippet in its fragment
            assert t["playground_url"] == playground_link(page, "x = 6 * 7\nprint('hi')\nx")

            files = [{"path": "main.py", "source": "import helper\nhelper.twice(21)"},
                     {"path": "helper.py", "source": "def twice(n):\n    return 2 * n\n"}]
            t = doc(await c.call_tool("run_in_sandbox", {"files": files}))
            assert t["result"] == "42", t

            # a hostile snippet is refused by the validator, unrun: its transcript says so
            r = await c.call_tool("run_in_sandbox", {"source": "import os\nos.system('id')"})
            t = doc(r)
            assert not r.is_error and t["level"] is None
            assert (t["errors"][0]["type"], t["errors"][0]["code"]) == \
                ("ValidationError", "forbidden-import")

            # a snippet that raises: the transcript carries the error and the facts so far
            t = doc(await c.call_tool("run_in_sandbox", {"source": "a = 1\n1 / 0"}))
            assert t["facts"] == {"a": 1}
            assert t["errors"][0]["type"] == "ZeroDivisionError"

            # a corral error is a tool error with its code
            r = await c.call_tool("run_in_sandbox", {"source": "1", "files": files})
            assert r.is_error and doc(r)["error"]["code"] == "config-invalid"
    run(main())


@STRICT
def test_run_command_results_and_typed_errors() -> None:
    async def main() -> None:
        async with Client(stdio_params()) as c:
            r = await c.call_tool("run_command", {
                "argv": ["/bin/sh", "-c", "read x; echo got $x; echo oops >&2; exit 3"],
                "stdin": "it\n"})
            d = doc(r)
            assert not r.is_error
            assert (d["outcome"], d["exit_code"], d["stdout"], d["stderr"]) == \
                ("exit", 3, "got it\n", "oops\n")

            # inside the strict boundary: its own pid namespace
            d = doc(await c.call_tool("run_command", {"argv": ["/bin/sh", "-c", "echo $$"]}))
            assert int(d["stdout"]) < 10  # a pid of a fresh pid namespace

            # the one rule (docs/errors.md): a command that ran is its result, a timeout
            # included; not a tool error
            r = await c.call_tool("run_command", {"argv": ["/bin/sleep", "10"],
                                                  "timeout_ms": 300})
            d = doc(r)
            assert not r.is_error and d["outcome"] == "timeout" and d["limit_value"] == 300

            for args, field in (([], "argv"),):
                r = await c.call_tool("run_command", {"argv": args})
                assert r.is_error and doc(r)["error"]["code"] == "config-invalid"
                assert doc(r)["error"]["field"] == field
            r = await c.call_tool("run_command", {"argv": ["/bin/true"], "level": "none"})
            assert r.is_error and doc(r)["error"]["field"] == "level"
            r = await c.call_tool("run_command", {"argv": ["/bin/true"], "timeout_ms": 10**9})
            assert r.is_error and doc(r)["error"]["field"] == "timeout_ms"
    run(main())


@STRICT
def test_named_sandbox_lives_across_calls_and_ends_with_the_session() -> None:
    async def main() -> str:
        async with Client(stdio_params()) as c:
            made = doc(await c.call_tool("sandbox_create", {"name": "work", "mem_mb": 128}))
            assert (made["name"], made["level"], made["provider"]) == ("work", "strict", "linux")
            r = await c.call_tool("sandbox_create", {"name": "work"})
            assert r.is_error and doc(r)["error"]["field"] == "name"
            r = await c.call_tool("sandbox_create", {"name": "../bad"})
            assert r.is_error and doc(r)["error"]["code"] == "config-invalid"

            w = doc(await c.call_tool("sandbox_write_file", {
                "name": "work", "path": "src/job.py",
                "content": "open('out.txt', 'w').write(str(sum(range(10))))\n"}))
            assert w["size"] > 0
            r = await c.call_tool("sandbox_exec", {
                "name": "work", "argv": ["/usr/bin/python3", "src/job.py"]})
            assert not r.is_error and doc(r)["exit_code"] == 0, doc(r)
            got = doc(await c.call_tool("sandbox_read_file", {"name": "work", "path": "out.txt"}))
            assert (got["content"], got["encoding"]) == ("45", "utf-8")

            # bytes round-trip through base64
            await c.call_tool("sandbox_write_file", {"name": "work", "path": "b.bin",
                                                     "content": "AP8=", "encoding": "base64"})
            got = doc(await c.call_tool("sandbox_read_file", {"name": "work", "path": "b.bin"}))
            assert (got["content"], got["encoding"], got["size"]) == ("AP8=", "base64", 2)

            # files stay inside; a missing file and a missing sandbox are typed errors
            for args in ({"name": "work", "path": "../../etc/passwd"},
                         {"name": "ghost", "path": "out.txt"}):
                r = await c.call_tool("sandbox_read_file", args)
                assert r.is_error and doc(r)["error"]["code"] == "config-invalid", args
            r = await c.call_tool("sandbox_read_file", {"name": "work", "path": "nope.txt"})
            assert r.is_error and doc(r)["error"]["code"] == "not-found"  # as over HTTP

            # a command past its timeout in the sandbox: timeout, with its output so far
            r = await c.call_tool("sandbox_exec", {
                "name": "work", "argv": ["/bin/sh", "-c", "echo started; sleep 10"],
                "timeout_ms": 400})
            assert not r.is_error and doc(r)["outcome"] == "timeout"
            assert doc(r)["stdout"] == "started\n"

            gone = doc(await c.call_tool("sandbox_create", {"name": "gone"}))
            assert doc(await c.call_tool("sandbox_list", {}))["sandboxes"] == ["gone", "work"]
            assert cgroup_of(gone["id"]) is not None
            d = doc(await c.call_tool("sandbox_destroy", {"name": "gone"}))
            assert d == {"name": "gone", "destroyed": True}
            assert cgroup_gone(gone["id"])
            r = await c.call_tool("sandbox_destroy", {"name": "gone"})
            assert r.is_error
            assert doc(await c.call_tool("sandbox_list", {}))["sandboxes"] == ["work"]
            return str(made["id"])

    kept = run(main())
    # the client left: the server exited and destroyed what was still alive
    assert cgroup_gone(kept)


@pytest.mark.slow
@STRICT
def test_an_idle_sandbox_is_destroyed_after_the_timeout() -> None:
    async def main() -> None:
        async with Client(stdio_params("--idle-timeout", "600ms")) as c:
            a = doc(await c.call_tool("sandbox_create", {"name": "a"}))
            b = doc(await c.call_tool("sandbox_create", {"name": "b"}))
            # b is used while a idles: only a is reaped
            for _ in range(6):
                await asyncio.sleep(0.25)
                r = await c.call_tool("sandbox_exec", {"name": "b", "argv": ["/bin/true"]})
                assert not r.is_error
            assert doc(await c.call_tool("sandbox_list", {}))["sandboxes"] == ["b"]
            assert cgroup_gone(a["id"]) and cgroup_of(b["id"]) is not None
            r = await c.call_tool("sandbox_exec", {"name": "a", "argv": ["/bin/true"]})
            assert r.is_error and "reaped when idle" in doc(r)["error"]["message"]
    run(main())


def test_context_isolated_server_runs_without_the_strict_provider() -> None:
    """``--level context-isolated``: the subproc provider; per-sandbox limits it cannot
    enforce are refused with level-not-supported, never ignored."""
    async def main() -> None:
        async with Client(stdio_params("--level", "context-isolated")) as c:
            t = doc(await c.call_tool("run_in_sandbox", {"source": "sum(range(5))"}))
            assert (t["result"], t["level"]) == ("10", "context-isolated")
            made = doc(await c.call_tool("sandbox_create", {"name": "s"}))
            assert made["provider"] == "subproc"
            r = await c.call_tool("sandbox_exec", {"name": "s", "argv": ["/bin/echo", "hi"]})
            assert doc(r)["stdout"] == "hi\n"
            r = await c.call_tool("sandbox_create", {"name": "t", "mem_mb": 64})
            assert r.is_error and doc(r)["error"]["code"] == "level-not-supported"
            d = doc(await c.call_tool("run_command", {"argv": ["/bin/echo", "x"]}))
            assert d["stdout"] == "x\n"
    run(main())


@pytest.mark.parametrize("argv", [["--level", "none"], ["--idle-timeout", "soon"]])
def test_bad_options_exit_64(argv: list[str]) -> None:
    from corral.cli import main
    assert main(["mcp", *argv]) == 64


@STRICT
def test_sigterm_to_a_stdio_server_destroys_its_sandboxes_and_exits() -> None:
    """The server is told to stop while its client is still connected: it destroys every
    sandbox first (its pid is in its sandboxes' cgroup names: corral-<pid>-...)."""
    import os
    import signal

    async def main() -> None:
        async with Client(stdio_params()) as c:
            made = doc(await c.call_tool("sandbox_create", {"name": "x"}))
            name = cgroup_of(made["id"])
            assert name is not None
            pid = int(name.split("-")[1])
            os.kill(pid, signal.SIGTERM)  # the server this test's client started
            assert cgroup_gone(made["id"])
            for _ in range(200):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the server did not exit after SIGTERM")
            assert cgroups_of_pid(pid) == []
            from mcp import MCPError
            with pytest.raises(MCPError):  # the server is gone
                await c.call_tool("sandbox_list", {})
    run(main())


@pytest.mark.slow
@STRICT
def test_a_call_the_client_gives_up_on_is_cancelled_in_the_sandbox() -> None:
    """The client's request timeout cancels the call (``notifications/cancelled``): the
    command is killed at once; the named sandbox lives on."""
    from mcp import MCPError

    async def main() -> None:
        async with Client(stdio_params()) as c:
            await c.call_tool("sandbox_create", {"name": "s"})
            with pytest.raises(MCPError, match="timed out"):
                await c.call_tool("sandbox_exec", {
                    "name": "s", "argv": ["/bin/sleep", "30"], "timeout_ms": 30_000},
                    read_timeout_seconds=1)
            listing = ["/bin/sh", "-c", "for p in /proc/[0-9]*; do cat $p/comm; done"]
            for _ in range(50):
                r = await c.call_tool("sandbox_exec", {"name": "s", "argv": listing})
                if "sleep" not in doc(r)["stdout"]:
                    break
                await asyncio.sleep(0.05)
            assert "sleep" not in doc(r)["stdout"], doc(r)["stdout"]
    run(main())


@STRICT
def test_output_arrives_as_progress_while_the_command_runs() -> None:
    """With a progress callback (a progress token), each chunk of output comes as a
    progress notification before the command ends; the result still has all of it."""
    import json
    import time

    async def main() -> None:
        async with Client(stdio_params()) as c:
            script = "echo one; sleep 0.6; echo two >&2; sleep 0.2; echo three"
            for tool, extra in (("run_command", {}), ("sandbox_exec", {"name": "s"})):
                if tool == "sandbox_exec":
                    await c.call_tool("sandbox_create", {"name": "s"})
                seen: list[tuple[float, float, dict[str, str]]] = []

                async def progress(done: float, total: float | None, message: str | None,
                                   seen: list[tuple[float, float, dict[str, str]]] = seen
                                   ) -> None:
                    assert message is not None
                    seen.append((time.monotonic(), done, json.loads(message)))

                r = await c.call_tool(tool, {"argv": ["/bin/sh", "-c", script], **extra},
                                      progress_callback=progress)
                ended = time.monotonic()
                d = doc(r)
                assert (d["stdout"], d["stderr"]) == ("one\nthree\n", "two\n")
                assert [m for _, _, m in seen] == [
                    {"stream": "stdout", "text": "one\n"}, {"stream": "stderr", "text": "two\n"},
                    {"stream": "stdout", "text": "three\n"}], tool
                assert [n for _, n, _ in seen] == [4, 8, 14]
                assert ended - seen[0][0] > 0.5, f"{tool}: the first line came at the end"
    run(main())
