"""Local OCI images -> root filesystems in a content-addressed, size-capped cache.

``ImageCache.unpack(image)`` accepts an OCI image layout directory, a tar of
one (``skopeo copy ... oci-archive:``), a ``docker save`` tar (optionally
gzipped), or a plain rootfs directory (used in place). Layers are applied in
order with whiteouts (``.wh.NAME``) and opaque dirs (``.wh..wh..opq``).

The image is read and unpacked by a bounded child process
(:mod:`._image_child`: memory, CPU, file size and wall-clock caps), never in
the host process. Hostile layers cannot write outside the entry: member and
hardlink paths that are absolute or contain ``..`` are refused, every parent
is opened from a dir fd with ``O_NOFOLLOW`` (a symlink in a parent is
refused, never followed), files are created ``O_EXCL | O_NOFOLLOW`` after
removing what was there, devices are skipped, and setuid/setgid bits are
dropped. Sizes, member counts and decompressed bytes are capped; every layer
is checked against the config's ``diff_ids``. Unpacking goes to a temp dir in
the cache and is renamed into place, so a refused image leaves no entry. Key:
the config blob's sha256.

The cache holds at most ``max_cache_bytes`` of unpacked trees (disk usage):
adding an entry first evicts the least recently used ones, skipping any
mounted by a live sandbox (of any process) and any used in the last
``min_age_s`` seconds (a sandbox may be starting on it).

Reading images and layers is :mod:`._image_layers`; applying a layer without
leaving the root is :mod:`._image_extract`; running both in the bounded child
is :mod:`._image_child`; this module is the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, cast, final

from corral.core.errors import ConfigInvalidError, ProviderError
from corral.images.child import (
    DEFAULT_MAX_CPU_S,
    DEFAULT_MAX_MEMORY,
    DEFAULT_MAX_WALL_S,
    ChildResult,
    UnpackCaps,
    parse_answer,
    unpack_bounded,
)
from corral.images.extract import disk_usage
from corral.images.layers import ImageConfig, bad

if TYPE_CHECKING:
    from corral.images.store import PulledImage, PulledStore

__all__ = ["CACHE_LIMIT_ENV", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_CACHE_BYTES",
           "DEFAULT_MAX_CPU_S", "DEFAULT_MAX_MEMBERS", "DEFAULT_MAX_MEMORY",
           "DEFAULT_MAX_WALL_S", "DEFAULT_MIN_AGE_S", "ImageCache", "ImageConfig",
           "UnpackedImage", "default_cache_dir", "mounted_digests", "split_local",
           "unreachable_part"]

DEFAULT_MAX_BYTES: Final = 1 << 30
DEFAULT_MAX_MEMBERS: Final = 200_000
#: the most disk the cache's unpacked trees may take together
DEFAULT_MAX_CACHE_BYTES: Final = 4 << 30
#: overrides ``DEFAULT_MAX_CACHE_BYTES`` (bytes, or with a K/M/G/T suffix)
CACHE_LIMIT_ENV: Final = "CORRAL_IMAGE_CACHE_MAX_BYTES"
#: an entry used this recently is never evicted (a sandbox may be starting on it)
DEFAULT_MIN_AGE_S: Final = 60.0
SourceKind = Literal["oci-layout", "oci-archive", "docker-archive", "rootfs"]

_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_MOUNTED: Final = re.compile(rb"/([0-9a-f]{64})/rootfs(?:/|$)")
_UNITS: Final = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}



def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/corral/images`` (``~/.cache/corral/images``); for root without
    ``XDG_CACHE_HOME``, ``/var/cache/corral/images`` (root's sandboxes run as uid
    65534, which cannot reach into ``/root``)."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base and os.geteuid() == 0:
        return "/var/cache/corral/images"
    base = base or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "corral", "images")


def unreachable_part(path: str, uid: int, gid: int) -> str | None:
    """The first directory on the way to ``path`` (itself included) that user
    ``uid``/group ``gid`` cannot search, or None when every one allows it."""
    cur = "/"
    for part in [p for p in os.path.realpath(path).split("/") if p] + [""]:
        st = os.stat(cur)
        bits = (stat.S_IXUSR if st.st_uid == uid else
                stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH)
        if uid != 0 and not st.st_mode & bits:
            return cur
        cur = os.path.join(cur, part)
    return None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class UnpackedImage:
    """A root filesystem ready to bind: ``key`` is ``sha256:<config digest>``
    (``dir:<path>`` for a rootfs directory)."""

    key: str
    rootfs: str
    config: ImageConfig
    source: SourceKind



# ---------------------------------------------------------------- the cache


def _reap_stale(root: str) -> None:
    """Remove temp and eviction dirs of unpackers that died (``.tmp-<pid>-...``,
    ``.evict-<pid>-...``)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if not name.startswith((".tmp-", ".evict-")):
                continue
            try:
                pid = int(name.split("-")[1])
                os.kill(pid, 0)
            except (ValueError, IndexError, ProcessLookupError):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            except PermissionError:
                pass


