"""Dispatch test fixtures: one ``Via`` per provider x mode that can run handlers."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from corral.dispatch import Outcome, invoke, invoke_in
from corral.providers.inprocess import InProcessProvider
from corral.spec import (
    HandlerRef,
    InvocationMode,
    Level,
    NetworkPolicy,
    SandboxInvocationContext,
    SandboxSpec,
)

sys.path.insert(0, os.path.dirname(__file__))  # for imagebuild


@dataclass(frozen=True)
class Via:
    """How a test reaches a handler: provider + mode (``process``: frames over a pipe)."""

    name: str
    process: bool

    def run(self, source: str, payload: Any = None, ctx: SandboxInvocationContext | None = None,
            *, attribute: str = "handler", entry: str | None = None,
            files: Mapping[str, str] | None = None, run_id: str = "run-1",
            **kw: Any) -> Outcome:
        ref = HandlerRef(artifact_id="a", version="1", module_path="h.py", attribute=attribute,
                         entrypoint_path=entry)
        all_files = {"h.py": source, **(files or {})}
        return asyncio.run(self._run(ref, payload, ctx, all_files, run_id, kw))

    async def _run(self, ref: HandlerRef, payload: Any, ctx: Any, files: Any, run_id: str,
                   kw: dict[str, Any]) -> Outcome:
        level = Level.CONTEXT_ISOLATED if self.name.startswith("subproc") else Level.NONE
        common = {"tenant_id": "acme", "run_id": run_id, "node_id": "n1",
                  "network": NetworkPolicy.unrestricted(), "level": level}
        provider: Any = InProcessProvider()
        if self.name.startswith("linux"):
            return await self._linux(ref, payload, ctx, files, run_id, kw)
        if self.name.startswith("subproc"):
            from corral.providers.subproc import SubprocProvider
            provider = SubprocProvider()
        if self.name == "inprocess-in-context":
            spec = SandboxSpec(mode=InvocationMode.IN_CONTEXT, **common)
            return await invoke(provider, spec, ref, payload, ctx, files=files, **kw)
        # json-stdio over the provider's processes, in a live sandbox the test owns (these
        # providers refuse spec.mode/spec.image, so invoke() cannot create one for them)
        sb: Any = await provider.create(SandboxSpec(**common))
        try:
            return await invoke_in(sb, ref, payload, ctx, mode="json-stdio", files=files, **kw)
        finally:
            await sb.destroy()
            assert not os.path.exists(sb.base), "the sandbox left its files behind"


    async def _linux(self, ref: HandlerRef, payload: Any, ctx: Any, files: Any, run_id: str,
                     kw: dict[str, Any]) -> Outcome:
        from corral.providers.linux import LinuxProvider
        provider = LinuxProvider()
        try:
            # json-stdio needs spec.image, which the linux provider refuses today; any spec
            # with a mode makes it bind corral's package read-only, so ask for that here
            spec = SandboxSpec(tenant_id="acme", run_id=run_id, node_id="n1",
                               mode=InvocationMode.IN_CONTEXT)
            sb = await provider.create(spec)
            try:
                return await invoke_in(sb, ref, payload, ctx, mode="json-stdio", files=files,
                                       **kw)
            finally:
                await sb.destroy()
        finally:
            await provider.aclose()


def _linux_why() -> str:
    try:
        from corral.providers.linux import LinuxProvider
        LinuxProvider().plan(SandboxSpec(tenant_id="t", run_id="r", mode="in-context"))
    except Exception as e:
        return f"the linux provider cannot run here: {e}"
    return ""


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


_LINUX_WHY = ("the linux provider refuses any spec.image (plan.py: 'no image support'), and "
              "handler-image needs one: see the dispatch report for the wiring")
_LINUX_RUNS = _linux_why()
_SUBPROC_WHY = "" if _has("corral.providers.subproc") else "the subproc provider has not landed"
VIAS: list[Via | str] = [
    Via("inprocess-in-context", process=False),
    Via("inprocess-json-stdio", process=True),
    _SUBPROC_WHY or Via("subproc-json-stdio", process=True),
    _LINUX_RUNS or Via("linux-json-stdio", process=True),
    _LINUX_WHY + " (handler-image)",
]
_IDS = ["inprocess-in-context", "inprocess-json-stdio", "subproc-json-stdio",
        "linux-json-stdio", "linux-handler-image"]


def _pick(param: Via | str) -> Via:
    if isinstance(param, str):
        pytest.skip(param)
    return param


@pytest.fixture(params=VIAS, ids=_IDS)
def via(request: pytest.FixtureRequest) -> Via:
    return _pick(request.param)


@pytest.fixture(params=VIAS[1:], ids=_IDS[1:])
def proc_via(request: pytest.FixtureRequest) -> Via:
    """Only the ways that run the handler as a process speaking frames."""
    return _pick(request.param)
