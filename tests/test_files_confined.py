"""The file operations stay inside the root: probes against corral.providers.confined,
each beside a control showing the same move works with plain ``os`` on the host."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from corral.core.errors import ConfigInvalidError
from corral.providers.confined import (
    list_dir_under,
    make_dir_under,
    remove_under,
    stat_under,
)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    (root / "hostdir").symlink_to(outside)
    (root / "up").symlink_to("..")
    (root / "sub").mkdir()
    (root / "sub" / "f").write_bytes(b"abc")
    return root, outside


def test_control_plain_os_follows_the_links(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    assert os.listdir(root / "hostdir") == ["secret"]
    assert os.stat(root / "up" / "outside" / "secret").st_size == 1
    os.mkdir(root / "hostdir" / "made")
    os.rmdir(outside / "made")


@pytest.mark.parametrize("path", ["hostdir", "up", "hostdir/", "up/outside", "../outside",
                                  "/outside", "sub/../../outside"])
def test_list_never_leaves(tree: tuple[Path, Path], path: str) -> None:
    root, _ = tree
    with pytest.raises(ConfigInvalidError):
        list_dir_under(str(root), path, root_alias="/work")


@pytest.mark.parametrize("path", ["hostdir/secret", "up/outside/secret", "../outside/secret"])
def test_stat_make_remove_never_leave(tree: tuple[Path, Path], path: str) -> None:
    root, outside = tree
    with pytest.raises(ConfigInvalidError):
        stat_under(str(root), path)
    with pytest.raises(ConfigInvalidError):
        make_dir_under(str(root), path + "/new")
    with pytest.raises(ConfigInvalidError):
        remove_under(str(root), path, recursive=True)
    assert sorted(os.listdir(outside)) == ["secret"]


def test_links_are_entries_never_followed(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    names = {e[0]: e for e in list_dir_under(str(root), "")}
    assert names["hostdir"][1] == "symlink" and names["hostdir"][5] == str(outside)
    assert stat_under(str(root), "up")[1] == "symlink"
    remove_under(str(root), "hostdir", recursive=True)  # the link only
    assert not (root / "hostdir").exists() and (outside / "secret").exists()


def test_remove_refuses_the_root_and_needs_recursive(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    for p in ("", ".", "/work"):
        with pytest.raises(ConfigInvalidError):
            remove_under(str(root), p, recursive=True, root_alias="/work")
    with pytest.raises(OSError, match="not empty") as ei:
        remove_under(str(root), "sub")
    assert ei.value.errno == errno.ENOTEMPTY
    remove_under(str(root), "sub", recursive=True)
    assert not (root / "sub").exists()


def test_recursive_remove_racing_a_swap_to_a_link_stays_inside(tmp_path: Path) -> None:
    """While a recursive remove walks ``d``, another thread keeps replacing ``d/x`` (a
    dir) with a symlink to a dir outside: the outside files survive every round."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    for i in range(20):
        (outside / f"keep{i}").write_bytes(b"k")
    stop = threading.Event()
    setup = threading.Lock()  # the swapper waits while a round's tree is built

    def swapper() -> None:
        while not stop.is_set():
            with setup:
                try:
                    os.rename(root / "d" / "x", root / "d" / "y")
                    os.symlink(outside, root / "d" / "x")
                except OSError:
                    pass

    t = threading.Thread(target=swapper)
    t.start()
    try:
        for _ in range(200):
            with setup:
                if (root / "d").is_symlink() or (root / "d" / "x").is_symlink():
                    remove_under(str(root), "d", recursive=True)
                (root / "d" / "x").mkdir(parents=True, exist_ok=True)
                for i in range(5):
                    (root / "d" / "x" / f"f{i}").write_bytes(b"f")
            try:
                remove_under(str(root), "d", recursive=True)
            except OSError:
                pass  # a name vanished under it: fine, as long as nothing outside did
    finally:
        stop.set()
        t.join()
    assert sorted(os.listdir(outside)) == sorted(f"keep{i}" for i in range(20))
