"""Interop: an image skopeo pushes from a layout with several tags pulls back unchanged."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import regsupport as rs

from corral.images.cache import ImageCache
from corral.images.reference import RegistryPolicy

SKOPEO = shutil.which("skopeo")


@pytest.mark.skipif(SKOPEO is None, reason="skopeo is not installed (scripts/test.sh installs it)")
def test_skopeo_pushed_image_pulls_back(tmp_path: Path, plain_registry: rs.Registry) -> None:
    assert SKOPEO is not None
    one = rs.busybox_image({"app/hello.txt": "skopeo one"})
    two = rs.busybox_image({"app/hello.txt": "skopeo two"})
    layout = rs.write_layout(str(tmp_path / "layout"), {"1": one, "2": two})
    host = plain_registry.host
    subprocess.run([SKOPEO, "--tmpdir", str(tmp_path), "copy", "--quiet",
                    "--dest-tls-verify=false", f"oci:{layout}:2",
                    f"docker://{host}/corral/skopeo:2"], check=True, timeout=120,
                   capture_output=True)
    cache = ImageCache(str(tmp_path / "cache"))
    p = cache.pull(f"{host}/corral/skopeo:2", policy=RegistryPolicy.of([], [host]))
    assert p.manifest_digest == two.digest  # skopeo kept the bytes: the digest holds
    assert Path(cache.unpack_pulled(p).rootfs, "app/hello.txt").read_text() == "skopeo two"