def mounted_digests() -> set[str]:
    """Hex digests of cache entries whose ``rootfs`` is mounted in any mount
    namespace this process can see (every live sandbox's, whichever process made it)."""
    seen: set[str] = set()
    found: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
            if ns in seen:
                continue
            with open(f"/proc/{pid}/mountinfo", "rb") as f:
                data = f.read()
        except OSError:
            continue
        seen.add(ns)
        for line in data.splitlines():
            fields = line.split(b" ", 4)  # id parent major:minor root mountpoint ...
            if len(fields) > 3 and (m := _MOUNTED.search(fields[3])):
                found.add(m.group(1).decode())
    return found


def _positive(name: str, v: object, kind: type = int) -> None:
    ok = isinstance(v, (int, float) if kind is float else int) and not isinstance(v, bool)
    if not ok or v <= 0:  # type: ignore[operator]
        raise ConfigInvalidError(name, "must be a positive " + (
            "number" if kind is float else "integer"))


def _limit_from_env() -> int:
    raw = os.environ.get(CACHE_LIMIT_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_CACHE_BYTES
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)i?B?", raw, re.IGNORECASE)
    if m is None or int(m.group(1)) == 0:
        raise ConfigInvalidError(CACHE_LIMIT_ENV, f"must be a positive size in bytes "
                                 f"(K/M/G/T suffixes allowed), got {raw!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


@final
class ImageCache:
    """Unpacks local images into ``root`` (:func:`default_cache_dir` by default).

    ``max_bytes`` caps the file bytes of one image, ``max_members`` its tar
    members (all layers together). The unpacking child is capped at
    ``max_memory`` bytes of address space, ``max_cpu_s`` CPU seconds and
    ``max_wall_s`` seconds of wall clock. ``max_cache_bytes`` caps the disk
    the cache's entries take together (default ``$CORRAL_IMAGE_CACHE_MAX_BYTES``,
    else 4 GiB): least recently used entries are evicted to make room, never
    one mounted by a live sandbox or used in the last ``min_age_s`` seconds.
    Refusals are ``ConfigInvalidError`` on field ``image`` (a cap that was hit
    is named); nothing of a refused image stays in the cache. A cache too full
    of images in use to take a new one is ``ProviderError``.
    """

    def __init__(self, root: str | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_members: int = DEFAULT_MAX_MEMBERS, max_cache_bytes: int | None = None,
                 max_memory: int = DEFAULT_MAX_MEMORY, max_cpu_s: int = DEFAULT_MAX_CPU_S,
                 max_wall_s: float = DEFAULT_MAX_WALL_S,
                 min_age_s: float = DEFAULT_MIN_AGE_S) -> None:
        if max_cache_bytes is None:
            max_cache_bytes = _limit_from_env()
        for name, v in (("max_bytes", max_bytes), ("max_members", max_members),
                        ("max_cache_bytes", max_cache_bytes), ("max_memory", max_memory),
                        ("max_cpu_s", max_cpu_s)):
            _positive(name, v)
        _positive("max_wall_s", max_wall_s, float)
        if isinstance(min_age_s, bool) or not isinstance(min_age_s, (int, float)) \
                or min_age_s < 0:
            raise ConfigInvalidError("min_age_s", "must be a number >= 0")
        self.root = os.path.abspath(root or default_cache_dir())
        self.max_bytes, self.max_members = max_bytes, max_members
        self.max_cache_bytes, self.min_age_s = max_cache_bytes, float(min_age_s)
        unpacked = min(max_bytes, max_cache_bytes)
        self.caps = UnpackCaps(memory=max_memory, cpu_s=max_cpu_s, wall_s=float(max_wall_s),
                               file_bytes=unpacked + (1 << 20))

    def entries(self) -> list[str]:
        """The keys' hex digests present in the cache (complete entries only)."""
        with contextlib.suppress(FileNotFoundError):
            return sorted(n for n in os.listdir(self.root) if _HEX64.fullmatch(n))
        return []

    def usage(self) -> int:
        """Bytes of disk the cache's unpacked entries and pulled images take (as counted
        against ``max_cache_bytes``)."""
        with contextlib.suppress(FileNotFoundError):
            return sum(size for _, _, size in self._usage()) + self.pulled.usage()
        return 0

    @property
    def pulled(self) -> PulledStore:
        """The images pulled from registries into this cache (its ``oci`` layout)."""
        from corral.images.store import PulledStore
        return PulledStore(self)

    def pull(self, reference: str, **kw: Any) -> PulledImage:
        """Pull ``reference`` from its registry into the cache (:meth:`PulledStore.pull`:
        ``policy``, ``credentials``, ``timeout_s``, ``max_time_s``)."""
        try:
            return self.pulled.pull(reference, **kw)
        except OSError as e:
            raise ProviderError(f"cannot pull {reference!r} into {self.root!r}: {e}", e) from e

    def unpack_pulled(self, image: PulledImage) -> UnpackedImage:
        """The root filesystem of a pulled image (marks it used)."""
        self.pulled.touch(image.ref_name)
        return self.unpack(image.layout, ref=image.ref_name)

    def unpack(self, image: str, ref: str | None = None) -> UnpackedImage:
        """The root filesystem of ``image`` (unpacked on first use, then from the cache).

        A layout or tar holding several images needs ``ref``: a tag (the
        ``org.opencontainers.image.ref.name`` annotation; in a ``docker save`` tar a
        ``RepoTags`` entry) or a ``sha256:`` manifest digest. It can also be spelled in
        ``image`` itself: ``LAYOUT:TAG`` or ``LAYOUT@sha256:...`` (see :func:`split_local`).
        """
        if not isinstance(image, str) or not image:
            raise bad(f"no local image at {image!r}")
        if ref is None:
            image, ref = split_local(image)
        if not os.path.exists(image):
            raise bad(f"no local image at {image!r}")
        path = os.path.realpath(image)
        if os.path.isdir(path) and not any(
                os.path.exists(os.path.join(path, n)) for n in ("index.json", "manifest.json")):
            if ref is not None:
                raise bad(f"{image!r} is a root filesystem directory, not an image that "
                          f"holds {ref!r}")
            return UnpackedImage(key=f"dir:{path}", rootfs=path, config=ImageConfig(),
                                 source="rootfs")
        try:
            seen = _fingerprint(path)
            known = self._recalled(path, ref, seen)
            if known is not None and self._handout(known):
                return known  # unchanged since a child read it: no child this time
            result = self._unpack(path, ref)
            self._remember(path, ref, seen, result)
        except OSError as e:  # the cache's own disk or permissions, not the image
            raise ProviderError(f"cannot unpack {image!r} into {self.root!r}: {e}", e) from e
        return result

    def _unpack(self, path: str, ref: str | None) -> UnpackedImage:
        os.makedirs(self.root, 0o711, exist_ok=True)  # searchable: sandboxes bind entries
        _reap_stale(self.root)
        for look in (True, False):  # a hit evicted before we took it: unpack after all
            tmp = tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=self.root)
            try:
                got = unpack_bounded(path, tmp, cache_root=self.root if look else None,
                                     max_bytes=min(self.max_bytes, self.max_cache_bytes),
                                     max_members=self.max_members, caps=self.caps,
                                     ref=ref)
                result = self._result(got)
                if got.size is None:
                    if self._handout(result):
                        return result
                    continue
                self._admit(tmp, got.digest, got.size, ref)
                return result
            finally:
                shutil.rmtree(tmp, ignore_errors=True)  # gone when renamed into place
        raise ProviderError(f"image cache entries under {self.root!r} vanish as they are "
                            "unpacked")

    # -- what a child found, by image path (.seen/<sha256 of the path>) ---------------
    def _record(self, path: str, ref: str | None) -> str:
        key = path if ref is None else f"{path}\0{ref}"
        name = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
        return os.path.join(self.root, ".seen", name)

    def _recalled(self, path: str, ref: str | None, seen: list[Any]) -> UnpackedImage | None:
        """What unpacking ``path`` gave last time, if its files are the same since."""
        try:
            fd = os.open(self._record(path, ref), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            doc = json.loads(os.read(fd, 1 << 20))
            if doc.get("path") != path or doc.get("ref") != ref or doc.get("seen") != seen \
                    or "user" not in doc:  # a record from before ``User`` was kept
                return None
            got = parse_answer(doc)
        except (ValueError, AttributeError, OSError):
            return None
        finally:
            os.close(fd)
        return self._result(got)

    def _remember(self, path: str, ref: str | None, seen: list[Any],
                  result: UnpackedImage) -> None:
        record = self._record(path, ref)
        os.makedirs(os.path.dirname(record), 0o700, exist_ok=True)
        c = result.config
        doc = {"path": path, "ref": ref, "seen": seen, "digest": result.key[7:],
               "source": result.source, "size": None, "entrypoint": list(c.entrypoint),
               "cmd": list(c.cmd), "env": list(c.env), "working_dir": c.working_dir,
               "user": c.user}
        tmp = f"{record}.{os.getpid()}.{threading.get_ident()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.write(fd, json.dumps(doc).encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
        os.replace(tmp, record)

    def _result(self, got: ChildResult) -> UnpackedImage:
        return UnpackedImage(key=f"sha256:{got.digest}", config=got.config,
                             source=cast(SourceKind, got.source),
                             rootfs=os.path.join(self.root, got.digest, "rootfs"))

    # -- entries, use and eviction ---------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The cache-wide lock (``.lock``, flock): admitting, evicting, handing out."""
        fd = os.open(os.path.join(self.root, ".lock"),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _handout(self, result: UnpackedImage) -> bool:
        """Mark ``result``'s entry used now; False when it is gone (evicted)."""
        with self._locked():
            if not os.path.isdir(result.rootfs):
                return False
            os.utime(os.path.dirname(result.rootfs))
        return True

    def _admit(self, tmp: str, digest: str, size: int, ref: str | None = None) -> None:
        """Rename the unpacked ``tmp`` into place as entry ``digest``, evicting to make room."""
        if size > self.max_cache_bytes:
            raise bad(f"the image takes {size} bytes of disk unpacked, more than the whole "
                      f"image cache may hold (max_cache_bytes={self.max_cache_bytes}, "
                      f"${CACHE_LIMIT_ENV})")
        for name in (".out", ".err"):
            os.unlink(os.path.join(tmp, name))
        _write_size(tmp, size)
        os.chmod(tmp, 0o755)
        entry = os.path.join(self.root, digest)
        with self._locked():
            if not os.path.isdir(os.path.join(entry, "rootfs")):  # else: a concurrent unpack won
                if os.path.lexists(entry):  # a broken entry
                    self._evict(digest)
                self._make_room(size, keep=frozenset({ref} if ref else ()))
                os.rename(tmp, entry)
            os.utime(entry)

    def _make_room(self, need: int, keep: frozenset[str] = frozenset()) -> None:
        """Evict least recently used unpacked entries and pulled images (not those named
        in ``keep``) until ``need`` more bytes fit (lock held)."""
        held: list[tuple[float, str, str, int]] = [
            (used, "entry", digest, size) for used, digest, size in self._usage()]
        store = self.pulled
        held += [(p.last_used, "pulled", p.ref_name, 0) for p in store.images()
                 if p.ref_name not in keep]
        stored = store.usage()
        total = sum(h[3] for h in held) + stored
        mounted: set[str] | None = None
        now = time.time()
        for used, kind, key, size in sorted(held):
            if total + need <= self.max_cache_bytes:
                return
            if now - used < self.min_age_s:
                continue  # a sandbox may be starting on it, or a pull just made it
            if kind == "pulled":
                store.drop(key)
                after = store.usage()
                total -= stored - after
                stored = after
                continue
            if mounted is None:
                mounted = mounted_digests()
            if key in mounted:
                continue
            self._evict(key)
            total -= size
        if total + need > self.max_cache_bytes:
            raise ProviderError(
                f"the image cache {self.root!r} is full: {total} bytes of images in use "
                f"(mounted by a live sandbox, or used in the last {self.min_age_s:g} s) leave "
                f"no room for {need} more under max_cache_bytes={self.max_cache_bytes}")

    def _usage(self) -> list[tuple[float, str, int]]:
        """(last use, hex digest, disk bytes) of every entry."""
        out = []
        for name in os.listdir(self.root):
            if not _HEX64.fullmatch(name):
                continue
            entry = os.path.join(self.root, name)
            try:
                st = os.stat(entry, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                out.append((st.st_mtime, name, _size_of(entry, st)))
        return out

    def _evict(self, digest: str) -> None:
        gone = os.path.join(self.root, f".evict-{os.getpid()}-{digest}")
        os.rename(os.path.join(self.root, digest), gone)
        shutil.rmtree(gone, ignore_errors=True)


def split_local(image: str) -> tuple[str, str | None]:
    """``LAYOUT:NAME`` -> (LAYOUT, NAME) and ``LAYOUT@sha256:HEX`` -> (LAYOUT, sha256:HEX)
    when ``image`` itself does not exist but LAYOUT does (the first ``:`` after which
    that holds; NAME may be a full reference, as pulled images are named); else
    (``image``, None)."""
    if os.path.exists(image):
        return image, None
    path, at, digest = image.rpartition("@")
    if at and path and re.fullmatch(r"sha256:[0-9a-f]{64}", digest) and os.path.exists(path):
        return path, digest
    for m in re.finditer(":", image):
        path, name = image[:m.start()], image[m.end():]
        if path and name and os.path.exists(path):
            return path, name
    return image, None


def _fingerprint(path: str) -> list[Any]:
    """What changes when the image at ``path`` is replaced or rewritten: the stat of
    the file, or of the layout dir and its top-level documents (blobs are named by
    their digests)."""
    names = ("", "index.json", "oci-layout", "manifest.json") if os.path.isdir(path) else ("",)
    out: list[Any] = []
    for name in names:
        try:
            st = os.stat(os.path.join(path, name) if name else path)
        except FileNotFoundError:
            out.append(None)
            continue
        out.append([st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    return out


def _write_size(entry: str, size: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(os.path.join(entry, "size"), flags, 0o644)
    try:
        os.write(fd, b"%d\n" % size)
    finally:
        os.close(fd)


def _size_of(entry: str, st: os.stat_result) -> int:
    """An entry's disk usage: its ``size`` file, written when it was admitted (for an
    entry from before there was one: counted now and written, its last use kept)."""
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(os.path.join(entry, "size"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return max(0, int(os.read(fd, 32)))
        finally:
            os.close(fd)
    size = disk_usage(entry)
    with contextlib.suppress(OSError):
        _write_size(entry, size)
        os.utime(entry, ns=(st.st_atime_ns, st.st_mtime_ns))
    return size
