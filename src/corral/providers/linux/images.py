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
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from typing import IO, Any, Final, Literal, cast, final

from ...errors import ConfigInvalidError, ProviderError

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_MEMBERS", "ImageCache", "ImageConfig",
           "UnpackedImage", "default_cache_dir", "unreachable_part"]

DEFAULT_MAX_BYTES: Final = 1 << 30
DEFAULT_MAX_MEMBERS: Final = 200_000
_CHUNK: Final = 1 << 20
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SourceKind = Literal["oci-layout", "oci-archive", "docker-archive", "rootfs"]


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
class ImageConfig:
    """What the image config says about running it (empty when it says nothing)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    working_dir: str = ""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class UnpackedImage:
    """A root filesystem ready to bind: ``key`` is ``sha256:<config digest>``
    (``dir:<path>`` for a rootfs directory)."""

    key: str
    rootfs: str
    config: ImageConfig
    source: SourceKind


def _bad(reason: str) -> ConfigInvalidError:
    return ConfigInvalidError("image", reason)


def _strings(doc: Any, key: str) -> tuple[str, ...]:
    value = doc.get(key) if isinstance(doc, dict) else None
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"config field {key!r} must be a list of strings")
    return tuple(value)


def _parse_config(raw: bytes) -> tuple[ImageConfig, list[str]]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise _bad(f"image config is not JSON: {e}") from None
    cfg = doc.get("config") if isinstance(doc, dict) else None
    diff_ids = list(_strings(doc.get("rootfs") if isinstance(doc, dict) else None, "diff_ids"))
    wd = cfg.get("WorkingDir") if isinstance(cfg, dict) else None
    return ImageConfig(entrypoint=_strings(cfg, "Entrypoint"), cmd=_strings(cfg, "Cmd"),
                       env=_strings(cfg, "Env"),
                       working_dir=wd if isinstance(wd, str) else ""), diff_ids


# ---------------------------------------------------------------- reading image sources


class _Source:
    """Blobs by path inside a layout directory or an (outer) tar."""

    def __init__(self, image: str) -> None:
        self.tar: tarfile.TarFile | None = None
        self.dir = image if os.path.isdir(image) else None
        if self.dir is None:
            try:
                self.tar = tarfile.open(image, "r:*")  # noqa: SIM115 - closed by close()
            except (OSError, tarfile.TarError) as e:
                raise _bad(f"{image!r} is neither a directory nor a readable tar: {e}") from None

    def has(self, name: str) -> bool:
        if self.dir is not None:
            return os.path.isfile(os.path.join(self.dir, name))
        assert self.tar is not None
        with contextlib.suppress(KeyError):
            return self.tar.getmember(name).isreg() or self.tar.getmember(name).issym()
        return False

    def open(self, name: str) -> IO[bytes]:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if name.startswith("/") or ".." in parts or not parts:
            raise _bad(f"blob path {name!r} leaves the image")
        if self.dir is not None:
            fd = os.open(self.dir, _DIR)
            try:
                for p in parts[:-1]:
                    nfd = os.open(p, _DIR, dir_fd=fd)
                    os.close(fd)
                    fd = nfd
                return os.fdopen(os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd), "rb")
            except OSError as e:
                raise _bad(f"cannot read {name!r} from the image: {e.strerror}") from None
            finally:
                os.close(fd)
        assert self.tar is not None
        try:
            f = self.tar.extractfile("/".join(parts))
        except (KeyError, tarfile.TarError) as e:
            raise _bad(f"the image tar has no readable {name!r}: {e}") from None
        if f is None:
            raise _bad(f"{name!r} in the image tar is not a file")
        return f

    def read(self, name: str, limit: int = 16 << 20) -> bytes:
        with self.open(name) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise _bad(f"{name!r} is larger than {limit} bytes")
        return data

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()


def _json(src: _Source, name: str) -> Any:
    try:
        return json.loads(src.read(name))
    except ValueError as e:
        raise _bad(f"{name!r} is not JSON: {e}") from None


def _blob(digest: Any) -> str:
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        raise _bad(f"unsupported digest {digest!r} (sha256 only)")
    hexpart = digest[7:]
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise _bad(f"malformed digest {digest!r}")
    return f"blobs/sha256/{hexpart}"


def _oci_manifest(src: _Source) -> tuple[str, list[str]]:
    """(config blob path, layer blob paths) of the one image in an OCI layout."""
    index = _json(src, "index.json")
    for _ in range(4):  # an index may point to a nested index
        manifests = index.get("manifests") if isinstance(index, dict) else None
        if not isinstance(manifests, list) or not manifests:
            raise _bad("index.json lists no manifests")
        chosen = [m for m in manifests if isinstance(m, dict)
                  and (m.get("platform") or {}).get("os", "linux") == "linux"
                  and (m.get("platform") or {}).get("architecture", _ARCH) == _ARCH]
        if len(chosen) != 1:
            raise _bad(f"index.json has {len(chosen)} manifests for linux/{_ARCH}; need one")
        doc = _json(src, _blob(chosen[0].get("digest")))
        if isinstance(doc, dict) and "layers" in doc:
            layers = doc["layers"]
            if not isinstance(layers, list):
                raise _bad("manifest 'layers' is not a list")
            return (_blob((doc.get("config") or {}).get("digest")),
                    [_blob(layer.get("digest") if isinstance(layer, dict) else None)
                     for layer in layers])
        index = doc
    raise _bad("index.json nests indexes too deep")


def _docker_manifest(src: _Source) -> tuple[str, list[str]]:
    doc = _json(src, "manifest.json")
    if not isinstance(doc, list) or len(doc) != 1 or not isinstance(doc[0], dict):
        raise _bad("manifest.json must describe exactly one image")
    config, layers = doc[0].get("Config"), doc[0].get("Layers")
    if not isinstance(config, str) or not isinstance(layers, list) or not all(
            isinstance(x, str) for x in layers):
        raise _bad("manifest.json needs 'Config' (a path) and 'Layers' (a list of paths)")
    return config, list(layers)


_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


# ---------------------------------------------------------------- layer streams


class _Hashing(io.RawIOBase):
    """Reads through ``raw``, hashing and counting (capped) what passes."""

    def __init__(self, raw: IO[bytes], cap: int) -> None:
        self.raw, self.cap, self.seen = raw, cap, 0
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        data = self.raw.read(len(buf))
        self.seen += len(data)
        if self.seen > self.cap:
            raise _bad(f"a layer decompresses to more than {self.cap} bytes")
        self.sha.update(data)
        buf[: len(data)] = data
        return len(data)

    def drain(self, limit: int = 1 << 20) -> str:
        """Hash what follows the tar's end marker (padding; at most ``limit`` bytes)."""
        start = self.seen
        while self.read(_CHUNK):
            if self.seen - start > limit:
                raise _bad(f"a layer has more than {limit} bytes after its end marker")
        return "sha256:" + self.sha.hexdigest()


