"""Reading a local image: blobs from an OCI layout directory or an image tar
(:class:`_Source`), the OCI and ``docker save`` manifests, the image config,
and each layer as a decompressed, hashed, size-capped stream (:class:`Hashing`).

Blob paths never leave the image (absolute or ``..`` refused; a layout
directory is walked from dir fds with ``O_NOFOLLOW``). Refusals are
``ConfigInvalidError`` on field ``image``. Used by :mod:`.images`.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from typing import IO, Any, Final, cast, final

from corral.core.errors import ConfigInvalidError

__all__ = ["HOST_ARCH", "Hashing", "ImageConfig", "REF_NAME", "Source", "bad", "decompressed",
           "docker_manifest", "image_manifest", "oci_manifest", "parse_config"]

_CHUNK: Final = 1 << 20
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ImageConfig:
    """What the image config says about running it (empty when it says nothing)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    working_dir: str = ""
    #: the config's ``User`` (``""``: not set, which means root)
    user: str = ""



def bad(reason: str) -> ConfigInvalidError:
    return ConfigInvalidError("image", reason)


def _strings(doc: Any, key: str) -> tuple[str, ...]:
    value = doc.get(key) if isinstance(doc, dict) else None
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad(f"config field {key!r} must be a list of strings")
    return tuple(value)


def parse_config(raw: bytes) -> tuple[ImageConfig, list[str]]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise bad(f"image config is not JSON: {e}") from None
    cfg = doc.get("config") if isinstance(doc, dict) else None
    diff_ids = list(_strings(doc.get("rootfs") if isinstance(doc, dict) else None, "diff_ids"))
    wd = cfg.get("WorkingDir") if isinstance(cfg, dict) else None
    user = cfg.get("User") if isinstance(cfg, dict) else None
    return ImageConfig(entrypoint=_strings(cfg, "Entrypoint"), cmd=_strings(cfg, "Cmd"),
                       env=_strings(cfg, "Env"),
                       working_dir=wd if isinstance(wd, str) else "",
                       user=user if isinstance(user, str) else ""), diff_ids


# ---------------------------------------------------------------- reading image sources


class Source:
    """Blobs by path inside a layout directory or an (outer) tar."""

    def __init__(self, image: str) -> None:
        self.tar: tarfile.TarFile | None = None
        self.dir = image if os.path.isdir(image) else None
        if self.dir is None:
            try:
                self.tar = tarfile.open(image, "r:*")  # noqa: SIM115 - closed by close()
            except (OSError, tarfile.TarError) as e:
                raise bad(f"{image!r} is neither a directory nor a readable tar: {e}") from None

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
            raise bad(f"blob path {name!r} leaves the image")
        if self.dir is not None:
            fd = os.open(self.dir, _DIR)
            try:
                for p in parts[:-1]:
                    nfd = os.open(p, _DIR, dir_fd=fd)
                    os.close(fd)
                    fd = nfd
                return os.fdopen(os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd), "rb")
            except OSError as e:
                raise bad(f"cannot read {name!r} from the image: {e.strerror}") from None
            finally:
                os.close(fd)
        assert self.tar is not None
        try:
            f = self.tar.extractfile("/".join(parts))
        except (KeyError, tarfile.TarError) as e:
            raise bad(f"the image tar has no readable {name!r}: {e}") from None
        if f is None:
            raise bad(f"{name!r} in the image tar is not a file")
        return f

    def read(self, name: str, limit: int = 16 << 20) -> bytes:
        with self.open(name) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise bad(f"{name!r} is larger than {limit} bytes")
        return data

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()


def _json(src: Source, name: str) -> Any:
    try:
        return json.loads(src.read(name))
    except ValueError as e:
        raise bad(f"{name!r} is not JSON: {e}") from None


def _blob(digest: Any) -> str:
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        raise bad(f"unsupported digest {digest!r} (sha256 only)")
    hexpart = digest[7:]
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise bad(f"malformed digest {digest!r}")
    return f"blobs/sha256/{hexpart}"


#: the annotation an OCI layout's ``index.json`` names its images (tags) with
REF_NAME: Final = "org.opencontainers.image.ref.name"


def _for_host(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in entries
            if (m.get("platform") or {}).get("os", "linux") == "linux"
            and (m.get("platform") or {}).get("architecture", _ARCH) == _ARCH]


def _ref_name(entry: dict[str, Any]) -> str | None:
    ann = entry.get("annotations")
    name = ann.get(REF_NAME) if isinstance(ann, dict) else None
    return name if isinstance(name, str) else None


