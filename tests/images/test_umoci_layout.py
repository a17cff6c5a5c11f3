"""A layout umoci builds with two tags (index.json holding two manifests, as after a second
tag) is read by tag; pushed with skopeo, it pulls back by tag and by digest."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import regsupport as rs

from corral.core.errors import ConfigInvalidError
from corral.images.cache import ImageCache
from corral.images.reference import RegistryPolicy

UMOCI = shutil.which("umoci")
SKOPEO = shutil.which("skopeo")
BUSYBOX = shutil.which("busybox")
STAMP = "2024-01-01T00:00:00Z"


def _umoci(*args: str) -> None:
    assert UMOCI is not None
    subprocess.run([UMOCI, *args], check=True, capture_output=True, timeout=60)


def _tree(root: Path, text: str) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "app").mkdir()
    assert BUSYBOX is not None
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    (root / "bin" / "sh").symlink_to("busybox")
    (root / "app" / "which.txt").write_text(text)
    return root


@pytest.mark.skipif(UMOCI is None or BUSYBOX is None,
                    reason="umoci or busybox-static is not installed (scripts/test.sh)")
def test_umoci_layout_with_two_tags(tmp_path: Path, plain_registry: rs.Registry) -> None:
    layout = str(tmp_path / "oci-bb")
    _umoci("init", "--layout", layout)
    for tag in ("1", "2"):
        _umoci("new", "--image", f"{layout}:{tag}")
        _umoci("insert", "--history.created", STAMP, "--image", f"{layout}:{tag}",
               str(_tree(tmp_path / f"tree{tag}", f"tag {tag}")), "/")
        _umoci("config", "--created", STAMP, "--history.created", STAMP, "--image",
               f"{layout}:{tag}", "--config.entrypoint", "/bin/sh", "--config.env",
               "PATH=/bin", "--config.workingdir", "/app")
    _umoci("gc", "--layout", layout)
    assert len(json.loads(Path(layout, "index.json").read_text())["manifests"]) == 2
    cache = ImageCache(str(tmp_path / "cache"))
    with pytest.raises(ConfigInvalidError, match="2 manifests"):
        cache.unpack(layout)
    for tag in ("1", "2"):
        u = cache.unpack(f"{layout}:{tag}")
        assert Path(u.rootfs, "app/which.txt").read_text() == f"tag {tag}"
        assert u.config.working_dir == "/app" and u.config.env == ("PATH=/bin",)
    if SKOPEO is None:
        return
    host = plain_registry.host
    subprocess.run([SKOPEO, "--tmpdir", str(tmp_path), "copy", "--quiet",
                    "--dest-tls-verify=false", f"oci:{layout}:2",
                    f"docker://{host}/corral/umoci:2"], check=True, timeout=120,
                   capture_output=True)
    pol = RegistryPolicy.of([], [host])
    by_tag = cache.pull(f"{host}/corral/umoci:2", policy=pol)
    by_digest = cache.pull(f"{host}/corral/umoci@{by_tag.manifest_digest}", policy=pol)
    assert by_digest.config_digest == by_tag.config_digest
    u = cache.unpack_pulled(by_digest)
    assert Path(u.rootfs, "app/which.txt").read_text() == "tag 2"
