"""The strict Linux provider: namespaces, seccomp, cgroups and rlimits, no extra binaries.

``LinuxProvider`` (registry name ``linux``) gives level ``strict``. One
subpackage per side: ``host`` (the provider, its sandboxes, the channel to each
agent, cgroups), ``init`` (the processes that build and serve a sandbox: fork
server, pid 1, agent), ``policy`` (the pure plan and seccomp filter); raw
syscalls only in ``_sys_unsafe``. The host side is imported lazily, so the
fork server (which imports this package) does not load asyncio.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing (the CLI's one-shot path)

__all__ = ["PROVIDER_CLASS", "Bind", "LinuxProvider", "LinuxSandbox"]

if TYPE_CHECKING:
    from typing import Any

    from corral.providers.linux.host.provider import LinuxProvider
    from corral.providers.linux.host.sandbox import LinuxSandbox
    from corral.providers.linux.policy.plan import Bind

    PROVIDER_CLASS = LinuxProvider


def __getattr__(name: str) -> Any:
    if name in ("LinuxProvider", "PROVIDER_CLASS"):
        from corral.providers.linux.host.provider import LinuxProvider
        return LinuxProvider
    if name == "Bind":
        from corral.providers.linux.policy.plan import Bind
        return Bind
    if name == "LinuxSandbox":
        from corral.providers.linux.host.sandbox import LinuxSandbox
        return LinuxSandbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
