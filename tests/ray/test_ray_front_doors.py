"""Every front door runs on the Ray provider through the contract alone: run_snippet
(provider=...), a SnippetPool over it, run_strict (streamed output) and invoke."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from typing import Any

from raysupport import no_leaks, provider

import corral
from corral.core.spec import HandlerRef, InvocationMode, SandboxSpec
from corral.dispatch import HandlerOutput
from corral.snippets.host.pool import SnippetPool


def test_run_snippet_and_pool(ray_cluster: Any) -> None:
    async def go() -> None:
        p = provider()
        try:
            t = await corral.run_snippet(source="import math\nx = math.sqrt(16)\nx * 2",
                                         provider=p)
            assert t.result == "8.0" and not t.errors, t
            pool = SnippetPool(providers={"strict": p}, max_workers=2, spares=0)
            try:
                outs = await asyncio.gather(*(corral.run_snippet(source=f"{i} * 3", pool=pool)
                                             for i in range(6)))
            finally:
                await pool.aclose()
            assert [o.result for o in outs] == [str(i * 3) for i in range(6)], outs
            await no_leaks(p)
        finally:
            await p.aclose()
    asyncio.run(go())


def test_run_strict_streams(ray_cluster: Any) -> None:
    async def go() -> None:
        p = provider()
        seen: list[bytes] = []
        try:
            r = await corral.run_strict_async(
                sys.executable, ["-c", "import sys; print('a', flush=True); "
                                 "sys.stderr.write('b'); sys.exit(3)"],
                timeout_ms=20_000, provider=p, on_stdout=seen.append,
                limits=corral.SandboxLimits(mem_mb=128))
            assert (r.exit_code, r.stdout, r.stderr) == (3, b"a\n", b"b"), r
            assert b"".join(seen) == b"a\n"
            await no_leaks(p)
        finally:
            await p.aclose()
    asyncio.run(go())


def test_invoke(ray_cluster: Any) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dispatch"))
    from imagebuild import Member, oci_layout

    from corral.handler import entrypoint_script
    shared = tempfile.mkdtemp(prefix="corral-ray-invoke-")
    os.chmod(shared, 0o755)
    image = os.path.join(shared, "image")
    from pathlib import Path
    oci_layout(image, [[Member("corral/", "dir"), Member("corral/handler-base/", "dir"),
                        Member("corral/handler-base/entrypoint.py",
                               data=Path(entrypoint_script()).read_bytes(), mode=0o755)]])

    async def go() -> None:
        p = provider()
        try:
            spec = SandboxSpec(tenant_id="acme", mode=InvocationMode.JSON_STDIO, image=image)
            ref = HandlerRef(artifact_id="a", version="1", module_path="h.py")
            out = await corral.invoke(
                p, spec, ref, {"n": 20},
                files={"h.py": "def handler(input, ctx):\n    return input['n'] + 22\n"})
            assert isinstance(out, HandlerOutput) and out.value == 42, out
            await no_leaks(p)
        finally:
            await p.aclose()
    try:
        asyncio.run(go())
    finally:
        import shutil
        shutil.rmtree(shared, ignore_errors=True)


def test_process_count_sees_a_detached_leftover(ray_cluster: Any) -> None:
    """``process-count`` through the Ray provider: a process's end brings the count; a
    detached child left behind shows (the snippet pool retires such a slot)."""
    from corral.core.contract import SupportsProcessCount
    from corral.core.spec import ProcessOpts

    async def go() -> None:
        p = provider()
        try:
            assert "process-count" in p.capabilities
            sb = await p.create(SandboxSpec(tenant_id="pc"))
            assert isinstance(sb, SupportsProcessCount) and sb.alive
            h = await sb.start_process([sys.executable, "-c", "pass"], ProcessOpts(stdin=False))
            await h.wait()
            assert sb.process_count() == 0
            code = ("import os, time\n"
                    "if os.fork() == 0:\n"
                    "    os.setsid(); time.sleep(60)\n")
            h = await sb.start_process([sys.executable, "-c", code], ProcessOpts(stdin=False))
            await h.wait()
            for _ in range(50):
                if sb.process_count() >= 1:
                    break
                await asyncio.sleep(0.05)
            assert sb.process_count() >= 1
            await sb.destroy()
            assert not sb.alive and sb.process_count() == 0
            await no_leaks(p)
        finally:
            await p.aclose()
    asyncio.run(go())
