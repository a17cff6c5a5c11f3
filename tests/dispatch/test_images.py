"""ImageCache: OCI layouts, oci-archive and docker-save tars, rootfs dirs; hostile layers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from imagebuild import Member, docker_archive, layer_tar, oci_archive, oci_layout

from corral.core.errors import ConfigInvalidError
from corral.images.cache import ImageCache

HANDLER = Member("corral/handler-base/entrypoint.py", data=b"print('hi')\n", mode=0o4755)


def _tree(root: str) -> dict[str, str]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                out[rel] = Path(p).read_text()
    return out


def _cache(tmp_path: Path, **kw: int) -> ImageCache:
    return ImageCache(str(tmp_path / "cache"), **kw)


def test_two_layers_with_whiteouts_and_opaque_dirs(tmp_path: Path) -> None:
    base = [Member("etc/", "dir"), Member("etc/a", data=b"A"), Member("gone", data=b"x"),
            Member("opq/", "dir"), Member("opq/old", data=b"o"), HANDLER]
    top = [Member(".wh.gone"), Member("opq/.wh..wh..opq"), Member("opq/new", data=b"n"),
           Member("etc/a", data=b"A2"), Member("lnk", "symlink", link="/etc/passwd"),
           Member("hl", "hardlink", link="etc/a"), Member("fifo", "fifo")]
    img = oci_layout(str(tmp_path / "img"), [base, top],
                     config={"Entrypoint": ["python3"], "Cmd": ["/x.py"], "Env": ["A=1"]})
    cache = _cache(tmp_path)
    u = cache.unpack(img)
    assert u.source == "oci-layout" and u.key.startswith("sha256:")
    assert (u.config.entrypoint, u.config.cmd, u.config.env) == (("python3",), ("/x.py",),
                                                                ("A=1",))
    assert _tree(u.rootfs) == {
        "etc": "dir", "etc/a": "A2", "opq": "dir", "opq/new": "n", "lnk": "-> /etc/passwd",
        "hl": "A2", "corral": "dir", "corral/handler-base": "dir",
        "corral/handler-base/entrypoint.py": "print('hi')\n"}
    mode = os.stat(os.path.join(u.rootfs, HANDLER.name)).st_mode
    assert mode & 0o7777 == 0o755  # setuid dropped
    assert cache.entries() == [u.key[7:]]
    assert cache.unpack(img) == u  # a cache hit


def test_uncompressed_layers_docker_save_and_oci_archive(tmp_path: Path) -> None:
    layers = [[HANDLER], [Member("b", data=b"B")]]
    cache = _cache(tmp_path)
    a = cache.unpack(oci_layout(str(tmp_path / "plain"), layers, gzip_layers=False))
    b = cache.unpack(docker_archive(str(tmp_path), layers))
    c = cache.unpack(oci_archive(str(tmp_path), layers))
    assert (a.source, b.source, c.source) == ("oci-layout", "docker-archive", "oci-archive")
    for u in (a, b, c):
        assert _tree(u.rootfs)["b"] == "B"
    assert a.key == b.key  # same config bytes: one cache entry


def test_a_rootfs_directory_is_used_in_place(tmp_path: Path) -> None:
    (tmp_path / "rootfs" / "bin").mkdir(parents=True)
    u = _cache(tmp_path).unpack(str(tmp_path / "rootfs"))
    assert u.source == "rootfs" and u.rootfs == str(tmp_path / "rootfs")
    assert not (tmp_path / "cache").exists()


HOSTILE = {
    "dotdot": [Member("../escape", data=b"x")],
    "dotdot-deep": [Member("a/../../escape", data=b"x")],
    "absolute": [Member("/tmp/escape-abs", data=b"x")],
    "symlink-then-write": [Member("out", "symlink", link="{outside}"),
                           Member("out/escape", data=b"x")],
    "symlink-dir-then-write": [Member("d", "symlink", link="../../.."),
                               Member("d/escape", data=b"x")],
    "hardlink-outside": [Member("h", "hardlink", link="../../outside/victim")],
    "hardlink-absolute": [Member("h", "hardlink", link="{outside}/victim")],
    "hardlink-through-symlink": [Member("s", "symlink", link="{outside}"),
                                 Member("h", "hardlink", link="s/victim")],
    "whiteout-dotdot": [Member("a/.wh..."), Member("x", data=b"x")],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_layers_are_refused_and_leave_nothing(tmp_path: Path, case: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep")
    members = [Member(m.name, m.kind, m.data, m.link.format(outside=outside), m.mode)
               for m in HOSTILE[case]]
    img = oci_layout(str(tmp_path / "img"), [[Member("a/", "dir")], members])
    cache = _cache(tmp_path)
    with pytest.raises(ConfigInvalidError) as ei:
        cache.unpack(img)
    assert ei.value.field == "image"
    assert os.listdir(cache.root) == []  # no entry, no temp dir
    assert sorted(os.listdir(outside)) == ["victim"]
    assert (outside / "victim").read_text() == "keep"
    assert not (tmp_path / "escape").exists() and not Path("/tmp/escape-abs").exists()


def test_size_and_member_caps(tmp_path: Path) -> None:
    img = oci_layout(str(tmp_path / "img"), [[Member("big", data=b"x" * 5000)]])
    with pytest.raises(ConfigInvalidError, match="more than 4096 bytes"):
        _cache(tmp_path, max_bytes=4096).unpack(img)
    many = oci_layout(str(tmp_path / "many"), [[Member(f"f{i}") for i in range(20)]])
    with pytest.raises(ConfigInvalidError, match="more than 10 members"):
        _cache(tmp_path, max_members=10).unpack(many)
    assert os.listdir(tmp_path / "cache") == []


def test_a_layer_that_does_not_match_its_diff_id_is_refused(tmp_path: Path) -> None:
    img = oci_layout(str(tmp_path / "img"), [[Member("a", data=b"1")]], gzip_layers=False)
    blobs = tmp_path / "img" / "blobs" / "sha256"
    tampered = layer_tar([Member("a", data=b"2")])
    for blob in blobs.iterdir():  # swap the layer's bytes (the config keeps the old diff_id)
        if blob.read_bytes() == layer_tar([Member("a", data=b"1")]):
            blob.write_bytes(tampered)
    with pytest.raises(ConfigInvalidError, match="does not match diff_id"):
        _cache(tmp_path).unpack(img)
    assert os.listdir(tmp_path / "cache") == []


def test_not_an_image(tmp_path: Path) -> None:
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all")
    with pytest.raises(ConfigInvalidError, match="neither a directory nor a readable tar"):
        _cache(tmp_path).unpack(str(tmp_path / "junk.tar"))
    with pytest.raises(ConfigInvalidError, match="no local image"):
        _cache(tmp_path).unpack(str(tmp_path / "missing"))
