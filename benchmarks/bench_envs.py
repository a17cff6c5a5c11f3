"""Environments: a warm pandas snippet against a warm stdlib snippet, and the cold build.

    .venv/bin/python benchmarks/bench_envs.py [--runs 200] [--store DIR] [--cold]

Warm: ``run_snippet("import pandas as pd; pd.DataFrame({'a': [1, 2]}).sum()")`` through
a :class:`SnippetPool` of a numpy+pandas+matplotlib environment (its slots' template
imported the environment's modules once, inside the sandbox, and forks per run), next
to ``run_snippet("1+1")`` through a plain pool: p50/p99 of sequential runs and runs/s
with 2 concurrent callers, the snippet's own p50 (``Transcript.duration_ms``) and the
1-minute load average at start and end (the machine may be shared: compare side by
side). Goal (issue 29): the pandas p50 within 2x of the stdlib one. ``--interleave``
also runs the pandas snippet on the environment pool with its spares (the next run's
child forked and prefaulted ahead) and on one without, a run each in turn, so both
see the same load.
Cold: the first build of the environment (pip in a strict sandbox from the index,
read back, published), with ``--cold`` into a fresh temp store; then the second build
of the same inputs (a cache hit: no sandbox, no network).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from corral.envs import BuildOptions, EnvStore, build_environment, stats
from corral.envs.build import non_public_index_entries
from corral.providers.linux import LinuxProvider
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import env_preload, run_snippet

PANDAS = "import pandas as pd\npd.DataFrame({'a': [1, 2]}).sum()"
STDLIB = "1+1"
REQS = ["numpy", "pandas", "matplotlib"]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _measure(pool: SnippetPool, source: str, runs: int,
                   environment: str | None) -> dict[str, float]:
    for _ in range(5):  # warm the slots
        t = await run_snippet(source, pool=pool, environment=environment)
        assert t.ok, t.errors
    lat, inside = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        t = await run_snippet(source, pool=pool, environment=environment)
        lat.append((time.perf_counter() - t0) * 1000)
        inside.append(t.duration_ms)
        assert t.ok, t.errors
    t0 = time.perf_counter()
    per = runs // 2

    async def caller() -> None:
        for _ in range(per):
            await run_snippet(source, pool=pool, environment=environment)

    await asyncio.gather(caller(), caller())
    rate = 2 * per / (time.perf_counter() - t0)
    return {"p50_ms": round(statistics.median(lat), 2), "p99_ms": round(_pct(lat, 0.99), 2),
            "runs_per_s_2_callers": round(rate, 1),
            # the snippet's own time in its process (compile + run): what is left of a
            # run's first writes to shared pages after the spare's prefault
            "snippet_p50_ms": round(statistics.median(inside), 2)}


async def _interleaved(pools: dict[str, tuple[SnippetPool, str, str | None]],
                       runs: int) -> dict[str, dict[str, float]]:
    """Each pool's snippet (name -> (pool, source, environment)), one run each in turn
    (the same load for all, on a shared machine): p50 and the snippet's own p50."""
    lat: dict[str, list[float]] = {k: [] for k in pools}
    inside: dict[str, list[float]] = {k: [] for k in pools}
    for i in range(runs + 5):
        for name, (pool, source, environment) in pools.items():
            t0 = time.perf_counter()
            t = await run_snippet(source, pool=pool, environment=environment)
            if i >= 5:  # the first five warm the slots
                lat[name].append((time.perf_counter() - t0) * 1000)
                inside[name].append(t.duration_ms)
            assert t.ok, t.errors
    return {k: {"p50_ms": round(statistics.median(v), 2), "p99_ms": round(_pct(v, 0.99), 2),
                "snippet_p50_ms": round(statistics.median(inside[k]), 2)}
            for k, v in lat.items()}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    root = Path(tempfile.mkdtemp(prefix="corral-bench-envs-")) if args.cold else Path(
        args.store)
    os.environ["CORRAL_ENV_DIR"] = str(root)
    store = EnvStore(root)
    opts = BuildOptions(extra_hosts=non_public_index_entries(BuildOptions()))
    try:
        t0 = time.perf_counter()
        built = stats["sandbox_builds"]
        env = await build_environment("bench-sci", REQS, options=opts, store=store)
        first = time.perf_counter() - t0
        out["build"] = {"seconds": round(first, 2), "cold": stats["sandbox_builds"] > built,
                        "size_mb": round(env.size_bytes / 2**20, 1)}
        t0 = time.perf_counter()
        await build_environment("bench-sci", REQS, options=opts, store=store)
        out["build"]["hit_ms"] = round((time.perf_counter() - t0) * 1000, 2)
        async with LinuxProvider(spares=0, env_store_dir=str(root)) as p:
            plain = SnippetPool(providers={"strict": p}, max_workers=2, spares=1)
            envp = SnippetPool(providers={"strict": p}, max_workers=2, spares=1,
                               environment=env.digest, preload=env_preload(env.modules))
            bare = SnippetPool(providers={"strict": p}, max_workers=2, spares=1,
                               environment=env.digest, preload=env_preload(env.modules))
            bare._prefork = False  # no spare: each run's child forked when its job comes
            try:
                out["stdlib"] = await _measure(plain, STDLIB, args.runs, None)
                out["pandas"] = await _measure(envp, PANDAS, args.runs, env.digest)
                if args.interleave:
                    out["interleaved"] = got = await _interleaved(
                        {"stdlib": (plain, STDLIB, None),
                         "pandas_spare": (envp, PANDAS, env.digest),
                         "pandas_no_spare": (bare, PANDAS, env.digest)}, args.runs)
                    for k in ("pandas_spare", "pandas_no_spare"):
                        got[k]["over_stdlib_p50"] = round(got[k]["p50_ms"]
                                                          / got["stdlib"]["p50_ms"], 2)
            finally:
                await plain.aclose()
                await envp.aclose()
                await bare.aclose()
        out["pandas_over_stdlib_p50"] = round(out["pandas"]["p50_ms"]
                                              / out["stdlib"]["p50_ms"], 2)
        out["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    finally:
        if args.cold:
            from corral.envs.store import remove_tree
            remove_tree(root)
            shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--store", default="/var/cache/corral-envs-test" if os.geteuid() == 0
                    else str(Path.home() / ".cache" / "corral-envs-test"))
    ap.add_argument("--cold", action="store_true", help="build into a fresh temp store")
    ap.add_argument("--interleave", action="store_true",
                    help="also: the environment pool with and without its spares, a run "
                    "each in turn")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main_async(args)), indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
