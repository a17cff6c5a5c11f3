"""The MCP server closed while work is in flight: a named sandbox with a background
process (its output reader runs). When the server's lifespan has ended, every task the
backend made has ended (``Backend.tasks`` empty, nothing new pending on the loop) and
no process of it is left. The server runs in this process (the SDK's in-memory
transport), so its tasks are this loop's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import Client
from mcp_support import doc

from corral.core.spec import Level
from corral.mcp.config import McpConfig
from corral.mcp.server import build_server
from proctree import cmdline, descendants


def test_closing_the_server_ends_every_task_and_process() -> None:
    procs_before = descendants()

    async def main() -> tuple[set[asyncio.Task[Any]], int, int, bool]:
        before = asyncio.all_tasks()
        server, backend = build_server(McpConfig(level=Level.CONTEXT_ISOLATED))
        async with Client(server) as c:
            await c.call_tool("sandbox_create", {"name": "s"})
            pid = doc(await c.call_tool("process_start", {
                "name": "s", "command": "echo started; exec sleep 300"}))["process"]
            for _ in range(100):  # its reader has read the first line
                d = doc(await c.call_tool("process_poll", {"name": "s", "process": pid,
                                                           "wait_ms": 0}))
                if d["stdout"]:
                    break
                await asyncio.sleep(0.02)
            assert d["running"] is True and d["stdout"] == "started\n"
            in_flight = len(getattr(backend, "tasks", ()))
        # the client left: the server's run ended, its lifespan closed the backend
        await asyncio.sleep(0)
        left = {t for t in asyncio.all_tasks() - before if not t.done()}
        return left, in_flight, len(getattr(backend, "tasks", ())), backend.closed.is_set()

    left, in_flight, owned_after, closed = asyncio.run(main())
    assert closed
    assert left == set()
    assert (in_flight, owned_after) == (1, 0)
    left_procs = {pid: cmd for pid in descendants() - procs_before
                  if "_serve_spawns" not in (cmd := cmdline(pid))}  # one per process
    assert left_procs == {}
