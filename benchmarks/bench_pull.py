"""Pulling an image from a loopback registry: corral's pull against ``skopeo copy``.

    .venv/bin/python benchmarks/bench_pull.py            # --runs N (default 8)

Starts Debian's ``docker-registry`` on 127.0.0.1 (tests/images/regsupport.py), pushes
two images (busybox-static, ~1 MiB of layers; one random 32 MiB layer), then per round,
interleaved: ``ImageCache.pull`` into a fresh cache (cold), the same pull again (every
blob present: manifest requests only), and ``skopeo copy docker://... oci:DIR:1`` into
a fresh layout (cold). Reports medians in ms and corral/skopeo ratios. Needs
docker-registry and skopeo (scripts/test.sh installs both when run as root).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "images"))

import regsupport as rs

from corral.images.cache import ImageCache
from corral.images.reference import RegistryPolicy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    args = ap.parse_args()
    skopeo = shutil.which("skopeo")
    if rs.REGISTRY_BIN is None or skopeo is None:
        print("needs docker-registry and skopeo (apt-get install docker-registry skopeo)")
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-pull-") as d, \
            rs.registry(os.path.join(d, "reg")) as reg:
        images = {"busybox": rs.busybox_image({"app/hello.txt": "hi"}),
                  "big32": rs.image([rs.layer({"big": os.urandom(32 << 20)})])}
        for name, img in images.items():
            reg.push(f"bench/{name}", "1", img)
        pol = RegistryPolicy.of([], [reg.host])
        print(f"{'image':<8} {'corral cold':>12} {'corral again':>13} {'skopeo cold':>12} "
              f"{'cold ratio':>11}")
        for name in images:
            ref = f"{reg.host}/bench/{name}:1"
            cold, again, sk = [], [], []
            for i in range(args.runs + 1):  # the first round is a warm-up
                cache = ImageCache(os.path.join(d, f"c-{name}-{i}"))
                t = time.perf_counter()
                cache.pull(ref, policy=pol)
                cold.append(time.perf_counter() - t)
                t = time.perf_counter()
                cache.pull(ref, policy=pol)
                again.append(time.perf_counter() - t)
                t = time.perf_counter()
                subprocess.run([skopeo, "--tmpdir", d, "copy", "--quiet",
                                "--src-tls-verify=false", f"docker://{ref}",
                                f"oci:{os.path.join(d, f'sk-{name}-{i}')}:1"], check=True)
                sk.append(time.perf_counter() - t)
                shutil.rmtree(cache.root)
            c, a, s = (1000 * statistics.median(x[1:]) for x in (cold, again, sk))
            print(f"{name:<8} {c:>10.1f}ms {a:>11.1f}ms {s:>10.1f}ms {c / s:>10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
