"""``spec.image`` for providers without a root filesystem of their own.

The ``inprocess`` and ``subproc`` providers run commands on the host's own
filesystem, so for them an "image" cannot be a root filesystem: it is a local
directory holding the handler's files, copied into the sandbox's work dir at
``create``. Only mode ``json-stdio`` takes one (the handler runs from those
files through the host's interpreter and corral); ``handler-image`` is refused,
because it means running the image's own entrypoint inside the image's root.

The copy never follows a symlink: every directory is opened from its parent's
fd with ``O_NOFOLLOW``, symlinks are copied as symlinks (their text unchanged,
not read through), fifos, sockets and devices are skipped, setuid/setgid/sticky
bits are dropped, and the total file bytes and entry count are capped.
"""

from __future__ import annotations

import os
import stat
from typing import Final

from corral.core.errors import ConfigInvalidError, ProviderError
from corral.core.spec import InvocationMode, SandboxSpec

__all__ = ["DEFAULT_MAX_IMAGE_BYTES", "DEFAULT_MAX_IMAGE_FILES", "check_image_spec",
           "copy_image_dir"]

#: the most file bytes an image directory may hold
DEFAULT_MAX_IMAGE_BYTES: Final = 256 * 1024 * 1024
#: the most entries (files, dirs, symlinks) an image directory may hold
DEFAULT_MAX_IMAGE_FILES: Final = 10_000
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK: Final = 1 << 20


def check_image_spec(spec: SandboxSpec, provider: str) -> str | None:
    """The image directory to copy (its real path), None without an image; or refuse.

    ``handler-image`` -> ``ConfigInvalidError("mode")``; an image with any mode
    other than ``json-stdio``, or one that is not an existing directory ->
    ``ConfigInvalidError("image")``.
    """
    if spec.mode is InvocationMode.HANDLER_IMAGE:
        raise ConfigInvalidError(
            "mode", f"provider {provider!r} has no root filesystem of its own to run an "
            "image's entrypoint in; use mode 'json-stdio' (the image directory holds the "
            "handler's files) or the 'linux' provider for 'handler-image'")
    if spec.image is None:
        return None
    if spec.mode is not InvocationMode.JSON_STDIO:
        raise ConfigInvalidError(
            "image", f"provider {provider!r} takes an image (a directory of the handler's "
            f"files) only with mode 'json-stdio', not {getattr(spec.mode, 'value', None)!r}")
    if not os.path.isdir(spec.image):
        raise ConfigInvalidError(
            "image", f"provider {provider!r} needs the image to be an existing local directory "
            f"of the handler's files (OCI images run on the 'linux' provider): {spec.image!r}")
    return os.path.realpath(spec.image)


class _Copy:
    def __init__(self, source: str, max_bytes: int, max_files: int) -> None:
        self.source, self.max_bytes, self.max_files = source, max_bytes, max_files
        self.bytes = self.files = 0

    def _count(self, size: int = 0) -> None:
        self.files += 1
        self.bytes += size
        if self.files > self.max_files:
            raise ConfigInvalidError(
                "image", f"{self.source!r} holds more than {self.max_files} entries")
        if self.bytes > self.max_bytes:
            raise ConfigInvalidError(
                "image", f"{self.source!r} holds more than {self.max_bytes} bytes of files")

    def tree(self, src: int, dst: int, depth: int = 0) -> None:
        if depth > 64:
            raise ConfigInvalidError("image", f"{self.source!r} is nested too deep")
        for name in sorted(os.listdir(src)):
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                self._count()
                os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
            elif stat.S_ISDIR(st.st_mode):
                self._count()
                os.mkdir(name, 0o700, dir_fd=dst)
                s = os.open(name, _DIR, dir_fd=src)
                try:
                    d = os.open(name, _DIR, dir_fd=dst)
                    try:
                        self.tree(s, d, depth + 1)
                        os.fchmod(d, (st.st_mode & 0o777) | 0o700)
                    finally:
                        os.close(d)
                finally:
                    os.close(s)
            elif stat.S_ISREG(st.st_mode):
                self._file(src, dst, name)
            # fifos, sockets, devices: not handler files; skipped

    def _file(self, src: int, dst: int, name: str) -> None:
        s = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src)
        try:
            st = os.fstat(s)
            if not stat.S_ISREG(st.st_mode):  # swapped since the lstat: skip it
                return
            self._count(st.st_size)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            d = os.open(name, flags, 0o600, dir_fd=dst)
            try:
                left = self.max_bytes - self.bytes + st.st_size
                while chunk := os.read(s, _CHUNK):
                    left -= len(chunk)
                    if left < 0:  # grew while we copy
                        raise ConfigInvalidError(
                            "image", f"{self.source!r} holds more than {self.max_bytes} bytes")
                    os.write(d, chunk)
                os.fchmod(d, (st.st_mode & 0o777) | 0o600)  # no setuid/setgid/sticky
            finally:
                os.close(d)
        finally:
            os.close(s)


def copy_image_dir(source: str, dest: str, *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
                   max_files: int = DEFAULT_MAX_IMAGE_FILES) -> None:
    """Copy the tree of ``source`` into the existing empty dir ``dest`` (see module doc).

    Over a cap -> ``ConfigInvalidError("image")``; an unreadable source or a
    failing write -> ``ProviderError``. The caller removes ``dest`` on failure.
    """
    copy = _Copy(source, max_bytes, max_files)
    try:
        s = os.open(source, _DIR)
        try:
            d = os.open(dest, _DIR)
            try:
                copy.tree(s, d)
            finally:
                os.close(d)
        finally:
            os.close(s)
    except OSError as e:
        raise ProviderError(f"cannot copy the image directory {source!r}: {e}", e) from e
