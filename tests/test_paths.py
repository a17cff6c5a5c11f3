from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.core.errors import ConfigInvalidError
from corral.providers.confined import read_file_under, split_relative, write_file_under


@pytest.mark.parametrize("bad", ["", "..", "../x", "a/../../x", "a/..", "/etc/passwd",
                                 "/workx/a", "a\0b", ".", "./"])
def test_split_refuses(bad: str) -> None:
    with pytest.raises(ConfigInvalidError):
        split_relative(bad, root_alias="/work")


def test_split_accepts() -> None:
    assert split_relative("a/./b//c") == ["a", "b", "c"]
    assert split_relative("/work/a/b", root_alias="/work") == ["a", "b"]


def test_round_trip_binary(tmp_path: Path) -> None:
    data = bytes(range(256)) * 100
    write_file_under(str(tmp_path), "d/e/f.bin", data)
    assert read_file_under(str(tmp_path), "d/e/f.bin") == data


def test_symlink_out_refused_both_ways(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "secret"
    outside.write_text("canary")
    (root / "link").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)
    with pytest.raises(ConfigInvalidError):
        read_file_under(str(root), "link")
    with pytest.raises(ConfigInvalidError):
        write_file_under(str(root), "link", b"x")
    with pytest.raises(ConfigInvalidError):
        read_file_under(str(root), "dirlink/secret")
    with pytest.raises(ConfigInvalidError):
        write_file_under(str(root), "dirlink/new", b"x")
    assert outside.read_text() == "canary"
    assert not (tmp_path / "new").exists()


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_file_under(str(tmp_path), "nope")


def test_not_regular(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigInvalidError):
        read_file_under(str(tmp_path), "fifo")
