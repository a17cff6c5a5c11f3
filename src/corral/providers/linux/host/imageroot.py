"""An unpacked image as the sandbox's root: the facts its plan needs (``plan.ImageRoot``),
read from the image's config and files, and the unpacking as a sandbox uid must see it.

Shared by the provider and the CLI's one-shot path (``oneshot.py``), so it loads only
the image cache (``corral.images.cache``), never the provider's asyncio machinery.
"""

from __future__ import annotations

import os
from typing import Any

from corral.core.errors import ConfigInvalidError
from corral.images.cache import ImageCache, UnpackedImage, unreachable_part
from corral.providers.linux.policy.plan import ImageRoot

__all__ = ["env_of", "image_root_of", "reachable", "read_image"]


def reachable(image: str, cache: ImageCache, uid_out: int, gid_out: int, *,
              pull_policy: str = "missing") -> UnpackedImage:
    """Unpack (or find in the cache) ``image`` (``images.resolve``: a registry reference
    is pulled when missing), refused unless the sandbox's outside ids (negative: a
    uid of its own, as root) can search their way to its rootfs."""
    from corral.images import resolve
    unpacked = resolve(image, cache=cache, pull_policy=pull_policy)
    blocked = unreachable_part(unpacked.rootfs, uid_out, gid_out)
    if blocked is not None:
        who = "a uid of its own" if uid_out < 0 else f"uid {uid_out}"
        raise ConfigInvalidError(
            "image", f"the sandbox's user ({who}) cannot reach {unpacked.rootfs!r}: "
            f"{blocked!r} is not searchable by it; put the image (or image_cache_dir) "
            "where it is")
    return unpacked


def read_image(ref: str, *, cache: ImageCache, uid_out: int, gid_out: int) -> ImageRoot:
    """``ref`` unpacked (or found in the cache), refused unless the sandbox's user can
    reach it (:func:`reachable`), and read into the plan's facts, once: nothing after
    the plan reads the image again. Blocking (the provider runs it in a worker thread)."""
    return image_root_of(reachable(ref, cache, uid_out, gid_out))


def image_root_of(image: UnpackedImage) -> ImageRoot:
    """The facts of an unpacked image the plan of an image root needs (plan.ImageRoot)."""
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
    has_passwd = real("etc/passwd", os.path.isfile)
    has_group = real("etc/group", os.path.isfile)
    uid, gid = _resolve_user(c.user, root, has_passwd, has_group)
    return ImageRoot(rootfs=root, env=env_of(c.env), working_dir=wd, user=c.user,
                     has_passwd=has_passwd, has_group=has_group,
                     has_working_dir=bool(wd) and real(wd, os.path.isdir),
                     top_level=frozenset(os.listdir(root)), uid=uid, gid=gid,
                     entrypoint=c.entrypoint, cmd=c.cmd, key=image.key)


#: how much of an image's /etc/passwd or /etc/group is read to resolve its User
_ID_FILE_CAP = 1 << 20


def _id_table(root: str, name: str, present: bool) -> dict[str, tuple[int, int]]:
    """``name`` (etc/passwd or etc/group) of the image: entry name -> (id, group id);
    empty when absent or unreadable. Opened without following a symlink at its end
    (``image_root_of`` checked the parents), at most ``_ID_FILE_CAP`` bytes."""
    if not present:
        return {}
    try:
        fd = os.open(os.path.join(root, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        data = f.read(_ID_FILE_CAP)
    out: dict[str, tuple[int, int]] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[0] and parts[2].isascii() and parts[2].isdigit():
            gid = parts[3] if len(parts) > 3 and parts[3].isascii() and parts[3].isdigit() \
                else parts[2]
            out.setdefault(parts[0], (int(parts[2]), int(gid)))
    return out


def _resolve_user(user: str, root: str, has_passwd: bool,
                  has_group: bool) -> tuple[int | None, int | None]:
    """An image config's ``User`` (``name``, ``uid``, ``name:group``, ``uid:gid`` ...)
    as the ids it names, from the image's own /etc/passwd and /etc/group (a number
    stands for itself; a user alone takes its passwd group, a bare uid without a
    passwd entry group 0, as Docker does). ``(None, None)`` when something does not
    resolve: the plan then refuses any User but root's (``plan.inside_ids``)."""
    user = (user or "").strip()
    if not user:
        return 0, 0
    name, _, group = user.partition(":")
    passwd = _id_table(root, "etc/passwd", has_passwd)
    if name.isascii() and name.isdigit():
        uid = int(name)
        gid = next((g for u, g in passwd.values() if u == uid), 0)
    elif name in passwd:
        uid, gid = passwd[name]
    else:
        return None, None
    if group:
        if group.isascii() and group.isdigit():
            gid = int(group)
        else:
            groups = _id_table(root, "etc/group", has_group)
            if group not in groups:
                return None, None
            gid = groups[group][0]
    return uid, gid


def env_of(entries: tuple[str, ...]) -> dict[str, str]:
    """An image config's ``Env`` (``NAME=value`` strings) as a dict."""
    out: dict[str, str] = {}
    for e in entries:
        name, eq, value = e.partition("=")
        if eq and name and "\0" not in e:
            out[name] = value
    return out

