"""The named-sandbox registry behind ``corral mcp`` (no MCP needed): names, caps per
session and in all, the idle reaper, a session's end and the server's stop, each ending
in the contract's ``destroy``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.core.errors import ConfigInvalidError, LevelNotSupportedError
from corral.core.spec import SandboxSpec
from corral.mcp.config import McpConfig, level_at_least
from corral.mcp.registry import SandboxRegistry, Scope
from corral.testing import FakeProvider


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(**kw: Any) -> tuple[SandboxRegistry, FakeProvider, Clock]:
    clock = Clock()
    args: dict[str, Any] = {"idle_timeout_s": 10.0, "max_per_scope": 2, "max_total": 3}
    args.update(kw)
    return SandboxRegistry(clock=clock, **args), FakeProvider(), clock


def alive(p: FakeProvider) -> int:
    return sum(1 for sb in p.sandboxes if not sb.destroyed)


def test_names_are_per_scope_and_checked() -> None:
    async def main() -> None:
        reg, p, _ = make()
        await reg.create(Scope("t", "s1"), "a", SandboxSpec(), p.create)
        await reg.create(Scope("t", "s2"), "a", SandboxSpec(), p.create)
        assert reg.names(Scope("t", "s1")) == ["a"] and reg.names(Scope("t", "s2")) == ["a"]
        with pytest.raises(ConfigInvalidError, match="already exists") as e:
            await reg.create(Scope("t", "s1"), "a", SandboxSpec(), p.create)
        assert e.value.field == "name"
        for bad in ("", "../x", "a b", "-x", "x" * 65, 3):
            with pytest.raises(ConfigInvalidError):
                await reg.create(Scope("t", "s1"), bad, SandboxSpec(), p.create)  # type: ignore[arg-type]
        with pytest.raises(ConfigInvalidError, match="no sandbox named 'a'"):
            async with reg.use(Scope("t", "s3"), "a"):
                pass
        assert alive(p) == 2
        await reg.aclose()
        assert alive(p) == 0 and reg.count() == 0
    asyncio.run(main())


def test_caps_per_scope_and_in_all_refuse_before_anything_is_made() -> None:
    async def main() -> None:
        reg, p, _ = make()
        await reg.create(Scope("t", "s1"), "a", SandboxSpec(), p.create)
        await reg.create(Scope("t", "s1"), "b", SandboxSpec(), p.create)
        with pytest.raises(ConfigInvalidError, match="this session has 2") as e:
            await reg.create(Scope("t", "s1"), "c", SandboxSpec(), p.create)
        assert e.value.field == "max_sandboxes"
        await reg.create(Scope("t", "s2"), "a", SandboxSpec(), p.create)
        with pytest.raises(ConfigInvalidError, match="the server has 3"):
            await reg.create(Scope("t", "s3"), "a", SandboxSpec(), p.create)
        assert len(p.sandboxes) == 3
        s1 = Scope("t", "s1")
        assert await reg.destroy(s1, "a") and not await reg.destroy(s1, "a")
        await reg.create(Scope("t", "s3"), "a", SandboxSpec(), p.create)
        await reg.aclose()
    asyncio.run(main())


def test_a_refused_create_registers_nothing() -> None:
    async def main() -> None:
        reg, _, _ = make()
        p = FakeProvider(levels=("none",))
        with pytest.raises(LevelNotSupportedError):
            await reg.create(Scope("t", "s"), "a", SandboxSpec(), p.create)
        assert reg.count() == 0 and reg.names(Scope("t", "s")) == []
    asyncio.run(main())


def test_the_reaper_ends_idle_sandboxes_but_not_busy_ones() -> None:
    async def main() -> None:
        reg, p, clock = make()
        await reg.create(Scope("t", "s"), "idle", SandboxSpec(), p.create)
        await reg.create(Scope("t", "s"), "busy", SandboxSpec(), p.create)
        clock.now = 5.0
        async with reg.use(Scope("t", "s"), "busy"):
            clock.now = 30.0
            assert await reg.reap() == 1  # busy is in a call: kept
            assert reg.names(Scope("t", "s")) == ["busy"]
        assert await reg.reap() == 0  # its idle clock restarted when the call ended
        clock.now = 40.0
        assert await reg.reap() == 1
        assert alive(p) == 0
        assert [why for *_, why in reg.ended] == ["idle timeout", "idle timeout"]
    asyncio.run(main())


def test_the_reaper_runs_on_its_own() -> None:
    async def main() -> None:
        reg = SandboxRegistry(idle_timeout_s=0.2, max_per_scope=2, max_total=2)
        p = FakeProvider()
        reg.start()
        await reg.create(Scope("t", "s"), "a", SandboxSpec(), p.create)
        for _ in range(100):
            if not reg.count():
                break
            await asyncio.sleep(0.05)
        assert reg.count() == 0 and alive(p) == 0
        await reg.aclose()
    asyncio.run(main())


def test_a_session_end_destroys_only_its_sandboxes() -> None:
    async def main() -> None:
        reg, p, _ = make(max_per_scope=3, max_total=6)
        for scope in (Scope("t", "s1"), Scope("t", "s2")):
            for name in ("a", "b"):
                await reg.create(scope, name, SandboxSpec(), p.create)
        assert await reg.end_scope(Scope("t", "s1")) == 2
        assert reg.names(Scope("t", "s1")) == [] and reg.names(Scope("t", "s2")) == ["a", "b"]
        assert alive(p) == 2
        await reg.aclose()
        assert alive(p) == 0
        with pytest.raises(ConfigInvalidError, match="shutting down"):
            await reg.create(Scope("t", "s2"), "c", SandboxSpec(), p.create)
    asyncio.run(main())


def test_levels_never_go_below_the_servers() -> None:
    from corral.core.spec import Level
    assert level_at_least(None, Level.STRICT) is Level.STRICT
    assert level_at_least("strict", Level.CONTEXT_ISOLATED) is Level.STRICT
    with pytest.raises(ConfigInvalidError, match="weaker"):
        level_at_least("context-isolated", Level.STRICT)
    with pytest.raises(ConfigInvalidError, match="unknown level"):
        level_at_least("paranoid", Level.STRICT)
    with pytest.raises(ConfigInvalidError):
        McpConfig(level=Level.NONE)
    with pytest.raises(ConfigInvalidError):
        McpConfig(idle_timeout_s=0)
    with pytest.raises(ConfigInvalidError):
        McpConfig(max_sandboxes=0)


def test_importing_corral_mcp_does_not_import_the_sdk() -> None:
    import subprocess
    import sys
    code = ("import sys, corral.mcp, corral.mcp.registry, corral.mcp.config, corral.cli; "
            "corral.cli._parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('mcp', 'starlette', 'uvicorn', 'pydantic')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_without_the_sdk_corral_mcp_names_the_extra() -> None:
    import subprocess
    import sys
    code = ("import sys; sys.modules['mcp'] = None  # as if not installed\n"
            "from corral.cli import main; sys.exit(main(['mcp']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 64, out.stderr
    assert "config-invalid" in out.stderr and "pip install corral[mcp]" in out.stderr


def test_playground_links_carry_the_source_in_the_fragment() -> None:
    import base64

    from corral.mcp.server import MAX_LINK_CHARS, playground_link
    page = "http://127.0.0.1:8580/playground/"
    source = "print('héllo ✓')\nx = 1 + 1  # ünïcode, + and /?&\n"
    link = playground_link(page, source)
    assert link is not None and link.startswith(page + "#source=")
    encoded = link.split("#source=", 1)[1]
    assert "=" not in encoded and "+" not in encoded and "/" not in encoded
    padded = encoded + "=" * (-len(encoded) % 4)
    assert base64.urlsafe_b64decode(padded).decode() == source
    assert playground_link(None, source) is None and playground_link(page, None) is None
    assert playground_link(page, "x" * MAX_LINK_CHARS) is None
    for bad in ("ftp://x/", "http://x/#frag", "playground"):
        with pytest.raises(ConfigInvalidError):
            McpConfig(playground_url=bad)


def test_aclose_waits_for_a_destroy_whose_caller_was_cancelled() -> None:
    """A destroy is shielded from its caller's cancellation; the registry owns it: its
    aclose waits for it (and ends the reaper), so no task of it is left pending."""
    async def main() -> tuple[set[asyncio.Task[Any]], bool]:
        before = asyncio.all_tasks()
        reg, p, _ = make()
        reg.start()  # the idle reaper runs
        entry = await reg.create(Scope("t", "s"), "a", SandboxSpec(), p.create)
        release = asyncio.Event()
        real = entry.sandbox.destroy

        async def slow_destroy() -> None:
            await release.wait()
            await real()

        entry.sandbox.destroy = slow_destroy  # type: ignore[method-assign]
        caller = asyncio.ensure_future(reg.destroy(Scope("t", "s"), "a"))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        closing = asyncio.ensure_future(reg.aclose())
        await asyncio.sleep(0.01)
        assert not closing.done()  # it waits for the destroy under way
        release.set()
        await closing
        left = {t for t in asyncio.all_tasks() - before if not t.done()}
        return left, alive(p) == 0
    left, none_alive = asyncio.run(main())
    assert left == set()
    assert none_alive
