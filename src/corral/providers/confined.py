"""Confined file access: every sandbox file operation goes through here.

Paths are resolved one component at a time from a directory fd with
``O_NOFOLLOW``, so neither ``..``, an absolute path, nor a symlink (placed
there by the sandboxed code, maybe while we walk) can lead outside the root.
"""

from __future__ import annotations

import os
import stat

from corral.core.errors import ConfigInvalidError

__all__ = ["read_file_under", "split_relative", "write_file_under"]

_MAX_PATH = 4096


def split_relative(path: str, *, root_alias: str | None = None) -> list[str]:
    """Split a sandbox path into safe components, or raise ConfigInvalidError.

    ``path`` is relative to the sandbox's work dir. An absolute path is
    accepted only if it lies under ``root_alias`` (the work dir as the
    sandboxed code sees it, e.g. ``/work``).
    """
    if not isinstance(path, str) or not path or "\0" in path or len(path) > _MAX_PATH:
        raise ConfigInvalidError("path", f"not a usable path: {path!r}")
    if path.startswith("/"):
        alias = (root_alias or "").rstrip("/")
        if not alias or not (path == alias or path.startswith(alias + "/")):
            raise ConfigInvalidError("path", f"absolute path outside the sandbox: {path!r}")
        path = path[len(alias):]
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ConfigInvalidError("path", f"'..' is not allowed in sandbox paths: {path!r}")
    if not parts:
        raise ConfigInvalidError("path", f"path names the work dir itself: {path!r}")
    return parts


def _open_parent(root: str, parts: list[str], *, create: bool) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for name in parts[:-1]:
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(name, flags, dir_fd=fd)
            except OSError as e:  # ELOOP (a symlink), ENOTDIR, EACCES
                raise ConfigInvalidError(
                    "path", f"{name!r}: {e.strerror} (symlink or not a directory)") from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_file_under(root: str, path: str, data: bytes, *,
                     root_alias: str | None = None, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` under ``root``, never following a symlink."""
    parts = split_relative(path, root_alias=root_alias)
    dfd = _open_parent(root, parts, create=True)
    try:
        try:
            fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_CLOEXEC, mode, dir_fd=dfd)
        except OSError as e:
            raise ConfigInvalidError("path", f"cannot write {path!r}: {e.strerror}") from None
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def read_file_under(root: str, path: str, *, root_alias: str | None = None,
                    max_bytes: int | None = None) -> bytes:
    """Read the regular file at ``path`` under ``root``, never following a symlink.

    Raises FileNotFoundError if it does not exist.
    """
    parts = split_relative(path, root_alias=root_alias)
    dfd = _open_parent(root, parts, create=False)
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=dfd)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise ConfigInvalidError("path", f"cannot read {path!r}: {e.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigInvalidError("path", f"not a regular file: {path!r}")
            chunks = []
            total = 0
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                total += len(b)
                if max_bytes is not None and total > max_bytes:
                    raise ConfigInvalidError("path", f"file larger than {max_bytes} bytes")
                chunks.append(b)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
