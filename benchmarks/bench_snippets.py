"""Snippet runner benchmark: a warm strict pool against a cold strict run of the same snippet.

    .venv/bin/python benchmarks/bench_snippets.py [--runs 300] [--cold-runs 20]

Warm: ``run_snippet("1+1")`` through a :class:`SnippetPool` whose slots for the
tenant were created beforehand: p50/p99 latency of sequential runs, and runs per
second with 2 and 8 concurrent callers (the pool's default bound, the CPU count).
Memory: private memory (Private_Clean + Private_Dirty of /proc/PID/smaps_rollup)
of every process of one idle warm slot (``LinuxSandbox.host_pids()``), and the
slot-exclusive memory: pages mapped by no process outside the slot (pagemap +
/proc/kpagecount; needs root, else -1), which also counts the pages the agent
and a template share with each other (a strict slot is its agent alone).
Cold: create a strict sandbox, write the worker, run it once on the same job
(``python -I -S``, nothing preloaded), destroy the sandbox.
Goals (issue 5, two cores): p50 <= 5 ms, >= 200 runs/s, <= 2 MiB private per warm slot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

from corral.core.spec import ExecOpts, SandboxLimits, SandboxSpec
from corral.providers.linux import LinuxProvider, LinuxSandbox
from corral.snippets.host.pool import WORKER_FILE, SnippetPool, _frame, _worker_source
from corral.snippets.host.runner import _job, run_snippet
from corral.snippets.sandbox.worker import RECORDS_FILE
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS
from corral.wire import records
from corral.wire.protocol import FrameOk, OutputFrame, parse_frame

SNIPPET = "1+1"
PAGE = os.sysconf("SC_PAGE_SIZE")


def private_kib(pid: int) -> int:
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1])
    except OSError:
        return 0
    return total


def _pfns(pid: int) -> dict[int, int]:
    """Resident page frame number -> how many of this process's pages map it (needs root)."""
    out: dict[int, int] = {}
    with open(f"/proc/{pid}/maps", encoding="ascii") as maps, \
            open(f"/proc/{pid}/pagemap", "rb") as pm:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if line.rstrip().endswith("[vsyscall]"):
                continue
            pm.seek(lo // PAGE * 8)
            raw = pm.read((hi - lo) // PAGE * 8)
            for (entry,) in struct.iter_unpack("Q", raw):
                if entry >> 63 and entry & ((1 << 55) - 1):  # present, PFN visible
                    pfn = entry & ((1 << 55) - 1)
                    out[pfn] = out.get(pfn, 0) + 1
    return out


def exclusive_kib(pids: list[int]) -> int:
    """KiB of the pages mapped only by ``pids`` (together): what freeing the slot
    returns, counting pages its processes share with each other once. -1 if the
    kernel does not show page frames (not root)."""
    try:
        counts: dict[int, int] = {}
        for pid in pids:
            for pfn, n in _pfns(pid).items():
                counts[pfn] = counts.get(pfn, 0) + n
        total = 0
        with open("/proc/kpagecount", "rb") as kc:
            for pfn, n in counts.items():
                kc.seek(pfn * 8)
                (mapped,) = struct.unpack("Q", kc.read(8))
                if mapped <= n:
                    total += 1
        return total * PAGE // 1024
    except (OSError, struct.error):
        return -1


def slot_memory(pool: SnippetPool) -> tuple[list[tuple[int, int, str]], int]:
    """(host pid, private KiB, command) of each process of one idle slot, and the
    slot-exclusive KiB of them all."""
    slot = next(s for q in pool._idle.values() for s in q)
    assert isinstance(slot.sandbox, LinuxSandbox)
    pids = slot.sandbox.host_pids()
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:60]
        except OSError:
            cmd = "?"
        out.append((pid, private_kib(pid), cmd))
    return out, exclusive_kib(pids)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def warm(runs: int) -> dict[str, Any]:
    cpus = os.cpu_count() or 1
    async with SnippetPool(spares=0, max_idle=16) as pool:
        await pool.prewarm(level="strict", tenant_id="bench", count=max(cpus, 2))
        for _ in range(20):
            await run_snippet(SNIPPET, pool=pool, tenant_id="bench")
        lat = []
        for _ in range(runs):
            t0 = time.perf_counter()
            t = await run_snippet(SNIPPET, pool=pool, tenant_id="bench")
            lat.append((time.perf_counter() - t0) * 1000)
            assert t.result == "2", t
        rates = {}
        for callers in (2, 8):
            per = max(runs // callers, 10)

            async def caller(n: int = per) -> None:
                for _ in range(n):
                    await run_snippet(SNIPPET, pool=pool, tenant_id="bench")

            t0 = time.perf_counter()
            await asyncio.gather(*(caller() for _ in range(callers)))
            rates[callers] = per * callers / (time.perf_counter() - t0)
        await asyncio.sleep(0.5)
        mem, exclusive = slot_memory(pool)
        return {"p50": pct(lat, 50), "p99": pct(lat, 99), "rates": rates, "mem": mem,
                "exclusive_kib": exclusive,
                "max_workers": pool.statistics().max_workers}


async def cold(runs: int) -> list[float]:
    provider = LinuxProvider()
    job = _job([("main.py", SNIPPET)], 5000, DEFAULT_ALLOWED_IMPORTS, 256, True)
    frame = _frame(job, "bench")
    source = _worker_source()
    codec = Path(records.__file__).read_text(encoding="utf-8")  # the worker's record codec
    times = []
    try:
        for i in range(runs + 1):
            t0 = time.perf_counter()
            sb = await provider.create(SandboxSpec(
                tenant_id="bench", run_id=f"cold-{i}", limits=SandboxLimits(mem_mb=320)))
            try:
                await sb.write_file(WORKER_FILE, source)
                await sb.write_file(RECORDS_FILE, codec)
                res = await sb.exec([sys.executable, "-I", "-S", WORKER_FILE],
                                    ExecOpts(stdin=frame, timeout_ms=10000))
            finally:
                await sb.destroy()
            result = parse_frame(res.stdout.splitlines()[0])
            assert isinstance(result, FrameOk) and isinstance(result.frame, OutputFrame)
            assert result.frame.output["result"] == "2", res
            if i:  # the first one also starts the zygote
                times.append((time.perf_counter() - t0) * 1000)
    finally:
        await provider.aclose()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--cold-runs", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    w = asyncio.run(warm(args.runs))
    c = asyncio.run(cold(args.cold_runs))
    c50, c99 = pct(c, 50), pct(c, 99)
    mem_kib = sum(k for _p, k, _c in w["mem"])
    rows = [
        ("p50 latency, ms", w["p50"], c50, "<= 5"),
        ("p99 latency, ms", w["p99"], c99, ""),
        ("runs/s, 2 callers", w["rates"][2], 1000 / c50, ">= 200"),
        ("runs/s, 8 callers", w["rates"][8], 1000 / c50 * (os.cpu_count() or 1), ">= 200"),
        ("private MiB per warm slot", mem_kib / 1024, float("nan"), "<= 2"),
        ("  slot-exclusive MiB", w["exclusive_kib"] / 1024, float("nan"), ""),
    ]
    if args.json:
        print(json.dumps({"warm": {k: v for k, v in w.items()}, "cold_ms": c}, default=str))
        return
    print(f"snippet {SNIPPET!r}, strict (linux provider), pool max_workers={w['max_workers']}, "
          f"{args.runs} warm runs, {args.cold_runs} cold runs, {os.cpu_count()} CPUs")
    print(f"{'metric':<28}{'warm pool':>12}{'cold':>12}{'cold/warm':>12}  goal")
    for name, wv, cv, goal in rows:
        ratio = cv / wv if "latency" in name else wv / cv if cv == cv else float("nan")
        cold_s = f"{cv:12.2f}" if cv == cv else f"{'-':>12}"
        ratio_s = f"{ratio:11.1f}x" if ratio == ratio else f"{'-':>12}"
        print(f"{name:<28}{wv:12.2f}{cold_s}{ratio_s}  {goal}")
    print("(cold runs/s: one run per core at the cold p50; 'cold/warm' is how many times "
          "the warm pool is better)")
    print("warm slot processes (host pid, private KiB, command):")
    for pid, kib, cmd in w["mem"]:
        print(f"  {pid:>8} {kib:>8}  {cmd}")


if __name__ == "__main__":
    main()
