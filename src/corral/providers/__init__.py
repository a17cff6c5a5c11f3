"""The provider registry: short name -> module, imported lazily.

Each module named here exposes ``PROVIDER_CLASS`` (a :class:`~corral.core.contract.SandboxProvider`
subclass) and is imported only when that provider is asked for, so heavy or
platform-specific code costs nothing until used. Importing this package runs no
other module (``DEFAULT_FOR_LEVEL`` is made on first use), so the CLI's one-shot
path (``corral.providers.linux.oneshot``) loads only what it uses.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing
if TYPE_CHECKING:
    from typing import Any

    from corral.core.contract import SandboxProvider
    from corral.core.spec import Level

    #: the provider :func:`provider` picks for a level when no name is given
    DEFAULT_FOR_LEVEL: dict[Level, str]

__all__ = ["DEFAULT_FOR_LEVEL", "PROVIDERS", "get_provider_class", "provider", "provider_names"]

#: provider name -> module path (relative to this package)
PROVIDERS: dict[str, str] = {
    "inprocess": ".inprocess",
    "linux": ".linux",
    "oci": ".oci",  # container sandboxes on crun / runsc (docs/providers/oci.md)
    "ray": ".ray",  # the optional extra corral[ray]: Ray is imported when one is made
    "remote": ".remote",
    "subproc": ".subproc",
}


def _default_for_level() -> dict[Level, str]:
    from corral.core.spec import Level
    return {Level.STRICT: "linux", Level.CONTEXT_ISOLATED: "subproc", Level.NONE: "inprocess"}


def __getattr__(name: str) -> Any:
    if name == "DEFAULT_FOR_LEVEL":  # the provider provider() picks for a level
        return globals().setdefault(name, _default_for_level())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def provider(name: str | None = None, *, level: Level | str | None = None,
             **options: Any) -> SandboxProvider:
    """A provider with its default options: by registry ``name``, or the one that gives
    ``level`` (default: ``strict``, the linux provider). ``options`` go to the provider's
    class (``corral.provider("remote", url=..., token=...)``).

    With both, the named provider must give ``level`` on this host. Providers are
    async context managers (``async with corral.provider() as p:``; leaving it calls
    ``aclose``). For options, construct the provider's class yourself (for example
    ``corral.providers.linux.LinuxProvider(ro_binds=...)``). The remote provider takes
    ``level`` as its own: it offers only that level of the server's, with that level's
    capabilities. ``limits_by="auto"`` (the
    linux provider) takes the strongest way this user has to enforce memory, process
    and CPU limits: ``"cgroup"`` (for the whole sandbox) where its cgroups give memory
    and pids, else ``"rlimit"`` (per process), as ``corral doctor`` reports it.

    Raises:
        ConfigInvalidError: an unknown name or level.
        LevelNotSupportedError: the provider cannot give ``level`` on this host.
    """
    from corral.core.errors import ConfigInvalidError, LevelNotSupportedError
    from corral.core.spec import Level
    want: Level | None = None
    if level is not None:
        try:
            want = Level(level)
        except ValueError:
            known = ", ".join(lv.value for lv in Level)
            raise ConfigInvalidError("level", f"unknown level {level!r} (known: {known})"
                                     ) from None
    if name is None:
        defaults: dict[Level, str] = __getattr__("DEFAULT_FOR_LEVEL")  # made once
        name = defaults[want or Level.STRICT]
    if options.get("limits_by") == "auto":
        # linux: the strongest this user has, cgroup limits where its cgroups give them,
        # else rlimits per process (what corral python, run_snippet and doctor say);
        # another provider holds limits its own one way: "auto" is that way
        options = {k: v for k, v in options.items() if k != "limits_by"}
        if name == "linux":
            from corral.providers.linux.host.hostinfo import strongest_limits_by
            options["limits_by"] = strongest_limits_by()
    if name == "remote" and want is not None:
        # the remote provider narrows itself to one level of the server's (its levels
        # and that level's full capabilities: docs/service.md)
        options = {**options, "level": want}
    made: SandboxProvider = get_provider_class(name)(**options)
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
    from importlib import import_module

    from corral.core.errors import ConfigInvalidError
    try:
        module = PROVIDERS[name]
    except KeyError:
        known = ", ".join(provider_names())
        raise ConfigInvalidError(
            "provider", f"unknown provider {name!r} (known: {known})") from None
    return import_module(module, __name__).PROVIDER_CLASS
