"""Python snippets: the pure validator and the traceback sanitizer.

Names load lazily on first use so that importing this package (for example from a
worker process) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sanitize import sanitize_stack as sanitize_stack
    from .validate import (
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
    "Violation",
    "ViolationCode",
    "sanitize_stack",
    "validate_files",
    "validate_source",
]

_HOMES = {name: "validate" for name in __all__}
_HOMES["sanitize_stack"] = "sanitize"


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
