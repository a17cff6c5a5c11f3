"""The ``corral`` command: thin verbs over the library.

Each verb is a module with ``add_parser(subparsers)`` and ``run(args) -> int``.
Only :class:`~corral.core.errors.CorralError` is caught here: it is printed as
``corral: <code>: <message>`` on stderr and the command exits with the
error's ``exit_status``. A usage error that argparse finds (an unknown option,
a bad value) exits 64 too, like a ``config-invalid`` error, not argparse's 2.
The whole exit-status table is :mod:`corral.cli._common` and ``docs/cli.md``.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from corral.cli._common import EXIT_USAGE
from corral.core.errors import CorralError

__all__ = ["main"]

#: verb name -> module under corral.cli
VERBS: dict[str, str] = {
    "doctor": "doctor",
    "env": "env",
    "image": "image",
    "mcp": "mcp",
    "python": "python",
    "run": "run",
    "serve": "serve",
    "session": "session",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits 64 (sysexits' EX_USAGE), the status every
    other bad option or argument of ``corral`` gets."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class _Version(argparse.Action):
    """``--version``: read when asked, so building the parser imports nothing more."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from corral import __version__
        print(f"corral {__version__}")
        parser.exit(0)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="corral", description="Run code nobody trusts behind a real boundary.",
        epilog="Exit statuses: see docs/cli.md (64 usage, 69 unavailable, 70 internal, "
               "124 timeout, 126 cannot execute, 127 not found, 130 cancelled, 137 limit; "
               "otherwise the command's own).")
    parser.add_argument("--version", action=_Version, help="print corral's version and exit")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB",
                                parser_class=_Parser)
    for verb, module in VERBS.items():
        mod = importlib.import_module(f"corral.cli.{module}")
        mod.add_parser(sub)
        del verb
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``corral`` command; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help, --version (0) or a usage error (64)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        status: int = args.handler(args)
    except CorralError as err:
        print(f"corral: {err.code}: {err.message}", file=sys.stderr)
        return err.exit_status
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
