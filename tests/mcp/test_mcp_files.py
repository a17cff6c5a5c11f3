"""The file operations of a named sandbox through ``corral mcp`` (issue 27 item 4), driven
by the MCP SDK's own client over stdio (which checks every answer against the tool's
``outputSchema``): list ``depth`` levels deep and cut at ``max_entries`` with
``truncated``, info, exists, make a directory, remove; a missing file ``not-found``, what
the file system refuses ``conflict`` with its errno name, a path outside /work
``config-invalid``, a wrong-typed argument in corral's error shape. Once at
context-isolated (fast, every host) and once at strict (the sandbox's own /work)."""

from __future__ import annotations

import asyncio
from typing import Any

from mcp import Client
from mcp_support import STRICT, doc, stdio_params

FILE_TOOLS = ("sandbox_list_files", "sandbox_file_info", "sandbox_file_exists",
              "sandbox_make_dir", "sandbox_remove")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


async def _walk_through(c: Any) -> None:
    tools = {t.name: t for t in (await c.list_tools()).tools}
    for name in FILE_TOOLS:
        assert tools[name].output_schema is not None, name
        assert "\n    " not in (tools[name].description or "")
    assert tools["sandbox_remove"].annotations.destructive_hint is True
    assert tools["sandbox_list_files"].annotations.read_only_hint is True
    assert not (await c.call_tool("sandbox_create", {"name": "s"})).is_error
    for path in ("t/a/b/c.txt", "t/top.txt"):
        r = await c.call_tool("sandbox_write_file", {"name": "s", "path": path,
                                                     "content": "hello"})
        assert not r.is_error, r

    async def call(tool: str, **args: Any) -> dict[str, Any]:
        if "path" in args:  # under t/ (at strict on a host whose own paths are under
            args["path"] = "t/" + args["path"]  # /work, /work holds their mount points)
        return doc(await c.call_tool(tool, {"name": "s", **args}))

    got = await call("sandbox_list_files", path="")
    assert [e["name"] for e in got["entries"]] == ["a", "top.txt"]
    assert got["truncated"] is False and got["entries"][0]["type"] == "dir"
    got = await call("sandbox_list_files", path="", depth=3)
    assert [e["name"] for e in got["entries"]] == ["a", "b", "c.txt", "top.txt"]
    assert got["entries"][2]["path"].endswith("/a/b/c.txt")
    got = await call("sandbox_list_files", path="", depth=3, max_entries=2)
    assert got["truncated"] is True and len(got["entries"]) == 2

    info = (await call("sandbox_file_info", path="a/b/c.txt"))["info"]
    assert (info["type"], info["size"], info["name"]) == ("file", 5, "c.txt")
    assert (await call("sandbox_file_exists", path="a/b"))["exists"] is True
    assert (await call("sandbox_file_exists", path="nope"))["exists"] is False
    assert (await call("sandbox_make_dir", path="m/n"))["created"] is True
    assert (await call("sandbox_make_dir", path="m/n"))["created"] is False
    assert (await call("sandbox_file_info", path="m/n"))["info"]["type"] == "dir"

    r = await c.call_tool("sandbox_remove", {"name": "s", "path": "t/a"})
    assert r.is_error
    e = doc(r)["error"]
    assert (e["code"], e["what"], e["errno"], e["path"]) == ("conflict", "file",
                                                              "ENOTEMPTY", "t/a")
    assert (await call("sandbox_remove", path="a", recursive=True))["removed"] is True
    assert (await call("sandbox_file_exists", path="a"))["exists"] is False

    for tool in ("sandbox_file_info", "sandbox_list_files", "sandbox_remove"):
        r = await c.call_tool(tool, {"name": "s", "path": "missing"})
        assert r.is_error, tool
        assert (doc(r)["error"]["code"], doc(r)["error"]["what"]) == ("not-found", "file")
    r = await c.call_tool("sandbox_list_files", {"name": "s", "path": "t/top.txt"})
    assert r.is_error and doc(r)["error"]["errno"] == "ENOTDIR"
    for tool in FILE_TOOLS:
        r = await c.call_tool(tool, {"name": "s", "path": "../../etc"})
        assert r.is_error and doc(r)["error"]["code"] == "config-invalid", tool
    r = await c.call_tool("sandbox_list_files", {"name": "s", "depth": "deep"})
    assert r.is_error
    assert (doc(r)["error"]["code"], doc(r)["error"]["field"]) == ("config-invalid", "depth")
    r = await c.call_tool("sandbox_file_info", {"name": "nobody", "path": "x"})
    assert r.is_error and doc(r)["error"]["code"] == "config-invalid"


def test_file_tools_context_isolated() -> None:
    async def main() -> None:
        async with Client(stdio_params("--level", "context-isolated")) as c:
            await _walk_through(c)
    run(main())


@STRICT
def test_file_tools_strict() -> None:
    async def main() -> None:
        async with Client(stdio_params()) as c:
            await _walk_through(c)
    run(main())

