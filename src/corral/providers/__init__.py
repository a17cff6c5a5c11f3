"""The provider registry: short name -> module, imported lazily.

Each module named here exposes ``PROVIDER_CLASS`` (a :class:`~corral.core.contract.SandboxProvider`
subclass) and is imported only when that provider is asked for, so heavy or
platform-specific code costs nothing until used.
"""

from __future__ import annotations

import importlib
from typing import Any

from corral.core.contract import SandboxProvider
from corral.core.errors import ConfigInvalidError, LevelNotSupportedError
from corral.core.spec import Level

__all__ = ["DEFAULT_FOR_LEVEL", "PROVIDERS", "get_provider_class", "provider", "provider_names"]

#: provider name -> module path (relative to this package)
PROVIDERS: dict[str, str] = {
    "inprocess": ".inprocess",
    "linux": ".linux",
    "subproc": ".subproc",
}


#: the provider :func:`provider` picks for a level when no name is given
DEFAULT_FOR_LEVEL: dict[Level, str] = {
    Level.STRICT: "linux",
    Level.CONTEXT_ISOLATED: "subproc",
    Level.NONE: "inprocess",
}


def provider(name: str | None = None, *, level: Level | str | None = None) -> SandboxProvider:
    """A provider with its default options: by registry ``name``, or the one that gives
    ``level`` (default: ``strict``, the linux provider).

    With both, the named provider must give ``level`` on this host. Providers are
    async context managers (``async with corral.provider() as p:``; leaving it calls
    ``aclose``). For options, construct the provider's class yourself (for example
    ``corral.providers.linux.LinuxProvider(ro_binds=...)``).

    Raises:
        ConfigInvalidError: an unknown name or level.
        LevelNotSupportedError: the provider cannot give ``level`` on this host.
    """
    want: Level | None = None
    if level is not None:
        try:
            want = Level(level)
        except ValueError:
            known = ", ".join(lv.value for lv in Level)
            raise ConfigInvalidError("level", f"unknown level {level!r} (known: {known})"
                                     ) from None
    if name is None:
        name = DEFAULT_FOR_LEVEL[want or Level.STRICT]
    made: SandboxProvider = get_provider_class(name)()
    if want is not None and want not in made.levels:
        raise LevelNotSupportedError(
            want.value, tuple(sorted(lv.value for lv in made.levels)),
            f"provider {name!r} cannot give level {want.value!r} on this host")
    return made


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
