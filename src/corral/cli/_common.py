"""What every verb of the ``corral`` command shares: the exit-status table and
the parsing of durations. Standard library only, so importing it costs nothing.

The table (``docs/cli.md`` shows it; ``tests/cli/test_exit_codes.py`` runs
every row) follows ``sysexits.h`` where one fits, ``timeout(1)`` for 124 and the
shell for 126, 127, 130 and 137. A run's own exit status passes through
unchanged (128 + N when signal N killed it), so a status a command can give
itself (0-255) may also mean that; ``--json`` says which.
"""

from __future__ import annotations

import argparse
import re
from typing import Final

__all__ = [
    "EXIT_CANCELLED", "EXIT_CANNOT_EXECUTE", "EXIT_INTERNAL", "EXIT_LIMIT", "EXIT_NOT_FOUND",
    "EXIT_TIMEOUT", "EXIT_UNAVAILABLE", "EXIT_USAGE", "duration_ms", "size_text",
]

#: bad usage: an unknown or malformed option, a missing argument, a bad value
#: (argparse's own errors included), a file named on the command line that is absent
EXIT_USAGE: Final = 64
#: the level or a limit cannot be given on this host (LevelNotSupportedError)
EXIT_UNAVAILABLE: Final = 69
#: corral itself failed (ProviderError, UnhandledWorkerError)
EXIT_INTERNAL: Final = 70
#: the run passed its wall-clock timeout and was killed
EXIT_TIMEOUT: Final = 124
#: the command exists but cannot be executed (not executable, not a program)
EXIT_CANNOT_EXECUTE: Final = 126
#: the command was not found
EXIT_NOT_FOUND: Final = 127
#: the run was cancelled (SIGINT / SIGTERM to corral)
EXIT_CANCELLED: Final = 130
#: the run hit a limit (memory, cpu, processes, disk, an output cap) and was killed
EXIT_LIMIT: Final = 137

_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DURATION: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*")


def duration_ms(text: str) -> int:
    """A duration option's value in ms: ``500`` (plain numbers are ms), ``500ms``,
    ``5s``, ``1.5s``, ``2m``, ``1h``. For argparse's ``type=``: a bad value raises
    ``ArgumentTypeError`` (exit 64, like every usage error)."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (a number of ms, or with a unit: 500ms, 5s, 2m, 1h)")
    number, unit = m.groups()
    if unit is None and "." in number:
        raise argparse.ArgumentTypeError(f"not a whole number of ms: {text!r}")
    return round(float(number) * _UNITS[unit or "ms"])


def size_text(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB`` ... ``3.2 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
