"""An environment on a base image next to one on the host's interpreter: a miss and a
hit, side by side.

    .venv/bin/python benchmarks/bench_envs_image.py [--runs N]

The image is the test suite's cached Debian bookworm python3 root
(tests/linux/imageroot_support.py; debootstrapped on first use, about a minute) plus a
layer with pip (this venv's), written as an OCI layout and unpacked before the clock;
the index a loopback HTTPS index of one tiny local wheel (no PyPI). Rounds, each into
fresh stores: a host build (miss), a build on the image with its interpreter not yet
probed (miss + the probe sandbox), one with the probe's facts in the store (miss),
then ``--runs`` hits of each (the image's resolves the layout in the image cache each
time). Medians; the image rows as ratios to the host's of the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("images", "linux", ""):
    sys.path.insert(0, os.path.join(HERE, "..", "tests", sub))

import imageroot_support as irs  # noqa: E402
import regsupport as rs  # noqa: E402
from netservers import MapResolver, build_wheel, http_server, make_ca  # noqa: E402

from corral.envs import BuildOptions, EnvStore, build_environment  # noqa: E402


def _image(root: str) -> str:
    rootfs = irs.python_numpy_rootfs()
    if rootfs is None:
        raise SystemExit("the python3 test image needs root and debootstrap")
    path, diff_id = irs.rootfs_layer(rootfs)
    with open(path, "rb") as f:
        base = (f.read(), diff_id)
    spec = importlib.util.find_spec("pip")
    assert spec is not None and spec.submodule_search_locations
    src = spec.submodule_search_locations[0]
    files: dict[str, bytes | str] = {}
    for top, dirs, names in os.walk(src):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for n in names:
            if not n.endswith(".pyc"):
                rel = os.path.relpath(os.path.join(top, n), os.path.dirname(src))
                with open(os.path.join(top, n), "rb") as f:
                    files[f"usr/lib/python3/dist-packages/{rel}"] = f.read()
    img = rs.image([base, rs.layer(files)], {"Env": ["PATH=/usr/bin:/bin"]})
    return rs.write_layout(os.path.join(root, "layout"), {"v1": img}) + ":v1"


async def _timed(coro: Any) -> float:
    t = time.perf_counter()
    await coro
    return time.perf_counter() - t


async def main(runs: int, rounds: int, root: str) -> None:
    from corral.images import resolve
    from corral.images.cache import ImageCache
    from corral.providers.linux import LinuxProvider
    ref = _image(root)
    cache = os.path.join(root, "cache")
    os.mkdir(os.path.join(root, "ca"))
    ca = make_ca("pypi.test", within=os.path.join(root, "ca"))
    fn, whl = build_wheel("corraltoy", "1.0", "A = 1\n")
    index = {"/simple/": b'<a href="/simple/corraltoy/">corraltoy</a>',
             "/simple/corraltoy/": (f'<a href="/files/{fn}#sha256='
                                    f'{hashlib.sha256(whl).hexdigest()}">{fn}</a>').encode(),
             f"/files/{fn}": whl}
    t = time.perf_counter()
    await asyncio.to_thread(resolve, ref, cache=ImageCache(cache))
    print(f"image unpacked (before the clock): {time.perf_counter() - t:.2f} s")
    rows: dict[str, list[float]] = {k: [] for k in (
        "host miss", "image miss + probe", "image miss", "host hit", "image hit")}
    with http_server(index, ca.server_context()) as srv:
        opts = BuildOptions(index_url=f"https://pypi.test:{srv.port}/simple/",
                            index_hosts=(f"pypi.test:{srv.port}", f"127.0.0.1/32:{srv.port}"),
                            cert_pem=ca.ca_pem)
        p = LinuxProvider(spares=0, image_cache_dir=cache,
                          egress_resolver=MapResolver({"pypi.test": ["127.0.0.1"]}))
        try:
            for r in range(rounds):
                host = EnvStore(os.path.join(root, f"host{r}"))
                img1 = EnvStore(os.path.join(root, f"img{r}a"))
                img2 = EnvStore(os.path.join(root, f"img{r}b"))

                def b(store: EnvStore, image: str | None) -> Any:
                    return build_environment("t", ["corraltoy"], options=opts, store=store,
                                             provider=p, image=image, image_cache_dir=cache)
                rows["host miss"].append(await _timed(b(host, None)))
                rows["image miss + probe"].append(await _timed(b(img1, ref)))
                facts = img1.image_facts(next(iter(img1.all())).image or "")
                assert facts is not None
                img2.set_image_facts(str(facts["image"]), facts)
                rows["image miss"].append(await _timed(b(img2, ref)))
                for _ in range(runs):
                    rows["host hit"].append(await _timed(b(host, None)))
                    rows["image hit"].append(await _timed(b(img1, ref)))
        finally:
            await p.aclose()
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"{'':<20} {'median':>10}  vs host")
    for k, v in med.items():
        base = med["host hit" if "hit" in k else "host miss"]
        unit = (f"{v * 1000:8.2f} ms" if "hit" in k else f"{v:8.2f} s ")
        print(f"{k:<20} {unit}  {v / base:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50, help="hits per round (default 50)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of misses (default 3)")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="corral-bench-envs-image-", dir="/var/tmp")
    os.chmod(d, 0o755)
    try:
        asyncio.run(main(a.runs, a.rounds, d))
    finally:
        shutil.rmtree(d, ignore_errors=True)
