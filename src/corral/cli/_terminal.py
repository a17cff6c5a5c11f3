"""Make a sandboxed command's output safe to show on a terminal.

A terminal obeys escape sequences in what it prints: OSC 52 writes the
user's clipboard, OSC 0 sets the window title, CSI sequences move the cursor,
clear the screen, hide text or ask the terminal to answer (the answer arrives
on the user's shell as if typed). Output of code nobody trusts must not reach
a terminal raw. :class:`TerminalSanitizer` turns every control character but
newline, tab and carriage return into visible text (``\\x1b`` for ESC,
``\\x9b`` for the C1 CSI), so a sequence shows as letters and does nothing.

Text is decoded as UTF-8 incrementally, so a character (or a C1 control,
two bytes in UTF-8) split across two chunks is judged whole; bytes that are
not UTF-8 are shown as ``\\xNN`` too (a terminal in an 8-bit mode would read a
raw 0x9b as CSI). What is printed is UTF-8. A literal backslash is left as
it is, so the rendering is for people, not a lossless encoding: callers that
need the exact bytes write to a pipe or file (or pass ``--raw-output``).
"""

from __future__ import annotations

import codecs
from typing import Final

__all__ = ["TerminalSanitizer", "sanitize"]

#: control characters passed through: they move within the text, they do not
#: change the terminal's state (a carriage return can overwrite the current
#: line, which progress bars need)
_KEPT: Final = frozenset("\n\t\r")


def _escape(ch: str) -> str:
    return f"\\x{ord(ch):02x}"


def _table() -> dict[int, str]:
    table = {c: _escape(chr(c)) for c in range(0x20) if chr(c) not in _KEPT}
    table[0x7F] = _escape("\x7f")
    table.update({c: _escape(chr(c)) for c in range(0x80, 0xA0)})  # C1 controls
    return table


_TABLE: Final = _table()


class TerminalSanitizer:
    """Stateful: ``feed`` each chunk of one stream in order, ``flush`` at its end."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def feed(self, chunk: bytes) -> bytes:
        """What to write to the terminal for ``chunk`` (may hold back an unfinished
        UTF-8 character until the next chunk)."""
        return self._decoder.decode(chunk).translate(_TABLE).encode("utf-8")

    def flush(self) -> bytes:
        """The rest: an unfinished character at the very end, escaped."""
        return self._decoder.decode(b"", final=True).translate(_TABLE).encode("utf-8")


def sanitize(data: bytes) -> bytes:
    """``data`` whole, made safe for a terminal."""
    s = TerminalSanitizer()
    return s.feed(data) + s.flush()
