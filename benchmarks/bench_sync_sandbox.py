"""What the synchronous sandbox (``corral.sandbox.Sandbox``) costs over the async contract.

One sandbox (strict by default), three ways to run ``/bin/true`` in it, interleaved
(A B C A B C ...): the async contract's ``await sb.exec(argv)`` driven on corral's loop
(the floor), ``sb.commands.run(argv)`` from sync code (the loop hop), and
``sb.commands.run("true")`` (a shell line: ``/bin/sh -c``). Medians and the ratios to
the floor, side by side from one run.

    .venv/bin/python benchmarks/bench_sync_sandbox.py              # --runs N, --level L
"""

from __future__ import annotations

import argparse
import statistics
import time

from corral.core.sync import run_sync
from corral.sandbox import Sandbox


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--level", default="strict")
    args = ap.parse_args()
    times: dict[str, list[float]] = {"async exec (floor)": [], "sync argv": [],
                                     "sync shell line": []}
    with Sandbox.create(level=args.level) as sb:
        inner = sb.sandbox
        for _ in range(3):  # warm
            sb.commands.run(["/bin/true"])
        for _ in range(args.runs):
            t = time.perf_counter()
            run_sync(inner.exec(["/bin/true"]))
            times["async exec (floor)"].append(time.perf_counter() - t)
            t = time.perf_counter()
            sb.commands.run(["/bin/true"])
            times["sync argv"].append(time.perf_counter() - t)
            t = time.perf_counter()
            sb.commands.run("true")
            times["sync shell line"].append(time.perf_counter() - t)
    floor = statistics.median(times["async exec (floor)"])
    print(f"level {args.level}, {args.runs} runs each, interleaved")
    for name, xs in times.items():
        med = statistics.median(xs)
        print(f"  {name:20s} median {med * 1000:7.2f} ms   x{med / floor:5.2f}")


if __name__ == "__main__":
    main()
