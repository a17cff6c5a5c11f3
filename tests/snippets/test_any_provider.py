"""run_snippet on any provider that offers what it needs (issue 11, property 1).

``run_snippet(..., provider=p)`` runs through a short-lived pool on ``p`` (the same pool
code for every provider: no provider class is named), at the strongest snippet level
``p`` offers unless the caller asks for another; the transcript says which level it ran
at; ``p`` stays open (the caller owns it); a provider offering neither ``strict`` nor
``context-isolated`` is refused before anything runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from snippet_levels import STRICT_SKIP

import corral
from corral import CancelToken
from corral.core.contract import SandboxProvider
from corral.core.errors import ConfigInvalidError, LevelNotSupportedError, SandboxCancelledError
from corral.core.spec import Level
from corral.core.sync import close_sync
from corral.snippets.host import runner
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet, run_snippet_sync, shutdown_snippet_pool
from corral.snippets.host.transcript import Transcript
from strict_tier import needs_strict

SOURCE = "import math\nr = 2\nprint('area')\nround(math.pi * r ** 2, 3)"
PROVIDERS = [pytest.param("linux", "strict", marks=needs_strict(STRICT_SKIP), id="linux"),
             pytest.param("subproc", "context-isolated", id="subproc")]


@pytest.fixture(scope="module", autouse=True)
def _pool() -> Iterator[None]:
    yield
    shutdown_snippet_pool()


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of every SnippetPool run_snippet makes (the real pool)."""
    made: list[dict[str, Any]] = []

    def recording(**kw: Any) -> SnippetPool:
        made.append(kw)
        return SnippetPool(**kw)

    monkeypatch.setattr(runner, "SnippetPool", recording)
    return made


def _close_after_sync_runs(provider: SandboxProvider) -> None:
    """Close a provider the sync twin used: on the loop the twin runs on (the process-wide
    pool's), where the provider's background work lives."""
    close_sync(provider)


def _same_run(t: Transcript) -> tuple[Any, ...]:
    return ([(x.stream, x.text) for x in t.logs], dict(t.facts), t.result, t.errors,
            t.timed_out)


@pytest.mark.parametrize(("name", "level"), PROVIDERS)
def test_runs_at_the_providers_level_through_one_pool_path(
        name: str, level: str, pools: list[dict[str, Any]]) -> None:
    async def main() -> None:
        provider = corral.provider(name)
        try:
            t = await run_snippet(SOURCE, provider=provider, tenant_id="any")
            assert t.ok, t.errors
            assert t.level == Level(level) and t.to_dict()["level"] == level
            assert (t.result, [x.text for x in t.logs], dict(t.facts)) == ("12.566", ["area"],
                                                                           {"r": 2})
            # the same code path for every provider: one short-lived pool on the provider
            assert pools == [{"providers": {Level(level): provider}, "max_workers": 1,
                              "spares": 0}]
            # the provider is not closed: a second run on it works
            again = await run_snippet("6 * 7", provider=provider, tenant_id="any")
            assert again.ok and again.result == "42" and again.level == Level(level)
        finally:
            await provider.aclose()

    asyncio.run(main())


@needs_strict(STRICT_SKIP)
def test_linux_and_subproc_give_the_same_transcript_but_the_level() -> None:
    async def one(name: str) -> Transcript:
        async with corral.provider(name) as provider:
            return await run_snippet(SOURCE, provider=provider)

    async def main() -> None:
        strict, isolated = await one("linux"), await one("subproc")
        assert _same_run(strict) == _same_run(isolated)
        assert (strict.level, isolated.level) == (Level.STRICT, Level.CONTEXT_ISOLATED)

    asyncio.run(main())


def test_sync_twin_runs_on_a_provider_twice() -> None:
    provider = corral.provider("subproc")
    t = run_snippet_sync("1 + 1", provider=provider)
    assert (t.result, t.level) == ("2", Level.CONTEXT_ISOLATED)
    assert run_snippet_sync("2 + 2", provider=provider).result == "4"
    _close_after_sync_runs(provider)


