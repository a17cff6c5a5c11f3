"""A listing ``depth`` levels deep (E2B's ``files.list(path, depth)``, issue 27 item 4):
the walk over the contract's one-level ``list_files`` (corral.core.filewalk), its bound
(at most 10 000 entries: the library raises ``ConfigInvalidError`` naming
``max_entries``), symlinks never walked into, and the sync ``Sandbox`` using it."""

from __future__ import annotations

import asyncio
import os

import pytest

from corral.core.errors import ConfigInvalidError
from corral.core.files import FileInfo
from corral.core.filewalk import MAX_LIST_DEPTH, MAX_LIST_ENTRIES, list_tree
from corral.sandbox import Sandbox


class _Tree:
    """A sandbox's list_files over a dict of dirs (a fake: the walk only)."""

    def __init__(self, dirs: dict[str, list[tuple[str, str]]]) -> None:
        self.dirs, self.calls = dirs, []  # type: ignore[var-annotated]

    async def list_files(self, path: str = "") -> list[FileInfo]:
        self.calls.append(path)
        if path not in self.dirs:
            raise FileNotFoundError(2, "gone", path)
        return [FileInfo(name=n, path=f"/work/{path}/{n}".replace("//", "/"), type=t,  # type: ignore[arg-type]
                         size=0, mode=0o755, modified=0.0)
                for n, t in self.dirs[path]]


def test_the_walk_goes_depth_levels_and_never_into_a_link() -> None:
    fake = _Tree({"": [("a", "dir"), ("l", "symlink"), ("z", "file")],
                  "a": [("b", "dir")], "a/b": [("c", "file")]})
    got, cut = asyncio.run(list_tree(fake, "", 1))
    assert [f.name for f in got] == ["a", "l", "z"] and not cut and fake.calls == [""]
    got, cut = asyncio.run(list_tree(fake, "", 5))
    assert [f.path for f in got] == ["/work/a", "/work/a/b", "/work/a/b/c", "/work/l",
                                     "/work/z"]
    assert "l" not in fake.calls  # a symlink is an entry, never walked into
    got, cut = asyncio.run(list_tree(fake, "", 5, 2))
    assert cut and len(got) == 2


def test_a_directory_gone_during_the_walk_is_skipped_the_start_is_not() -> None:
    fake = _Tree({"": [("a", "dir"), ("b", "dir")], "b": [("x", "file")]})
    got, _cut = asyncio.run(list_tree(fake, "", 2))  # "a" vanished before its turn
    assert [f.name for f in got] == ["a", "b", "x"]
    with pytest.raises(FileNotFoundError):
        asyncio.run(list_tree(fake, "nope", 2))


@pytest.mark.parametrize(("depth", "max_entries", "field"), [
    (0, 10, "depth"), (MAX_LIST_DEPTH + 1, 10, "depth"), (True, 10, "depth"),
    ("2", 10, "depth"), (1, 0, "max_entries"), (1, MAX_LIST_ENTRIES + 1, "max_entries")])
def test_bounds_are_typed_refusals(depth: object, max_entries: object, field: str) -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        asyncio.run(list_tree(_Tree({"": []}), "", depth, max_entries))  # type: ignore[arg-type]
    assert ei.value.field == field


def test_sync_sandbox_lists_depth_levels() -> None:
    with Sandbox.create(level="context-isolated") as sb:
        sb.files.write("t/a/b/c.txt", "hi")
        sb.files.write("t/top.txt", "x")
        work = sb.files.get_info("t").path.rsplit("/", 1)[0]
        names = [os.path.relpath(f.path, work) for f in sb.files.list("t", depth=3)]
        assert names == ["t/a", "t/a/b", "t/a/b/c.txt", "t/top.txt"]
        assert [f.name for f in sb.files.list("t")] == ["a", "top.txt"]
        with pytest.raises(ConfigInvalidError) as ei:
            sb.files.list("t", depth=3, max_entries=3)
        assert ei.value.field == "max_entries"
        with pytest.raises(NotADirectoryError):
            sb.files.list("t/top.txt", depth=2)
