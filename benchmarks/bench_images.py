"""Image unpacking: what the bounded child costs for a normal small image.

    .venv/bin/python benchmarks/bench_images.py                      # this tree alone
    .venv/bin/python benchmarks/bench_images.py --before /tmp/old/src  # A/B against another

``--before`` is the ``src`` dir of another corral tree (``git archive <rev> src |
tar -x -C /tmp/old``). Each round runs one worker process per tree, interleaved
(A B A B ...); a worker times, on a fresh cache dir per run: the first unpack
(cold), the same image again from the same ``ImageCache`` (hit), and from a
new ``ImageCache`` on the same dir (hit, nothing remembered). Reports medians
in ms and the after/before ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "dispatch"))

from imagebuild import Member, oci_layout

WORKER = r'''
import json, os, shutil, sys, tempfile, time
from corral.images.cache import ImageCache
image, runs = sys.argv[1], int(sys.argv[2])
out = {"cold": [], "hit": [], "hit_new_cache": []}
for _ in range(runs):
    root = tempfile.mkdtemp(prefix="bench-images-")
    try:
        t = time.perf_counter()
        cache = ImageCache(os.path.join(root, "c"))
        cache.unpack(image)
        out["cold"].append(time.perf_counter() - t)
        t = time.perf_counter()
        cache.unpack(image)
        out["hit"].append(time.perf_counter() - t)
        t = time.perf_counter()
        ImageCache(os.path.join(root, "c")).unpack(image)
        out["hit_new_cache"].append(time.perf_counter() - t)
    finally:
        shutil.rmtree(root)
print(json.dumps(out))
'''


def _image(root: str) -> str:
    """Three gzip layers, 60 small files and a 256 KiB one: a handler image's shape."""
    base = [Member("app/", "dir"), *[Member(f"app/m{i}.py", data=b"x = 1\n" * 50)
                                    for i in range(60)]]
    return oci_layout(os.path.join(root, "img"), [
        base, [Member("data.bin", data=os.urandom(256 << 10))],
        [Member("corral/", "dir"), Member("corral/handler-base/", "dir"),
         Member("corral/handler-base/entrypoint.py", data=b"print('hi')\n")]])


def _worker(src: str | None, image: str, runs: int) -> dict[str, list[float]]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    proc = subprocess.run([sys.executable, "-c", WORKER, image, str(runs)], env=env,
                          capture_output=True, text=True, check=True)
    result: dict[str, list[float]] = json.loads(proc.stdout)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="src dir of the tree to compare against")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=10, help="unpacks per worker")
    args = ap.parse_args()
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    trees = {"after": here} | ({"before": args.before} if args.before else {})
    with tempfile.TemporaryDirectory() as tmp:
        image = _image(tmp)
        got: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
        for _ in range(args.rounds):
            for name, src in trees.items():
                for k, v in _worker(src, image, args.runs).items():
                    got[name].setdefault(k, []).extend(v)
    for k in ("cold", "hit", "hit_new_cache"):
        med = {t: statistics.median(got[t][k]) * 1000 for t in trees}
        row = "  ".join(f"{t} {ms:7.2f} ms" for t, ms in med.items())
        ratio = f"  after/before {med['after'] / med['before']:.2f}" if "before" in med else ""
        print(f"{k:14} {row}{ratio}")


if __name__ == "__main__":
    main()
