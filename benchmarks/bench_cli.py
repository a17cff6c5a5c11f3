"""`corral run --level strict` alone, side by side with other checkouts' CLIs: wall and CPU.

Usage: .venv/bin/python benchmarks/bench_cli.py [--runs N] [--against PATH ...] [-- PYTHON ARGS]

A leaner companion of ``bench_strict.py``'s CLI rows: the bare command (by default
``python -c pass``, python = the real interpreter behind ``sys.executable``), this
checkout's installed ``corral`` script running it at strict, and every ``--against``
script (another checkout's ``.venv/bin/corral``: main's, say) running the same
command line; one run of each per round, interleaved (the order reversed every other
round), N rounds after two warm-up rounds. Per row: the median wall time, its median
pairwise difference and ratio against the bare run of the same round, and the median
CPU time (user + system of the process and every descendant it waited for: the
``wait4`` rusage, so pid 1, the view builder and the command are in it). CPU time
moves less than wall time when other jobs share the cores; the last lines give the
pairwise median of this checkout minus each ``--against`` one, wall and CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _once(argv: list[str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run of ``argv``, its output discarded."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        t = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, os.environ,
                             file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0),
                                           (os.POSIX_SPAWN_DUP2, devnull, 1),
                                           (os.POSIX_SPAWN_DUP2, devnull, 2)])
        _, status, ru = os.wait4(pid, 0)
        wall = (time.perf_counter() - t) * 1000
    finally:
        os.close(devnull)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv} exited {os.waitstatus_to_exitcode(status)}")
    return wall, (ru.ru_utime + ru.ru_stime) * 1000


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=40, help="interleaved rounds (default 40)")
    ap.add_argument("--against", action="append", default=[], metavar="PATH",
                    help="another checkout's corral script (repeatable)")
    ap.add_argument("args", nargs="*", help="python's arguments before -c pass (e.g. -I -S)")
    ns = ap.parse_args(argv)
    py = os.path.realpath(sys.executable)
    cmd = [py, *ns.args, "-c", "pass"]
    mine = str(Path(sys.prefix) / "bin" / "corral")
    rows = {"bare": cmd, "this checkout": [mine, "run", "--level", "strict", "--", *cmd]}
    for i, path in enumerate(ns.against):
        rows[f"--against {i + 1}"] = [os.path.abspath(path), "run", "--level", "strict",
                                      "--", *cmd]
    wall: dict[str, list[float]] = {k: [] for k in rows}
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    load0 = os.getloadavg()[0]
    names = list(rows)
    for i in range(ns.runs + 2):
        for name in names if i % 2 == 0 else names[::-1]:
            w, c = _once(rows[name])
            if i >= 2:  # two warm-up rounds (the plan caches fill)
                wall[name].append(w)
                cpu[name].append(c)
    base = wall["bare"]
    print(f"corral run --level strict -- {' '.join(cmd)}: {ns.runs} interleaved rounds; "
          f"load {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"  {'':<14} {'wall ms':>8} {'+ms':>8} {'ratio':>7} {'CPU ms':>8}")
    for name in names:
        plus = statistics.median(a - b for a, b in zip(wall[name], base, strict=True))
        ratio = statistics.median(a / b for a, b in zip(wall[name], base, strict=True))
        print(f"  {name:<14} {statistics.median(wall[name]):8.2f} {plus:+8.2f} "
              f"{ratio:6.2f}x {statistics.median(cpu[name]):8.2f}")
    for i, path in enumerate(ns.against):
        key = f"--against {i + 1}"
        dw = statistics.median(a - b for a, b in zip(wall["this checkout"], wall[key],
                                                     strict=True))
        dc = statistics.median(a - b for a, b in zip(cpu["this checkout"], cpu[key],
                                                     strict=True))
        print(f"  this checkout - {key} ({path}): wall {dw:+.2f} ms, CPU {dc:+.2f} ms "
              "(pairwise medians)")


if __name__ == "__main__":
    main()
