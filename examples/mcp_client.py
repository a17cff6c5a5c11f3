"""An MCP client (the official SDK's) that starts ``corral mcp`` over stdio, as an AI
client does, and calls its tools (the README's first screen runs this). Needs the
``mcp`` extra (scripts/main.sh installs it)."""

import asyncio
import json
import sys

from mcp import Client, StdioServerParameters


async def main() -> None:
    server = StdioServerParameters(command=sys.executable, args=["-m", "corral", "mcp"])
    async with Client(server) as c:
        tools = (await c.list_tools()).tools
        print(len(tools), "tools:", ", ".join(sorted(t.name for t in tools)))

        async def call(tool: str, **args: object) -> dict:
            r = await c.call_tool(tool, args)
            doc = json.loads(r.content[0].text)
            if r.is_error:
                raise SystemExit(f"{tool}: {doc['error']}")
            return doc

        r = await call("run_in_sandbox", source="import math\nmath.factorial(5)")
        print("run_in_sandbox:", r["result"], "at", r["level"])
        r = await call("run_command", command="echo hello from $(uname -s)")
        print("run_command:", r["outcome"], r["stdout"].strip())
        await call("sandbox_create", name="box")
        await call("sandbox_write_file", name="box", path="notes/a.txt", content="hi\n")
        r = await call("sandbox_list_files", name="box", path="notes")
        print("sandbox_list_files:", [e["name"] for e in r["entries"]])
        await call("sandbox_destroy", name="box")


asyncio.run(main())
