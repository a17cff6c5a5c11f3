"""``corral session``: a live Python interpreter in a strict sandbox (docs/sessions.md).

On a terminal it is a REPL: ``>>>`` / ``...`` prompts (a cell ends where Python's own
REPL would end it), each cell's output as it is written, then its value; a display item
is shown by its ``text/plain`` (an image by its type and size; ``--save-images DIR``
writes each PNG there). Ctrl-C interrupts the running cell (the session keeps its
variables), Ctrl-D ends the session. Not on a terminal, each ``-c CODE`` is a cell, else
the whole of stdin is one. ``--put FILE`` copies a file into the session's work dir
first. Exit status: 0 when the last cell ran without an error, 1 when it raised, 137 when
a cell took the session past its memory limit, 124 when a cell ignored its interrupt;
otherwise the table of docs/cli.md.
"""

from __future__ import annotations

import argparse
import codeop
import os
import sys
from typing import TYPE_CHECKING, Any

from corral.cli._common import duration_ms
from corral.cli._terminal import sanitize
from corral.core.errors import ConfigInvalidError, CorralError

if TYPE_CHECKING:
    from corral.sessions import CellResult, DisplayItem, Session

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    """Register the ``session`` verb."""
    p = subparsers.add_parser(
        "session", help="a live Python interpreter in a strict sandbox (a REPL on a terminal)",
        description="Start a session: a strict sandbox holding a Python interpreter whose "
                    "variables persist between cells. A REPL on a terminal; else each -c "
                    "CODE (or stdin) is a cell.")
    p.add_argument("-c", dest="cells", action="append", default=[], metavar="CODE",
                   help="a cell to run (repeat for more); without it and not on a terminal, "
                        "stdin is one cell")
    p.add_argument("--put", action="append", default=[], metavar="FILE",
                   help="copy FILE into the session's work dir (by its base name) first")
    p.add_argument("--mem", type=int, default=None, metavar="MB",
                   help="the session's memory limit, MiB (default 512)")
    p.add_argument("--timeout", type=duration_ms, default=30_000, metavar="TIME",
                   help="a cell's timeout: past it the cell is interrupted (default 30s)")
    p.add_argument("--environment", default=None, metavar="NAME",
                   help="run in a built environment (corral env build): its packages "
                        "import in the session (docs/environments.md)")
    p.add_argument("--save-images", default=None, metavar="DIR",
                   help="write each PNG a cell shows to DIR")
    p.set_defaults(handler=run)


class _Printer:
    """Writes a cell's outputs to the terminal (made safe: no escape sequences)."""

    def __init__(self, save_dir: str | None) -> None:
        self.save_dir = save_dir
        self.saved = 0

    @staticmethod
    def text(s: str, err: bool = False) -> None:
        stream = sys.stderr if err else sys.stdout
        stream.write(sanitize(s.encode("utf-8", "replace")).decode("utf-8", "replace"))
        stream.flush()

    def item(self, item: DisplayItem) -> None:
        png = item.png
        if png is not None:
            w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
            where = ""
            if self.save_dir is not None:
                self.saved += 1
                path = os.path.join(self.save_dir, f"corral-session-{self.saved}.png")
                with open(path, "wb") as fh:
                    fh.write(png)
                where = f" -> {path}"
            self.text(f"[image/png {w}x{h}, {len(png)} bytes{where}]\n")
            return
        plain = item.text() or ""
        self.text(plain + ("\n" if plain and not plain.endswith("\n") else ""))

    def done(self, r: CellResult) -> None:
        if r.result is not None:
            self.item(r.result)
        if r.error is not None:
            self.text(r.error.traceback or f"{r.error.name}: {r.error.value}\n", err=True)
        for note in r.notes:
            self.text(f"[{note}]\n", err=True)


def _status(r: CellResult | None) -> int:
    return 0 if r is None or r.ok else 1


def _cell(s: Session, code: str, out: _Printer) -> CellResult:
    r = s.run(code, on_stdout=out.text, on_stderr=lambda t: out.text(t, err=True),
              on_display=lambda d: out.item(d) if d.kind == "display" else None)
    out.done(r)
    return r


def _repl(s: Session, out: _Printer) -> int:
    last: CellResult | None = None
    print(f"corral session {s.id} (Python {s.inner.python}, strict sandbox); Ctrl-D ends it",
          file=sys.stderr)
    while True:
        lines: list[str] = []
        try:
            while True:
                line = input("... " if lines else ">>> ")
                lines.append(line)
                src = "\n".join(lines)
                try:
                    complete = codeop.compile_command(src, "<cell>", "exec") is not None
                except (SyntaxError, ValueError, OverflowError):
                    complete = True  # the session says what is wrong
                if complete and (len(lines) == 1 or line == ""):
                    break
        except EOFError:
            print(file=sys.stderr)
            return _status(last)
        except KeyboardInterrupt:
            print("\nKeyboardInterrupt", file=sys.stderr)
            continue
        src = "\n".join(lines)
        if not src.strip():
            continue
        try:
            last = _cell(s, src, out)
        except KeyboardInterrupt:  # the cell was interrupted; the session lives on
            print("\nKeyboardInterrupt (the cell was interrupted)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from corral.core.spec import SandboxLimits
    from corral.sessions import DEFAULT_LIMITS, Session
    if args.save_images is not None and not os.path.isdir(args.save_images):
        raise ConfigInvalidError("--save-images", f"not a directory: {args.save_images}")
    puts = []
    for path in args.put:
        try:
            with open(path, "rb") as fh:
                puts.append((os.path.basename(path), fh.read()))
        except OSError as e:
            raise ConfigInvalidError("--put", f"{path}: {e.strerror}") from None
    limits = DEFAULT_LIMITS if args.mem is None else SandboxLimits(
        mem_mb=args.mem, max_processes=DEFAULT_LIMITS.max_processes,
        disk_mb=DEFAULT_LIMITS.disk_mb)
    out = _Printer(args.save_images)
    with Session(limits=limits, cell_timeout_s=args.timeout / 1000,
                 environment=args.environment) as s:
        for name, data in puts:
            s.write_file(name, data)
        try:
            if args.cells:
                last = None
                for code in args.cells:
                    last = _cell(s, code, out)
                return _status(last)
            if sys.stdin.isatty():
                return _repl(s, out)
            return _status(_cell(s, sys.stdin.read(), out))
        except CorralError as err:
            print(f"corral: {err.code}: {err.message}", file=sys.stderr)
            return err.exit_status
