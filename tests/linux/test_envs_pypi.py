"""An environment with numpy, pandas and matplotlib, built from the package index inside
a strict sandbox (marked ``env_build``: it needs the index; cached across runs under
/var/cache/corral-envs-test, so a second CI run's build is a cache hit; the session
tests share it: tests/env_fixture.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.cli import main
from corral.envs import EnvStore, build_environment, stats
from env_fixture import ENV_NAME, REQS, env_options, env_root, env_store

pytestmark = [pytest.mark.linux, pytest.mark.env_build]


@pytest.fixture
def sci_store(linux: Any, monkeypatch: pytest.MonkeyPatch) -> EnvStore:
    """The cached store the session tests share (tests/env_fixture.py), and
    CORRAL_ENV_DIR pointing at it for the CLI and snippets."""
    monkeypatch.setenv("CORRAL_ENV_DIR", str(env_root()))
    return env_store()


def test_numpy_pandas_matplotlib_built_in_the_sandbox_and_used(
        sci_store: EnvStore, capfd: pytest.CaptureFixture[str]) -> None:
    from corral.providers.linux import LinuxProvider
    from corral.snippets.host.runner import run_snippet

    async def build() -> Any:
        return await build_environment(ENV_NAME, list(REQS), options=env_options(),
                                       store=sci_store)

    env = asyncio.run(build())
    assert {"numpy", "pandas", "matplotlib"} <= env.modules
    assert (env.site.stat().st_mode & 0o222) == 0
    # the same inputs again: a cache hit, no sandbox
    built = stats["sandbox_builds"]

    class Refusing:
        name, capabilities = "refusing", frozenset({"strict"})

        async def create(self, *_a: Any, **_k: Any) -> Any:
            raise AssertionError("a cache hit must not create a sandbox")

    async def again() -> Any:
        return await build_environment(ENV_NAME, list(reversed(REQS)), options=env_options(),
                                       store=sci_store, provider=Refusing())  # type: ignore[arg-type]

    assert asyncio.run(again()).digest == env.digest
    assert stats["sandbox_builds"] == built

    # corral run --environment: the packages import in a strict sandbox
    capfd.readouterr()
    rc = main(["run", "--environment", "sci", "--", "/usr/bin/python3", "-c",
               "import numpy, pandas, matplotlib; print('ok', numpy.__name__, "
               "pandas.__name__, matplotlib.__name__)"])
    out = capfd.readouterr()
    assert rc == 0, out.err
    assert out.out.split() == ["ok", "numpy", "pandas", "matplotlib"]

    # a snippet: pandas allowed (the environment's modules), imported once per slot
    async def snippet() -> Any:
        async with LinuxProvider(spares=0, env_store_dir=str(sci_store.root)) as p:
            return await run_snippet(
                "import pandas as pd\n"
                "d = pd.DataFrame({'a': [1, 2, 3, 4]}).describe()\n"
                "print(d.loc['mean', 'a'], d.loc['count', 'a'])\n", provider=p,
                environment="sci")

    t = asyncio.run(snippet())
    assert t.ok, t.errors
    assert [ln.text.strip() for ln in t.logs] == ["2.5 4.0"]
    # the same snippet without the environment: pandas is refused by the validator
    from corral.snippets.validator import validate_source
    assert validate_source("import pandas")
