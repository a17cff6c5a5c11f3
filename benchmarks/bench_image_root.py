"""The image as the strict sandbox's root: what it costs next to the default view.

    .venv/bin/python benchmarks/bench_image_root.py [--runs N]
    .venv/bin/python benchmarks/bench_image_root.py --before /tmp/old/src   # A/B default

Library path, one warm ``LinuxProvider(spares=0)`` per worker (its fork server
started, the image unpacked before the clock): create + ``exec true`` (the image's
``/bin/true`` or the host's ``/bin/true``) + destroy, for the default view (no image),
a busybox-static image root and, when it is cached (tests/linux/imageroot_support.py),
the Debian python3-numpy root (its ``/etc`` has ~100 entries, each bound). Then the
whole CLI (the console script): ``corral run -- /bin/true`` (the one-shot path) against ``corral run
--image BUSYBOX -- true`` (the one-shot path too, since it takes ``--image``) and the
same through ``python -m corral`` (the full CLI: the library path with its fork server,
what ``--image`` took before). Rows interleaved per round (the order reversed every other round);
medians in ms and the median of the per-round ratios against the default row.

``--before`` runs the default (no image) row in a worker importing another tree's
``src`` (``git archive <rev> src | tar -x -C /tmp/old``) next to this tree's:
the default path's time before and after, as a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "linux"))

from imageroot_support import CACHE, busybox_layout  # noqa: E402

WORKER = r'''
import asyncio, json, sys, time
from corral.core.spec import SandboxSpec
from corral.providers.linux import LinuxProvider
image, runs, cache = (sys.argv[1] or None), int(sys.argv[2]), sys.argv[3]
async def main():
    out = []
    async with LinuxProvider(spares=0, image_cache_dir=cache) as p:
        spec = SandboxSpec(tenant_id="bench", image=image)
        sb = await p.create(spec)  # warm: fork server up, image unpacked
        await sb.destroy()
        for _ in range(runs):
            t = time.perf_counter()
            sb = await p.create(spec)
            r = await sb.exec(["/bin/true"])
            await sb.destroy()
            out.append((time.perf_counter() - t) * 1000)
            assert r.exit_code == 0, r.stderr
    print(json.dumps(out))
asyncio.run(main())
'''


def worker(src: str, image: str, runs: int, cache: str) -> list[float]:
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run([sys.executable, "-c", WORKER, image, str(runs), cache],
                          capture_output=True, text=True, env=env, check=True, timeout=600)
    return list(json.loads(done.stdout))


def cli(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, env=env, capture_output=True, timeout=120)
    return (time.perf_counter() - t) * 1000


def table(rows: dict[str, list[float]], base: str) -> None:
    print(f"{'':34} {'median ms':>10} {'ratio':>7}")
    for name, xs in rows.items():
        ratios = [a / b for a, b in zip(xs, rows[base], strict=True)]
        print(f"{name:34} {statistics.median(xs):10.1f} {statistics.median(ratios):7.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=10, help="rounds (default 10)")
    ap.add_argument("--before", default=None, metavar="SRC",
                    help="another tree's src dir: its default row next to this one's")
    args = ap.parse_args()
    src = os.path.join(HERE, "..", "src")
    work = tempfile.mkdtemp(prefix="bench-image-root-", dir="/var/tmp")
    os.chmod(work, 0o755)
    try:
        bb = busybox_layout(os.path.join(work, "bb"), {"Env": ["PATH=/bin"]})
        images = {"default (no image)": "", "busybox image root": bb}
        numpy_root = next((os.path.join(CACHE, k, "rootfs") for k in sorted(os.listdir(CACHE))
                           if os.path.isdir(os.path.join(CACHE, k, "rootfs"))), None) \
            if os.path.isdir(CACHE) else None
        if numpy_root:
            images["debian python3-numpy image root"] = numpy_root
        cache = os.path.join(work, "cache")
        rows: dict[str, list[float]] = {n: [] for n in images}
        if args.before:
            rows["default, --before tree"] = []
        order = [(n, src, i) for n, i in images.items()]
        if args.before:
            order.append(("default, --before tree", args.before, ""))
        for k in range(args.runs):  # one sandbox per worker call, interleaved
            for name, tree, image in (order if k % 2 == 0 else order[::-1]):
                rows[name] += worker(tree, image, 1, cache)
        print("library: create + exec /bin/true + destroy (warm provider)")
        table(rows, "default (no image)")
        env = {**os.environ, "XDG_CACHE_HOME": os.path.join(work, "xdg")}
        script = os.path.join(os.path.dirname(sys.executable), "corral")  # the console script
        corral = [script if os.path.exists(script) else "corral", "run", "--level", "strict"]
        cli([*corral, "--image", bb, "--", "true"], env)  # unpack once
        # ``python -m corral`` is the full CLI only: the library path, with its fork server
        library = [sys.executable, "-m", "corral", "run", "--level", "strict"]
        clis: dict[str, list[float]] = {"corral run -- /bin/true": [],
                                        "corral run --image BUSYBOX -- true": [],
                                        "  the same on the library path": []}
        for _ in range(args.runs):
            clis["corral run -- /bin/true"].append(cli([*corral, "--", "/bin/true"], env))
            clis["corral run --image BUSYBOX -- true"].append(
                cli([*corral, "--image", bb, "--", "true"], env))
            clis["  the same on the library path"].append(
                cli([*library, "--image", bb, "--", "true"], env))
        print("\nCLI, whole process (the corral console script)")
        table(clis, "corral run -- /bin/true")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
