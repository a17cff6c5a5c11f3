"""An environment a live sandbox uses is never removed from under it: ``corral env rm``
(EnvStore.remove) refuses it typed and LRU eviction passes it by until the sandbox is
destroyed; then both work (the control). Before, the files went from under a running
sandbox and its imports failed inside."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from corral.core.errors import ConfigInvalidError
from corral.core.spec import Level, SandboxSpec
from corral.envs import EnvStore
from corral.providers.linux import LinuxProvider
from env_toy import TOY, publish_toy

PY = os.path.realpath(sys.executable)


@pytest.fixture(autouse=True)
def _sandbox_available(linux: object) -> None:
    """The linux fixture (tests/linux/conftest.py) skips where the host cannot sandbox."""


def test_an_environment_in_use_is_neither_removed_nor_evicted(tmp_path: Path) -> None:
    env = publish_toy(tmp_path)
    store = EnvStore(tmp_path)
    store.set_name("toy", env.digest)
    tiny = EnvStore(tmp_path, max_bytes=1)  # every environment is over this bound

    async def go() -> None:
        async with LinuxProvider(spares=0, env_store_dir=str(tmp_path)) as p:
            sb = await p.create(SandboxSpec(level=Level.STRICT, environment="toy"))
            try:
                with pytest.raises(ConfigInvalidError, match="in use by a live sandbox"):
                    store.remove("toy")
                assert store.names() == {"toy": env.digest}  # refused whole
                assert tiny.evict() == []
                r = await sb.exec([PY, "-c", f"import {TOY}; print({TOY}.ANSWER)"])
                assert (r.exit_code, r.stdout) == (0, b"42\n"), r
            finally:
                await sb.destroy()
            # the control: once the sandbox is gone, eviction takes it
            assert tiny.evict() == [env.digest]
            assert store.find(env.digest) is None and store.names() == {}
            with pytest.raises(ConfigInvalidError, match="environment"):
                await p.create(SandboxSpec(level=Level.STRICT, environment=env.digest))

    asyncio.run(go())


def test_remove_takes_an_environment_nobody_uses(tmp_path: Path) -> None:
    env = publish_toy(tmp_path)
    store = EnvStore(tmp_path)
    store.set_name("toy", env.digest)

    async def go() -> None:
        async with LinuxProvider(spares=0, env_store_dir=str(tmp_path)) as p:
            async with await p.create(SandboxSpec(level=Level.STRICT, environment="toy")):
                pass
            assert store.remove("toy") == [env.digest]
            assert not store.object_dir(env.digest).exists()

    asyncio.run(go())


def test_an_idle_spare_of_a_removed_environment_is_not_used(tmp_path: Path) -> None:
    """A provider keeps a spare built for an environment's plan; the environment is then
    removed (nobody uses it: an idle spare holds no lock) and published again under the
    same digest (a new tree at the same path). The next sandbox must see the new tree:
    the spare, bound to the removed one, is ended instead of handed out. Before, the
    sandbox came from that spare and its import failed inside. Control: without the
    removal the spare is taken (the same sandbox pid 1 as the spare's), and sees it."""
    env = publish_toy(tmp_path)
    store = EnvStore(tmp_path)
    store.set_name("toy", env.digest)
    check = [PY, "-c", f"import {TOY}; print({TOY}.ANSWER)"]
    spec = SandboxSpec(level=Level.STRICT, environment="toy")

    async def go() -> None:
        async with LinuxProvider(spares=1, env_store_dir=str(tmp_path)) as p:
            async with await p.create(spec):
                pass
            assert await p._pool.drain() == 1  # a spare of the environment's plan, idle
            spare = next(iter(p._pool.idle.values()))[0].sid
            # control: nothing changed, so the spare is taken and sees the environment
            async with await p.create(spec) as sb:
                assert sb.id == spare
                r = await sb.exec(check)
                assert (r.exit_code, r.stdout) == (0, b"42\n"), r
            assert await p._pool.drain() == 1
            spare = next(iter(p._pool.idle.values()))[0].sid
            assert store.remove("toy") == [env.digest]
            again = publish_toy(tmp_path)
            assert again.digest == env.digest
            store.set_name("toy", env.digest)
            async with await p.create(spec) as sb:
                assert sb.id != spare
                r = await sb.exec(check)
                assert (r.exit_code, r.stdout) == (0, b"42\n"), r

    asyncio.run(go())
