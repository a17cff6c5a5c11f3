"""The strict Linux provider: namespaces, seccomp, cgroups and rlimits, no extra binaries.

``LinuxProvider`` (registry name ``linux``) gives level ``strict``. The host
side lives in ``host.py``/``sandbox.py`` and is imported lazily, so the fork
server (which imports this package) does not load asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["PROVIDER_CLASS", "LinuxProvider", "LinuxSandbox"]

if TYPE_CHECKING:
    from .host import LinuxProvider
    from .sandbox import LinuxSandbox

    PROVIDER_CLASS = LinuxProvider


def __getattr__(name: str) -> Any:
    if name in ("LinuxProvider", "PROVIDER_CLASS"):
        from .host import LinuxProvider
        return LinuxProvider
    if name == "LinuxSandbox":
        from .sandbox import LinuxSandbox
        return LinuxSandbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
