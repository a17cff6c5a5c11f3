"""Applying layer tars under a root without ever leaving it (:class:`Extractor`).

Member and hardlink paths that are absolute or contain ``..`` are refused,
every parent is opened from a dir fd with ``O_NOFOLLOW`` (a symlink in a
parent is refused, never followed), files are created ``O_EXCL |
O_NOFOLLOW`` after removing what was there, devices are skipped and
setuid/setgid bits dropped; whiteouts (``.wh.NAME``) and opaque dirs
(``.wh..wh..opq``) remove what lower layers made. File bytes and member
counts are capped, and so is what a layer may decompress to (a gzip bomb
stops there). :func:`extract_layers` applies an image's layers in order, each
checked against its ``diff_id``. Runs in the bounded child of
:mod:`._image_child`, never in the host process.
"""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import stat
import tarfile
from typing import IO, Final

from corral.images.layers import Hashing, Source, bad, decompressed

__all__ = ["Extractor", "disk_usage", "extract_layers"]

_CHUNK: Final = 1 << 20
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _split(name: str, what: str) -> list[str]:
    if "\0" in name or len(name) > 4096:
        raise bad(f"{what} {name[:80]!r}: not a usable path")
    if name.startswith("/"):
        raise bad(f"{what} {name!r} is absolute")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise bad(f"{what} {name!r} contains '..'")
    if len(parts) > 256:
        raise bad(f"{what} {name[:80]!r} is nested too deep")
    return parts


_Key = tuple[str, ...]


