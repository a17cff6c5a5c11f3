"""What the MCP tests share: starting ``corral mcp`` (stdio through the SDK's own client,
HTTP as a subprocess on loopback stopped by pid), an SDK client with a bearer token, and
finding a sandbox's cgroup."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from strict_tier import host_can_sandbox, needs_strict

__all__ = ["STRICT", "TOKEN", "cgroup_gone", "cgroup_of", "cgroups_of_pid", "client", "doc",
           "http_server", "rss_kib", "stdio_params"]

#: the bearer token of the tenant ``default`` of a server started by :func:`http_server`
#: without ``--config`` (given to it as $CORRAL_MCP_TOKEN)
TOKEN = "mcp-test-" + secrets.token_hex(16)

#: the mark of a test that needs the strict provider (the server's default level)
STRICT = needs_strict(host_can_sandbox())


def stdio_params(*extra: str) -> Any:
    """How the SDK client starts ``python -m corral mcp`` over stdio."""
    from mcp import StdioServerParameters
    return StdioServerParameters(command=sys.executable, args=["-m", "corral", "mcp", *extra],
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})


def doc(result: Any) -> dict[str, Any]:
    """A tool result's document: its structured content, which its text repeats."""
    content = result.structured_content
    assert content is not None, result
    assert json.loads(result.content[0].text) == content
    return dict(content)


def cgroup_of(sandbox_id: str) -> str | None:
    """The name of the cgroup of the linux sandbox ``sandbox_id`` (any owner), or None."""
    from corral.providers.linux.host.cgroups import CgroupManager
    m = CgroupManager()
    if m.support.version == "none":
        return None
    return next((n for n in m.list_cgroups() if n.endswith("-" + sandbox_id)), None)


def cgroup_gone(sandbox_id: str, within_s: float = 10.0) -> bool:
    """Whether the sandbox's cgroup is gone within ``within_s`` (a destroyed linux
    sandbox's empty cgroup is removed by its provider's reaper thread, just after)."""
    deadline = time.monotonic() + within_s
    while cgroup_of(sandbox_id) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def cgroups_of_pid(pid: int) -> list[str]:
    """The sandbox cgroups a corral process ``pid`` owns."""
    from corral.providers.linux.host.cgroups import CgroupManager
    m = CgroupManager()
    if m.support.version == "none":
        return []
    return [n for n in m.list_cgroups() if f"-{pid}-" in n]


@contextlib.asynccontextmanager
async def client(url: str, token: str | None = TOKEN, **kw: Any) -> AsyncIterator[Any]:
    """The SDK's own client of ``url`` (streamable HTTP) sending ``Authorization: Bearer
    token``; ``kw`` go to ``mcp.Client`` (``mode="legacy"`` for the handshake protocol)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)
                                  ) as http, \
            Client(streamable_http_client(url, http_client=http), **kw) as c:
        yield c


def rss_kib(pid: int) -> int:
    """The resident set of process ``pid``, KiB."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


_URL = re.compile(r"serving streamable HTTP at (\S+)")


@contextlib.contextmanager
def http_server(*extra: str, token: str | None = TOKEN
                ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``corral mcp --http --port 0`` on loopback: (its URL, the process), with ``token``
    as $CORRAL_MCP_TOKEN (None: not set). Stopped by SIGTERM to its pid at the end
    (SIGKILL if it does not exit within 20 s)."""
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_MCP_TOKEN"}
    if token is not None:
        env["CORRAL_MCP_TOKEN"] = token
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "mcp", "--http", "--port", "0", *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=env)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        url = None
        seen = b""
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
            m = _URL.search(line.decode())
            if m:
                url = m.group(1)
                break
        assert url is not None, f"the server did not start: {seen.decode(errors='replace')}"
        stderr = proc.stderr
        # keep reading its stderr, so a chatty server never blocks on a full pipe
        threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
