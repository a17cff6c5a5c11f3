"""How the CLI looks where a person watches: colour, and a live status line.

Colour and the status line are for a terminal only. The rules are the usual
ones (https://no-color.org and https://force-color.org): ``NO_COLOR`` (any
non-empty value) turns colour off, ``FORCE_COLOR`` (non-empty) turns it on
even into a pipe, ``TERM=dumb`` and a stream that is not a TTY mean plain
text. The status line is drawn only on a TTY, never forced: a pipe or a
file gets exactly the command's bytes and corral's plain messages.

:class:`LiveStatus` keeps one line at the bottom of stderr ("corral: running
at strict  1.2s") and redraws it a few times a second from a thread while a
run goes. The command's own output is written above it: every write first
erases the status line, and the line is redrawn only when the output ended a
line (a command's half-written line, a prompt or a progress bar, is left
alone until it ends). No dependency: ANSI SGR and "erase line" (``ESC [2K``)
are all it takes, and every terminal in use understands them.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Final, TextIO

__all__ = ["LiveStatus", "Palette", "colour_wanted", "is_tty"]

_RESET: Final = "\x1b[0m"
_CODES: Final = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33",
                 "blue": "34", "magenta": "35", "cyan": "36"}
#: erase the whole line and return to its start
_ERASE: Final = "\r\x1b[2K"
#: the spinner's frames (ASCII: a terminal without Unicode fonts shows it too)
_FRAMES: Final = "|/-\\"


def is_tty(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (False for anything that cannot say)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def colour_wanted(stream: Any, environ: dict[str, str] | None = None) -> bool:
    """Colour for ``stream``: NO_COLOR wins, then FORCE_COLOR, then a TTY whose
    TERM is not ``dumb``."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR"):
        return True
    return is_tty(stream) and env.get("TERM", "") != "dumb"


class Palette:
    """``paint(text, "red", "bold")``: text in SGR colours, or as is when colour is off."""

    __slots__ = ("enabled",)

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream: Any) -> Palette:
        return cls(colour_wanted(stream))

    def paint(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}{_RESET}"


class LiveStatus:
    """A status line at the bottom of a TTY, redrawn by a thread until :meth:`stop`.

    ``write(stream, text)`` is how output reaches the terminal while the line is
    shown: the line is erased first, the text written, the line redrawn if the
    text ended a line. Use as a context manager; with ``enabled=False`` (not a
    TTY) nothing is ever drawn and ``write`` just writes.
    """

    def __init__(self, label: str, *, stream: TextIO, enabled: bool,
                 palette: Palette | None = None, interval: float = 0.1) -> None:
        self.label = label
        self.stream = stream
        self.enabled = enabled
        self.palette = palette or Palette(False)
        self.interval = interval
        self._lock = threading.Lock()
        self._shown = False
        self._mid_line = False
        self._frame = 0
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LiveStatus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="corral-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop redrawing and erase the line (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            self._erase()

    def write(self, stream: TextIO, text: str) -> None:
        """Write ``text`` to ``stream`` (stdout or stderr) above the status line."""
        if not text:
            return
        with self._lock:
            self._erase()
            stream.write(text)
            stream.flush()
            self._mid_line = not text.endswith("\n")
            if self.enabled and not self._mid_line and not self._stop.is_set():
                self._draw()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                if not self._mid_line:
                    self._draw()

    def _line(self) -> str:
        self._frame = (self._frame + 1) % len(_FRAMES)
        p = self.palette
        return (f"{p.paint(_FRAMES[self._frame], 'cyan')} {p.paint('corral', 'bold')}: "
                f"{self.label}  {p.paint(f'{self.elapsed:.1f}s', 'dim')}")

    def _draw(self) -> None:
        self.stream.write(_ERASE + self._line())
        self.stream.flush()
        self._shown = True

    def _erase(self) -> None:
        if self._shown:
            self.stream.write(_ERASE)
            self.stream.flush()
            self._shown = False
