"""``corral python CODE`` or ``corral python FILE.py``: run a snippet, show its transcript.

For a person: the log lines (stderr and logging lines tagged), then the
result (``=> repr``), the facts, the errors with their sanitized tracebacks
and what was truncated. ``--json`` prints the transcript as one JSON object.
Exit status: 0 when the snippet ran without an error, 1 when it raised or
the validator refused it, 124 when it timed out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from corral.core.errors import ConfigInvalidError

if TYPE_CHECKING:
    from corral.snippets.host.transcript import Transcript

#: --timeout when not given (the snippet runner's own default; a test keeps them equal)
DEFAULT_TIMEOUT_MS = 5000

__all__ = ["add_parser", "render", "run"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_TIMEOUT = 124


def add_parser(subparsers: Any) -> None:
    """Register the ``python`` verb."""
    p = subparsers.add_parser(
        "python", help="run a Python snippet in a warm sandbox and show its transcript",
        description="Validate a Python snippet (allow-listed stdlib imports only) and run it "
                    "in a strict sandbox; print its logs, result, facts and errors. Exit 0 if "
                    "it ran cleanly, 1 if it raised or was rejected, 124 on timeout.")
    p.add_argument("code", metavar="CODE|FILE.py",
                   help="the snippet's source, a .py file (main.py), or - for stdin")
    p.add_argument("--module", action="append", default=[], metavar="FILE.py",
                   help="another payload file, importable by its file name (repeatable)")
    p.add_argument("--json", action="store_true", help="print the transcript as JSON")
    p.add_argument("--level", choices=("strict", "context-isolated"), default="strict",
                   help="isolation level (default strict)")
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_MS, metavar="MS",
                   help="wall-clock timeout in ms, clamped to [100, 10000] (default 5000)")
    p.add_argument("--tenant", default="cli", help="tenant id (default cli)")
    p.set_defaults(handler=run)


def _read(path: str, field: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigInvalidError(field, f"cannot read {path!r}: {exc}") from None


def _payload(args: argparse.Namespace) -> dict[str, str]:
    code: str = args.code
    if code == "-":
        main = sys.stdin.read()
    elif code.endswith(".py") and "\n" not in code and os.path.isfile(code):
        main = _read(code, "code")
    else:
        main = code
    files = {"main.py": main}
    for path in args.module:
        name = os.path.basename(path)
        if name in files:
            raise ConfigInvalidError("--module", f"{name!r} is given twice")
        files[name] = _read(path, "--module")
    return files


def _fact(value: Any) -> str:
    from corral.snippets.host.transcript import thaw

    return json.dumps(thaw(value), ensure_ascii=False)


def render(t: Transcript) -> str:
    """The transcript as text for a person."""
    out: list[str] = []
    for line in t.logs:
        out.append(line.text if line.stream == "stdout" else f"[{line.stream}] {line.text}")
    if t.result is not None:
        out.append(f"=> {t.result}")
    if t.facts:
        out.append("facts:")
        out.extend(f"  {name} = {_fact(value)}" for name, value in t.facts.items())
    for e in t.errors:
        where = ""
        if e.line is not None:
            where = f" ({e.path or 'main.py'}, line {e.line}"
            where += f", column {e.column})" if e.column is not None else ")"
        kind = f"{e.type} [{e.code}]" if e.code else e.type
        out.append(f"error: {kind}: {e.message}{where}")
        if e.traceback:
            out.extend("  " + line for line in e.traceback.rstrip("\n").splitlines())
    if t.truncated:
        out.append(f"(truncated: {', '.join(sorted(t.truncated))})")
    if not t.rejected:
        out.append(f"({t.duration_ms:.1f} ms{', timed out' if t.timed_out else ''})")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    """Run the snippet; print the transcript; exit 0, 1 or 124."""
    # imported here, not at the top: every verb's module loads to build the parser
    from corral.snippets.host.runner import run_snippet_sync, shutdown_snippet_pool

    files = _payload(args)
    try:
        transcript = run_snippet_sync(files=files, level=args.level, timeout_ms=args.timeout,
                                      tenant_id=args.tenant)
    finally:
        shutdown_snippet_pool()
    if args.json:
        print(json.dumps(transcript.to_dict(), ensure_ascii=False, indent=2))
    else:
        print(render(transcript))
    if transcript.timed_out:
        return EXIT_TIMEOUT
    return EXIT_OK if transcript.ok else EXIT_FAILED
