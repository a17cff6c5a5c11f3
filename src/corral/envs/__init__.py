"""Environments: third-party packages built once in a strict sandbox, cached
read-only on the host, and shown read-only to every sandbox that names them
(``SandboxSpec(environment=...)``). See docs/environments.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.sync import run_sync
from corral.envs.build import BUILD_LIMITS, DEFAULT_INDEX, BuildOptions, build_environment, stats
from corral.envs.store import ENV_MOUNT, Environment, EnvStore, default_root

__all__ = ["BUILD_LIMITS", "DEFAULT_INDEX", "ENV_MOUNT", "BuildOptions", "EnvStore",
           "Environment", "build", "build_environment", "default_root", "environment",
           "stats"]


def environment(name: str, requirements: Sequence[str] | str | None = None, *,
                options: BuildOptions | None = None,
                store: EnvStore | None = None, image: str | None = None,
                image_cache_dir: str | None = None) -> Environment:
    """The environment ``name`` (a name or a digest) from the store; with
    ``requirements``, built first when its inputs are not built yet (in a strict
    sandbox; a cache hit otherwise, with no sandbox and no network); ``image``: built
    on that base image, with its own python3 and pip (:func:`build_environment`).

    Raises ConfigInvalidError (field ``environment``) when there is none."""
    store = store or EnvStore()
    if requirements is None:
        return store.get(name)
    return build(name, requirements, options=options, store=store, image=image,
                 image_cache_dir=image_cache_dir)


def build(name: str, requirements: Sequence[str] | str, *,
          options: BuildOptions | None = None, store: EnvStore | None = None,
          image: str | None = None, image_cache_dir: str | None = None) -> Environment:
    """:func:`build_environment`, from sync code."""
    return run_sync(build_environment(name, requirements, options=options, store=store,
                                      image=image, image_cache_dir=image_cache_dir))
