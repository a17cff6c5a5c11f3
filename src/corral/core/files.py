"""What a sandbox's file operations return: :class:`FileInfo`, one entry of its files.

The shape an E2B user knows from ``sandbox.files.list`` / ``get_info`` (its
``EntryInfo``): a name, the path, a type, size, permission bits, the modification
time and a symlink's target. corral never follows a symlink inside a sandbox's files,
so a link is reported as ``symlink`` with its ``symlink_target`` (text, as the link
holds it; where it points is not looked at).

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, final

__all__ = ["FileInfo", "FileType"]

#: ``file`` a regular file, ``dir`` a directory, ``symlink`` a symbolic link (never
#: followed), ``other`` anything else (a fifo, a socket, a device node)
FileType = Literal["file", "dir", "symlink", "other"]


@final
@dataclasses.dataclass(frozen=True, slots=True)
class FileInfo:
    """One entry of a sandbox's files.

    Attributes:
        name: the last component of ``path`` (``""`` for the work dir itself).
        path: the path as the sandboxed code sees it (under the work dir, e.g.
            ``/work/data/a.csv`` for the strict level).
        type: ``file``, ``dir``, ``symlink`` or ``other``.
        size: bytes (a symlink: its target's length; a directory: what the file
            system says).
        mode: the permission bits (``0o644``), without the type bits.
        modified: the modification time, in seconds since the epoch.
        symlink_target: the text of a symlink, ``None`` for anything else.
    """

    name: str
    path: str
    type: FileType
    size: int
    mode: int
    modified: float
    symlink_target: str | None = None

    @property
    def permissions(self) -> str:
        """``mode`` as ``ls -l`` spells it, e.g. ``rw-r--r--``."""
        return "".join(ch if self.mode & (1 << (8 - i)) else "-"
                       for i, ch in enumerate("rwxrwxrwx"))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (the HTTP API's and MCP's shape)."""
        return {"name": self.name, "path": self.path, "type": self.type, "size": self.size,
                "mode": self.mode, "permissions": self.permissions,
                "modified": self.modified, "symlink_target": self.symlink_target}