def _decompressed(blob: IO[bytes]) -> IO[bytes]:
    head = io.BufferedReader(cast(io.RawIOBase, blob))
    magic = head.peek(4)[:4]
    if magic[:2] == b"\x1f\x8b":
        return cast(IO[bytes], gzip.GzipFile(fileobj=head, mode="rb"))
    if magic == b"\x28\xb5\x2f\xfd":
        raise _bad("zstd-compressed layers are not supported; use gzip or none")
    return head


# ---------------------------------------------------------------- applying layers


def _split(name: str, what: str) -> list[str]:
    if "\0" in name or len(name) > 4096:
        raise _bad(f"{what} {name[:80]!r}: not a usable path")
    if name.startswith("/"):
        raise _bad(f"{what} {name!r} is absolute")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _bad(f"{what} {name!r} contains '..'")
    if len(parts) > 256:
        raise _bad(f"{what} {name[:80]!r} is nested too deep")
    return parts


_Key = tuple[str, ...]


class _Extractor:
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
                    raise _bad(f"path {'/'.join(parts)!r} goes through {p!r}, which is a "
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
            raise _bad(f"a layer is not a tar: {e}") from None
        with tar:
            try:
                for m in tar:
                    self._member(tar, m, created)
            except tarfile.TarError as e:
                raise _bad(f"a layer is a broken tar: {e}") from None

    def _member(self, tar: tarfile.TarFile, m: tarfile.TarInfo, created: set[_Key]) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise _bad(f"the image has more than {self.max_members} members")
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
            raise _bad(f"the image unpacks to more than {self.max_bytes} bytes")
        self._remove(dfd, base)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        src = tar.extractfile(m)
        with os.fdopen(os.open(base, flags, 0o600, dir_fd=dfd), "wb") as out:
            left = m.size
            while src is not None and left > 0:
                chunk = src.read(min(_CHUNK, left))
                if not chunk:
                    raise _bad(f"layer member {m.name!r} is truncated")
                out.write(chunk)
                left -= len(chunk)
            os.fchmod(out.fileno(), (m.mode & 0o777) | 0o644)  # no setuid/setgid/sticky

    def _link(self, m: tarfile.TarInfo, parts: list[str], dfd: int, base: str) -> None:
        target = _split(m.linkname, "hardlink target")
        if not target:
            raise _bad(f"hardlink {m.name!r} points at the root")
        if target == parts:
            return
        tfd = self._walk(target[:-1], None)
        if tfd is None:
            raise _bad(f"hardlink {m.name!r}: target {m.linkname!r} does not exist")
        try:
            try:
                st = os.stat(target[-1], dir_fd=tfd, follow_symlinks=False)
            except FileNotFoundError:
                raise _bad(f"hardlink {m.name!r}: target {m.linkname!r} does not exist") from None
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                raise _bad(f"hardlink {m.name!r}: target {m.linkname!r} is not a file")
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
                    raise _bad(f"bad whiteout {'/'.join((*dirs, base))!r}")
                names = [] if (*dirs, name) in created else [name]
            for n in names:
                self._remove(dfd, n)
        finally:
            os.close(dfd)


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
            raise _bad(f"no local image at {image!r}")
        path = os.path.realpath(image)
        if os.path.isdir(path) and not any(
                os.path.exists(os.path.join(path, n)) for n in ("index.json", "manifest.json")):
            return UnpackedImage(key=f"dir:{path}", rootfs=path, config=ImageConfig(),
                                 source="rootfs")
        src = _Source(path)
        try:
            return self._unpack(src)
        except OSError as e:  # the cache's own disk or permissions, not the image
            raise ProviderError(f"cannot unpack {image!r} into {self.root!r}: {e}", e) from e
        finally:
            src.close()

    def _unpack(self, src: _Source) -> UnpackedImage:
        source: SourceKind
        if src.has("index.json") and src.has("oci-layout"):
            source = "oci-layout" if src.dir is not None else "oci-archive"
            config_path, layers = _oci_manifest(src)
        elif src.has("manifest.json"):
            source = "docker-archive"
            config_path, layers = _docker_manifest(src)
        else:
            raise _bad("not an image: no index.json + oci-layout, and no manifest.json")
        raw = src.read(config_path)
        digest = hashlib.sha256(raw).hexdigest()
        if config_path.startswith("blobs/sha256/") and config_path[13:] != digest:
            raise _bad(f"config blob {config_path!r} does not match its digest")
        config, diff_ids = _parse_config(raw)
        if len(diff_ids) != len(layers):
            raise _bad(f"{len(layers)} layers but {len(diff_ids)} diff_ids in the config")
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

    def _extract(self, src: _Source, layers: list[str], diff_ids: list[str], root: str) -> None:
        os.mkdir(root, 0o755)
        ex = _Extractor(root, self.max_bytes, self.max_members)
        cap = self.max_bytes + self.max_members * 2048 + (1 << 20)
        try:
            for layer, diff_id in zip(layers, diff_ids, strict=True):
                with src.open(layer) as blob:
                    stream = _Hashing(_decompressed(blob), cap)
                    try:
                        ex.apply(stream)  # type: ignore[arg-type]
                        got = stream.drain()
                    except (OSError, EOFError, gzip.BadGzipFile) as e:
                        raise _bad(f"cannot read layer {layer!r}: {e}") from None
                    cap -= stream.seen
                if got != diff_id:
                    raise _bad(f"layer {layer!r} does not match diff_id {diff_id!r}")
        finally:
            ex.close()

