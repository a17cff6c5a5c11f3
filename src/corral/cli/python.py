"""``corral python FILE.py | - | -c CODE``: run a snippet, show its transcript.

For a person: the log lines (stderr and logging lines tagged; on a terminal
printed as the snippet writes them), then the result (``=> repr``), the
facts, the errors with their sanitized tracebacks and what was truncated.
``--json`` prints the transcript as one JSON object. Exit status: 0 when the
snippet ran without an error, 1 when it raised or the validator refused it,
124 when it timed out; otherwise the table of ``docs/cli.md`` (64 for a bad
option or a file that does not exist, 69 when the level is not available
here, 70 for an internal error).

The code comes from ``-c CODE``, a file, or ``-`` (stdin). A bare argument
that is not an existing file is still taken as code (``corral python
'1+1'``), except one that can only be a file name (one word ending in
``.py``): that one is an error (exit 64), never run as code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from corral.cli._common import duration_ms
from corral.cli._style import LiveStatus, Palette, is_tty
from corral.cli._terminal import sanitize
from corral.core.errors import ConfigInvalidError

if TYPE_CHECKING:
    from collections.abc import Callable

    from corral.snippets.host.transcript import LogLine, Transcript

#: --timeout when not given (the snippet runner's own default; a test keeps them equal)
DEFAULT_TIMEOUT_MS = 5000
#: the snippet runner's range for timeout_ms (corral.snippets.host.runner clamps to it;
#: a test keeps them equal): outside it, the CLI says it clamped
MIN_TIMEOUT_MS = 100
MAX_TIMEOUT_MS = 10_000

__all__ = ["add_parser", "live_logs", "render", "run"]

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
    p.add_argument("code", metavar="FILE.py|-|CODE", nargs="?", default=None,
                   help="a .py file (run as main.py), - for stdin, or the source itself "
                        "(a missing FILE.py is an error, not code)")
    p.add_argument("-c", dest="source", default=None, metavar="CODE",
                   help="the snippet's source, given inline")
    p.add_argument("--module", action="append", default=[], metavar="FILE.py",
                   help="another payload file, importable by its file name (repeatable)")
    p.add_argument("--json", action="store_true", help="print the transcript as JSON")
    p.add_argument("--level", choices=("strict", "context-isolated"), default="strict",
                   help="isolation level (default strict)")
    p.add_argument("--timeout", type=duration_ms, default=DEFAULT_TIMEOUT_MS, metavar="TIME",
                   help="wall-clock timeout: 500ms, 5s (a plain number is ms); the runner "
                        "allows [100 ms, 10 s]: a value outside is clamped, and said on "
                        "stderr (default 5s)")
    p.add_argument("--tenant", default="cli", help="tenant id (default cli)")
    p.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="let the strict snippet reach HOST through its egress proxy "
                        "(repeatable; implies --network allowlist; see docs/network.md)")
    p.add_argument("--network", choices=("none", "allowlist", "unrestricted"), default=None,
                   help="network policy of the strict snippet's sandbox (default none)")
    p.add_argument("--allow-import", action="append", default=[], metavar="MODULE",
                   help="allow importing MODULE besides the default stdlib allowlist "
                        "(repeatable; e.g. urllib.request to use the network)")
    p.add_argument("--environment", default=None, metavar="NAME",
                   help="run in a built environment (corral env build): its packages are "
                        "importable and its top-level modules allowed (strict only; "
                        "docs/environments.md)")
    p.add_argument("--limits", choices=("auto", "cgroup", "rlimit"), default="auto",
                   help="how the strict sandbox holds memory, processes and cpu: auto (the "
                        "default: cgroup where this user's cgroups give them, else rlimits "
                        "per process, as corral doctor says), cgroup (refused where there "
                        "is none), or rlimit")
    p.set_defaults(handler=run)


def _read(path: str, field: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigInvalidError(field, f"cannot read {path!r}: {exc}") from None


#: one word ending in .py: a file name, never code
_FILE_NAME = re.compile(r"[^\s()\[\]{}'\";=+*]+\.py", re.IGNORECASE)


def _payload(args: argparse.Namespace) -> dict[str, str]:
    code: str | None = args.code
    if args.source is not None:
        if code is not None:
            raise ConfigInvalidError("-c", "give the code with -c or as FILE, not both")
        main = args.source
    elif code is None:
        raise ConfigInvalidError("code", "no code given: corral python FILE.py | - | -c CODE")
    elif code == "-":
        main = sys.stdin.read()
    elif os.path.isfile(code):
        main = _read(code, "code")
    elif _FILE_NAME.fullmatch(code.strip()):
        raise ConfigInvalidError("code", f"no such file: {code!r} (for inline code use -c)")
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


def _keep(text: str) -> str:
    return text


def _safe(text: str) -> str:
    """Untrusted text made harmless for a terminal (escape sequences shown as text)."""
    return sanitize(text.encode("utf-8", "surrogateescape")).decode("utf-8")


def _log_line(line: LogLine, paint: Callable[..., str], safe: Callable[[str], str]) -> str:
    """One log line as shown: stdout as is, the others tagged ``[stderr]`` / ``[log]``."""
    return (safe(line.text) if line.stream == "stdout" else
            f"{paint(f'[{line.stream}]', 'yellow')} {safe(line.text)}")


def render(t: Transcript, *, palette: Palette | None = None, terminal: bool = False,
           logs: bool = True) -> str:
    """The transcript as text for a person. ``terminal``: every piece that came from
    the snippet (its logs, result, facts, errors, tracebacks, file names) is passed
    through the terminal sanitizer, so an escape sequence it printed shows as text
    and does nothing; ``palette`` colours corral's own parts. ``logs=False`` leaves the
    log lines out (they were shown live, :func:`live_logs`)."""
    paint = (palette or Palette(False)).paint
    safe = _safe if terminal else _keep
    out: list[str] = [_log_line(line, paint, safe) for line in t.logs] if logs else []
    if t.result is not None:
        out.append(f"{paint('=>', 'green', 'bold')} {safe(str(t.result))}")
    if t.facts:
        out.append(paint("facts:", "bold"))
        out.extend(f"  {safe(name)} = {safe(_fact(value))}" for name, value in t.facts.items())
    for e in t.errors:
        where = ""
        if e.line is not None:
            where = f" ({safe(e.path or 'main.py')}, line {e.line}"
            where += f", column {e.column})" if e.column is not None else ")"
        kind = f"{safe(e.type)} [{e.code}]" if e.code else safe(e.type)
        out.append(f"{paint('error:', 'red', 'bold')} {kind}: {safe(e.message)}{where}")
        if e.traceback:
            out.extend("  " + safe(line) for line in e.traceback.rstrip("\n").splitlines())
    if t.truncated:
        out.append(paint(f"(truncated: {', '.join(sorted(t.truncated))})", "yellow"))
    if not t.rejected:
        out.append(paint(f"({t.duration_ms:.1f} ms{', timed out' if t.timed_out else ''})",
                         "dim"))
    return "\n".join(out)


def live_logs(status: LiveStatus, palette: Palette) -> Callable[[LogLine], None]:
    """``run_snippet``'s ``on_log`` for a terminal: each line, sanitized and tagged as
    :func:`render` shows it, printed on stdout as it arrives (above the status line)."""
    def on_log(line: LogLine) -> None:
        status.write(sys.stdout, _log_line(line, palette.paint, _safe) + "\n")
    return on_log


async def _on_linux(limits_by: str, kw: dict[str, Any]) -> Transcript:
    """The snippet on a linux provider of its own that holds limits ``limits_by``."""
    from corral.providers.linux import LinuxProvider
    from corral.snippets.host.runner import run_snippet

    async with LinuxProvider(limits_by=limits_by, spares=0) as provider:
        return await run_snippet(provider=provider, **kw)


def run(args: argparse.Namespace) -> int:
    """Run the snippet; print the transcript; exit 0, 1 or 124."""
    # imported here, not at the top: every verb's module loads to build the parser
    from corral.snippets.host.runner import run_snippet_sync, shutdown_snippet_pool

    files = _payload(args)
    if args.level == "strict":  # the default: a snippet never falls back to a weaker level
        from corral.cli.run import strict_verdict
        usable, why = strict_verdict()
        if not usable:
            from corral.core.errors import LevelNotSupportedError
            raise LevelNotSupportedError(
                "strict", ("context-isolated",), missing=why,
                detail="snippets run at strict by default and never below it unasked; "
                       "--level context-isolated runs them in a child process, NOT a "
                       "security boundary (`corral doctor` says what strict lacks here)")
    used = min(max(args.timeout, MIN_TIMEOUT_MS), MAX_TIMEOUT_MS)
    notes: list[str] = []
    if used != args.timeout:
        notes.append(f"--timeout {args.timeout} ms is outside the snippet runner's range "
                     f"[{MIN_TIMEOUT_MS}, {MAX_TIMEOUT_MS}] ms: clamped to {used} ms")
        print(f"corral: note: {notes[-1]}", file=sys.stderr)
    from corral.cli.run import _network
    from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS
    network = _network(args)
    allowed = (DEFAULT_ALLOWED_IMPORTS | frozenset(args.allow_import)
               if args.allow_import else None)
    if args.environment is not None:
        if args.level != "strict":
            raise ConfigInvalidError("--environment", "an environment needs --level strict")
        from corral.envs.store import EnvStore
        env = EnvStore().get(args.environment)
        if allowed is not None:
            allowed |= env.allowed_imports()
    status = LiveStatus(f"running a snippet at {args.level}", stream=sys.stderr,
                        enabled=is_tty(sys.stderr) and not args.json,
                        palette=Palette.for_stream(sys.stderr))
    # on a terminal the log lines are printed as they come (sanitized); a pipe gets the
    # transcript in one piece at the end, exactly as before
    live = not args.json and is_tty(sys.stdout)
    out_palette = Palette.for_stream(sys.stdout)
    if args.limits != "auto" and args.level != "strict":
        raise ConfigInvalidError("--limits", "applies to --level strict only (context-"
                                 "isolated holds each run by its own rlimits)")
    kw: dict[str, Any] = dict(files=files, level=args.level, timeout_ms=used,
                              tenant_id=args.tenant, allowed_imports=allowed,
                              environment=args.environment,
                              network=network if network.kind != "none" else None,
                              on_log=live_logs(status, out_palette) if live else None)
    try:
        with status:
            transcript = (run_snippet_sync(**kw) if args.limits == "auto"
                          else asyncio.run(_on_linux(args.limits, kw)))
    finally:
        shutdown_snippet_pool()
    held = "; ".join(f"{k}: {v}" for k, v in transcript.limits.items())
    if args.level == "strict" and any("rlimit" in v for v in transcript.limits.values()):
        # strict without its cgroup limits is said (the transcript's limits, in --json too)
        print(f"corral: note: limits: {held}", file=sys.stderr)
    if args.json:
        doc = transcript.to_dict()
        doc["timeout_ms"] = {"asked": args.timeout, "used": used}
        doc["notes"] = notes
        print(json.dumps(doc, ensure_ascii=False, indent=2))
    else:
        text = render(transcript, palette=out_palette, terminal=is_tty(sys.stdout),
                      logs=not live)
        if text:
            print(text)
    if transcript.timed_out:
        return EXIT_TIMEOUT
    return EXIT_OK if transcript.ok else EXIT_FAILED
