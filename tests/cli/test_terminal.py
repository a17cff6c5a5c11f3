"""corral.cli._terminal: what a terminal is shown of untrusted output."""

from __future__ import annotations

import pytest

from corral.cli._terminal import TerminalSanitizer, sanitize


@pytest.mark.parametrize(("raw", "shown"), [
    (b"plain text\n", b"plain text\n"),
    (b"tab\there\r\n", b"tab\there\r\n"),                        # kept: \t \n \r
    (b"\x1b]52;c;cHduZWQ=\x07", b"\\x1b]52;c;cHduZWQ=\\x07"),     # OSC 52: clipboard
    (b"\x1b]0;title\x1b\\", b"\\x1b]0;title\\x1b\\"),             # OSC 0 with ST
    (b"\x1b[31mred\x1b[0m", b"\\x1b[31mred\\x1b[0m"),             # CSI SGR
    (b"\x1b[6n", b"\\x1b[6n"),                                    # asks for an answer
    (b"\x00\x08\x7f", b"\\x00\\x08\\x7f"),                        # NUL, backspace, DEL
    ("\u009b2J".encode(), b"\\x9b2J"),                            # C1 CSI, as UTF-8
    ("\u0090q\u009c".encode(), b"\\x90q\\x9c"),                   # C1 DCS ... ST
    (b"\x9b2J", b"\\x9b2J"),                                      # a raw 8-bit CSI byte
    (b"\xff\xfe", b"\\xff\\xfe"),                                 # not UTF-8
    ("caf\u00e9 \u0101 \u65e5\u672c \U0001f600".encode(),         # text stays text
     "caf\u00e9 \u0101 \u65e5\u672c \U0001f600".encode()),
])
def test_controls_become_visible_text(raw: bytes, shown: bytes) -> None:
    assert sanitize(raw) == shown


def test_every_control_but_newline_tab_and_cr_is_escaped() -> None:
    for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]:
        out = sanitize(chr(c).encode())
        if chr(c) in "\n\t\r":
            assert out == chr(c).encode()
        else:
            assert out == f"\\x{c:02x}".encode(), hex(c)
            assert all(0x20 <= b < 0x7F for b in out)


def test_a_sequence_split_across_chunks() -> None:
    data = "a\x1b[2Jb\u009b31mc\u00e9\U0001f600d".encode()
    whole = sanitize(data)
    for size in (1, 2, 3):
        s = TerminalSanitizer()
        out = b"".join(s.feed(data[i:i + size]) for i in range(0, len(data), size))
        assert out + s.flush() == whole, size
    assert whole == "a\\x1b[2Jb\\x9b31mc\u00e9\U0001f600d".encode()


def test_an_unfinished_character_at_the_end_is_shown() -> None:
    s = TerminalSanitizer()
    assert s.feed(b"x\xc2") == b"x"       # maybe the start of a C1 control: held back
    assert s.flush() == b"\\xc2"
