"""The service, given the Ray provider: ``corral serve`` with ``strict = "ray"`` in its
config, driven over HTTP by the remote provider (a snippet, a sandbox's exec and files):
the service and the remote provider know the contract only."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serve"))
pytest.importorskip("httpx")  # the serve extra's client, used by servehelp

from raysupport import no_leaks, provider
from servehelp import ALICE, running

import corral
from corral.core.spec import SandboxSpec


def test_serve_on_ray(ray_cluster: Any, tmp_path: Path) -> None:
    config = f"""
[server]
snippet_workers = 2

[levels]
strict = "ray"

[provider_options.ray]
address = "{ray_cluster.address}"
node_resource = "corral"
lease_s = 10.0

[[tenants]]
name = "alice"
token = "{ALICE}"
"""
    env = {**ray_cluster.env, "PYTHONWARNINGS": "ignore"}
    with running(tmp_path, config, env=env) as server:
        async def go() -> None:
            async with corral.provider("remote", url=server.url, token=ALICE) as p:
                t = await corral.run_snippet("6 * 7", provider=p)
                assert t.ok and t.result == "42" and t.level == corral.Level.STRICT, t
                async with await p.create(SandboxSpec()) as sb:
                    await sb.write_file("in.txt", b"hello")
                    r = await sb.exec(["/bin/cat", "in.txt"])
                    assert (r.exit_code, r.stdout) == (0, b"hello"), r
        asyncio.run(go())
        code = server.stop()
        log = server.log_path.read_text()
        assert code == 0, log[-3000:]
        # the server's own SIGTERM handling ran (a drain), not the handler ray.init
        # installs (SystemExit wherever the main thread was)
        assert '"draining"' in log, log[-3000:]

    async def check() -> None:
        p = provider()
        try:
            await no_leaks(p)
        finally:
            await p.aclose()
    asyncio.run(check())
