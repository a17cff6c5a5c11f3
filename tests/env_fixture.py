"""The environment the ``env_build`` tests share (importable by name: tests/ is on
sys.path): ``sci`` with numpy, pandas and matplotlib, built by corral's own
:func:`corral.envs.build_environment` (in a strict sandbox, from the package index) into
the cached store /var/cache/corral-envs-test (~/.cache/corral-envs-test when not root).
One cold build (about 30 s) serves tests/linux/test_envs_pypi.py, the session tests,
the MCP and serve walks and the playground; every later build is a cache hit (no
sandbox, no network), also on CI's second run."""

from __future__ import annotations

import os
from pathlib import Path

from corral.envs import BuildOptions, Environment, EnvStore, build
from corral.envs.build import non_public_index_entries

__all__ = ["ENV_NAME", "REQS", "build_sci", "env_options", "env_root", "env_store"]

ENV_NAME = "sci"
REQS = ("numpy", "pandas", "matplotlib")


def env_root() -> Path:
    """The cached store's root (what ``CORRAL_ENV_DIR`` names for the CLI and servers)."""
    if os.geteuid() == 0:
        return Path("/var/cache/corral-envs-test")
    return Path.home() / ".cache" / "corral-envs-test"


def env_store() -> EnvStore:
    return EnvStore(env_root())


def env_options() -> BuildOptions:
    """The default options; where this host's resolver sends the index to a private
    address (a mirror or a proxy), that address is listed too: the egress proxy refuses
    private addresses unasked."""
    base = BuildOptions()
    return BuildOptions(extra_hosts=non_public_index_entries(base))


def build_sci() -> Environment:
    """``sci`` from the cached store (built first on a cold cache). Not from a running
    event loop (it runs one)."""
    return build(ENV_NAME, list(REQS), options=env_options(), store=env_store())
