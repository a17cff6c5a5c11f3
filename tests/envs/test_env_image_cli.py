"""``corral env build --image``: the base image reaches the build (no sandbox here: a
rootfs dir has no content digest and is refused before any)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.cli import main


def test_env_build_image_takes_only_an_image_with_a_content_digest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr" / "bin").mkdir(parents=True)
    store = tmp_path / "envs"
    assert main(["env", "--store", str(store), "build", "x", "six", "--image", str(rootfs),
                 "--image-cache", str(tmp_path / "images")]) == 64
    err = capsys.readouterr().err
    assert "config-invalid: image:" in err and "content digest" in err, err
    assert not (store / "objects").exists() and not (store / "names").exists()
