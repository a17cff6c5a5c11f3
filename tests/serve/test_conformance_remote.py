"""The conformance kit against the remote provider, talking to a real ``corral serve``
started by the test: every check, at context-isolated (subproc on the server) and, where
the strict provider runs, at strict (linux on the server, with its snapshot, restore,
pause and streaming-exec relayed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from servehelp import ALICE, Server, config_text, running

import corral
from corral.core.spec import NetworkPolicy
from corral.providers.remote import RemoteProvider
from corral.testing import KitOptions, check_provider
from strict_tier import host_can_sandbox, needs_strict


def _no_sandboxes_left(server: Server) -> KitOptions:
    async def leak_check() -> None:
        with server.client() as c:
            left = c.get("/v1/sandboxes").json()["sandboxes"]
        assert not left, f"sandboxes left on the server: {[s['id'] for s in left]}"
    return KitOptions(network=NetworkPolicy.unrestricted(), leak_check=leak_check)


def test_remote_conformance_context_isolated(server: Server) -> None:
    """corral.provider("remote", url=, token=) passes every check."""
    p = corral.provider("remote", url=server.url, token=ALICE)
    assert p.name == "remote" and p.levels == {corral.Level.CONTEXT_ISOLATED}

    async def go() -> None:
        try:
            await check_provider(p, _no_sandboxes_left(server))
        finally:
            await p.aclose()

    asyncio.run(go())


@pytest.mark.slow
@pytest.mark.linux
@needs_strict(host_can_sandbox())
def test_remote_conformance_strict(tmp_path: Path) -> None:
    cfg = config_text({"strict": "linux", "context-isolated": "subproc"})
    with running(tmp_path, cfg) as server:
        p = RemoteProvider(server.url, ALICE, level="strict")
        assert {"snapshot", "restore", "streaming-exec"} <= p.capabilities

        async def leak_check() -> None:
            with server.client() as c:
                assert c.get("/v1/sandboxes").json()["sandboxes"] == []

        async def go() -> None:
            try:
                await check_provider(p, KitOptions(
                    supports_limits={"mem_mb", "cpu_ms", "disk_mb", "max_processes"},
                    leak_check=leak_check))
            finally:
                await p.aclose()

        asyncio.run(go())
