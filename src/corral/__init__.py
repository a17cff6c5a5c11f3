"""corral: run code nobody trusts behind a real boundary, with hard limits and typed results.

The public face, pinned by ``tests/test_public_api.py``: the value types
(:mod:`corral.core.spec`), the closed error set (:mod:`corral.core.errors`), the
provider contract (:mod:`corral.core.contract`), the cancel token, a way to get
a provider (:func:`provider`), and the front doors: ``run_bounded``,
``run_strict``, ``run_snippet``, ``invoke``. Everything else lives in its own
module (the wire codec in :mod:`corral.wire.protocol`, the snippet pool's knobs
in :mod:`corral.snippets`, the handler side in :mod:`corral.handler`). From sync code,
:mod:`corral.sandbox` gives a ``Sandbox`` in E2B's shape (``Sandbox.create()``,
``sb.commands.run("ls | wc -l")``) over the same contract.

Every name loads on first use (PEP 562 ``__getattr__``): importing corral runs
no other module, so the sandbox's fork server and the CLI's one-shot path
(``corral.providers.linux.oneshot``) load only what they use.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing
if TYPE_CHECKING:
    from typing import Any

    from corral.core.cancel import CancelToken
    from corral.core.contract import (
        ProcessHandle,
        ProcessStdin,
        Sandbox,
        SandboxProvider,
        pause,
        restore,
        resume,
        snapshot,
    )
    from corral.core.errors import (
        ConfigInvalidError,
        CorralError,
        CreateCancelledError,
        ErrorCode,
        InvalidSnapshotHandleError,
        LevelNotSupportedError,
        LimitsExceededError,
        OrphanedError,
        PauseNotSupportedError,
        ProviderError,
        RestoreNotSupportedError,
        SandboxCancelledError,
        SandboxTimeoutError,
        SnapshotNotSupportedError,
        UnhandledWorkerError,
    )
    from corral.core.files import FileInfo
    from corral.core.result import ExecResult, ExitStatus, Outcome, RunResult
    from corral.core.spec import (
        Capability,
        ExecOpts,
        HandlerRef,
        InvocationMode,
        Level,
        NetworkPolicy,
        ProcessOpts,
        ResourceUsage,
        ResumeInfo,
        SandboxInvocationContext,
        SandboxLimits,
        SandboxSpec,
        SnapshotHandle,
    )
    from corral.dispatch import (
        HandlerOutput,
        HandlerSuspended,
        invoke,
        invoke_in,
        invoke_sync,
    )
    from corral.providers import provider
    from corral.run.bounded import run_bounded, run_bounded_async
    from corral.run.strict import run_strict, run_strict_async
    from corral.snippets import Transcript, run_snippet, run_snippet_sync, validate_source

__version__ = "0.1.0"

#: every public name, loaded on first use: module -> the names it gives
_LAZY_MODULES: dict[str, tuple[str, ...]] = {
    "corral.core.cancel": ("CancelToken",),
    "corral.core.contract": ("ProcessHandle", "ProcessStdin", "Sandbox", "SandboxProvider",
                             "pause", "restore", "resume", "snapshot"),
    "corral.core.errors": ("ConfigInvalidError", "CorralError", "CreateCancelledError",
                           "ErrorCode", "InvalidSnapshotHandleError", "LevelNotSupportedError",
                           "LimitsExceededError", "OrphanedError", "PauseNotSupportedError",
                           "ProviderError", "RestoreNotSupportedError", "SandboxCancelledError",
                           "SandboxTimeoutError", "SessionEndedError",
                           "SnapshotNotSupportedError", "UnhandledWorkerError"),
    "corral.core.files": ("FileInfo",),
    "corral.core.result": ("ExecResult", "ExitStatus", "Outcome", "RunResult"),
    "corral.core.spec": ("Capability", "ExecOpts", "HandlerRef", "InvocationMode", "Level",
                         "NetworkPolicy", "ProcessOpts", "ResourceUsage", "ResumeInfo",
                         "SandboxInvocationContext", "SandboxLimits", "SandboxSpec",
                         "SnapshotHandle"),
    "corral.dispatch": ("HandlerOutput", "HandlerSuspended", "invoke", "invoke_in",
                        "invoke_sync"),
    "corral.envs": ("Environment", "environment"),
    "corral.providers": ("provider",),
    "corral.run.bounded": ("run_bounded", "run_bounded_async"),
    "corral.run.strict": ("run_strict", "run_strict_async"),
    "corral.sessions": ("AsyncSession", "CellResult", "Session"),
    "corral.snippets": ("Transcript", "run_snippet", "run_snippet_sync", "validate_source"),
}
_LAZY: dict[str, str] = {n: m for m, names in _LAZY_MODULES.items() for n in names}

__all__ = [
    "AsyncSession",
    "CancelToken",
    "Capability",
    "CellResult",
    "ConfigInvalidError",
    "CorralError",
    "CreateCancelledError",
    "Environment",
    "ErrorCode",
    "ExecOpts",
    "ExecResult",
    "ExitStatus",
    "FileInfo",
    "HandlerOutput",
    "HandlerRef",
    "HandlerSuspended",
    "InvalidSnapshotHandleError",
    "InvocationMode",
    "Level",
    "LevelNotSupportedError",
    "LimitsExceededError",
    "NetworkPolicy",
    "OrphanedError",
    "Outcome",
    "PauseNotSupportedError",
    "ProcessHandle",
    "ProcessOpts",
    "ProcessStdin",
    "ProviderError",
    "ResourceUsage",
    "RestoreNotSupportedError",
    "ResumeInfo",
    "RunResult",
    "Sandbox",
    "SandboxCancelledError",
    "SandboxInvocationContext",
    "SandboxLimits",
    "SandboxProvider",
    "SandboxSpec",
    "SandboxTimeoutError",
    "Session",
    "SessionEndedError",
    "SnapshotHandle",
    "SnapshotNotSupportedError",
    "Transcript",
    "UnhandledWorkerError",
    "environment",
    "invoke",
    "invoke_in",
    "invoke_sync",
    "pause",
    "provider",
    "restore",
    "resume",
    "run_bounded",
    "run_bounded_async",
    "run_snippet",
    "run_snippet_sync",
    "run_strict",
    "run_strict_async",
    "snapshot",
    "validate_source",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
