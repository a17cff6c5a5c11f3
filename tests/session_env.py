"""What the session tests share (importable by name: tests/ is on sys.path): the
site-packages dir holding pandas and matplotlib that the ``env_build`` tests bind into
their sandboxes, built once with ``pip install --target`` and cached under
/var/cache/corral-session-test, and the walk's data and PNG checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

__all__ = ["CSV", "PNG_SIGNATURE", "build_site", "png_size"]

CACHE = "/var/cache/corral-session-test"
PACKAGES = ("pandas", "matplotlib")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CSV = "a,b\n1,2\n3,4\n5,7\n7,11\n"


def build_site() -> str:
    """A dir on the host with pandas and matplotlib importable (for PYTHONPATH)."""
    site = os.path.join(CACHE, f"py{sys.version_info[0]}.{sys.version_info[1]}-site")
    if os.path.isdir(os.path.join(site, "pandas")):
        return site
    os.makedirs(CACHE, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="build-", dir=CACHE)
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir",
                        "--disable-pip-version-check", "--target", tmp, *PACKAGES],
                       check=True, timeout=900)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, site)
        except OSError:  # another run made it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return site


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) of a PNG from its IHDR chunk (the signature checked first)."""
    assert png.startswith(PNG_SIGNATURE)
    assert png[12:16] == b"IHDR"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
