"""The serve app's lifespan end while work is in flight: a streamed run and a started
process's output pumps. When the lifespan has ended, every task the service made has
ended (``Service.tasks`` empty, nothing new pending on the loop) and no process of the
runs is left.

The app is driven in this process over ASGI (no server): lifespan startup, requests,
then the lifespan shutdown while the requests still run, as a server whose grace ran
out would.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from servehelp import ALICE, config_text

from corral.serve import service as service_mod
from corral.serve.app import create_app
from corral.serve.config import config_from_dict
from proctree import cmdline, descendants

Message = MutableMapping[str, Any]


class _Lifespan:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.outbox: asyncio.Queue[Message] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def _send(self, msg: Message) -> None:
        await self.outbox.put(msg)

    async def step(self, kind: str) -> None:
        if self.task is None:
            self.task = asyncio.ensure_future(self.app(
                {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                self.inbox.get, self._send))
        await self.inbox.put({"type": f"lifespan.{kind}"})
        got = await self.outbox.get()
        assert got["type"] == f"lifespan.{kind}.complete", got
        if kind == "shutdown":
            await self.task


class _Request:
    """One request; its answer's messages in ``sent`` (the client never goes away)."""

    def __init__(self, app: Any, method: str, path: str, body: Any) -> None:
        self.sent: asyncio.Queue[Message] = asyncio.Queue()
        data = json.dumps(body).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
                 "root_path": "", "query_string": b"", "client": ("127.0.0.1", 1),
                 "server": ("127.0.0.1", 80),
                 "headers": [(b"host", b"test"), (b"authorization", f"Bearer {ALICE}".encode()),
                             (b"content-type", b"application/json"),
                             (b"content-length", str(len(data)).encode())]}
        self._body = data
        self._gone = asyncio.Event()
        self.task = asyncio.ensure_future(app(scope, self._receive, self.sent.put))

    async def _receive(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def body(self) -> bytes:
        out = b""
        while True:
            msg = await self.sent.get()
            if msg["type"] == "http.response.body":
                out += msg.get("body", b"")
                if not msg.get("more_body"):
                    return out

    async def until(self, marker: bytes) -> bytes:
        """What the stream sent up to the first chunk holding ``marker``."""
        out = b""
        while marker not in out:
            msg = await self.sent.get()
            if msg["type"] == "http.response.start":
                assert msg["status"] == 200, msg
            out += msg.get("body", b"")
        return out

async def _running(command: str, before: set[int]) -> None:
    for _ in range(500):
        if any(cmdline(pid) == command for pid in descendants() - before):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{command!r} never ran")


def test_lifespan_end_leaves_no_task_and_no_process(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setattr(service_mod, "_UNWIND_S", 0.2)  # the in-flight work never ends
    doc = tomllib.loads(config_text({"context-isolated": "subproc"}))
    app = create_app(config_from_dict(doc))
    service = app.state.service
    procs_before = descendants()

    async def main() -> tuple[set[asyncio.Task[Any]], int, bytes, int]:
        before = asyncio.all_tasks()
        life = _Lifespan(app)
        await life.step("startup")
        # a streamed run, in flight (it sleeps far past the test; at this level its
        # output comes when it ends, so it is seen running as a process)
        run = _Request(app, "POST", "/v1/runs", {
            "level": "context-isolated", "stream": True, "cmd": "exec sleep 300"})
        await _running("sleep 300", procs_before)
        # a live sandbox with a started process: its output pumps run
        made = _Request(app, "POST", "/v1/sandboxes",
                        {"spec": {"level": "context-isolated",
                                  "network": {"kind": "unrestricted"}}})
        sid = json.loads(await made.body())["id"]
        proc = _Request(app, "POST", f"/v1/sandboxes/{sid}/processes",
                        {"cmd": "echo proc-started; exec sleep 300"})
        pid_doc = json.loads(await proc.body())
        assert "id" in pid_doc, pid_doc
        in_flight = len(getattr(service, "tasks", ()))  # the expiry loop, the run's work
        await life.step("shutdown")  # while the run still streams
        tail = await asyncio.wait_for(run.until(b"\n"), 10)  # the stream's last line
        await asyncio.wait_for(run.task, 10)
        left = {t for t in asyncio.all_tasks() - before if not t.done()}
        return left, in_flight, tail, len(getattr(service, "tasks", ()))

    left, in_flight, tail, owned_after = asyncio.run(main())
    assert left == set()
    assert in_flight >= 2
    assert owned_after == 0
    assert b"unavailable" in tail  # the server stopped before the run ended
    # the runner's spawn helper is one per process (it ends when this process does)
    left_procs = {pid: cmd for pid in descendants() - procs_before
                  if "_serve_spawns" not in (cmd := cmdline(pid))}
    assert left_procs == {}  # the sleeps are gone
