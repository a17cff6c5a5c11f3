"""``spec.image`` unpacked and read, once, into the facts the plan needs.

The host side of an image for the strict provider: the image is found in (or pulled
into) the cache, checked reachable by the sandbox's user, and read into a frozen
:class:`~corral.providers.linux.policy.plan.ImageRoot` that ``build_plan`` takes
whole (the sandbox's root without a mode, handler files with one). Nothing after
the plan reads the image again.
"""

from __future__ import annotations

import os
from typing import Any

from corral.core.errors import ConfigInvalidError
from corral.images.cache import ImageCache, UnpackedImage, unreachable_part
from corral.providers.linux.policy.plan import ImageRoot

__all__ = ["image_root_of", "read_image"]


def read_image(ref: str, *, cache: ImageCache, uid_out: int, gid_out: int) -> ImageRoot:
    """Unpack (or find in the cache) ``ref``, refuse it unless the sandbox's user
    (``uid_out``/``gid_out``; negative: a uid of its own) can reach it, and read it.
    Blocking (the provider runs it in a worker thread)."""
    from corral.images import resolve  # a registry reference is pulled when missing
    unpacked = resolve(ref, cache=cache)
    blocked = unreachable_part(unpacked.rootfs, uid_out, gid_out)
    if blocked is not None:
        who = "a uid of its own" if uid_out < 0 else f"uid {uid_out}"
        raise ConfigInvalidError(
            "image", f"the sandbox's user ({who}) cannot reach {unpacked.rootfs!r}: "
            f"{blocked!r} is not searchable by it; put the image (or image_cache_dir) "
            "where it is")
    return image_root_of(unpacked)


def image_root_of(image: UnpackedImage) -> ImageRoot:
    """The facts of an unpacked image the plan needs (plan.ImageRoot)."""
    c, root = image.config, image.rootfs

    def real(rel: str, check: Any) -> bool:
        # no symlink on the way: the image's own links point into the image, not here
        path = root
        for part in rel.strip("/").split("/"):
            if not part:
                continue
            path = os.path.join(path, part)
            if os.path.islink(path):
                return False
        return bool(check(path))

    wd = c.working_dir.strip() if c.working_dir else ""
    return ImageRoot(rootfs=root, env=_env_of(c.env), working_dir=wd, user=c.user,
                     has_passwd=real("etc/passwd", os.path.isfile),
                     has_group=real("etc/group", os.path.isfile),
                     has_working_dir=bool(wd) and real(wd, os.path.isdir),
                     top_level=frozenset(os.listdir(root)))


def _env_of(entries: tuple[str, ...]) -> dict[str, str]:
    """An image config's ``Env`` (``NAME=value`` strings) as a dict."""
    out: dict[str, str] = {}
    for e in entries:
        name, eq, value = e.partition("=")
        if eq and name and "\0" not in e:
            out[name] = value
    return out