class Extractor:
    """Applies layer tars under ``root`` through dir fds; never follows a symlink."""

    def __init__(self, root: str, max_bytes: int, max_members: int) -> None:
        self.root_fd = os.open(root, _DIR)
        self.max_bytes, self.max_members = max_bytes, max_members
        self.bytes = self.members = 0

    def close(self) -> None:
        os.close(self.root_fd)

    def _walk(self, parts: list[str], created: set[_Key] | None) -> int | None:
        """An fd of the dir ``parts`` (each a real directory); missing dirs are made
        when ``created`` is given, else None is returned."""
        fd = os.dup(self.root_fd)
        try:
            for i, p in enumerate(parts):
                try:
                    nfd = os.open(p, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if created is None:
                        os.close(fd)
                        return None
                    os.mkdir(p, 0o755, dir_fd=fd)
                    created.add(tuple(parts[: i + 1]))
                    nfd = os.open(p, _DIR, dir_fd=fd)
                except OSError:  # ELOOP: a symlink; ENOTDIR: a file
                    raise bad(f"path {'/'.join(parts)!r} goes through {p!r}, which is a "
                               "symlink or not a directory") from None
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _remove(dfd: int, name: str) -> None:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=dfd)
        else:
            os.unlink(name, dir_fd=dfd)

    def apply(self, stream: IO[bytes]) -> None:
        created: set[_Key] = set()  # what this layer made: whiteouts hide lower layers only
        try:
            tar = tarfile.open(fileobj=stream, mode="r|")  # noqa: SIM115
        except tarfile.TarError as e:
            raise bad(f"a layer is not a tar: {e}") from None
        with tar:
            try:
                while (m := tar.next()) is not None:
                    tar.members.clear()  # type: ignore[attr-defined]  # a stream keeps all
                    self._member(tar, m, created)
            except tarfile.TarError as e:
                raise bad(f"a layer is a broken tar: {e}") from None

    def _member(self, tar: tarfile.TarFile, m: tarfile.TarInfo, created: set[_Key]) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise bad(f"the image has more than {self.max_members} members")
        parts = _split(m.name, "member")
        if not parts:
            return
        *dirs, base = parts
        if base.startswith(".wh."):
            self._whiteout(dirs, base, created)
            return
        dfd = self._walk(dirs, created)
        assert dfd is not None
        try:
            if m.isdir():
                self._dir(dfd, base, m.mode)
            elif m.isreg():
                self._file(tar, m, dfd, base)
            elif m.issym():
                self._remove(dfd, base)
                os.symlink(m.linkname, base, dir_fd=dfd)
            elif m.islnk():
                self._link(m, parts, dfd, base)
            else:
                return  # devices and fifos: the provider builds /dev itself
            created.add(tuple(parts))
        finally:
            os.close(dfd)

    def _dir(self, dfd: int, base: str, mode: int) -> None:
        try:
            st = os.stat(base, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(base, dir_fd=dfd)
                raise FileNotFoundError
        except FileNotFoundError:
            os.mkdir(base, 0o755, dir_fd=dfd)
        fd = os.open(base, _DIR, dir_fd=dfd)
        try:
            os.fchmod(fd, (mode & 0o777) | 0o755)
        finally:
            os.close(fd)

    def _file(self, tar: tarfile.TarFile, m: tarfile.TarInfo, dfd: int, base: str) -> None:
        self.bytes += m.size
        if self.bytes > self.max_bytes:
            raise bad(f"the image unpacks to more than {self.max_bytes} bytes")
        self._remove(dfd, base)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        src = tar.extractfile(m)
        with os.fdopen(os.open(base, flags, 0o600, dir_fd=dfd), "wb") as out:
            left = m.size
            while src is not None and left > 0:
                chunk = src.read(min(_CHUNK, left))
                if not chunk:
                    raise bad(f"layer member {m.name!r} is truncated")
                out.write(chunk)
                left -= len(chunk)
            os.fchmod(out.fileno(), (m.mode & 0o777) | 0o644)  # no setuid/setgid/sticky

    def _link(self, m: tarfile.TarInfo, parts: list[str], dfd: int, base: str) -> None:
        target = _split(m.linkname, "hardlink target")
        if not target:
            raise bad(f"hardlink {m.name!r} points at the root")
        if target == parts:
            return
        tfd = self._walk(target[:-1], None)
        if tfd is None:
            raise bad(f"hardlink {m.name!r}: target {m.linkname!r} does not exist")
        try:
            try:
                st = os.stat(target[-1], dir_fd=tfd, follow_symlinks=False)
            except FileNotFoundError:
                raise bad(f"hardlink {m.name!r}: target {m.linkname!r} does not exist") from None
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                raise bad(f"hardlink {m.name!r}: target {m.linkname!r} is not a file")
            self._remove(dfd, base)
            os.link(target[-1], base, src_dir_fd=tfd, dst_dir_fd=dfd, follow_symlinks=False)
        finally:
            os.close(tfd)

    def _whiteout(self, dirs: list[str], base: str, created: set[_Key]) -> None:
        dfd = self._walk(dirs, None)
        if dfd is None:
            return
        try:
            if base == ".wh..wh..opq":
                names = [n for n in os.listdir(dfd) if (*dirs, n) not in created]
            else:
                name = base[len(".wh."):]
                if name in ("", ".", ".."):
                    raise bad(f"bad whiteout {'/'.join((*dirs, base))!r}")
                names = [] if (*dirs, name) in created else [name]
            for n in names:
                self._remove(dfd, n)
        finally:
            os.close(dfd)



def extract_layers(src: Source, layers: list[str], diff_ids: list[str], root: str, *,
                   max_bytes: int, max_members: int) -> None:
    """Apply ``layers`` (blob paths in ``src``) in order into the new dir ``root``;
    each must hash to its ``diff_id``. All layers together decompress to at most
    ``max_bytes`` + 2 KiB per member + 1 MiB."""
    os.mkdir(root, 0o755)
    ex = Extractor(root, max_bytes, max_members)
    cap = max_bytes + max_members * 2048 + (1 << 20)
    try:
        for layer, diff_id in zip(layers, diff_ids, strict=True):
            with src.open(layer) as blob:
                stream = Hashing(decompressed(blob), cap)
                try:
                    ex.apply(stream)  # type: ignore[arg-type]
                    got = stream.drain()
                except OSError as e:
                    if e.errno == errno.EFBIG:
                        raise bad(f"layer {layer!r} writes a file larger than the unpack "
                                  "file size cap (RLIMIT_FSIZE)") from None
                    raise bad(f"cannot read layer {layer!r}: {e}") from None
                except (EOFError, gzip.BadGzipFile) as e:
                    raise bad(f"cannot read layer {layer!r}: {e}") from None
                cap -= stream.seen
            if got != diff_id:
                raise bad(f"layer {layer!r} does not match diff_id {diff_id!r}")
    finally:
        ex.close()


def disk_usage(path: str) -> int:
    """Bytes of disk the tree at ``path`` takes (allocated blocks; a hardlinked
    file once). Symlinks are not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirs, files in os.walk(path):
        for name in (".", *dirs, *files):
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total
