"""Local OCI images -> root filesystems in a content-addressed cache.

``ImageCache.unpack(image)`` accepts an OCI image layout directory, a tar of
one (``skopeo copy ... oci-archive:``), a ``docker save`` tar (optionally
gzipped), or a plain rootfs directory (used in place). Layers are applied in
order with whiteouts (``.wh.NAME``) and opaque dirs (``.wh..wh..opq``).

Hostile layers cannot write outside the entry: member and hardlink paths that
are absolute or contain ``..`` are refused, every parent is opened from a dir
fd with ``O_NOFOLLOW`` (a symlink in a parent is refused, never followed), files
are created ``O_EXCL | O_NOFOLLOW`` after removing what was there, devices
are skipped, and setuid/setgid bits are dropped. Sizes, member counts and
decompressed bytes are capped; every layer is checked against the config's
``diff_ids``. Unpacking goes to a temp dir in the cache and is renamed into
place, so a refused image leaves no entry. Key: the config blob's sha256.

Reading images and layers is :mod:`._image_layers`; applying a layer without
leaving the root is :mod:`._image_extract`; this module is the cache.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from typing import Final, Literal, final

from ...errors import ConfigInvalidError, ProviderError
from ._image_extract import Extractor
from ._image_layers import (
    Hashing,
    ImageConfig,
    Source,
    bad,
    decompressed,
    docker_manifest,
    oci_manifest,
    parse_config,
)

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_MEMBERS", "ImageCache", "ImageConfig",
           "UnpackedImage", "default_cache_dir", "unreachable_part"]

DEFAULT_MAX_BYTES: Final = 1 << 30
DEFAULT_MAX_MEMBERS: Final = 200_000
SourceKind = Literal["oci-layout", "oci-archive", "docker-archive", "rootfs"]

ImageConfig.__module__ = __name__  # documented here, where users import it from


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
    """Remove temp dirs of unpackers that died (named ``.tmp-<pid>-...``)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if not name.startswith(".tmp-"):
                continue
            try:
                pid = int(name.split("-")[1])
                os.kill(pid, 0)
            except (ValueError, IndexError, ProcessLookupError):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            except PermissionError:
                pass


@final
class ImageCache:
    """Unpacks local images into ``root`` (:func:`default_cache_dir` by default).

    ``max_bytes`` caps the file bytes of one image, ``max_members`` its tar
    members (all layers together). Refusals are ``ConfigInvalidError`` on
    field ``image``; nothing of a refused image stays in the cache.
    """

    def __init__(self, root: str | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_members: int = DEFAULT_MAX_MEMBERS) -> None:
        for name, v in (("max_bytes", max_bytes), ("max_members", max_members)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigInvalidError(name, "must be a positive integer")
        self.root = os.path.abspath(root or default_cache_dir())
        self.max_bytes, self.max_members = max_bytes, max_members

    def entries(self) -> list[str]:
        """The keys' hex digests present in the cache (complete entries only)."""
        with contextlib.suppress(FileNotFoundError):
            return sorted(n for n in os.listdir(self.root) if not n.startswith("."))
        return []

    def unpack(self, image: str) -> UnpackedImage:
        """The root filesystem of ``image`` (unpacked on first use, then from the cache)."""
        if not isinstance(image, str) or not image or not os.path.exists(image):
            raise bad(f"no local image at {image!r}")
        path = os.path.realpath(image)
        if os.path.isdir(path) and not any(
                os.path.exists(os.path.join(path, n)) for n in ("index.json", "manifest.json")):
            return UnpackedImage(key=f"dir:{path}", rootfs=path, config=ImageConfig(),
                                 source="rootfs")
        src = Source(path)
        try:
            return self._unpack(src)
        except OSError as e:  # the cache's own disk or permissions, not the image
            raise ProviderError(f"cannot unpack {image!r} into {self.root!r}: {e}", e) from e
        finally:
            src.close()

    def _unpack(self, src: Source) -> UnpackedImage:
        source: SourceKind
        if src.has("index.json") and src.has("oci-layout"):
            source = "oci-layout" if src.dir is not None else "oci-archive"
            config_path, layers = oci_manifest(src)
        elif src.has("manifest.json"):
            source = "docker-archive"
            config_path, layers = docker_manifest(src)
        else:
            raise bad("not an image: no index.json + oci-layout, and no manifest.json")
        raw = src.read(config_path)
        digest = hashlib.sha256(raw).hexdigest()
        if config_path.startswith("blobs/sha256/") and config_path[13:] != digest:
            raise bad(f"config blob {config_path!r} does not match its digest")
        config, diff_ids = parse_config(raw)
        if len(diff_ids) != len(layers):
            raise bad(f"{len(layers)} layers but {len(diff_ids)} diff_ids in the config")
        entry = os.path.join(self.root, digest)
        result = UnpackedImage(key=f"sha256:{digest}", rootfs=os.path.join(entry, "rootfs"),
                               config=config, source=source)
        if os.path.isdir(result.rootfs):
            return result
        os.makedirs(self.root, 0o711, exist_ok=True)  # searchable: sandboxes bind entries
        _reap_stale(self.root)
        tmp = tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=self.root)
        try:
            self._extract(src, layers, diff_ids, os.path.join(tmp, "rootfs"))
            os.chmod(tmp, 0o755)
            try:
                os.rename(tmp, entry)
            except OSError:
                if not os.path.isdir(result.rootfs):  # not a concurrent unpack that won
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return result

    def _extract(self, src: Source, layers: list[str], diff_ids: list[str], root: str) -> None:
        os.mkdir(root, 0o755)
        ex = Extractor(root, self.max_bytes, self.max_members)
        cap = self.max_bytes + self.max_members * 2048 + (1 << 20)
        try:
            for layer, diff_id in zip(layers, diff_ids, strict=True):
                with src.open(layer) as blob:
                    stream = Hashing(decompressed(blob), cap)
                    try:
                        ex.apply(stream)  # type: ignore[arg-type]
                        got = stream.drain()
                    except (OSError, EOFError, gzip.BadGzipFile) as e:
                        raise bad(f"cannot read layer {layer!r}: {e}") from None
                    cap -= stream.seen
                if got != diff_id:
                    raise bad(f"layer {layer!r} does not match diff_id {diff_id!r}")
        finally:
            ex.close()

