"""``corral env build / ls / rm / inspect``: environments (docs/environments.md).

``build NAME -r requirements.txt`` runs ``pip install`` inside a strict sandbox whose
network allows only the index, and stores the result read-only under its inputs'
digest (a second build with the same inputs is a cache hit: no sandbox, no
network); ``ls`` lists the built ones; ``rm NAME`` removes one; ``inspect NAME``
prints its metadata as JSON. ``--store`` picks the store (default
``$CORRAL_ENV_DIR``, for root /var/cache/corral/envs, else ~/.cache/corral/envs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from corral.cli._common import size_text

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    """Register the ``env`` verb and its sub-verbs."""
    p = subparsers.add_parser(
        "env", help="build, list, remove and inspect environments (packages for sandboxes)",
        description="Environments: packages built once in a strict sandbox, cached "
                    "read-only, used with --environment (docs/environments.md).")
    p.add_argument("--store", metavar="DIR", help="the environment store (default: "
                   "$CORRAL_ENV_DIR; for root /var/cache/corral/envs, else "
                   "~/.cache/corral/envs)")
    p.add_argument("--max-store-mb", type=int, default=None, metavar="MB",
                   help="the store's size bound (least recently used evicted past it; "
                        "default 8192)")
    sub = p.add_subparsers(dest="env_verb", required=True, metavar="SUBVERB",
                           parser_class=type(p))
    b = sub.add_parser("build", help="build an environment from requirements")
    b.add_argument("name")
    b.add_argument("packages", nargs="*", metavar="REQ", help="requirement lines")
    b.add_argument("-r", "--requirement", action="append", default=[], metavar="FILE",
                   help="a requirements file (names and versions only; no options)")
    b.add_argument("--index-url", default=None, metavar="URL",
                   help="the package index (default https://pypi.org/simple/)")
    b.add_argument("--index-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="a host the build may reach (default: the index's own)")
    b.add_argument("--allow-host", action="append", default=[], metavar="ENTRY",
                   help="one more network entry, e.g. the index's address as ip/32:443 "
                        "where the host resolves it to a private range")
    b.add_argument("--allow-source", action="store_true",
                   help="let pip build sdists (their build back ends run in the sandbox); "
                        "default wheels only")
    b.add_argument("--cert", metavar="PEM", help="more CA certificates the index needs")
    b.add_argument("--image", default=None, metavar="REF",
                   help="a base image (registry reference or OCI layout): the install runs "
                        "with the image's own python3 and pip, in a sandbox whose root is "
                        "the image; use it with --image REF --environment NAME")
    b.add_argument("--image-cache", default=None, metavar="DIR",
                   help="the image cache the base image is resolved in (default: the "
                        "image cache's default dir, as corral run --image)")
    b.add_argument("--timeout", type=float, default=900.0, metavar="S",
                   help="seconds the install may take (default 900)")
    b.add_argument("--mem-mb", type=int, default=2048, help="build memory (default 2048)")
    b.add_argument("--disk-mb", type=int, default=2048, help="build disk (default 2048)")
    b.add_argument("--json", action="store_true", help="print JSON")
    ls = sub.add_parser("ls", help="list built environments")
    ls.add_argument("--json", action="store_true", help="print JSON")
    rm = sub.add_parser("rm", help="remove environments (a name or a digest)")
    rm.add_argument("ref", nargs="+")
    insp = sub.add_parser("inspect", help="print an environment's metadata as JSON")
    insp.add_argument("ref")
    p.set_defaults(handler=run)



def run(args: argparse.Namespace) -> int:
    from corral.envs.store import DEFAULT_MAX_BYTES, EnvStore
    max_bytes = DEFAULT_MAX_BYTES if args.max_store_mb is None else args.max_store_mb << 20
    store = EnvStore(args.store, max_bytes=max_bytes)
    if args.env_verb == "build":
        return _build(args, store)
    if args.env_verb == "ls":
        envs = store.all()
        if args.json:
            print(json.dumps({"environments": [_doc(e) for e in envs],
                              "store": str(store.root)}, indent=2))
            return 0
        now = time.time()
        rows = [("NAME", "DIGEST", "SIZE", "LAST USED", "MODULES")]
        for e in envs:
            ago = max(0, int(now - store.last_used(e.digest)))
            rows.append((e.name or "-", e.digest[:12], size_text(e.size_bytes),
                         f"{ago // 60} min ago" if ago >= 60 else f"{ago} s ago",
                         " ".join(sorted(e.modules))[:60]))
        widths = [max(len(r[c]) for r in rows) for c in range(4)]
        for r in rows:
            print(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  "
                  f"{r[3]:<{widths[3]}}  {r[4]}")
        used, cap = size_text(store.total_bytes()), size_text(store.max_bytes)
        print(f"store {store.root}: {used} of {cap}")
        return 0
    if args.env_verb == "rm":
        for ref in args.ref:
            gone = store.remove(ref)
            print(f"removed {ref}" + (f" ({', '.join(d[:12] for d in gone)})" if gone else ""))
        return 0
    env = store.get(args.ref)
    doc = dict(env.meta)
    doc["name"] = env.name
    doc["path"] = str(env.path)
    doc.pop("pip_log_tail", None)
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


def _doc(e: Any) -> dict[str, Any]:
    return {"name": e.name, "digest": e.digest, "path": str(e.path),
            "size_bytes": e.size_bytes, "modules": sorted(e.modules),
            "requirements": list(e.requirements), "image": e.image}


def _build(args: argparse.Namespace, store: Any) -> int:
    from corral.core.errors import ConfigInvalidError
    from corral.core.spec import SandboxLimits
    from corral.envs import BuildOptions, build
    lines = list(args.packages)
    for path in args.requirement:
        try:
            with open(path, encoding="utf-8") as f:
                lines.extend(f.read(1 << 20).splitlines())
        except OSError as e:
            raise ConfigInvalidError("--requirement", f"cannot read {path!r}: {e}") from None
    kw: dict[str, Any] = {}
    if args.index_url:
        kw["index_url"] = args.index_url
    if args.cert:
        try:
            with open(args.cert, "rb") as f:
                kw["cert_pem"] = f.read(1 << 20)
        except OSError as e:
            raise ConfigInvalidError("--cert", f"cannot read {args.cert!r}: {e}") from None
    opts = BuildOptions(index_hosts=tuple(args.index_host), extra_hosts=tuple(args.allow_host),
                        allow_source=args.allow_source, timeout_s=args.timeout,
                        limits=SandboxLimits(mem_mb=args.mem_mb, disk_mb=args.disk_mb,
                                             max_processes=256), **kw)
    t0 = time.monotonic()
    env = build(args.name, lines, options=opts, store=store, image=args.image,
                image_cache_dir=args.image_cache)
    took = time.monotonic() - t0
    if args.json:
        print(json.dumps({**_doc(env), "seconds": round(took, 3)}, indent=2))
    else:
        on = f"\n  on image {env.image}" if env.image else ""
        print(f"{env.name}: sha256:{env.digest}\n  {size_text(env.size_bytes)}, "
              f"modules: {' '.join(sorted(env.modules))}{on}\n  {took:.2f} s")
    return 0
