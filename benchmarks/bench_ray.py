"""Ray provider benchmark: what placing sandboxes on a cluster costs per call, and how
throughput grows with worker nodes.

    .venv/bin/python benchmarks/bench_ray.py [--runs 200] [--json]

Starts a real local cluster (``LocalCluster``: a head with no CPUs for work and two
worker nodes with one CPU each, on 127.0.0.2-4, private temp dir, stopped by pid), then:

1. **Added cost per call**, worker nodes not pinned (the local provider is not either).
   ``run_snippet("1+1")`` through a warm :class:`SnippetPool` (slots made beforehand) on
   the local strict provider (``LinuxProvider`` in this process) and on the Ray
   provider, run by run in turn (local, ray, local ...) so both see the same load:
   p50/p99 of sequential runs, then runs/s with 4 callers; one ``exec`` of
   ``/bin/true`` in a live sandbox both ways, in turn; one bare Ray actor call and one
   bare call over a node's data channel. The added cost is the difference of the p50s.
2. **Nodes**, on a second cluster whose worker nodes are each pinned to a core of its
   own (``worker_cpus``: each ``ray start`` runs under ``taskset``, so its raylet, node
   actor, sandboxes and their processes inherit that CPU; ``--no-pin`` leaves them
   floating; the driver and the head float). Runs/s of a pool on the Ray provider
   placing on both worker nodes and of one placing on the first only (the other idles),
   in alternating rounds (``--rounds``, medians reported) so both see the same outside
   load, ``--node-callers`` callers (default 12) each, and the CPU affinity seen on each
   node's processes (its session: raylet, node actor; and its sandboxes' processes).

On a 2-core host the driver and the head float over both cores and so share them with
the pinned nodes: the report says what was measured, and the load average with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

from corral.core.spec import SandboxSpec
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet

SNIPPET = "1+1"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def throughput(pool: SnippetPool, runs: int, callers: int) -> float:
    per = max(runs // callers, 10)

    async def caller() -> None:
        for _ in range(per):
            t = await run_snippet(SNIPPET, pool=pool, tenant_id="bench")
            assert t.result == "2", t

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return per * callers / (time.perf_counter() - t0)


def cpu_ms(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, ms (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            f = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def affinity(pids: list[int]) -> str:
    """The distinct CPU lists of ``pids`` ("0", "0-1", "0 | 0-1" when they differ)."""
    from corral.providers.ray.cluster import cpus_allowed
    seen = sorted({a for a in (cpus_allowed(x) for x in pids) if a is not None})
    return " | ".join(seen) or "?"


async def nodes_rates(runs: int, callers: int, rounds: int, one_ip: str) -> dict[str, Any]:
    """Runs/s with two worker nodes and with one, in alternating rounds (two, one, two,
    one ...) so both see the same outside load: a provider placing on every worker and
    one placing on ``one_ip`` only (Ray's ``node:<ip>`` resource); the other node then
    idles. Each with its own pool of ``callers`` warm slots."""
    import statistics

    from corral.providers.ray import RayProvider, _wire
    provs = {"two": RayProvider(node_resource="corral"),
             "one": RayProvider(node_resource=f"node:{one_ip}")}
    out: dict[str, Any] = {}
    try:
        actors = [_wire.unwrap(await x.actor.info.remote())["pid"]
                  for x in provs["two"].nodes()]
        async with contextlib.AsyncExitStack() as stack:
            pools = {}
            for name, p in provs.items():
                pools[name] = await stack.enter_async_context(SnippetPool(
                    providers={"strict": p}, spares=0, max_idle=max(16, callers),
                    max_workers=callers))
                await pools[name].prewarm(level="strict", tenant_id="bench", count=callers)
                for _ in range(20):
                    await run_snippet(SNIPPET, pool=pools[name], tenant_id="bench")
                spread: dict[str, int] = {}
                for sb in list(p._live):
                    spread[sb.node.address] = spread.get(sb.node.address, 0) + 1
                pins = {}
                for x in p.nodes():
                    info = _wire.unwrap(await x.actor.info.remote())
                    boxes = [pid for pids in info["host_pids"].values() for pid in pids]
                    pins[x.address] = {"node_actor": affinity([info["pid"]]),
                                       "sandboxes": affinity(boxes)}
                out[name] = {"workers": len(p.nodes()), "slots": spread, "affinity": pins,
                             "rates": [], "driver_s": 0.0, "actor_ms": 0.0, "runs": 0,
                             "loads": []}
            for _ in range(rounds):
                for name, pool in pools.items():
                    x = out[name]
                    x["loads"].append(os.getloadavg()[0])
                    c0, a0 = time.process_time(), sum(cpu_ms(a) for a in actors)
                    x["rates"].append(await throughput(pool, runs * 2, callers))
                    x["driver_s"] += time.process_time() - c0
                    x["actor_ms"] += sum(cpu_ms(a) for a in actors) - a0
                    x["runs"] += max(runs * 2 // callers, 10) * callers
        for x in out.values():
            x["rate"] = statistics.median(x["rates"])
            x["driver_cpu_ms"] = x.pop("driver_s") * 1000 / x["runs"]
            x["node_actor_cpu_ms"] = x.pop("actor_ms") / x["runs"]
        out["ratios"] = [a / b for a, b in zip(out["two"]["rates"], out["one"]["rates"],
                                               strict=True)]
        out["ratio"] = out["two"]["rate"] / out["one"]["rate"]
        return out
    finally:
        for p in provs.values():
            await p.aclose()


async def same_run(runs: int, callers: int) -> dict[str, Any]:
    """Local strict and Ray, interleaved run by run (local, ray, local, ray ...) so that
    both see the same load; then each one's rate with ``callers`` at once."""
    from corral.providers.linux import LinuxProvider
    from corral.providers.ray import RayProvider
    local, rp = LinuxProvider(), RayProvider(node_resource="corral")
    out: dict[str, Any] = {}
    try:
        async with SnippetPool(providers={"strict": local}, spares=0, max_idle=16,
                               max_workers=callers) as lpool, \
                SnippetPool(providers={"strict": rp}, spares=0, max_idle=16,
                            max_workers=callers) as rpool:
            lat: dict[str, list[float]] = {"local": [], "ray": []}
            for pool in (lpool, rpool):
                await pool.prewarm(level="strict", tenant_id="bench", count=2)
                for _ in range(20):
                    await run_snippet(SNIPPET, pool=pool, tenant_id="bench")
            for _ in range(runs):
                for name, pool in (("local", lpool), ("ray", rpool)):
                    t0 = time.perf_counter()
                    t = await run_snippet(SNIPPET, pool=pool, tenant_id="bench")
                    lat[name].append((time.perf_counter() - t0) * 1000)
                    assert t.result == "2", t
            for name, pool in (("local", lpool), ("ray", rpool)):
                out[f"{name}_pool"] = {"p50": pct(lat[name], 50), "p99": pct(lat[name], 99),
                                       "rate": await throughput(pool, runs, callers)}
        lsb = await local.create(SandboxSpec(tenant_id="bench-exec"))
        rsb = await rp.create(SandboxSpec(tenant_id="bench-exec"))
        try:
            ex: dict[str, list[float]] = {"local": [], "ray": []}
            for i in range(runs + 10):
                for name, sb in (("local", lsb), ("ray", rsb)):
                    t0 = time.perf_counter()
                    r = await sb.exec(["/bin/true"])
                    if i >= 10:
                        ex[name].append((time.perf_counter() - t0) * 1000)
                    assert r.exit_code == 0
            for name in ex:
                out[f"{name}_exec"] = {"p50": pct(ex[name], 50), "p99": pct(ex[name], 99)}
        finally:
            await lsb.destroy()
            await rsb.destroy()
        node = rp.nodes()[0]
        rt: dict[str, list[float]] = {"actor_rt": [], "channel_rt": []}
        for _ in range(runs):
            t0 = time.perf_counter()
            await node.actor.renew.remote("bench-rt", 60.0)
            t1 = time.perf_counter()
            await node.chan.call("ping")
            rt["actor_rt"].append((t1 - t0) * 1000)
            rt["channel_rt"].append((time.perf_counter() - t1) * 1000)
        for k, v in rt.items():
            out[k] = {"p50": pct(v, 50), "p99": pct(v, 99)}
    finally:
        await local.aclose()
        await rp.aclose()
    return out


@contextlib.contextmanager
def _connected(cluster: Any) -> Iterator[Any]:
    """Start ``cluster``, connect this process to it; disconnect and stop it after."""
    cluster.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import ray  # type: ignore[import-untyped,unused-ignore]
            ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        yield ray
    finally:
        import ray
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--callers", type=int, default=4)
    ap.add_argument("--node-callers", type=int, default=12,
                    help="callers for the one- and two-node throughput")
    ap.add_argument("--rounds", type=int, default=4,
                    help="alternating rounds of the two- and one-node throughput")
    ap.add_argument("--no-pin", action="store_true",
                    help="leave the worker nodes floating over every core")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from corral.providers.ray.cluster import LocalCluster
    os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"})
    ncpu = len(os.sched_getaffinity(0))
    pin = None if args.no_pin or ncpu < 2 else sorted(os.sched_getaffinity(0))[:2]
    # part 1 on floating nodes, as the local provider floats; part 2 on pinned ones
    cluster = LocalCluster(workers=2, head_cpus=0, port=6393)
    t0 = time.perf_counter()
    with _connected(cluster):
        up = time.perf_counter() - t0
        res = asyncio.run(same_run(args.runs, args.callers))
    cluster = LocalCluster(workers=2, head_cpus=0, port=6393, worker_cpus=pin)
    with _connected(cluster):
        pinned = {w.ip: sorted(w.cpus) if w.cpus else None for w in cluster.workers}
        nodes = asyncio.run(nodes_rates(args.runs, args.node_callers, args.rounds,
                                        cluster.workers[0].ip))
        sessions = {w.ip: w.affinities() for w in cluster.workers}
    nodes["callers"] = args.node_callers
    res.update({"cluster_up_s": up, "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
                "pinned": pinned if pin else None, "node_sessions": sessions, "nodes": nodes})
    if args.json:
        json.dump(res, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    lp, rp, le, re_ = res["local_pool"], res["ray_pool"], res["local_exec"], res["ray_exec"]
    print(f"cluster: head + 2 workers up in {up:.1f} s on {os.cpu_count()} cores")
    print(f"warm snippet, local strict: p50 {lp['p50']:.2f} ms  p99 {lp['p99']:.2f} ms  "
          f"{lp['rate']:.0f} runs/s ({args.callers} callers)")
    print(f"warm snippet, ray:          p50 {rp['p50']:.2f} ms  p99 {rp['p99']:.2f} ms  "
          f"{rp['rate']:.0f} runs/s ({args.callers} callers)")
    print(f"  added per call at p50: {rp['p50'] - lp['p50']:.2f} ms "
          f"(p99: {rp['p99'] - lp['p99']:.2f} ms)")
    print(f"one Ray actor call (round trip): p50 {res['actor_rt']['p50']:.2f} ms  "
          f"p99 {res['actor_rt']['p99']:.2f} ms")
    print(f"one data-channel call (round trip): p50 {res['channel_rt']['p50']:.2f} ms  "
          f"p99 {res['channel_rt']['p99']:.2f} ms")
    print(f"exec /bin/true, local:      p50 {le['p50']:.2f} ms  p99 {le['p99']:.2f} ms")
    print(f"exec /bin/true, ray:        p50 {re_['p50']:.2f} ms  p99 {re_['p99']:.2f} ms  "
          f"(added {re_['p50'] - le['p50']:.2f} ms at p50)")
    nd = res["nodes"]
    if pin:
        sess = res["node_sessions"]
        print("pinned: " + "; ".join(
            f"worker {ip} to CPU {','.join(map(str, c or []))} (its session's processes: "
            f"{' | '.join(sess.get(ip, {})) or '?'}; node actor "
            f"{nd['two']['affinity'].get(ip, {}).get('node_actor', '?')}, sandboxes "
            f"{nd['two']['affinity'].get(ip, {}).get('sandboxes', '?')})"
            for ip, c in res["pinned"].items())
            + f"; driver and head float (CPUs {affinity([os.getpid()])})")
    else:
        print("not pinned: every process floats over every core")
    for k in ("two", "one"):
        x = nd[k]
        print(f"ray, {k} worker(s): {x['rate']:.0f} runs/s median of "
              f"{' '.join(f'{r:.0f}' for r in x['rates'])} ({nd['callers']} callers), "
              f"slots {x['slots']}; per run: driver {x['driver_cpu_ms']:.2f} ms CPU, node "
              f"actors {x['node_actor_cpu_ms']:.2f} ms CPU; load average "
              f"{' '.join(f'{v:.2f}' for v in x['loads'])}")
    print(f"two workers / one worker: {nd['ratio']:.2f}x (rounds: "
          f"{' '.join(f'{r:.2f}' for r in nd['ratios'])}; one worker = the other idle); "
          f"load average at the end {res['load_avg_1m']:.2f}")

if __name__ == "__main__":
    main()
