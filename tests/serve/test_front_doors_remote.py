"""The front doors, unchanged, against the remote provider: they only know the contract,
so ``run_snippet``, ``invoke`` and ``run_strict`` work against a remote host."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from servehelp import ALICE, Server, config_text, running

import corral
from corral.core.spec import NetworkPolicy, SandboxSpec
from corral.providers.remote import RemoteProvider
from strict_tier import host_can_sandbox, needs_strict


def test_run_snippet_through_the_remote_provider(server: Server) -> None:
    async def go() -> None:
        async with corral.provider("remote", url=server.url, token=ALICE) as p:
            t = await corral.run_snippet("import math\nprint('hi')\nmath.factorial(5)",
                                         provider=p)
            assert t.ok and t.result == "120" and t.level == corral.Level.CONTEXT_ISOLATED
            assert [x.text for x in t.logs] == ["hi"]
            t = await corral.run_snippet("import os", provider=p)
            assert t.rejected
            t = await corral.run_snippet("while True:\n    pass", provider=p, timeout_ms=300)
            assert t.timed_out
    asyncio.run(go())


def test_invoke_through_the_remote_provider(server: Server) -> None:
    assert server.image_root is not None
    tmp_path = server.image_root / "front-door"
    tmp_path.mkdir()
    (tmp_path / "h.py").write_text("def handler(payload, ctx):\n"
                                   "    return {'hello': payload, 'tenant': ctx.tenant_id}\n")
    spec = SandboxSpec(level="context-isolated", network=NetworkPolicy.unrestricted(),
                       mode="json-stdio", image=str(tmp_path), tenant_id="t1")
    ref = corral.HandlerRef(artifact_id="a", version="1", module_path="h.py")

    async def go() -> None:
        async with corral.provider("remote", url=server.url, token=ALICE) as p:
            out = await corral.invoke(p, spec, ref, "world")
            assert isinstance(out, corral.HandlerOutput)
            assert out.value == {"hello": "world", "tenant": "t1"}
    asyncio.run(go())


@pytest.mark.slow
@pytest.mark.linux
@needs_strict(host_can_sandbox())
def test_run_strict_through_the_remote_provider(tmp_path: Path) -> None:
    with running(tmp_path, config_text({"strict": "linux"})) as server:
        async def go() -> None:
            async with RemoteProvider(server.url, ALICE) as p:
                r = await corral.run_strict_async(
                    sys.executable, ["-c", "import os; print(os.getuid())"], provider=p,
                    limits=corral.SandboxLimits(mem_mb=128), timeout_ms=20_000)
                assert r.ok, r
                r = await corral.run_strict_async(
                    sys.executable, ["-c", "import time; time.sleep(10)"], provider=p,
                    timeout_ms=300)
                assert r.outcome == corral.Outcome.TIMEOUT
                t = await corral.run_snippet("sum(range(10))", provider=p)
                assert t.result == "45" and t.level == corral.Level.STRICT
        asyncio.run(go())



def test_remote_provider_from_sync_code(server: Server) -> None:
    """The sync twins run on the process-wide loop; the provider opens its connections
    there and is closed there (corral.core.sync)."""
    from corral.core.sync import close_sync
    p = RemoteProvider(server.url, ALICE)
    try:
        t = corral.run_snippet_sync("1 + 1", provider=p)
        assert t.result == "2"
    finally:
        close_sync(p)
