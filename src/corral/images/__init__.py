"""Images -> root filesystems: pulling from OCI registries (:mod:`.store`, :mod:`.registry`,
:mod:`.reference`), reading local layouts and tars (:mod:`.layers`), confined extraction in a
bounded child (:mod:`.child`, :mod:`.extract`), and the size-capped cache (:mod:`.cache`)
that holds both. docs/images.md.

The two front doors, for providers that run images::

    img = corral.images.pull("registry.example.com/team/tool:1.2")   # -> PulledImage
    root = corral.images.unpack(img)                                 # -> UnpackedImage
    root.rootfs, root.config.env, img.layout, img.ref_name

Both take ``cache=`` (an :class:`~corral.images.cache.ImageCache`; default: one on
:func:`~corral.images.cache.default_cache_dir`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.images.cache import ImageCache, UnpackedImage
    from corral.images.store import PulledImage

__all__ = ["pull", "unpack"]


def _cache(cache: ImageCache | None) -> ImageCache:
    from corral.images.cache import ImageCache
    return cache if cache is not None else ImageCache()


def pull(reference: str, *, cache: ImageCache | None = None, **kw: Any) -> PulledImage:
    """Pull ``reference`` (``[registry/]repository[:tag][@sha256:...]``) for this host's
    platform into the cache's OCI layout; every digest is checked. Keywords: ``policy``
    (a :class:`~corral.images.reference.RegistryPolicy`; default the operator's),
    ``credentials``, ``timeout_s`` (each connect or read), ``max_time_s`` (the whole pull,
    default 3600). A registry the policy does not allow:
    ``ConfigInvalidError("registry")`` before any connection."""
    return _cache(cache).pull(reference, **kw)


def unpack(image: PulledImage | str, *, cache: ImageCache | None = None) -> UnpackedImage:
    """The root filesystem of a pulled image, or of a local image path (an OCI layout,
    ``LAYOUT:TAG``, an OCI or ``docker save`` tar, a rootfs dir), unpacked into the cache."""
    c = _cache(cache)
    if isinstance(image, str):
        return c.unpack(image)
    return c.unpack_pulled(image)
