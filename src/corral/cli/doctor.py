"""``corral doctor``: what each provider can enforce on this host, and why not.

Plain aligned text for a person, or ``--json`` for a machine, both on stdout
(the report is the command's result). Exits 0 whatever the host lacks: the
report says it; a script that needs strict checks ``providers[].usable`` in
the JSON. See docs/doctor.md for what each row means and how to fix a "no".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["add_parser", "collect", "render", "run"]


def add_parser(subparsers: Any) -> None:
    """Register the ``doctor`` verb."""
    p = subparsers.add_parser(
        "doctor", help="show what each provider can enforce on this host",
        description="Show, for this host, what each provider enforces (namespaces, seccomp, "
                    "Landlock, cgroup controllers, user namespaces) and why not.")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--ray", metavar="ADDRESS", help="report each node of the Ray cluster at "
                   "ADDRESS instead (needs corral[ray]; docs/scale-out.md)")
    p.set_defaults(handler=run)


def collect() -> dict[str, Any]:
    """The report as JSON-safe data: ``host`` facts and ``providers`` rows."""
    if not sys.platform.startswith("linux"):
        return {"host": {"kernel": os.uname().release, "platform": sys.platform, "checks": []},
                "providers": [_not_linux()]}
    from corral.providers.linux.host import hostinfo
    from corral.providers.oci import doctor as oci_doctor
    info = hostinfo.probe()
    return {"host": info.to_dict(),
            "providers": [r.to_dict() for r in hostinfo.providers_report(info)]
            + oci_doctor.providers_report()}


def _not_linux() -> dict[str, Any]:
    return {"name": "linux", "level": "strict", "usable": False,
            "summary": f"strict needs Linux; this is {sys.platform}", "rows": []}


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def _table(rows: Sequence[tuple[str, str, str]], indent: str) -> list[str]:
    if not rows:
        return []
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return [f"{indent}{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows]


def render(report: dict[str, Any]) -> str:
    """The report as aligned plain text."""
    host = report["host"]
    who = "root" if host.get("is_root") else f"uid {host.get('uid', '?')}"
    lines = [f"corral doctor: kernel {host.get('kernel', '?')}, {host.get('arch', '?')}, {who}",
             "", "Host primitives"]
    lines += _table([(_yes(c["ok"]), c["name"], c["detail"]) for c in host["checks"]], "  ")
    lines += ["", "Providers"]
    for p in report["providers"]:
        state = "usable" if p["usable"] else "NOT usable"
        lines += ["", f"  {p['name']} (level {p['level']}): {state}; {p['summary']}"]
        lines += _table([(_yes(r["enforced"]), r["what"], r["how"]) for r in p["rows"]], "    ")
        if p.get("limits"):  # what the doors that take the strongest do (docs/doctor.md)
            lines += ["", f"    limits by {p['limits_by']} (corral python, run_snippet, "
                          "corral mcp):"]
            lines += _table([("", k, v) for k, v in p["limits"].items()], "     ")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Print the report; always exit 0 (the report says what is missing)."""
    if getattr(args, "ray", None):  # the cluster's nodes (corral.providers.ray.doctor)
        from corral.providers.ray import doctor as ray_doctor
        rep = ray_doctor.collect(args.ray)
        sys.stdout.write(json.dumps(rep, indent=2) + "\n" if args.json else ray_doctor.render(rep))
        return 0
    report = collect()
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render(report))
    return 0
