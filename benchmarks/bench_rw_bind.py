"""What a read-write bind costs a strict create, side by side with a read-only one.

Usage: flock /tmp/corral-bench.lock .venv/bin/python benchmarks/bench_rw_bind.py [--runs N]

As root a read-write bind is an idmapped mount (issue 24): the fork server clones a
throwaway user namespace per create for its idmapping. This prints, for N rounds of
``create`` + exec ``/bin/true`` + ``destroy`` with ``spares=0`` (every sandbox cold),
a provider with one read-only bind and one with the same dir bound read-write,
interleaved (the order reversed every other round): the median and p90 of each and
the median of the pairwise differences and ratios. Compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time

from corral.core.spec import SandboxSpec
from corral.providers.linux import Bind, LinuxProvider


async def _one(p: LinuxProvider, i: int) -> float:
    t0 = time.perf_counter()
    sb = await p.create(SandboxSpec(tenant_id="bench", run_id=str(i)))
    try:
        r = await sb.exec(["/bin/true"])
        assert r.exit_code == 0, r
    finally:
        await sb.destroy()
    return (time.perf_counter() - t0) * 1000


async def main(runs: int) -> None:
    d = tempfile.mkdtemp(prefix="corral-bench-bind-")
    os.chmod(d, 0o755)
    ps = {"read-only bind": LinuxProvider(spares=0, binds=[Bind(d, "/work/p")]),
          "read-write bind": LinuxProvider(spares=0, binds=[Bind(d, "/work/p", rw=True)])}
    times: dict[str, list[float]] = {k: [] for k in ps}
    try:
        for p in ps.values():  # warm: the fork servers start
            await _one(p, -1)
        for i in range(runs):
            order = list(ps.items()) if i % 2 == 0 else list(reversed(ps.items()))
            for k, p in order:
                times[k].append(await _one(p, i))
    finally:
        for p in ps.values():
            await p.aclose()
        shutil.rmtree(d, ignore_errors=True)
    ro, rw = times["read-only bind"], times["read-write bind"]
    print(f"create + exec /bin/true + destroy, spares=0, {runs} rounds, euid {os.geteuid()}")
    for k, v in times.items():
        q = statistics.quantiles(v, n=10)
        print(f"  {k:16s} median {statistics.median(v):6.2f} ms   p90 {q[-1]:6.2f} ms")
    diff = statistics.median(b - a for a, b in zip(ro, rw, strict=True))
    ratio = statistics.median(b / a for a, b in zip(ro, rw, strict=True))
    print(f"  read-write vs read-only: +{diff:.2f} ms, {ratio:.2f}x (pairwise medians)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=40)
    asyncio.run(main(ap.parse_args().runs))
