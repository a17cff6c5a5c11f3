"""Pulled images: one OCI image layout inside the image cache (``<cache>/oci``).

:meth:`PulledStore.pull` resolves a reference on its registry (an image index
to this host's ``linux/<arch>`` manifest), downloads the config and layer blobs
it lacks into ``blobs/sha256/`` (shared by every pulled image: a layer is
fetched once) and names the manifest in ``index.json`` with the
``org.opencontainers.image.ref.name`` annotation set to the full reference
(``registry/repository:tag`` or ``...@sha256:...``). Any OCI tool reads the
layout; :meth:`corral.images.cache.ImageCache.unpack` reads one image of it by
that name.

Size: the layout's blobs and partial downloads count against the cache's
``max_cache_bytes`` together with the unpacked trees; least recently used
pulled images are evicted like unpacked entries (never one used in the last
``min_age_s`` seconds or being pulled). A blob is deleted once no pulled image
names it and no pull in progress (``.pulling/<pid>-*``) lists it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, final

from corral.core.errors import ConfigInvalidError, ProviderError
from corral.images.layers import HOST_ARCH, REF_NAME
from corral.images.reference import (
    Credentials,
    Reference,
    RegistryPolicy,
    credentials_for,
    parse_reference,
)
from corral.images.registry import INDEX_TYPES, MANIFEST_TYPES, Descriptor, RegistryClient

if TYPE_CHECKING:
    from corral.images.cache import ImageCache

__all__ = ["LAYOUT_DIR", "PulledImage", "PulledStore"]

LAYOUT_DIR: Final = "oci"
_PULLED_AT: Final = "io.corral.pulled-at"
_FROM_INDEX: Final = "io.corral.index-digest"
_MAX_LAYERS: Final = 256


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PulledImage:
    """An image in the cache's OCI layout: ``ImageCache.unpack(layout, ref=ref_name)``
    gives its root filesystem. ``manifest_digest`` is this host's platform manifest
    (``index_digest`` the index it was chosen from, if any); ``size`` the bytes of
    its blobs (shared ones included)."""

    reference: str
    layout: str
    ref_name: str
    manifest_digest: str
    index_digest: str | None
    config_digest: str
    layers: tuple[Descriptor, ...]
    size: int
    pulled_at: float
    last_used: float

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "layout": self.layout, "ref_name": self.ref_name,
                "manifest_digest": self.manifest_digest, "index_digest": self.index_digest,
                "config_digest": self.config_digest, "size": self.size,
                "layers": [{"digest": d.digest, "size": d.size, "mediaType": d.media_type}
                           for d in self.layers],
                "pulled_at": self.pulled_at, "last_used": self.last_used}


def _json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise ConfigInvalidError("image", f"{what} is not JSON") from None


def _choose(index: Any, what: str) -> Descriptor:
    """The index entry for this host (linux/HOST_ARCH)."""
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list):
        raise ConfigInvalidError("image", f"{what}: an image index without 'manifests'")
    found = []
    for m in manifests:
        plat = m.get("platform") if isinstance(m, dict) else None
        if isinstance(plat, dict) and plat.get("os") == "linux" \
                and plat.get("architecture") == HOST_ARCH:
            found.append(m)
    if not found:
        plats = sorted({f"{(m.get('platform') or {}).get('os')}/"
                        f"{(m.get('platform') or {}).get('architecture')}"
                        for m in manifests if isinstance(m, dict)})
        raise ConfigInvalidError("image", f"{what} has no image for linux/{HOST_ARCH} "
                                 f"(it has: {', '.join(plats) or 'none'})")
    return Descriptor.of(found[0], what)


class PulledStore:
    """The pulled images of ``cache`` (its ``oci`` layout; see the module doc)."""

    def __init__(self, cache: ImageCache) -> None:
        self.cache = cache
        self.layout = os.path.join(cache.root, LAYOUT_DIR)
        self.blobs = os.path.join(self.layout, "blobs", "sha256")
        self.partial = os.path.join(self.layout, ".partial")
        self.pulling = os.path.join(self.layout, ".pulling")
        self.used = os.path.join(self.layout, ".used")

    def _ensure(self) -> None:
        os.makedirs(self.cache.root, 0o711, exist_ok=True)
        for d in (self.blobs, self.partial, self.pulling, self.used):
            os.makedirs(d, 0o755 if d == self.blobs else 0o700, exist_ok=True)
        os.chmod(self.layout, 0o755)
        marker = os.path.join(self.layout, "oci-layout")
        if os.path.exists(marker):
            return
        with self.cache._locked():  # two first pulls: one makes the (empty) index
            if not os.path.exists(os.path.join(self.layout, "index.json")):
                self._save_index([])
            self._write(marker, {"imageLayoutVersion": "1.0.0"})

    @staticmethod
    def _write(path: str, doc: Any) -> None:
        tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)

    def _index(self) -> list[dict[str, Any]]:
        try:
            with open(os.path.join(self.layout, "index.json"), "rb") as f:
                doc = json.loads(f.read(16 << 20))
        except FileNotFoundError:
            return []
        manifests = doc.get("manifests") if isinstance(doc, dict) else None
        return [m for m in manifests or [] if isinstance(m, dict)]

    def _save_index(self, entries: list[dict[str, Any]]) -> None:
        self._write(os.path.join(self.layout, "index.json"),
                    {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                     "manifests": entries})

    def _blob(self, digest: str, cap: int = 4 << 20) -> bytes:
        with open(os.path.join(self.blobs, digest[7:]), "rb") as f:
            return f.read(cap)

    def _used_file(self, ref_name: str) -> str:
        import hashlib
        return os.path.join(self.used, hashlib.sha256(ref_name.encode()).hexdigest())

    def touch(self, ref_name: str) -> None:
        """Mark a pulled image used now (eviction goes least recently used first)."""
        path = self._used_file(ref_name)
        with contextlib.suppress(OSError):
            with open(path, "a"):
                pass
            os.utime(path)

    # -- pulling ------------------------------------------------------------------------
    def pull(self, reference: str, *, policy: RegistryPolicy | None = None,
             credentials: Credentials | None = None, timeout_s: float = 60.0,
             max_time_s: float | None = 3600.0) -> PulledImage:
        """Pull ``reference`` (tag or digest) for this host's platform; see the module
        doc. The registry must be allowed by ``policy`` (default
        :meth:`RegistryPolicy.load`), else ``ConfigInvalidError("registry")`` before
        any connection. Credentials default to :func:`credentials_for`. ``timeout_s``
        bounds each connect and each wait for bytes, ``max_time_s`` the whole pull
        (``ProviderError`` past it; partial downloads are kept to resume)."""
        ref = parse_reference(reference)
        policy = RegistryPolicy.load() if policy is None else policy
        policy.check(ref.registry)
        if ref.api_host != ref.registry:
            policy.check(ref.api_host, "registry API host")
        if credentials is None:
            credentials = credentials_for(ref.registry)
        self._ensure()
        with RegistryClient.for_reference(ref, policy, credentials=credentials,
                                          timeout_s=timeout_s,
                                          max_time_s=max_time_s) as client:
            return self._pull(ref, client)

    def _pull(self, ref: Reference, client: RegistryClient) -> PulledImage:
        body, media_type, digest = client.fetch_manifest(ref.repository, ref.locator)
        index_digest = None
        if media_type in INDEX_TYPES:
            index_digest = digest
            chosen = _choose(_json(body, f"index {ref}"), f"the index of {ref}")
            body, media_type, digest = client.fetch_manifest(ref.repository, chosen.digest)
            if len(body) != chosen.size:
                raise ConfigInvalidError("image", f"manifest {chosen.digest} is {len(body)} "
                                         f"bytes, the index says {chosen.size}: refused")
        if media_type not in MANIFEST_TYPES:
            raise ConfigInvalidError("image", f"{ref}: unsupported manifest type "
                                     f"{media_type!r}")
        doc = _json(body, f"manifest of {ref}")
        if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
            raise ConfigInvalidError("image", f"manifest of {ref} has no 'layers' list")
        config = Descriptor.of(doc.get("config"), f"{ref} config")
        layers = tuple(Descriptor.of(x, f"{ref} layer {i}")
                       for i, x in enumerate(doc["layers"]))
        if len(layers) > _MAX_LAYERS:
            raise ConfigInvalidError("image", f"{ref} has {len(layers)} layers, more than "
                                     f"{_MAX_LAYERS}")
        wanted = [config, *layers]
        declared = sum(d.size for d in wanted)
        cap = min(self.cache.max_bytes, self.cache.max_cache_bytes)
        if declared > cap:
            raise ConfigInvalidError("image", f"{ref} declares {declared} bytes of blobs, more "
                                     f"than one image may take ({cap}: the cache's max_bytes "
                                     "and max_cache_bytes)")
        name = str(ref)
        ticket = os.path.join(self.pulling, f"{os.getpid()}-{uuid.uuid4().hex}")
        with open(ticket, "w") as f:
            json.dump([d.digest for d in wanted] + [digest], f)
        try:
            need = sum(d.size for d in wanted if not os.path.isfile(
                os.path.join(self.blobs, d.hex)))
            if need:
                with self.cache._locked():
                    self.cache._make_room(need, keep=frozenset({name}))
            for d in wanted:
                if not client.fetch_blob(ref.repository, d, self.blobs, self.partial):
                    with contextlib.suppress(OSError):
                        os.utime(os.path.join(self.blobs, d.hex))  # keep it from a GC
            self._put_manifest(digest, body)
            ann = {REF_NAME: name, _PULLED_AT: f"{time.time():.3f}"}
            if index_digest:
                ann[_FROM_INDEX] = index_digest
            entry = {"mediaType": media_type, "digest": digest, "size": len(body),
                     "platform": {"os": "linux", "architecture": HOST_ARCH},
                     "annotations": ann}
            with self.cache._locked():
                index = self._index()
                if not any(_name(e) == name and e.get("digest") == digest for e in index):
                    self._save_index([*(e for e in index if _name(e) != name), entry])
            self.touch(name)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(ticket)
        got = self.get(name)
        if got is None:
            raise ProviderError(f"{name} was removed from the cache as it was pulled")
        return got

    def _put_manifest(self, digest: str, body: bytes) -> None:
        final = os.path.join(self.blobs, digest[7:])
        if os.path.isfile(final):
            os.utime(final)
            return
        tmp = os.path.join(self.partial, f"{digest[7:]}.{uuid.uuid4().hex}.m")
        with open(tmp, "wb") as f:
            f.write(body)
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)

    # -- what is here -------------------------------------------------------------------
    def images(self) -> list[PulledImage]:
        """Every pulled image, in the order pulled."""
        out = []
        for e in self._index():
            with contextlib.suppress(OSError, ConfigInvalidError, ValueError, KeyError):
                if (p := self._describe(e)) is not None:
                    out.append(p)
        return out

    def get(self, reference: str) -> PulledImage | None:
        """The pulled image named ``reference`` (normalised: ``busybox`` is
        ``docker.io/library/busybox:latest``), or None."""
        name = _normalise(reference)
        for e in self._index():
            if _name(e) == name:
                return self._describe(e)
        return None

    def _describe(self, e: dict[str, Any]) -> PulledImage | None:
        name = _name(e)
        if name is None:
            return None
        digest = Descriptor.of(e, name).digest
        doc = _json(self._blob(digest), name)
        config = Descriptor.of(doc.get("config"), name)
        layers = tuple(Descriptor.of(x, name) for x in doc.get("layers", []))
        ann = e.get("annotations") or {}
        pulled = float(ann.get(_PULLED_AT, 0) or 0)
        try:
            used = os.stat(self._used_file(name)).st_mtime
        except OSError:
            used = pulled
        size = sum(d.size for d in (config, *layers)) + int(e.get("size") or 0)
        return PulledImage(reference=name, layout=self.layout, ref_name=name,
                           manifest_digest=digest, index_digest=ann.get(_FROM_INDEX),
                           config_digest=config.digest, layers=layers, size=size,
                           pulled_at=pulled, last_used=used)

    def config(self, image: PulledImage) -> dict[str, Any]:
        """The image's config document (digest checked)."""
        import hashlib
        raw = self._blob(image.config_digest)
        if "sha256:" + hashlib.sha256(raw).hexdigest() != image.config_digest:
            raise ConfigInvalidError("image", f"{image.reference}: the stored config does "
                                     "not match its digest")
        doc = _json(raw, f"config of {image.reference}")
        return doc if isinstance(doc, dict) else {}

    # -- removing -----------------------------------------------------------------------
    def remove(self, reference: str) -> PulledImage:
        """Forget a pulled image and delete the blobs no other one uses."""
        got = self.get(reference)
        if got is None:
            raise ConfigInvalidError("image", f"no pulled image {reference!r} "
                                     f"(named {_normalise(reference)!r})")
        with self.cache._locked():
            self.drop(got.ref_name)
        return got

    def drop(self, ref_name: str) -> None:
        """Remove ``ref_name`` from the index and collect garbage (cache lock held)."""
        self._save_index([e for e in self._index() if _name(e) != ref_name])
        with contextlib.suppress(OSError):
            os.unlink(self._used_file(ref_name))
        self.gc()

    def gc(self, min_age_s: float = 0.0) -> None:
        """Delete blobs no pulled image and no live pull names, and partial downloads
        no live pull holds (cache lock held)."""
        if not os.path.isdir(self.blobs):
            return
        keep: set[str] = set()
        for e in self._index():
            d = e.get("digest")
            if isinstance(d, str):
                keep.add(d[7:])
                with contextlib.suppress(OSError, ValueError, ConfigInvalidError):
                    doc = _json(self._blob(d), "manifest")
                    for x in [doc.get("config"), *doc.get("layers", [])]:
                        if isinstance(x, dict) and isinstance(x.get("digest"), str):
                            keep.add(x["digest"][7:])
        for name in os.listdir(self.pulling):
            path = os.path.join(self.pulling, name)
            try:
                pid = int(name.split("-")[0])
                os.kill(pid, 0)
            except (ValueError, ProcessLookupError):  # its puller is gone
                with contextlib.suppress(OSError):
                    os.unlink(path)
                continue
            except PermissionError:
                pass  # alive, another user's
            with contextlib.suppress(OSError, ValueError), open(path) as f:
                keep.update(d[7:] for d in json.load(f) if isinstance(d, str))
        now = time.time()
        for name in os.listdir(self.blobs):
            if name in keep:
                continue
            path = os.path.join(self.blobs, name)
            with contextlib.suppress(OSError):
                if now - os.stat(path).st_mtime >= min_age_s:
                    os.unlink(path)
        import fcntl
        for name in os.listdir(self.partial):
            path = os.path.join(self.partial, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if now - os.fstat(fd).st_mtime >= max(min_age_s, 3600.0):
                    os.unlink(path)
            except OSError:
                pass  # a pull holds it
            finally:
                os.close(fd)

    def usage(self) -> int:
        """Bytes of disk the layout's blobs and partial downloads take."""
        total = 0
        for d in (self.blobs, self.partial):
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(d):
                    with contextlib.suppress(FileNotFoundError):
                        total += os.lstat(os.path.join(d, name)).st_blocks * 512
        return total


def _name(entry: dict[str, Any]) -> str | None:
    ann = entry.get("annotations")
    n = ann.get(REF_NAME) if isinstance(ann, dict) else None
    return n if isinstance(n, str) else None


def _normalise(reference: str) -> str:
    try:
        return str(parse_reference(reference))
    except ConfigInvalidError:
        return reference
