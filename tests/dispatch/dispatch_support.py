"""Dispatch test support (conftest.py re-exports the fixtures): one ``Via`` per
provider x mode that can run handlers.

Every ``Via`` but ``subproc-json-stdio-own`` goes through ``invoke`` (a fresh
sandbox per call, always destroyed); ``-own`` uses ``invoke_in`` in a sandbox
the test made. At the inprocess and subproc levels the handler's files are the
"image" (a directory copied into the work dir); on linux the image is a small
OCI layout carrying the handler-base entrypoint, and the handler's files come
in through ``files=``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral.core.spec import (
    HandlerRef,
    InvocationMode,
    Level,
    NetworkPolicy,
    SandboxInvocationContext,
    SandboxSpec,
)
from corral.dispatch import HandlerReply, invoke, invoke_in
from corral.handler import entrypoint_script
from corral.providers.inprocess import InProcessProvider

sys.path.insert(0, os.path.dirname(__file__))  # for imagebuild

from imagebuild import Member, oci_layout

from cgroup_view import mine
from strict_tier import unavailable


def _shared_dir() -> str:
    """A temp dir the linux sandboxes' user (uid 65534 under root) can search:
    pytest's own tmp dirs are 0700, so images and the cache live here instead."""
    d = tempfile.mkdtemp(prefix="corral-dispatch-test-")
    os.chmod(d, 0o755)
    return d


_SHARED = _shared_dir()


@pytest.fixture(scope="session", autouse=True)
def _remove_shared() -> Iterator[None]:
    yield
    shutil.rmtree(_SHARED, ignore_errors=True)


def entrypoint_member() -> Member:
    return Member("corral/handler-base/entrypoint.py",
                  data=Path(entrypoint_script()).read_bytes(), mode=0o755)


#: where base_image() carries the handler-base entrypoint
IMAGE_ENTRYPOINT = "/corral/handler-base/entrypoint.py"


def base_image() -> str:
    """An OCI layout holding only the handler-base entrypoint (built once)."""
    path = os.path.join(_SHARED, "base-image")
    if not os.path.isdir(path):
        oci_layout(path, [[Member("corral/", "dir"), Member("corral/handler-base/", "dir"),
                           entrypoint_member()]])
    return path


def shared_cache() -> str:
    return os.path.join(_SHARED, "cache")


def shared_tmp(name: str) -> str:
    """A fresh searchable dir for an image of one test."""
    return tempfile.mkdtemp(prefix=name + "-", dir=_SHARED)


@dataclass(frozen=True)
class Via:
    """How a test reaches a handler: provider + mode (``process``: frames over a pipe)."""

    name: str
    process: bool

    def run(self, source: str, payload: Any = None, ctx: SandboxInvocationContext | None = None,
            *, attribute: str = "handler", entry: str | None = None,
            files: Mapping[str, str] | None = None, run_id: str = "run-1",
            **kw: Any) -> HandlerReply:
        ref = HandlerRef(artifact_id="a", version="1", module_path="h.py", attribute=attribute,
                         entrypoint_path=entry)
        all_files = {"h.py": source, **(files or {})}
        return asyncio.run(self._run(ref, payload, ctx, all_files, run_id, kw))

    async def _run(self, ref: HandlerRef, payload: Any, ctx: Any, files: dict[str, str],
                   run_id: str, kw: dict[str, Any]) -> HandlerReply:
        common: dict[str, Any] = {"tenant_id": "acme", "run_id": run_id, "node_id": "n1"}
        if self.name.startswith("linux"):
            return await self._linux(ref, payload, ctx, files, common, kw)
        common["network"] = NetworkPolicy.unrestricted()
        temp = tempfile.mkdtemp(prefix="corral-dispatch-sb-")
        try:
            provider: Any
            if self.name.startswith("subproc"):
                from corral.providers.subproc import SubprocProvider
                provider = SubprocProvider(temp_dir=temp)
                common["level"] = Level.CONTEXT_ISOLATED
            else:
                provider = InProcessProvider(temp_dir=temp)
                common["level"] = Level.NONE
            if self.name == "inprocess-in-context":
                spec = SandboxSpec(mode=InvocationMode.IN_CONTEXT, **common)
                return await invoke(provider, spec, ref, payload, ctx, files=files, **kw)
            if self.name.endswith("-own"):  # invoke_in: a live sandbox the test owns
                sb: Any = await provider.create(SandboxSpec(**common))
                try:
                    return await invoke_in(sb, ref, payload, ctx, mode="json-stdio",
                                           files=files, **kw)
                finally:
                    await sb.destroy()
            image = os.path.join(temp, "image")  # the handler's files are the image
            for name, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(image, name)), exist_ok=True)
                Path(image, name).write_text(text)
            spec = SandboxSpec(mode=InvocationMode.JSON_STDIO, image=image, **common)
            return await invoke(provider, spec, ref, payload, ctx, **kw)
        finally:
            left = [n for n in os.listdir(temp) if n != "image"]
            shutil.rmtree(temp, ignore_errors=True)
            assert left == [], f"the sandbox left its files behind: {left}"

    async def _linux(self, ref: HandlerRef, payload: Any, ctx: Any, files: dict[str, str],
                     common: dict[str, Any], kw: dict[str, Any]) -> HandlerReply:
        from corral.providers.linux import LinuxProvider
        provider = LinuxProvider(image_cache_dir=shared_cache())
        mode = InvocationMode.JSON_STDIO
        if self.name.endswith("image-entry") and ref.entrypoint_path is None:
            # the entrypoint the image carries, run by the host's interpreter (the image
            # is handler files over the host's system dirs; mode handler-image runs an
            # image's own userland: tests/linux/test_handler_image*.py)
            ref = dataclasses.replace(ref, entrypoint_path=IMAGE_ENTRYPOINT)
        try:
            spec = SandboxSpec(mode=mode, image=base_image(), **common)
            return await invoke(provider, spec, ref, payload, ctx, files=files, **kw)
        finally:
            # this process's sandbox cgroups, less the idle spares: the live sandboxes
            spares = await provider.wait_spares()  # also finishes removing destroyed ones
            live = len(mine()) - spares
            await provider.aclose()
            assert live == 0, "invoke left a live sandbox"


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


LINUX_WHY = _linux_why()
_SUBPROC_WHY = "" if _has("corral.providers.subproc") else "the subproc provider has not landed"
VIAS: list[Via | str] = [
    Via("inprocess-in-context", process=False),
    Via("inprocess-json-stdio", process=True),
    _SUBPROC_WHY or Via("subproc-json-stdio", process=True),
    _SUBPROC_WHY or Via("subproc-json-stdio-own", process=True),
    LINUX_WHY or Via("linux-json-stdio", process=True),
    LINUX_WHY or Via("linux-json-stdio-image-entry", process=True),
]
_IDS = ["inprocess-in-context", "inprocess-json-stdio", "subproc-json-stdio",
        "subproc-json-stdio-own", "linux-json-stdio", "linux-json-stdio-image-entry"]


def _pick(param: Via | str) -> Via:
    if isinstance(param, str):
        if param == LINUX_WHY:
            unavailable(param)  # the strict tier: fails under CORRAL_REQUIRE_STRICT=1
        pytest.skip(param)
    return param


@pytest.fixture(params=VIAS, ids=_IDS)
def via(request: pytest.FixtureRequest) -> Via:
    return _pick(request.param)


@pytest.fixture(params=VIAS[1:], ids=_IDS[1:])
def proc_via(request: pytest.FixtureRequest) -> Via:
    """Only the ways that run the handler as a process speaking frames."""
    return _pick(request.param)
