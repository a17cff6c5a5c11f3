"""Python snippets: the pure validator (``validator``), the host side (``host``: the pool,
``run_snippet``, the transcript, the stack sanitizer) and the in-sandbox side (``sandbox``:
the worker).

Names load lazily on first use so that importing this package (for example from a
worker process) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.snippets.host.pool import (
        PoolStatistics as PoolStatistics,
        SnippetPool as SnippetPool,
    )
    from corral.snippets.host.runner import (
        run_snippet as run_snippet,
        run_snippet_sync as run_snippet_sync,
        set_max_concurrent_workers as set_max_concurrent_workers,
        shutdown_snippet_pool as shutdown_snippet_pool,
        snippet_pool_statistics as snippet_pool_statistics,
    )
    from corral.snippets.host.sanitize import sanitize_stack as sanitize_stack
    from corral.snippets.host.transcript import (
        LogLine as LogLine,
        SnippetError as SnippetError,
        Transcript as Transcript,
    )
    from corral.snippets.validator import (
        DEFAULT_ALLOWED_IMPORTS as DEFAULT_ALLOWED_IMPORTS,
        DEFAULT_MAX_SOURCE_BYTES as DEFAULT_MAX_SOURCE_BYTES,
        FORBIDDEN_ATTRIBUTES as FORBIDDEN_ATTRIBUTES,
        FORBIDDEN_NAMES as FORBIDDEN_NAMES,
        Violation as Violation,
        ViolationCode as ViolationCode,
        validate_files as validate_files,
        validate_source as validate_source,
    )

__all__ = [
    "DEFAULT_ALLOWED_IMPORTS",
    "DEFAULT_MAX_SOURCE_BYTES",
    "FORBIDDEN_ATTRIBUTES",
    "FORBIDDEN_NAMES",
    "LogLine",
    "PoolStatistics",
    "SnippetError",
    "SnippetPool",
    "Transcript",
    "Violation",
    "ViolationCode",
    "run_snippet",
    "run_snippet_sync",
    "sanitize_stack",
    "set_max_concurrent_workers",
    "shutdown_snippet_pool",
    "snippet_pool_statistics",
    "validate_files",
    "validate_source",
]

_HOMES = {name: "validator" for name in __all__}
_HOMES["sanitize_stack"] = "host.sanitize"
_HOMES.update(dict.fromkeys(("PoolStatistics", "SnippetPool"), "host.pool"))
_HOMES.update(dict.fromkeys(("LogLine", "SnippetError", "Transcript"), "host.transcript"))
_HOMES.update(dict.fromkeys(("run_snippet", "run_snippet_sync", "set_max_concurrent_workers",
                             "shutdown_snippet_pool", "snippet_pool_statistics"), "host.runner"))


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
