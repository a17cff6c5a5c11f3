"""The local-layout reader: a layout whose index.json holds several images is read by
tag (org.opencontainers.image.ref.name) or digest, and refused without one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import regsupport as rs

from corral.core.errors import ConfigInvalidError
from corral.images.cache import ImageCache


def _two(tmp_path: Path) -> tuple[str, rs.Image, rs.Image]:
    one = rs.image([rs.layer({"which": "one"})])
    two = rs.image([rs.layer({"which": "two"})])
    return rs.write_layout(str(tmp_path / "layout"), {"1": one, "2": two}), one, two


def test_several_manifests_need_a_tag_or_digest(tmp_path: Path) -> None:
    layout, _, two = _two(tmp_path)
    cache = ImageCache(str(tmp_path / "cache"))
    with pytest.raises(ConfigInvalidError, match=r"2 manifests .*select one by tag.*'1', '2'"):
        cache.unpack(layout)
    for ref, want in (("1", "one"), ("2", "two"), (two.digest, "two")):
        u = cache.unpack(layout, ref=ref)
        assert Path(u.rootfs, "which").read_text() == want
    # the same, spelled in the image string (as spec.image or --image would)
    assert Path(cache.unpack(f"{layout}:1").rootfs, "which").read_text() == "one"
    assert Path(cache.unpack(f"{layout}@{two.digest}").rootfs, "which").read_text() == "two"
    with pytest.raises(ConfigInvalidError, match=r"no manifest named '3' \(names: '1', '2'\)"):
        cache.unpack(layout, ref="3")
    assert len(cache.entries()) == 2


def test_the_record_of_one_tag_is_not_the_other(tmp_path: Path) -> None:
    """A cache hit without a child (the .seen record) is per (layout, tag)."""
    layout, _, _ = _two(tmp_path)
    cache = ImageCache(str(tmp_path / "cache"))
    a = cache.unpack(layout, ref="1")
    b = cache.unpack(layout, ref="2")
    assert a.key != b.key
    assert cache.unpack(layout, ref="1") == a and cache.unpack(layout, ref="2") == b
    assert len(os.listdir(tmp_path / "cache" / ".seen")) == 2
