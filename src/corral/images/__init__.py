"""Images -> root filesystems: pulling from OCI registries (:mod:`.store`, :mod:`.registry`,
:mod:`.reference`), reading local layouts and tars (:mod:`.layers`), confined extraction in a
bounded child (:mod:`.child`, :mod:`.extract`), and the size-capped cache (:mod:`.cache`)
that holds both. docs/images.md.

The two front doors, for providers that run images::

    img = corral.images.pull("registry.example.com/team/tool:1.2")   # -> PulledImage
    root = corral.images.unpack(img)                                 # -> UnpackedImage
    root.rootfs, root.config.env, img.layout, img.ref_name
    root = corral.images.resolve("registry.example.com/team/tool:1.2")  # pull if missing

Both take ``cache=`` (an :class:`~corral.images.cache.ImageCache`; default: one on
:func:`~corral.images.cache.default_cache_dir`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.images.cache import ImageCache, UnpackedImage
    from corral.images.store import PulledImage

__all__ = ["pull", "resolve", "unpack"]


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


def resolve(image: str, *, cache: ImageCache | None = None, pull_policy: str = "missing",
            **kw: Any) -> UnpackedImage:
    """``image`` as a user writes it (``--image``, ``spec.image``) -> its root filesystem.

    A local path (an OCI layout, ``LAYOUT:TAG``, ``LAYOUT@sha256:...``, a tar, a rootfs
    dir) is unpacked; anything else is read as a registry reference and pulled first:
    ``pull_policy`` ``"missing"`` (default: only when the cache has no image of that
    name; a digest reference never changes), ``"always"`` (ask the registry again:
    a moved tag is followed) or ``"never"`` (``ConfigInvalidError`` when not pulled).
    ``kw`` go to :func:`pull`."""
    from corral.core.errors import ConfigInvalidError
    from corral.images.cache import split_local
    c = _cache(cache)
    path, _ = split_local(image)
    if os.path.exists(path):
        return c.unpack(image)
    if pull_policy not in ("missing", "always", "never"):
        raise ConfigInvalidError("pull_policy", f"must be missing, always or never, not "
                                 f"{pull_policy!r}")
    from corral.images.reference import parse_reference
    try:
        name = str(parse_reference(image))
    except ConfigInvalidError:
        raise ConfigInvalidError("image", f"{image!r} is neither a local image (no such "
                                 "path) nor an image reference") from None
    got = None if pull_policy == "always" else c.pulled.get(name)
    if got is None:
        if pull_policy == "never":
            raise ConfigInvalidError("image", f"{name} is not pulled (pull_policy never; "
                                     "`corral image pull` it)")
        got = c.pull(name, **kw)
    return c.unpack_pulled(got)
