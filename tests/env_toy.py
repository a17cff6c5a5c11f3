"""A small environment for the snippet tests, published straight into a store of the
test's own (no index, no build, no network): the package ``corraltoy``, which imports
``subprocess`` and ``asyncio`` when it loads, as a real package keeps what it imported
(pandas: ``shutil``, ``tempfile``...), so an environment template holds them."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from corral.envs import Environment, EnvStore
from corral.providers.linux import LinuxProvider
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import env_preload
from proctree import descendants

__all__ = ["TOY", "descendants", "publish_toy", "toy_pool"]

TOY = "corraltoy"
SOURCE = "import asyncio\nimport subprocess\n\nANSWER = 42\n"


def publish_toy(root: Path) -> Environment:
    """The toy environment, published into the store at ``root``."""
    store = EnvStore(root)
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()
    temp = store.new_temp()
    (temp / "site" / TOY).mkdir(parents=True)
    (temp / "site" / TOY / "__init__.py").write_text(SOURCE)
    (temp / "meta.json").write_text(json.dumps(
        {"digest": digest, "modules": [TOY], "size_bytes": len(SOURCE),
         "requirements": [f"{TOY}==1"]}))
    with store.lock(digest):
        return store.publish(temp, digest)


@contextlib.asynccontextmanager
async def toy_pool(root: Path, **kw: Any) -> AsyncIterator[SnippetPool]:
    """A strict pool of the toy environment (its templates preload ``corraltoy``) on a
    linux provider of its own; both closed after."""
    env = publish_toy(root)
    async with LinuxProvider(spares=0, env_store_dir=str(root)) as provider:
        kw.setdefault("spares", 0)
        kw.setdefault("max_workers", 1)
        pool = SnippetPool(providers={"strict": provider}, environment=env.digest,
                           preload=env_preload(env.modules) | {TOY}, **kw)
        try:
            yield pool
        finally:
            await pool.aclose()
