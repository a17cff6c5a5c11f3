"""What a snippet run pays for shedding the runtime's modules (``worker._shed_runtime``).

    .venv/bin/python benchmarks/bench_shed.py [--forks 300]

A process loaded as a strict slot's fork server is (asyncio, subprocess, the worker with
its guards preloaded: ``corral.snippets.sandbox.guards``) forks, interleaved: a child
that does nothing, and a child that runs ``_shed_runtime`` for the default allowlist
(``fork_exec`` replaced, ``RLIMIT_NPROC`` 0, the runtime's modules out of
``sys.modules``). Each child reports its own time and its minor page faults (the
copy-on-write copies a fresh fork pays for every page it writes). Medians, and the
shed run's figures beside the idle one's.
"""

from __future__ import annotations

import argparse
import asyncio  # noqa: F401 (loaded, as the agent has it)
import os
import resource
import statistics
import subprocess  # noqa: F401 (loaded, as the agent has it)
import sys
import time

import corral.snippets.sandbox.guards  # noqa: F401 (_harden, prepare_shed, warm)
from corral.snippets.sandbox import worker
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS

ALLOWED = frozenset(DEFAULT_ALLOWED_IMPORTS)


def one(shed: bool) -> tuple[int, int]:
    """(ns, minor faults) of one fresh child doing nothing, or shedding."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter_ns()
        held = worker._shed_runtime(ALLOWED) if shed else []  # held to the exit
        t1 = time.perf_counter_ns()
        f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        os.write(w, f"{t1 - t0} {f1 - f0} {len(held)}".encode())
        os._exit(0)
    os.close(w)
    try:
        ns, faults, _ = os.read(r, 100).split()
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return int(ns), int(faults)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forks", type=int, default=300)
    args = ap.parse_args()
    idle: list[tuple[int, int]] = []
    shed: list[tuple[int, int]] = []
    for _ in range(args.forks):  # interleaved: A B A B
        idle.append(one(False))
        shed.append(one(True))
    dropped = len(worker._ARM_STATE["shed"]["drops"][ALLOWED])
    print(f"python {sys.version.split()[0]}, {len(sys.modules)} modules loaded, "
          f"{dropped} dropped per run, {args.forks} forks each")
    print(f"{'':22} {'idle child':>12} {'shed':>12} {'shed - idle':>12}")
    for label, i in (("median us", 0), ("median page faults", 1)):
        a = statistics.median(x[i] for x in idle) / (1000 if i == 0 else 1)
        b = statistics.median(x[i] for x in shed) / (1000 if i == 0 else 1)
        print(f"{label:22} {a:12.1f} {b:12.1f} {b - a:12.1f}")


if __name__ == "__main__":
    main()
