"""The oci provider (crun; runsc where installed) against the linux provider and podman.

Usage: .venv/bin/python benchmarks/bench_oci.py [--runs N]

Rows, each a cold create + exec + destroy of one sandbox running ``true`` (every
variant once per round, interleaved, the order reversed every other round; N rounds
after one discarded warm-up round):

- ``linux``: the linux provider (strict), default root; and the image as the root;
- ``oci/crun``: default root (the host's /usr read-only) and the image as the root;
- ``oci/runsc``: the same, where gVisor's runsc is installed;
- ``podman run --rm`` of the same image (``--network=none``; podman 4.3 runs it with
  crun, its storage private to the run, the image pulled once before the clock), where
  podman is installed (``apt-get install podman``); the row says so when it is not.

The image is a busybox-static root (one gzip layer, ``/bin/true`` a busybox applet),
built here as an OCI layout. A second table times one ``exec`` of ``true`` into a live
sandbox. Figures are medians (p90) in ms; "ratio" is the median of the pairwise ratios
against ``linux`` (default root) of the same round. The machine is shared: compare the
ratios of one run, not absolute figures across runs. A row that cannot run says why.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "dispatch"))

from imagebuild import Member, oci_layout

from corral.core.errors import CorralError
from corral.core.spec import SandboxSpec

Step = Callable[[], Awaitable[None]]


def busybox_image(root: str) -> str:
    bb = shutil.which("busybox")
    if bb is None:
        raise SystemExit("needs busybox-static (apt-get install busybox-static)")
    with open(bb, "rb") as f:
        data = f.read()
    members = [Member("bin", "dir", mode=0o755), Member("bin/busybox", data=data, mode=0o755)]
    members += [Member(f"bin/{a}", "symlink", link="busybox") for a in ("sh", "true", "echo")]
    return oci_layout(os.path.join(root, "bb"), [members], config={"Env": ["PATH=/bin"]})


def _cold(provider: Any, spec: SandboxSpec, argv: list[str]) -> Step:
    async def step() -> None:
        sb = await provider.create(spec)
        try:
            r = await sb.exec(argv)
            if r.exit_code != 0:
                raise RuntimeError(f"exit {r.exit_code}: {r.stderr[-200:]!r}")
        finally:
            await sb.destroy()
    return step


#: cgroup v2 mounted next to v1 hierarchies: crun (podman's runtime) refuses such a
#: host unless that mount is hidden in the container's mount namespace (WORKSPACE.md)
HYBRID_V2 = "/sys/fs/cgroup/unified"


class Podman:
    """``podman run --rm`` of the bench's image with a private storage (``--root`` and
    ``--runroot`` in the bench's temp dir, so nothing lands in /var/lib/containers), the
    image pulled into it once, before the clock. Limits podman sets above this host's
    hard rlimits are lowered (``--ulimit``: crun cannot raise them), and on a host with
    hybrid cgroups each run is started in a private mount namespace without the cgroup2
    mount (``unshare --mount``, as the oci provider does for crun)."""

    def __init__(self, layout: str, tmp: str) -> None:
        self.base = ["podman", "--root", os.path.join(tmp, "podman-root"), "--runroot",
                     os.path.join(tmp, "podman-run"), "--cgroup-manager", "cgroupfs",
                     "--events-backend", "none"]
        done = subprocess.run([*self.base, "pull", "-q", "oci:" + layout],
                              capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"podman pull: {done.stderr[-200:]}")
        self.image = done.stdout.strip().splitlines()[-1]

    def argv(self, *cmd: str) -> list[str]:
        run = [*self.base, "run", "--rm", "--network=none", "--ulimit", "nofile=1024:1024",
               "--ulimit", "nproc=1024:1024", self.image, *cmd]
        if not os.path.ismount(HYBRID_V2):
            return run
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'umount {HYBRID_V2} && exec "$@"', "podman-run", *run]

    def step(self) -> Step:
        async def step() -> None:
            p = await asyncio.create_subprocess_exec(
                *self.argv("true"), stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE)
            _, err = await p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"podman exit {p.returncode}: {err[-200:]!r}")
        return step

    def close(self) -> None:
        subprocess.run([*self.base, "system", "reset", "--force"], capture_output=True,
                       timeout=120, check=False)


async def _try(step: Step) -> str:
    try:
        await step()
    except (CorralError, RuntimeError, OSError) as e:
        return f"{type(e).__name__}: {e}"[:160]
    return ""


def _stats(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)
    return statistics.median(s) * 1000, s[min(len(s) - 1, int(len(s) * 0.9))] * 1000


async def _table(title: str, rows: dict[str, Step], runs: int, base: str) -> None:
    skipped: dict[str, str] = {}
    for name, step in list(rows.items()):  # the warm-up round, which also says who can run
        why = await _try(step)
        if why:
            skipped[name] = why
            del rows[name]
    times: dict[str, list[float]] = {n: [] for n in rows}
    names = list(rows)
    for i in range(runs):
        for name in names if i % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            await rows[name]()
            times[name].append(time.perf_counter() - t)
    print(f"\n{title} ({runs} rounds)")
    print(f"  {'variant':<28} {'median ms':>10} {'p90 ms':>8} {'ratio':>7}")
    for name in names:
        med, p90 = _stats(times[name])
        ratio = ""
        if base in times:
            pairs = zip(times[name], times[base], strict=True)
            ratio = f"{statistics.median(a / b for a, b in pairs):.2f}x"
        print(f"  {name:<28} {med:>10.1f} {p90:>8.1f} {ratio:>7}")
    for name, why in skipped.items():
        print(f"  {name:<28} skipped: {why}")


async def main(runs: int) -> None:
    from corral.providers.linux import LinuxProvider
    from corral.providers.oci import OciProvider
    tmp = tempfile.mkdtemp(prefix="corral-bench-oci-")
    os.chmod(tmp, 0o711)  # the linux provider's sandbox user must reach its image cache
    providers: list[Any] = []
    cleanups: list[Callable[[], None]] = []
    try:
        image = busybox_image(tmp)
        plain = SandboxSpec()
        with_image = SandboxSpec(image=image)  # the image as the root (its own /bin/true)
        linux = LinuxProvider(spares=0, image_cache_dir=os.path.join(tmp, "cache-linux"))
        providers.append(linux)
        cold: dict[str, Step] = {
            "linux (host root)": _cold(linux, plain, ["/bin/true"]),
            "linux (image)": _cold(linux, with_image, ["/bin/true"]),
        }
        live: dict[str, Any] = {"linux (host root)": (linux, plain)}
        for runtime in ("crun", "runsc"):
            try:
                p = OciProvider(runtime, image_cache_dir=os.path.join(tmp, f"cache-{runtime}"))
            except CorralError as e:
                why = getattr(e, "missing", "") or str(e)
                cold[f"oci/{runtime}"] = _fail(why)
                continue
            providers.append(p)
            cold[f"oci/{runtime} (host root)"] = _cold(p, plain, ["/bin/true"])
            cold[f"oci/{runtime} (image)"] = _cold(p, with_image, ["/bin/true"])
            live[f"oci/{runtime} (host root)"] = (p, plain)
        if shutil.which("podman"):
            try:
                podman = Podman(image, tmp)
                cleanups.append(podman.close)
                cold["podman run --rm (image)"] = podman.step()
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                cold["podman run --rm (image)"] = _fail(str(e))
        else:
            cold["podman run --rm (image)"] = _fail(
                "podman is not installed (apt-get install podman)")
        await _table("cold create + exec true + destroy", cold, runs, "linux (host root)")

        sandboxes = {}
        execs: dict[str, Step] = {}
        for name, (p, spec) in live.items():
            sb = sandboxes[name] = await p.create(spec)

            def run(sb: Any = sb) -> Awaitable[None]:
                return sb.exec(["/bin/true"])

            execs[name] = run
        try:
            await _table("exec true into a live sandbox", execs, runs, "linux (host root)")
        finally:
            for sb in sandboxes.values():
                await sb.destroy()
    finally:
        for p in providers:
            await p.aclose()
        for cleanup in cleanups:
            cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def _fail(why: str) -> Step:
    async def step() -> None:
        raise RuntimeError(why)
    return step


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ns = ap.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(
        os.path.dirname(__file__), "..", "src")], check=False)
    asyncio.run(main(ns.runs))