@needs_strict(STRICT_SKIP)
def test_sync_twin_runs_on_a_linux_provider_twice() -> None:
    # the twin runs every call on one loop, so a provider's loop-bound state (the fork
    # server's channel) serves the second call too
    provider = corral.provider("linux")
    try:
        assert run_snippet_sync("3 * 3", provider=provider).result == "9"
        t = run_snippet_sync("4 * 4", provider=provider)
        assert (t.result, t.level) == ("16", Level.STRICT)
    finally:
        _close_after_sync_runs(provider)


class _Spy:
    """Records whether a provider's ``create`` was called."""

    def __init__(self, provider: SandboxProvider, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = provider.create

        async def create(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(provider, "create", create)


def test_a_provider_offering_only_none_is_refused_before_anything_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    provider = corral.provider("inprocess")
    assert provider.levels == frozenset({Level.NONE})
    spy = _Spy(provider, monkeypatch)
    with pytest.raises(LevelNotSupportedError) as info:
        run_snippet_sync("1", provider=provider)
    assert info.value.requested == "strict" and info.value.supported == ("none",)
    with pytest.raises(LevelNotSupportedError):
        asyncio.run(run_snippet("1", provider=provider, level="context-isolated"))
    assert spy.calls == 0


def test_a_level_the_provider_does_not_offer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = corral.provider("subproc")
    spy = _Spy(provider, monkeypatch)
    with pytest.raises(LevelNotSupportedError) as info:
        run_snippet_sync("1", provider=provider, level="strict")
    assert info.value.requested == "strict" and info.value.supported == ("context-isolated",)
    with pytest.raises(ConfigInvalidError, match="level"):
        run_snippet_sync("1", provider=provider, level="none")  # never a snippet level
    assert spy.calls == 0


def test_pool_and_provider_exclude_each_other() -> None:
    async def main() -> None:
        async with SnippetPool(spares=0) as pool, corral.provider("subproc") as provider:
            with pytest.raises(ConfigInvalidError, match="provider"):
                await run_snippet("1", pool=pool, provider=provider)

    asyncio.run(main())


@pytest.mark.parametrize(("name", "level"), PROVIDERS)
def test_cancel_token_stops_a_run_on_a_provider(name: str, level: str) -> None:
    async def main() -> None:
        async with corral.provider(name) as provider:
            token = CancelToken()
            timer = threading.Timer(0.5, token.cancel)  # from another thread
            timer.start()
            try:
                with pytest.raises(SandboxCancelledError):
                    await run_snippet("while True:\n    pass", provider=provider,
                                      cancel=token, timeout_ms=10_000)
            finally:
                timer.cancel()
            t = await run_snippet("5", provider=provider)  # the provider still serves
            assert (t.result, t.level) == ("5", Level(level))

    asyncio.run(main())


def test_cancel_token_stops_a_sync_run_on_a_provider() -> None:
    provider = corral.provider("subproc")
    try:
        token = CancelToken()
        timer = threading.Timer(0.5, token.cancel)
        timer.start()
        try:
            with pytest.raises(SandboxCancelledError):
                run_snippet_sync("while True:\n    pass", provider=provider, cancel=token,
                                 timeout_ms=10_000)
        finally:
            timer.cancel()
        with pytest.raises(SandboxCancelledError):
            run_snippet_sync("1", provider=provider, cancel=token)  # already cancelled
        assert run_snippet_sync("5", provider=provider).result == "5"
    finally:
        _close_after_sync_runs(provider)


def test_asyncio_cancel_of_a_run_on_a_provider() -> None:
    async def main() -> None:
        async with corral.provider("subproc") as provider:
            task = asyncio.ensure_future(run_snippet("while True:\n    pass", provider=provider,
                                                     timeout_ms=10_000))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await run_snippet("6", provider=provider)).result == "6"

    asyncio.run(main())


def test_transcript_level_without_a_provider_and_when_rejected() -> None:
    t = run_snippet_sync("1", level="context-isolated")
    assert t.level == Level.CONTEXT_ISOLATED and t.to_dict()["level"] == "context-isolated"
    rejected = run_snippet_sync("import os", level="context-isolated")
    assert rejected.rejected and rejected.level is None  # it did not run
    assert rejected.to_dict()["level"] is None
