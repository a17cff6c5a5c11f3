"""Confined file access: every sandbox file operation goes through here.

Paths are resolved one component at a time from a directory fd with
``O_NOFOLLOW``, so neither ``..``, an absolute path, nor a symlink (placed
there by the sandboxed code, maybe while we walk) can lead outside the root.
A symlink is never followed: as the last component it is itself the entry
(listed, stat'ed, removed as a link); before it, the path is refused with
ConfigInvalidError.

Errors: ConfigInvalidError for a path that is unusable or would leave the root;
the builtin ``OSError`` subclasses where the file system answers (no such file,
not a directory, exists, not empty), as ``open`` and ``os`` raise them.

Imported by the sandbox agent (every page it runs is copied into a sandbox):
standard library only.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat

from corral.core.errors import ConfigInvalidError

__all__ = ["list_dir_under", "make_dir_under", "read_file_under", "remove_under",
           "split_relative", "stat_under", "write_file_under"]

#: (name, type, size, mode, mtime, symlink target) of one entry
EntryTuple = tuple[str, str, int, int, float, str | None]

_MAX_PATH = 4096


def split_relative(path: str, *, root_alias: str | None = None,
                   allow_root: bool = False) -> list[str]:
    """Split a sandbox path into safe components, or raise ConfigInvalidError.

    ``path`` is relative to the sandbox's work dir. An absolute path is
    accepted only if it lies under ``root_alias`` (the work dir as the
    sandboxed code sees it, e.g. ``/work``). ``allow_root``: a path naming
    the work dir itself (``""``, ``"."``, the alias) gives ``[]``.
    """
    if allow_root and path in ("", ".", "./"):
        return []
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
    if not parts and not allow_root:
        raise ConfigInvalidError("path", f"path names the work dir itself: {path!r}")
    return parts


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_parent(root: str, parts: list[str], *, create: bool) -> int:
    return _open_dirs(root, parts[:-1], create=create)


def _open_dirs(root: str, names: list[str], *, create: bool) -> int:
    """A descriptor of the directory ``root/names...``, walked without following a link."""
    flags = _DIR_FLAGS
    fd = os.open(root, flags)
    try:
        for name in names:
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


def _entry(name: str, st: os.stat_result, dfd: int) -> EntryTuple:
    mode = st.st_mode
    kind = ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode)
            else "symlink" if stat.S_ISLNK(mode) else "other")
    target = None
    if kind == "symlink":
        try:
            target = os.readlink(name, dir_fd=dfd)
        except OSError:
            target = ""
    return (name, kind, st.st_size, stat.S_IMODE(mode), st.st_mtime, target)


def _open_last_dir(root: str, parts: list[str], path: str) -> int:
    """A descriptor of the directory at ``parts`` (the root for ``[]``); the last
    component must be a directory, not a link to one."""
    dfd = _open_parent(root, parts, create=False) if parts else os.open(root, _DIR_FLAGS)
    if not parts:
        return dfd
    try:
        return os.open(parts[-1], _DIR_FLAGS, dir_fd=dfd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(parts[-1], dfd):
            raise ConfigInvalidError("path", f"{path!r} is a symlink (never followed)") from None
        raise
    finally:
        os.close(dfd)


def _is_link(name: str, dfd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def list_dir_under(root: str, path: str, *, root_alias: str | None = None,
                   max_entries: int = 100_000) -> list[EntryTuple]:
    """The entries of the directory at ``path`` (``""``: the root), sorted by name,
    none followed. FileNotFoundError, NotADirectoryError as the file system says;
    ConfigInvalidError past ``max_entries``."""
    parts = split_relative(path, root_alias=root_alias, allow_root=True)
    fd = _open_last_dir(root, parts, path)
    try:
        out: list[EntryTuple] = []
        with os.scandir(fd) as it:
            for ent in it:
                if len(out) >= max_entries:
                    raise ConfigInvalidError("path", f"more than {max_entries} entries")
                try:
                    st = ent.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # gone while we looked
                out.append(_entry(ent.name, st, fd))
        out.sort()
        return out
    finally:
        os.close(fd)


def stat_under(root: str, path: str, *, root_alias: str | None = None) -> EntryTuple:
    """What is at ``path`` (a last symlink is the link itself); FileNotFoundError if
    nothing is."""
    parts = split_relative(path, root_alias=root_alias, allow_root=True)
    if not parts:
        return _entry("", os.stat(root, follow_symlinks=False), -1)
    dfd = _open_parent(root, parts, create=False)
    try:
        return _entry(parts[-1], os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False), dfd)
    finally:
        os.close(dfd)


def remove_under(root: str, path: str, *, recursive: bool = False,
                 root_alias: str | None = None) -> None:
    """Remove the file, link or directory at ``path`` (never the root). A directory
    that is not empty needs ``recursive`` (else ``OSError(ENOTEMPTY)``); the tree is
    removed through descriptors, never following a link (``shutil.rmtree``'s
    fd-based walk)."""
    parts = split_relative(path, root_alias=root_alias)
    dfd = _open_parent(root, parts, create=False)
    try:
        name = parts[-1]
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dfd)
        elif recursive:
            shutil.rmtree(name, dir_fd=dfd)
        else:
            os.rmdir(name, dir_fd=dfd)
    finally:
        os.close(dfd)


def make_dir_under(root: str, path: str, *, parents: bool = True,
                   root_alias: str | None = None, mode: int = 0o755) -> bool:
    """Make the directory at ``path`` (``parents``: the missing ones above it too);
    True if made, False if a directory was there. FileExistsError if something else
    is; FileNotFoundError for a missing parent without ``parents``."""
    parts = split_relative(path, root_alias=root_alias, allow_root=True)
    if not parts:
        return False
    dfd = _open_parent(root, parts, create=parents)
    try:
        try:
            os.mkdir(parts[-1], mode, dir_fd=dfd)
            return True
        except FileExistsError:
            if stat.S_ISDIR(os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False).st_mode):
                return False
            raise
    finally:
        os.close(dfd)
