"""What the session tests share (importable by name: tests/ is on sys.path): the
walk's data and PNG checks. The ``env_build`` ones run in the environment ``sci``
(tests/env_fixture.py, the ``sci_env`` fixture of tests/conftest.py)."""

from __future__ import annotations

__all__ = ["CSV", "PNG_SIGNATURE", "png_size"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CSV = "a,b\n1,2\n3,4\n5,7\n7,11\n"


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) of a PNG from its IHDR chunk (the signature checked first)."""
    assert png.startswith(PNG_SIGNATURE)
    assert png[12:16] == b"IHDR"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
