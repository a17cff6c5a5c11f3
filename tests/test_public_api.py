"""Pin the public surface: what `corral` exports, and where each name is documented."""

from __future__ import annotations

import importlib

import pytest

import corral

PUBLIC = [
    # the value types; how a run ended (ExecResult and ExitStatus are RunResult)
    "Capability", "ExecOpts", "ExecResult", "ExitStatus", "FileInfo", "HandlerRef",
    "InvocationMode",
    "Outcome", "RunResult",
    "Level", "NetworkPolicy", "ProcessOpts", "ResourceUsage", "ResumeInfo",
    "SandboxInvocationContext", "SandboxLimits", "SandboxSpec", "SnapshotHandle",
    # the closed error set
    "ConfigInvalidError", "CorralError", "CreateCancelledError", "ErrorCode",
    "InvalidSnapshotHandleError", "LevelNotSupportedError", "LimitsExceededError",
    "OrphanedError", "PauseNotSupportedError", "ProviderError", "RestoreNotSupportedError",
    "SandboxCancelledError", "SandboxTimeoutError", "SnapshotNotSupportedError",
    "UnhandledWorkerError", "SessionEndedError",
    # sessions: a live interpreter whose globals persist between cells (issue 30)
    "AsyncSession", "CellResult", "Session",
    # the contract, the cancel token, a provider by name or level
    "ProcessHandle", "ProcessStdin", "Sandbox", "SandboxProvider", "pause", "restore", "resume",
    "snapshot", "CancelToken", "provider",
    # the front doors
    "run_bounded", "run_bounded_async", "run_strict", "run_strict_async",
    "Transcript", "run_snippet", "run_snippet_sync", "validate_source",
    "HandlerOutput", "HandlerSuspended", "invoke", "invoke_in", "invoke_sync",
    # environments (packages built once, shown read-only to sandboxes)
    "Environment", "environment",
]

#: public modules; each declares __all__
MODULES = [
    "corral", "corral.core.errors", "corral.core.spec", "corral.core.result",
    "corral.core.files",
    "corral.wire.protocol",
    "corral.core.contract", "corral.run.bounded", "corral.run.strict", "corral.dispatch",
    "corral.snippets", "corral.envs",
    "corral.testing", "corral.sessions", "corral.providers", "corral.providers.inprocess",
    "corral.providers.subproc", "corral.providers.linux",
]


def test_all_is_sorted_and_pinned() -> None:
    assert corral.__all__ == sorted(corral.__all__)
    assert sorted(PUBLIC) == corral.__all__


@pytest.mark.parametrize("name", PUBLIC)
def test_every_name_resolves_to_a_public_module(name: str) -> None:
    obj = getattr(corral, name)
    module = getattr(obj, "__module__", None)
    if module is not None and isinstance(obj, type | type(run_fn)):
        assert module.startswith("corral")
        # documented where users import it from: never a private module path
        assert not any(part.startswith("_") for part in module.split(".")), (name, module)


def run_fn() -> None:  # a plain function, for the isinstance check above
    pass


@pytest.mark.parametrize("modname", MODULES)
def test_public_modules_declare_all(modname: str) -> None:
    mod = importlib.import_module(modname)
    assert isinstance(mod.__all__, list | tuple)
    for name in mod.__all__:
        assert hasattr(mod, name), f"{modname}.{name} listed in __all__ but missing"


def test_unknown_attribute_raises() -> None:
    with pytest.raises(AttributeError):
        _ = corral.no_such_name  # type: ignore[attr-defined]


def test_the_codec_and_pool_knobs_stay_in_their_modules() -> None:
    for name in ("FrameDecoder", "encode_frame", "parse_frame", "SnippetPool",
                 "set_max_concurrent_workers", "PROTOCOL_VERSION"):
        assert not hasattr(corral, name), name
    from corral.snippets import SnippetPool, set_max_concurrent_workers
    from corral.wire.protocol import FrameDecoder, encode_frame
    assert SnippetPool and set_max_concurrent_workers and FrameDecoder and encode_frame


def test_a_spec_for_quick_use_needs_no_ids() -> None:
    a, b = corral.SandboxSpec(), corral.SandboxSpec()
    assert a.tenant_id == "default" and a.level is corral.Level.STRICT
    assert a.run_id and a.run_id != b.run_id


def test_provider_by_name_and_by_level() -> None:
    import asyncio

    from corral.providers.inprocess import InProcessProvider
    from corral.providers.subproc import SubprocProvider

    async def main() -> None:
        async with corral.provider("subproc") as p:
            assert isinstance(p, SubprocProvider)
            spec = corral.SandboxSpec(level="context-isolated",
                                      network=corral.NetworkPolicy.unrestricted())
            async with await p.create(spec) as sb:
                r = await sb.exec(["/bin/echo", "hi"])
                assert r.stdout == b"hi\n"
        async with corral.provider(level="none") as p:
            assert isinstance(p, InProcessProvider)
        with pytest.raises(corral.LevelNotSupportedError):
            corral.provider("inprocess", level="strict")
        with pytest.raises(corral.ConfigInvalidError, match="provider"):
            corral.provider("nope")
        with pytest.raises(corral.ConfigInvalidError, match="level"):
            corral.provider(level="stricter")

    asyncio.run(main())
