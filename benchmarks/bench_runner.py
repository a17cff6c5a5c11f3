"""run_bounded's overhead against subprocess.run, measured side by side.

Usage: .venv/bin/python benchmarks/bench_runner.py [N]

For each command the variants run interleaved (A B C A B C ...), N times each,
so machine noise hits them alike; the table gives the median and p90 wall
time per run and the ratio of medians against subprocess.run. The
"no supervisor" row is run_bounded with the command started directly
(``spawner=popen_process``, process-group kill only): the difference to the
"(sync)" row is what the supervisor that holds the tree costs. The "no
supervisor, fork alive" row is the same with a fork of this process alive
during the run (blocked on a pipe, released after): the part of that cost
that is the runner's own copy-on-write faults while it shares its pages.

The "(sync)" row's supervisor comes from the spawn helper (a small process started
once, issue 26: the command's peak RSS is then its own in a large host); the
"supervisor forked here" row is the previous way, the supervisor a fork of this
process (the helper turned off for that call), side by side. ``--ballast MB`` grows
this process by MB of touched memory first: a large host, where forking it costs more.

Usage: .venv/bin/python benchmarks/bench_runner.py [N] [--ballast MB]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import corral.runner.tree as tree
from corral.run.bounded import run_bounded, run_bounded_async
from corral.runner.tree import popen_process, warm_spawn_helper

__all__ = ["main"]


def _sub(argv: list[str]) -> Callable[[], object]:
    return lambda: subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL,
                                  timeout=60, check=False)


def _rb(argv: list[str], **kw: object) -> Callable[[], object]:
    return lambda: run_bounded(argv[0], argv[1:], timeout_ms=60_000, **kw)  # type: ignore[arg-type]


def _rb_forked_here(argv: list[str]) -> Callable[[], object]:
    def once() -> object:
        tree._HELPER._off = True
        try:
            return run_bounded(argv[0], argv[1:], timeout_ms=60_000)
        finally:
            tree._HELPER._off = False

    return once


def _rb_fork_alive(argv: list[str]) -> Callable[[], object]:
    def once() -> object:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        os.close(r)
        try:
            return run_bounded(argv[0], argv[1:], timeout_ms=60_000, spawner=popen_process)
        finally:
            os.close(w)
            os.waitpid(pid, 0)

    return once


def _rb_async_loop(argv: list[str]) -> tuple[Callable[[], object], Callable[[], None]]:
    loop = asyncio.new_event_loop()

    def once() -> object:
        return loop.run_until_complete(run_bounded_async(argv[0], argv[1:], timeout_ms=60_000))

    return once, loop.close


def _measure(variants: dict[str, Callable[[], object]], n: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():  # warm up
        fn()
    for _ in range(n):
        for name, fn in variants.items():
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1000)
    return times


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    ballast = b""
    if "--ballast" in args:
        i = args.index("--ballast")
        ballast = b"\1" * (int(args[i + 1]) << 20)
        del args[i:i + 2]
    n = int(args[0]) if args else 200
    helper = warm_spawn_helper(30)
    commands = {
        "/bin/true": ["/bin/true"],
        "python -c pass": [sys.executable, "-c", "pass"],
    }
    print(f"run_bounded vs subprocess.run, {n} interleaved runs each; ms per run "
          f"(python {sys.version.split()[0]}; this process {len(ballast) >> 20} MiB "
          f"ballast; spawn helper {'serving' if helper else 'NOT serving'})\n")
    print(f"{'command':<16} {'variant':<35} {'median':>8} {'p90':>8} {'ratio':>7}")
    for label, cmd in commands.items():
        once_async, close = _rb_async_loop(cmd)
        try:
            variants = {
                "subprocess.run": _sub(cmd),
                "run_bounded (sync)": _rb(cmd),
                "supervisor forked here (no helper)": _rb_forked_here(cmd),
                "run_bounded, no supervisor": _rb(cmd, spawner=popen_process),
                "no supervisor, fork alive": _rb_fork_alive(cmd),
                "run_bounded_async (warm loop)": once_async,
                "run_bounded + mem_mb (trampoline)": _rb(cmd, mem_mb=4096),
            }
            times = _measure(variants, n if "python" not in label else max(n // 4, 20))
        finally:
            close()
        base = statistics.median(times["subprocess.run"])
        for name, ts in times.items():
            med = statistics.median(ts)
            p90 = statistics.quantiles(ts, n=10)[-1]
            print(f"{label:<16} {name:<35} {med:8.2f} {p90:8.2f} {med / base:6.2f}x")
        print()
    del ballast


if __name__ == "__main__":
    main()
