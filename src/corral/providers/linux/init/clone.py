"""The launcher's half of a sandbox's bring-up, shared by the fork server (``zygote.py``,
the library path) and the CLI's one-shot path (``oneshot.py``): what happens outside the
new namespaces before and right after pid 1 is cloned.

1. :func:`prepare`: as root, the sandbox's own outside uid (``uidpool``), a detached
   read-only copy of each bind source's mount tree (``mounts.detach_sources``) and, for
   a read-write bind, its idmapped writer (``mounts.idmap_trees``);
2. :func:`clone_pid1`: pid 1 cloned straight into the new namespaces with a pidfd, with
   that uid as effective uid so the new user namespace is owned by it;
3. :func:`write_maps`: uid/gid 0 (or an image's User) inside -> that uid/gid outside,
   no setgroups.

pid 1 then runs :func:`pid1.bring_up` (view, cgroup, contain) and becomes the agent or
the one-shot relay's pid 1. Standard library and corral's own ``init`` modules only (the
one-shot path loads this on every run).
"""

from __future__ import annotations

import os

from corral.providers.linux import _sys_unsafe as su
from corral.providers.linux.init import mounts

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing (the one-shot path)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from corral.providers.linux.host.uidpool import SandboxUids

__all__ = ["IDMAP_ERROR", "LaunchError", "clone_pid1", "prepare", "write_maps"]

#: how a launch that needs an idmapped mount and cannot have one fails (the host turns
#: it into LevelNotSupportedError)
IDMAP_ERROR = "idmapped mount"


class LaunchError(OSError):
    """A launch step failed before pid 1 existed; the message starts with the step."""


def prepare(plan: Mapping[str, Any], uids: SandboxUids) -> tuple[int, int, bool, list[int]]:
    """(uid, gid, pooled, trees) for a sandbox of ``plan`` (its wire form): the outside
    ids pid 1 maps 0 to, whether they came from the pool (hold them while it lives), and
    the detached bind trees (as root; the caller closes them). :class:`LaunchError` names
    the step that failed; nothing is left open then."""
    from corral.providers.linux.host.uidpool import BIND_UID
    try:
        uid, gid, pooled = uids.pick(plan["uid_map"][1], plan["gid_map"][1])
    except OSError as e:
        raise LaunchError(e.errno or 0, f"sandbox uid: {e}") from None
    # as root: the sandbox's uid need not reach the sources (not without root)
    trees: list[int] = []
    step = "bind source"
    try:
        if uids.root:
            trees = mounts.detach_sources(plan["mounts"])
            step = IDMAP_ERROR  # a read-write bind: its writes land as BIND_UID, not uid
            mounts.idmap_trees(plan["mounts"], trees, uid, gid, BIND_UID)
    except OSError as e:
        for fd in trees:
            os.close(fd)
        raise LaunchError(e.errno or 0, f"{step}: {e}") from None
    return uid, gid, pooled, trees


def clone_pid1(flags: int, uid: int, gid: int, *, switch: bool) -> tuple[int, int]:
    """``clone_pidfd(flags)``: (pid, pidfd) in the parent, (0, -1) in pid 1. With
    ``switch`` (root, after ``keep_caps_on_setuid``), the clone runs with ``uid``/``gid``
    as effective ids, so the new user namespace is owned by (and its per-user quotas
    charged to) the sandbox's own outside uid, not root; the parent switches back."""
    if switch:
        os.setresgid(-1, gid, -1)
        os.setresuid(-1, uid, -1)
    try:
        pid, pidfd = su.clone_pidfd(flags)
    except BaseException:
        if switch:
            os.setresuid(-1, 0, -1)
            os.setresgid(-1, 0, -1)
        raise
    if pid and switch:  # never in pid 1: its ids are the new namespace's now
        os.setresuid(-1, 0, -1)
        os.setresgid(-1, 0, -1)
    return pid, pidfd


def write_maps(pid: int, uid: int, gid: int, inside: tuple[int, int] = (0, 0)) -> None:
    """uid/gid ``inside`` (the plan's ``uid_map[0]``/``gid_map[0]``: 0, or an image's
    User) in pid 1's user namespace -> ``uid``/``gid`` outside (one id each), no
    setgroups."""
    for name, data in (("setgroups", b"deny"), ("uid_map", b"%d %d 1\n" % (inside[0], uid)),
                       ("gid_map", b"%d %d 1\n" % (inside[1], gid))):
        fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
