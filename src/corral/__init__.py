"""corral: run code nobody trusts behind a real boundary, with hard limits and typed results.

The value types, errors and the provider contract load eagerly (they are small and
pure); the front doors (runner, strict runs, dispatch, snippets, protocol) load on
first use, so that importing corral stays cheap, in the sandbox's fork server too.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from corral.core.cancel import CancelToken as CancelToken
from corral.core.contract import (
    ProcessHandle as ProcessHandle,
    ProcessStdin as ProcessStdin,
    Sandbox as Sandbox,
    SandboxProvider as SandboxProvider,
    pause as pause,
    restore as restore,
    resume as resume,
    snapshot as snapshot,
)
from corral.core.errors import (
    ConfigInvalidError as ConfigInvalidError,
    CorralError as CorralError,
    CreateCancelledError as CreateCancelledError,
    ErrorCode as ErrorCode,
    InvalidSnapshotHandleError as InvalidSnapshotHandleError,
    LevelNotSupportedError as LevelNotSupportedError,
    LimitsExceededError as LimitsExceededError,
    OrphanedError as OrphanedError,
    PauseNotSupportedError as PauseNotSupportedError,
    ProviderError as ProviderError,
    RestoreNotSupportedError as RestoreNotSupportedError,
    SandboxCancelledError as SandboxCancelledError,
    SandboxTimeoutError as SandboxTimeoutError,
    SnapshotNotSupportedError as SnapshotNotSupportedError,
    UnhandledWorkerError as UnhandledWorkerError,
)
from corral.core.spec import (
    DEFAULT_ENTRYPOINT_PATH as DEFAULT_ENTRYPOINT_PATH,
    Capability as Capability,
    ExecOpts as ExecOpts,
    ExecResult as ExecResult,
    ExitStatus as ExitStatus,
    HandlerRef as HandlerRef,
    InvocationMode as InvocationMode,
    Level as Level,
    NetworkPolicy as NetworkPolicy,
    ProcessOpts as ProcessOpts,
    ResourceUsage as ResourceUsage,
    ResumeInfo as ResumeInfo,
    SandboxInvocationContext as SandboxInvocationContext,
    SandboxLimits as SandboxLimits,
    SandboxSpec as SandboxSpec,
    SnapshotHandle as SnapshotHandle,
)

if TYPE_CHECKING:
    from corral.dispatch import (
        OutputOutcome as OutputOutcome,
        SuspendedOutcome as SuspendedOutcome,
        invoke as invoke,
        invoke_in as invoke_in,
        invoke_sync as invoke_sync,
    )
    from corral.run.bounded import (
        RunResult as RunResult,
        run_bounded as run_bounded,
        run_bounded_async as run_bounded_async,
    )
    from corral.run.strict import run_strict as run_strict, run_strict_async as run_strict_async
    from corral.snippets import (
        LogLine as LogLine,
        PoolStatistics as PoolStatistics,
        SnippetError as SnippetError,
        SnippetPool as SnippetPool,
        Transcript as Transcript,
        Violation as Violation,
        run_snippet as run_snippet,
        run_snippet_sync as run_snippet_sync,
        sanitize_stack as sanitize_stack,
        set_max_concurrent_workers as set_max_concurrent_workers,
        shutdown_snippet_pool as shutdown_snippet_pool,
        snippet_pool_statistics as snippet_pool_statistics,
        validate_files as validate_files,
        validate_source as validate_source,
    )
    from corral.wire.protocol import (
        PROTOCOL_VERSION as PROTOCOL_VERSION,
        SUSPEND_EXIT_CODE as SUSPEND_EXIT_CODE,
        FrameDecoder as FrameDecoder,
        SandboxSuspensionRequest as SandboxSuspensionRequest,
        encode_frame as encode_frame,
        parse_frame as parse_frame,
        parse_frames as parse_frames,
    )

__version__ = "0.1.0"

#: lazily loaded public name -> its module
_LAZY: dict[str, str] = {
    "snippet_pool_statistics": ".snippets",
    "shutdown_snippet_pool": ".snippets",
    "set_max_concurrent_workers": ".snippets",
    "run_snippet_sync": ".snippets",
    "run_snippet": ".snippets",
    "Transcript": ".snippets",
    "SnippetPool": ".snippets",
    "SnippetError": ".snippets",
    "PoolStatistics": ".snippets",
    "LogLine": ".snippets",
    "OutputOutcome": ".dispatch",
    "SuspendedOutcome": ".dispatch",
    "invoke": ".dispatch",
    "invoke_in": ".dispatch",
    "invoke_sync": ".dispatch",
    "FrameDecoder": ".wire.protocol",
    "PROTOCOL_VERSION": ".wire.protocol",
    "SUSPEND_EXIT_CODE": ".wire.protocol",
    "SandboxSuspensionRequest": ".wire.protocol",
    "encode_frame": ".wire.protocol",
    "parse_frame": ".wire.protocol",
    "parse_frames": ".wire.protocol",
    "RunResult": ".run.bounded",
    "run_bounded": ".run.bounded",
    "run_bounded_async": ".run.bounded",
    "Violation": ".snippets",
    "sanitize_stack": ".snippets",
    "validate_files": ".snippets",
    "validate_source": ".snippets",
    "run_strict": ".run.strict",
    "run_strict_async": ".run.strict",
}

__all__ = [
    "CancelToken",
    "Capability",
    "ConfigInvalidError",
    "CorralError",
    "CreateCancelledError",
    "DEFAULT_ENTRYPOINT_PATH",
    "ErrorCode",
    "ExecOpts",
    "ExecResult",
    "ExitStatus",
    "FrameDecoder",
    "HandlerRef",
    "InvalidSnapshotHandleError",
    "InvocationMode",
    "Level",
    "LevelNotSupportedError",
    "LimitsExceededError",
    "LogLine",
    "NetworkPolicy",
    "OrphanedError",
    "OutputOutcome",
    "PROTOCOL_VERSION",
    "PauseNotSupportedError",
    "PoolStatistics",
    "ProcessHandle",
    "ProcessOpts",
    "ProcessStdin",
    "ProviderError",
    "ResourceUsage",
    "RestoreNotSupportedError",
    "ResumeInfo",
    "RunResult",
    "SUSPEND_EXIT_CODE",
    "Sandbox",
    "SandboxCancelledError",
    "SandboxInvocationContext",
    "SandboxLimits",
    "SandboxProvider",
    "SandboxSpec",
    "SandboxSuspensionRequest",
    "SandboxTimeoutError",
    "SnapshotHandle",
    "SnapshotNotSupportedError",
    "SnippetError",
    "SnippetPool",
    "SuspendedOutcome",
    "Transcript",
    "UnhandledWorkerError",
    "Violation",
    "encode_frame",
    "invoke",
    "invoke_in",
    "invoke_sync",
    "parse_frame",
    "parse_frames",
    "pause",
    "restore",
    "resume",
    "run_bounded",
    "run_bounded_async",
    "run_snippet",
    "run_snippet_sync",
    "run_strict",
    "run_strict_async",
    "sanitize_stack",
    "set_max_concurrent_workers",
    "shutdown_snippet_pool",
    "snapshot",
    "snippet_pool_statistics",
    "validate_files",
    "validate_source",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
