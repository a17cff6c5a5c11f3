"""``run_in_sandbox`` over stdio with a progress token: each log line of the snippet comes
as a progress notification while it runs, before the transcript (which has them all)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from mcp import Client
from mcp_support import STRICT, doc, stdio_params


@STRICT
def test_snippet_log_lines_arrive_as_progress_while_it_runs() -> None:
    async def main() -> None:
        async with Client(stdio_params()) as c:
            seen: list[tuple[float, float, dict[str, str]]] = []

            async def progress(done: float, total: float | None, message: str | None) -> None:
                assert message is not None
                seen.append((time.monotonic(), done, json.loads(message)))

            source = ("import time, logging\nprint('one')\ntime.sleep(0.6)\n"
                      "logging.warning('two')\nprint('three')\n7")
            r = await c.call_tool("run_in_sandbox", {"source": source},
                                  progress_callback=progress)
            ended = time.monotonic()
            t = doc(r)
            assert not r.is_error and t["result"] == "7"
            lines = [{"stream": "stdout", "text": "one"},
                     {"stream": "log", "text": "WARNING:root:two"},
                     {"stream": "stdout", "text": "three"}]
            assert t["logs"] == lines
            assert [m for _, _, m in seen] == lines
            assert [n for _, n, _ in seen] == [1, 2, 3]
            assert ended - seen[0][0] > 0.4, "the first line came at the end"
            # without a progress token: the transcript alone, as before
            t = doc(await c.call_tool("run_in_sandbox", {"source": "print('x')"}))
            assert t["logs"] == [{"stream": "stdout", "text": "x"}]

    def run(coro: Any) -> Any:
        return asyncio.run(asyncio.wait_for(coro, 120))

    run(main())
