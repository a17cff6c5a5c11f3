"""The ``corral`` command: thin verbs over the library.

Each verb is a module with ``add_parser(subparsers)`` and ``run(args) -> int``.
Only :class:`~corral.core.errors.CorralError` is caught here: it is printed as
``corral: <code>: <message>`` on stderr and the command exits with the
error's ``exit_status`` (the one table, in :mod:`corral.core.errors` and
``docs/errors.md``). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from corral.core.errors import CorralError

__all__ = ["main"]

#: verb name -> module under corral.cli
VERBS: dict[str, str] = {
    "doctor": "doctor",
    "python": "python",
    "run": "run",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral", description="Run code nobody trusts behind a real boundary.")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, module in VERBS.items():
        mod = importlib.import_module(f"corral.cli.{module}")
        mod.add_parser(sub)
        del verb
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``corral`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except CorralError as err:
        print(f"corral: {err.code}: {err.message}", file=sys.stderr)
        return err.exit_status
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
