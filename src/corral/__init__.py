"""corral: run code nobody trusts behind a real boundary, with hard limits and typed results."""

from __future__ import annotations

from ._cancel import (
    CancelToken as CancelToken,
)
from .errors import (
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
from .provider import (
    Sandbox as Sandbox,
    SandboxProvider as SandboxProvider,
)
from .spec import (
    ExecOpts as ExecOpts,
    ExecResult as ExecResult,
    HandlerRef as HandlerRef,
    InvocationMode as InvocationMode,
    Level as Level,
    NetworkPolicy as NetworkPolicy,
    ProcessOpts as ProcessOpts,
    SandboxLimits as SandboxLimits,
    SandboxSpec as SandboxSpec,
)

__version__ = "0.1.0"

__all__ = [
    "CancelToken",
    "ConfigInvalidError",
    "CorralError",
    "CreateCancelledError",
    "ErrorCode",
    "ExecOpts",
    "ExecResult",
    "HandlerRef",
    "InvalidSnapshotHandleError",
    "InvocationMode",
    "Level",
    "LevelNotSupportedError",
    "LimitsExceededError",
    "NetworkPolicy",
    "OrphanedError",
    "PauseNotSupportedError",
    "ProcessOpts",
    "ProviderError",
    "RestoreNotSupportedError",
    "Sandbox",
    "SandboxCancelledError",
    "SandboxLimits",
    "SandboxProvider",
    "SandboxSpec",
    "SandboxTimeoutError",
    "SnapshotNotSupportedError",
    "UnhandledWorkerError",
]