def _select(entries: list[dict[str, Any]], ref: str | None) -> dict[str, Any]:
    """The one top-level ``index.json`` entry ``ref`` names (a ``ref.name``
    annotation, or a ``sha256:`` digest), or the only one for this host."""
    if ref is not None:
        if ref.startswith("sha256:"):
            chosen = [m for m in entries if m.get("digest") == ref]
        else:
            chosen = [m for m in entries if _ref_name(m) == ref]
        if len(chosen) > 1:
            chosen = _for_host(chosen)
        if not chosen:
            names = sorted({n for m in entries if (n := _ref_name(m)) is not None})
            raise bad(f"index.json has no manifest named {ref!r} (names: "
                      f"{', '.join(map(repr, names)) or 'none'})")
        if len(chosen) > 1:
            raise bad(f"index.json has {len(chosen)} manifests named {ref!r} for "
                      f"linux/{_ARCH}; need one")
        return chosen[0]
    chosen = _for_host(entries)
    if len(chosen) > 1:
        names = sorted({n for m in chosen if (n := _ref_name(m)) is not None})
        raise bad(f"index.json has {len(chosen)} manifests for linux/{_ARCH}; select one by "
                  "tag (LAYOUT:TAG, the org.opencontainers.image.ref.name annotation) or "
                  f"by digest (LAYOUT@sha256:...); tags here: "
                  f"{', '.join(map(repr, names)) or 'none'}")
    if not chosen:
        raise bad(f"index.json has no manifest for linux/{_ARCH}")
    return chosen[0]


def oci_manifest(src: Source, ref: str | None = None) -> tuple[str, list[str]]:
    """(config blob path, layer blob paths) of an image in an OCI layout: the one
    ``ref`` names (a tag in the ``org.opencontainers.image.ref.name`` annotation,
    or a ``sha256:`` manifest digest), else the layout's only image for this host."""
    index = _json(src, "index.json")
    top = True
    for _ in range(4):  # an index may point to a nested index
        manifests = index.get("manifests") if isinstance(index, dict) else None
        if top and ref is not None and manifests == []:
            raise bad(f"index.json has no manifest named {ref!r} (it lists none)")
        if not isinstance(manifests, list) or not manifests:
            raise bad("index.json lists no manifests")
        entries = [m for m in manifests if isinstance(m, dict)]
        if top:
            chosen = _select(entries, ref)
        else:
            host = _for_host(entries)
            if len(host) != 1:
                raise bad(f"an image index has {len(host)} manifests for linux/{_ARCH}; "
                          "need one")
            chosen = host[0]
        top = False
        doc = _json(src, _blob(chosen.get("digest")))
        if isinstance(doc, dict) and "layers" in doc:
            layers = doc["layers"]
            if not isinstance(layers, list):
                raise bad("manifest 'layers' is not a list")
            return (_blob((doc.get("config") or {}).get("digest")),
                    [_blob(layer.get("digest") if isinstance(layer, dict) else None)
                     for layer in layers])
        index = doc
    raise bad("index.json nests indexes too deep")


def docker_manifest(src: Source, ref: str | None = None) -> tuple[str, list[str]]:
    doc = _json(src, "manifest.json")
    if ref is not None and isinstance(doc, list):
        doc = [d for d in doc if isinstance(d, dict) and isinstance(d.get("RepoTags"), list)
               and ref in d["RepoTags"]]
        if not doc:
            raise bad(f"manifest.json has no image tagged {ref!r}")
    if not isinstance(doc, list) or len(doc) != 1 or not isinstance(doc[0], dict):
        raise bad("manifest.json must describe exactly one image (select one by tag: "
                  "TAR:REPO:TAG)" if isinstance(doc, list) and len(doc) > 1 else
                  "manifest.json must describe exactly one image")
    config, layers = doc[0].get("Config"), doc[0].get("Layers")
    if not isinstance(config, str) or not isinstance(layers, list) or not all(
            isinstance(x, str) for x in layers):
        raise bad("manifest.json needs 'Config' (a path) and 'Layers' (a list of paths)")
    return config, list(layers)


def image_manifest(src: Source, ref: str | None = None) -> tuple[str, str, list[str]]:
    """(source kind, config blob path, layer blob paths) of the image ``src`` holds
    (the one ``ref`` names, when it holds several)."""
    if src.has("index.json") and src.has("oci-layout"):
        return ("oci-layout" if src.dir is not None else "oci-archive",
                *oci_manifest(src, ref))
    if src.has("manifest.json"):
        return ("docker-archive", *docker_manifest(src, ref))
    raise bad("not an image: no index.json + oci-layout, and no manifest.json")


_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
#: this host's architecture as OCI spells it (``amd64``, ``arm64``, ...)
HOST_ARCH: Final = _ARCH


# ---------------------------------------------------------------- layer streams


class Hashing(io.RawIOBase):
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
            raise bad(f"a layer decompresses to more than {self.cap} bytes")
        self.sha.update(data)
        buf[: len(data)] = data
        return len(data)

    def drain(self, limit: int = 1 << 20) -> str:
        """Hash what follows the tar's end marker (padding; at most ``limit`` bytes)."""
        start = self.seen
        while self.read(_CHUNK):
            if self.seen - start > limit:
                raise bad(f"a layer has more than {limit} bytes after its end marker")
        return "sha256:" + self.sha.hexdigest()


def decompressed(blob: IO[bytes]) -> IO[bytes]:
    head = io.BufferedReader(cast(io.RawIOBase, blob))
    magic = head.peek(4)[:4]
    if magic[:2] == b"\x1f\x8b":
        return cast(IO[bytes], gzip.GzipFile(fileobj=head, mode="rb"))
    if magic == b"\x28\xb5\x2f\xfd":
        raise bad("zstd-compressed layers are not supported; use gzip or none")
    return head

