"""The issue's walk through the library, as an agent would: pandas and matplotlib in
the session's environment (marker ``env_build``: ``sci`` is built from PyPI by corral,
cached: tests/env_fixture.py)."""

from __future__ import annotations

import asyncio

import pytest

from corral import LimitsExceededError, SandboxLimits
from corral.providers.linux import LinuxProvider
from corral.sessions import AsyncSession
from session_env import CSV, png_size
from strict_tier import needs_cgroup_limits

pytestmark = [pytest.mark.env_build, pytest.mark.usefixtures("strict")]

#: the limits of these sessions: pandas + matplotlib + a figure need ~150 MiB
LIMITS = SandboxLimits(mem_mb=400, max_processes=64, disk_mb=64)
PLOT = ("import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(4, 3), dpi=50)\n"
        "ax.plot(df.a, df.b)\nax.set_title('b by a')\nplt.show()")


@pytest.fixture
def provider(sci_env: str) -> LinuxProvider:
    from env_fixture import env_root
    return LinuxProvider(env_store_dir=str(env_root()))


@needs_cgroup_limits()
def test_the_agent_walk_through_the_library(provider: LinuxProvider, sci_env: str) -> None:
    async def main() -> None:
        try:
            s = await AsyncSession.create(provider=provider, environment=sci_env,
                                          limits=LIMITS, cell_timeout_s=2.0)
            async with s:
                await s.write_file("data.csv", CSV)
                r1 = await s.run("import pandas as pd; df = pd.read_csv('data.csv')",
                                 timeout_s=60)
                assert r1.ok, r1.error
                r2 = await s.run("df.describe()")
                assert r2.result is not None
                html, text = r2.result.html, r2.result.text()
                assert html is not None and "<table" in html and "mean" in html
                assert text is not None and "count" in text and "4.0" in text
                r3 = await s.run(PLOT, timeout_s=60)
                assert r3.ok, r3.error
                [png] = r3.pngs()
                assert png_size(png) == (200, 150)  # 4x3 inches at 50 dpi
                r4 = await s.run("while True: pass")
                assert r4.timed_out and r4.error is not None
                assert r4.error.name == "KeyboardInterrupt"
                r5 = await s.run("int(df.b.sum())")
                assert r5.result is not None and r5.result.text() == "24"
                with pytest.raises(LimitsExceededError) as info:
                    await s.run("import numpy as np\nbig = np.ones((1 << 30,), dtype=np.uint8)",
                                timeout_s=60)
                assert info.value.limit == "memory" and info.value.limit_value == 400
                assert not s.alive
        finally:
            await provider.aclose()
    asyncio.run(main())


def test_a_figure_left_open_is_shown_at_the_end_of_the_cell(provider: LinuxProvider,
                                                              sci_env: str) -> None:
    async def main() -> None:
        try:
            s = await AsyncSession.create(provider=provider, environment=sci_env)
            async with s:
                r = await s.run("import matplotlib.pyplot as plt\n"
                                "plt.figure(figsize=(2, 2), dpi=40)\nplt.plot([1, 2], [3, 1])\n"
                                "None", timeout_s=60)
                assert r.ok, r.error
                [png] = r.pngs()
                assert png_size(png) == (80, 80)
                # shown once, then closed: the next cell shows nothing
                assert (await s.run("len(plt.get_fignums())")).result.text() == "0"  # type: ignore[union-attr]
        finally:
            await provider.aclose()
    asyncio.run(main())


def test_a_sync_session_finds_its_environment_by_name(sci_env: str) -> None:
    """``Session(environment=...)`` with the default provider: the store is the one
    ``CORRAL_ENV_DIR`` names; the packages import from the read-only mount, which a
    cell cannot write. Control: a session without it cannot import pandas."""
    from corral.envs import ENV_MOUNT
    from corral.sessions import Session
    with Session(environment=sci_env) as s:
        r = s.run("import os, pandas, numpy\n"
                  "print(os.path.dirname(os.path.dirname(pandas.__file__)))\n"
                  "print(numpy.arange(4).sum())", timeout_s=60)
        assert r.ok, r.error
        assert r.stdout.split() == [ENV_MOUNT, "6"]
        w = s.run(f"open({ENV_MOUNT!r} + '/pandas/x.py', 'w')")
        assert w.error is not None and w.error.name in ("OSError", "PermissionError"), w
    with Session() as s:
        r = s.run("import pandas")
        assert r.error is not None and r.error.name == "ModuleNotFoundError"
