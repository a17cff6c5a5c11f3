"""Pin the public surface: what `corral` exports, and where each name is documented."""

from __future__ import annotations

import importlib

import pytest

import corral

PUBLIC = [
    "CancelToken", "Capability", "ConfigInvalidError", "CorralError", "CreateCancelledError",
    "DEFAULT_ENTRYPOINT_PATH", "ErrorCode", "ExecOpts", "ExecResult", "ExitStatus",
    "FrameDecoder", "HandlerRef", "InvalidSnapshotHandleError", "InvocationMode", "Level",
    "LevelNotSupportedError", "LimitsExceededError", "NetworkPolicy", "OrphanedError",
    "OutputOutcome", "PROTOCOL_VERSION", "PauseNotSupportedError", "ProcessHandle",
    "ProcessOpts", "ProcessStdin", "ProviderError", "ResourceUsage", "RestoreNotSupportedError",
    "ResumeInfo", "RunResult", "SUSPEND_EXIT_CODE", "Sandbox", "SandboxCancelledError",
    "SandboxInvocationContext", "SandboxLimits", "SandboxProvider", "SandboxSpec",
    "SandboxSuspensionRequest", "SandboxTimeoutError", "SnapshotHandle",
    "SnapshotNotSupportedError", "SuspendedOutcome", "UnhandledWorkerError", "Violation",
    "encode_frame", "invoke", "invoke_in", "invoke_sync", "parse_frame", "parse_frames",
    "pause", "restore", "resume", "run_bounded", "run_bounded_async", "run_strict",
    "run_strict_async", "sanitize_stack", "LogLine", "PoolStatistics", "SnippetError",
    "SnippetPool", "Transcript", "run_snippet", "run_snippet_sync", "set_max_concurrent_workers",
    "shutdown_snippet_pool", "snippet_pool_statistics", "snapshot", "validate_files",
    "validate_source",
]

#: public modules; each declares __all__
MODULES = [
    "corral", "corral.core.errors", "corral.core.spec", "corral.wire.protocol",
    "corral.core.contract", "corral.run.bounded", "corral.run.strict", "corral.dispatch",
    "corral.snippets",
    "corral.testing", "corral.providers", "corral.providers.inprocess",
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
