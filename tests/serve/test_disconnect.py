"""A client that goes away cancels its run at once and frees its slot: seed 02's warning
(a disconnected client must not hold a worker slot, or the pool deadlocks under load).

Tenant bob has ``max_runs = 1``: while his one run is in flight a second is refused
(422); once his client drops the connection, the run's command is killed and the slot
is free again within 100 ms, and the next run is accepted."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from servehelp import BOB, Server, metric, wait_metric

from corral.core.spec import NetworkPolicy, SandboxSpec
from corral.providers.remote import RemoteProvider

PY = sys.executable
SPEC = {"level": "context-isolated", "network": {"kind": "unrestricted"}}
_SLEEPER = ("import os, time\n"
            "open('pid', 'w').write(str(os.getpid()))\n"
            "time.sleep(30)\n")


@pytest.fixture
def bob(server: Server) -> Iterator[tuple[httpx.Client, str]]:
    with server.client(BOB) as c:
        sid = c.post("/v1/sandboxes", json={"spec": SPEC}).json()["id"]
        yield c, sid
        c.delete(f"/v1/sandboxes/{sid}")


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # gone (ESRCH: between open and read)
        return True


def _raw_request(server: Server, path: str, body: dict[str, object]) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {BOB}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                 .encode() + data)
    return sock


def _started_pid(c: httpx.Client, sid: str) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        r = c.get(f"/v1/sandboxes/{sid}/files", params={"path": "pid"})
        if r.status_code == 200 and r.content:
            return int(r.content)
        time.sleep(0.02)
    raise AssertionError("the run never started")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "ndjson"])
def test_disconnect_cancels_within_100ms_and_frees_the_slot(
        server: Server, bob: tuple[httpx.Client, str], stream: bool) -> None:
    c, sid = bob
    before = metric(server, "corral_cancelled_total") or 0.0
    sock = _raw_request(server, f"/v1/sandboxes/{sid}/exec",
                        {"argv": [PY, "-c", _SLEEPER], "stream": stream})
    try:
        pid = _started_pid(c, sid)
        wait_metric(server, 'corral_runs_in_flight{tenant="bob"}', 1)
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"argv": ["/bin/true"]})
        assert r.status_code == 422 and r.json()["error"]["cap"] == "runs"
    finally:
        sock.close()
    t0 = time.monotonic()
    while not _dead(pid) and time.monotonic() - t0 < 5:
        time.sleep(0.001)
    killed = time.monotonic() - t0
    assert _dead(pid), "the run's command outlived its client"
    wait_metric(server, 'corral_runs_in_flight{tenant="bob"}', 0, seconds=5)
    freed = time.monotonic() - t0  # an upper bound: it includes one /metrics request
    assert killed < 0.1, f"the command was killed {killed * 1000:.0f} ms after the disconnect"
    assert freed < 0.1, f"the slot was freed {freed * 1000:.0f} ms after the disconnect"
    r = c.post(f"/v1/sandboxes/{sid}/exec", json={"argv": ["/bin/true"]})
    assert r.status_code == 200, r.text  # the slot is reused
    assert (metric(server, "corral_cancelled_total") or 0) > before


def test_disconnect_of_a_one_shot_run_destroys_its_sandbox(server: Server,
                                                            bob: tuple[httpx.Client, str]
                                                            ) -> None:
    marker = f"corral-disconnect-{os.getpid()}-{time.monotonic_ns()}"
    sock = _raw_request(server, "/v1/runs", {
        "argv": [PY, "-c", "import time; time.sleep(30)", marker],
        "level": "context-isolated", "stream": True})
    try:
        wait_metric(server, 'corral_runs_in_flight{tenant="bob"}', 1)
    finally:
        sock.close()
    wait_metric(server, 'corral_runs_in_flight{tenant="bob"}', 0, seconds=5)
    wait_metric(server, 'corral_memory_reserved_mb{tenant="bob"}', 256, seconds=5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _with_marker(marker):
        time.sleep(0.01)
    assert not _with_marker(marker)


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


def test_remote_task_cancel_cancels_on_the_server(server: Server) -> None:
    """Cancelling the task awaiting a remote exec aborts its request: the server kills
    the command and frees the slot."""
    p = RemoteProvider(server.url, BOB)

    async def go() -> None:
        sb = await p.create(SandboxSpec(level="context-isolated",
                                        network=NetworkPolicy.unrestricted()))
        try:
            task = asyncio.ensure_future(sb.exec([PY, "-c", _SLEEPER]))
            while not await _has_pid(sb):
                await asyncio.sleep(0.02)
            pid = int(await sb.read_file("pid"))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            t0 = time.monotonic()
            while not _dead(pid) and time.monotonic() - t0 < 5:
                await asyncio.sleep(0.005)
            assert _dead(pid)
            r = await sb.exec(["/bin/echo", "again"])  # the one run slot is free again
            assert r.stdout == b"again\n"
        finally:
            await sb.destroy()
            await p.aclose()

    asyncio.run(go())


async def _has_pid(sb: object) -> bool:
    try:
        return bool(await sb.read_file("pid"))  # type: ignore[attr-defined]
    except FileNotFoundError:
        return False


def test_disconnect_cancels_a_snippet_and_frees_its_pool_permit(server: Server,
                                                                bob: tuple[httpx.Client, str]
                                                                ) -> None:
    c, _sid = bob
    assert c.post("/v1/snippets", json={"source": "1"}).status_code == 200  # pool warm
    sock = _raw_request(server, "/v1/snippets", {"source": "while True:\n    pass",
                                                 "timeout_ms": 10000})
    try:
        wait_metric(server, 'corral_snippet_pool{state="running"}', 1)
    finally:
        sock.close()
    t0 = time.monotonic()
    wait_metric(server, 'corral_snippet_pool{state="running"}', 0, seconds=5)
    freed = time.monotonic() - t0
    assert metric(server, 'corral_runs_in_flight{tenant="bob"}') == 0
    assert freed < 0.1, f"the pool's permit was freed {freed * 1000:.0f} ms after"
    assert (metric(server, 'corral_snippet_pool{state="cancelled"}') or 0) >= 1
    r = c.post("/v1/snippets", json={"source": "2 + 2"})
    assert r.status_code == 200 and r.json()["result"] == "4"
