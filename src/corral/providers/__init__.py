"""The provider registry: short name -> module, imported lazily.

Each module named here exposes ``PROVIDER_CLASS`` (a :class:`~corral.core.contract.SandboxProvider`
subclass) and is imported only when that provider is asked for, so heavy or
platform-specific code costs nothing until used.
"""

from __future__ import annotations

import importlib
from typing import Any

from corral.core.errors import ConfigInvalidError

__all__ = ["PROVIDERS", "get_provider_class", "provider_names"]

#: provider name -> module path (relative to this package)
PROVIDERS: dict[str, str] = {
    "inprocess": ".inprocess",
    "linux": ".linux",
    "subproc": ".subproc",
}


def provider_names() -> tuple[str, ...]:
    """The registered provider names, sorted."""
    return tuple(sorted(PROVIDERS))


def get_provider_class(name: str) -> Any:
    """Import the provider module for ``name`` and return its ``PROVIDER_CLASS``.

    Raises ConfigInvalidError("provider", ...) for an unknown name.
    """
    try:
        module = PROVIDERS[name]
    except KeyError:
        known = ", ".join(provider_names())
        raise ConfigInvalidError(
            "provider", f"unknown provider {name!r} (known: {known})") from None
    return importlib.import_module(module, __name__).PROVIDER_CLASS
