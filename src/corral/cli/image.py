"""``corral image pull / ls / rm / inspect``: the images pulled into the image cache.

``pull REF`` fetches an image from a registry the operator allows
(``$CORRAL_REGISTRIES`` or registries.toml; docs/images.md) into the cache's
OCI layout; ``ls`` lists pulled images and the cache's use of its size bound;
``rm REF`` forgets one (and deletes the blobs no other image uses); ``inspect
REF`` prints its manifest digest, layers and config as JSON. ``--cache-dir``
picks the cache (default ``$XDG_CACHE_HOME/corral/images``, for root
``/var/cache/corral/images``).
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
    """Register the ``image`` verb and its sub-verbs."""
    p = subparsers.add_parser(
        "image", help="pull, list, remove and inspect images in the image cache",
        description="Images pulled from OCI registries into corral's image cache "
                    "(docs/images.md).")
    p.add_argument("--cache-dir", metavar="DIR", help="the image cache (default: "
                   "$XDG_CACHE_HOME/corral/images; for root /var/cache/corral/images)")
    sub = p.add_subparsers(dest="image_verb", required=True, metavar="SUBVERB",
                           parser_class=type(p))
    pull = sub.add_parser("pull", help="pull an image by tag or digest")
    pull.add_argument("reference", help="[REGISTRY/]REPOSITORY[:TAG][@sha256:HEX]")
    pull.add_argument("--json", action="store_true", help="print JSON")
    pull.add_argument("--timeout", type=float, default=60.0, metavar="S",
                      help="seconds a connection or a read may stall (default 60)")
    pull.add_argument("--max-time", type=float, default=3600.0, metavar="S",
                      help="seconds the whole pull may take (default 3600)")
    ls = sub.add_parser("ls", help="list pulled images")
    ls.add_argument("--json", action="store_true", help="print JSON")
    rm = sub.add_parser("rm", help="remove pulled images")
    rm.add_argument("reference", nargs="+")
    insp = sub.add_parser("inspect", help="print a pulled image's manifest and config as JSON")
    insp.add_argument("reference")
    p.set_defaults(handler=run)



def run(args: argparse.Namespace) -> int:
    from corral.images.cache import ImageCache
    cache = ImageCache(args.cache_dir)
    store = cache.pulled
    if args.image_verb == "pull":
        img = cache.pull(args.reference, timeout_s=args.timeout, max_time_s=args.max_time)
        if args.json:
            print(json.dumps(img.to_dict(), indent=2))
        else:
            print(f"{img.reference}\n  manifest {img.manifest_digest}, "
                  f"{len(img.layers)} layers, {size_text(img.size)}")
        return 0
    if args.image_verb == "ls":
        images = store.images()
        if args.json:
            print(json.dumps({"images": [i.to_dict() for i in images],
                              "usage": cache.usage(), "max": cache.max_cache_bytes},
                             indent=2))
            return 0
        rows = [("REFERENCE", "MANIFEST", "SIZE", "LAST USED")]
        now = time.time()
        for i in images:
            ago = max(0, int(now - i.last_used))
            rows.append((i.reference, i.manifest_digest[:19], size_text(i.size),
                         f"{ago // 60} min ago" if ago >= 60 else f"{ago} s ago"))
        widths = [max(len(r[c]) for r in rows) for c in range(3)]
        for r in rows:
            print(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}")
        used, cap = size_text(cache.usage()), size_text(cache.max_cache_bytes)
        print(f"cache {cache.root}: {used} of {cap}")
        return 0
    if args.image_verb == "rm":
        for ref in args.reference:
            gone = store.remove(ref)
            print(f"removed {gone.reference}")
        return 0
    # inspect
    from corral.core.errors import ConfigInvalidError
    img2 = store.get(args.reference)
    if img2 is None:
        raise ConfigInvalidError("image", f"no pulled image {args.reference!r}; "
                                 "`corral image ls` lists them")
    doc = img2.to_dict()
    cfg = store.config(img2)
    run_cfg: dict[str, Any] = cfg["config"] if isinstance(cfg.get("config"), dict) else {}
    doc["platform"] = {"os": cfg.get("os"), "architecture": cfg.get("architecture")}
    doc["config"] = {k: run_cfg.get(k) for k in ("Entrypoint", "Cmd", "Env", "WorkingDir",
                                                 "User", "Labels") if k in run_cfg}
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    return 0
