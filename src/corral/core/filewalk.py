"""A directory listing ``depth`` levels deep, bounded (E2B's ``files.list(path, depth)``).

The contract's :meth:`~corral.core.contract.Sandbox.list_files` lists one directory;
:func:`list_tree` walks from it, level by level, into the directories it finds (a
symlink is an entry, never walked into: the contract never follows one), and stops at
``max_entries`` entries. Every door uses it: the library's ``files.list(path, depth)``,
``corral serve``'s ``POST .../files/list`` and the MCP tool ``sandbox_list_files``. The
bound is the same everywhere (:data:`MAX_LIST_ENTRIES` at most); what a door does past it
is the door's (HTTP and MCP answer the first entries with ``truncated: true``; the
library raises ``ConfigInvalidError`` naming ``max_entries``).

A sandbox whose provider can walk in one call (the remote provider relays the walk to the
server) has ``list_tree(path, depth, max_entries)`` itself, and it is used instead.
"""

from __future__ import annotations

from typing import Any, Final

from corral.core.errors import ConfigInvalidError
from corral.core.files import FileInfo

__all__ = ["MAX_LIST_DEPTH", "MAX_LIST_ENTRIES", "check_walk", "list_tree"]

#: the most entries one listing returns (a bigger tree is cut there, and says so)
MAX_LIST_ENTRIES: Final = 10_000
#: the deepest a listing goes (a deeper tree: list a deeper path)
MAX_LIST_DEPTH: Final = 64


def check_walk(depth: object, max_entries: object) -> tuple[int, int]:
    """``depth`` and ``max_entries`` checked: ints, 1..MAX_LIST_DEPTH and
    1..MAX_LIST_ENTRIES."""
    for name, v, top in (("depth", depth, MAX_LIST_DEPTH),
                         ("max_entries", max_entries, MAX_LIST_ENTRIES)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
            raise ConfigInvalidError(name, f"an integer from 1 to {top}, got {v!r}")
    assert isinstance(depth, int) and isinstance(max_entries, int)
    return depth, max_entries


def _join(base: str, name: str) -> str:
    base = base.rstrip("/")
    return f"{base}/{name}" if base and base != "." else name


async def list_tree(sandbox: Any, path: str = "", depth: int = 1,
                    max_entries: int = MAX_LIST_ENTRIES) -> tuple[list[FileInfo], bool]:
    """The entries under ``path`` down to ``depth`` levels (1: the directory's own
    entries), sorted by path, and whether the listing was cut at ``max_entries``.

    Raises what ``list_files`` raises for ``path`` itself (FileNotFoundError,
    NotADirectoryError, ConfigInvalidError); a directory that goes away during the
    walk is skipped.
    """
    depth, max_entries = check_walk(depth, max_entries)
    own = getattr(sandbox, "list_tree", None)
    if own is not None:
        got: tuple[list[FileInfo], bool] = await own(path, depth, max_entries)
        return got
    out: list[FileInfo] = []
    level: list[str] = [path]
    for d in range(depth):
        below: list[str] = []
        for i, dir_path in enumerate(level):
            try:
                entries = await sandbox.list_files(dir_path)
            except (FileNotFoundError, NotADirectoryError):
                if d == 0 and i == 0:
                    raise
                continue  # went away (or was swapped for a file) meanwhile
            for e in entries:
                if len(out) == max_entries:
                    return sorted(out, key=lambda f: f.path), True
                out.append(e)
                if e.type == "dir":
                    below.append(_join(dir_path, e.name))
        level = below
        if not level:
            break
    return sorted(out, key=lambda f: f.path), False
