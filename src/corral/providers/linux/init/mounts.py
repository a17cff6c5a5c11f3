"""Mounts: host facts for the plan (parent side) and the mount steps (child side).

``detect_host_layout`` runs in the host. ``detach_sources`` runs in the fork
server as root, in the host's mount namespace: a detached, read-only,
private copy of each bind source's mount tree, handed to the sandbox, so the
sandbox's own uid never has to walk the host path to a source (a checkout
under a 0700 home). ``init_child`` runs in the sandbox's view builder, inside
its fresh user + mount namespaces: it makes every mount private first
(nothing propagates to the host), builds the new root on a small tmpfs,
attaches those trees (or binds the sources, when there are none), pivots
into it, detaches the old root and remounts the new root and /dev
read-only. Any failure raises; the caller stops the sandbox.
"""

from __future__ import annotations

import os
import stat
import sys

from corral.providers.linux import _sys_unsafe as su

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing (the CLI's one-shot path)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any, Final

    from corral.providers.linux.policy.plan import HostLayout

__all__ = ["detach_sources", "detect_host_layout", "fs_types", "idmap_trees", "idmap_userns",
           "init_child", "rw_bind_sources"]

_SYSTEM_DIRS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES: Final = ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf",
                     "/etc/alternatives")
_DEV_NODES: Final = ("null", "zero", "full", "random", "urandom")
_STAGE_CANDIDATES: Final = ("/tmp", "/mnt", "/media", "/srv", "/var/tmp", "/run")
_AREA: Final = "/.corral-rw"
_IMAGE: Final = "/.corral-image"
#: the step kinds whose ``source`` is a host path (one detached tree each, in order)
_SOURCE_KINDS: Final = ("bind", "rootfs")
_RO_ATTRS: Final = su.MOUNT_ATTR_RDONLY | su.MOUNT_ATTR_NOSUID | su.MOUNT_ATTR_NODEV
# statvfs f_flag bit -> mount flag, so a read-only remount keeps the locked flags
_ST_TO_MS: Final = ((1, su.MS_RDONLY), (2, su.MS_NOSUID), (4, su.MS_NODEV), (8, su.MS_NOEXEC),
                    (1024, 1024), (2048, 2048), (4096, 1 << 21))


def detect_host_layout() -> HostLayout:
    """What this host offers: merged-/usr links, system dirs, prefixes, /etc and /dev files."""
    from corral.providers.linux.policy.plan import HostLayout
    return HostLayout(**host_fields())


def host_fields() -> dict[str, Any]:
    """:func:`detect_host_layout`'s fields as a plain dict (the CLI's one-shot path keys its
    cache on them without building the dataclass)."""
    dirs: list[str] = []
    links: list[tuple[str, str]] = []
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            links.append((d, os.readlink(d)))
        elif os.path.isdir(d):
            dirs.append(d)
    prefixes: list[str] = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable))):
        for q in (os.path.abspath(p), os.path.realpath(p)):
            if q not in prefixes and os.path.isdir(q):
                prefixes.append(q)
    import corral  # the import root is the dir above the package
    package_root = os.path.dirname(os.path.dirname(os.path.realpath(str(corral.__file__))))
    return {
        "euid": os.geteuid(), "egid": os.getegid(), "system_dirs": tuple(dirs),
        "system_links": tuple(links),
        "etc_files": tuple(f for f in _ETC_FILES if os.path.exists(f)),
        "prefixes": tuple(prefixes), "package_root": package_root,
        "dev_nodes": tuple(n for n in _DEV_NODES if os.path.exists(f"/dev/{n}")),
    }


def _locked_flags(path: str) -> int:
    f = os.statvfs(path).f_flag
    out = 0
    for st, ms in _ST_TO_MS:
        if f & st:
            out |= ms
    return out


def _make_target(target: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def _bind(source: str, target: str, *, readonly: bool, extra: int = 0) -> None:
    _make_target(target, os.path.isdir(source))
    su.mount(source, target, None, su.MS_BIND | su.MS_REC, None)
    if not readonly and not extra:
        return  # a bind keeps its source's flags: no remount needed
    _remount(target, (su.MS_RDONLY | su.MS_NOSUID | su.MS_NODEV if readonly else 0) | extra)


def _remount(target: str, flags: int) -> None:
    """Add ``flags`` to the mount at ``target`` (keeping the flags it has)."""
    su.mount(None, target, None, su.MS_BIND | su.MS_REMOUNT | _locked_flags(target) | flags,
             None)


def _attach(tree: int, target: str) -> None:
    """Attach a detached tree from :func:`detach_sources` at ``target``."""
    _make_target(target, stat.S_ISDIR(os.fstat(tree).st_mode))
    su.move_mount(tree, target)


_trees_work = True


def _rw_attrs(step: Mapping[str, Any]) -> int:
    """A read-write bind's mount attributes: nosuid and nodev for a caller's bind
    (``nosuid_nodev``), none for the /dev node binds (nodev would break them)."""
    return su.MOUNT_ATTR_NOSUID | su.MOUNT_ATTR_NODEV if step.get("nosuid_nodev") else 0


def detach_sources(steps: Iterable[Mapping[str, Any]]) -> list[int]:
    """Fork server side, as root: a detached copy of the mount tree at each bind or
    rootfs step's source, in step order (descriptors; the caller closes them).

    Each copy is made private (no mount event propagates between it and the
    host's tree it was copied from) and read-only, nosuid and nodev down to its
    last submount (a read-write step: nosuid and nodev if ``nosuid_nodev``, as a
    caller's bind is), before it leaves the host's mount namespace. [] from then
    on if the kernel has no such trees (before 5.12, or a container's seccomp
    denies them): the view builder binds the sources itself.
    Raises OSError with every copy closed."""
    global _trees_work
    trees: list[int] = []
    if not _trees_work:
        return trees
    try:
        for s in steps:
            if s["kind"] not in _SOURCE_KINDS:
                continue
            fd = su.open_tree_clone(s["source"])
            trees.append(fd)
            ro = s["kind"] == "rootfs" or s["readonly"]
            su.mount_setattr(fd, _RO_ATTRS if ro else _rw_attrs(s),
                             propagation=su.MS_PRIVATE)
    except OSError as e:
        for fd in trees:
            os.close(fd)
        if e.errno in (1, 38):  # EPERM, ENOSYS
            _trees_work = False
            return []
        raise OSError(e.errno, f"{s['source']}: {e.strerror}") from None
    return trees


def rw_bind_sources(steps: Iterable[Mapping[str, Any]]) -> list[str]:
    """The sources of the caller's read-write binds among ``steps`` (the /dev node
    binds are read-write too, but write no file)."""
    return [s["source"] for s in steps
            if s["kind"] == "bind" and not s["readonly"] and s.get("nosuid_nodev")]


def idmap_trees(steps: Iterable[Mapping[str, Any]], trees: Sequence[int], uid: int,
                gid: int, writer: int) -> None:
    """Fork server side, as root, before the sandbox is cloned: make each read-write
    bind's detached tree (``trees``: :func:`detach_sources`'s, in step order) an
    idmapped mount for a sandbox that runs as host ``uid``/``gid``; nothing without a
    read-write bind, or for a sandbox that runs as root itself.

    The mount's idmapping (:func:`idmap_userns`) turns the sandbox's ids into
    ``writer`` (``uidpool.BIND_UID``, uid and gid) on the way to the file system and
    back: what the sandbox writes lands on the host as ``writer``, an identity no
    sandbox runs as, never as its own uid (which a later sandbox may be given). Every
    other id maps to itself: root's files, a setuid binary among them, and another
    user's are "other" to the sandbox as before (writable only where their mode lets
    anyone), and a world-writable dir stays writable. The sandbox's own ids are left
    unmapped: a file some earlier sandbox of that uid left on the host cannot be
    written through the mount.

    Raises OSError naming the source and its file system type when the kernel or the
    file system (or a file system mounted below the source) has no idmapped mounts;
    the caller refuses the sandbox: a read-write bind as root never runs without it.
    """
    steps = list(steps)
    if (uid, gid) == (0, 0) or not rw_bind_sources(steps):
        return
    if not trees:
        raise OSError(38, "the fork server gets no detached mount trees here (open_tree: "
                          "Linux 5.12 and up, unless a container's seccomp denies it)")
    ns = idmap_userns(uid, gid, writer)
    try:
        it = iter(trees)
        for s in steps:
            if s["kind"] not in _SOURCE_KINDS:
                continue
            tree = next(it)
            if s["kind"] != "bind" or s["readonly"] or not s.get("nosuid_nodev"):
                continue
            try:
                su.mount_setattr(tree, su.MOUNT_ATTR_IDMAP, userns_fd=ns)
            except OSError as e:
                raise OSError(e.errno, f"idmapped mount of {s['source']} "
                                       f"({fs_types(s['source'])}): {e.strerror}"
                              ) from None
    finally:
        os.close(ns)


#: the highest valid id plus one ((uid_t)-1 is "no id")
_ID_END: Final = (1 << 32) - 1


def _id_map(own: int, writer: int) -> bytes:
    """A user namespace id map for an idmapped mount (file system id inside -> id seen
    through the mount outside): ``writer`` -> ``own`` (the sandbox's), every other id
    to itself but ``own`` (left unmapped: its outside id is taken) and ``writer`` (its
    inside id is taken); identity if they are equal."""
    if own == writer:
        return b"0 0 %d\n" % _ID_END
    lines = [b"%d %d 1\n" % (writer, own)]
    start = 0
    for skip in sorted((own, writer)):
        if skip > start:
            lines.append(b"%d %d %d\n" % (start, start, skip - start))
        start = skip + 1
    if start < _ID_END:
        lines.append(b"%d %d %d\n" % (start, start, _ID_END - start))
    return b"".join(lines)


def idmap_userns(uid: int, gid: int, writer: int) -> int:
    """A user namespace (a descriptor) whose id maps are :func:`_id_map` of ``uid`` and
    ``gid`` with ``writer``: an idmapping for :func:`idmap_trees`. A child is cloned
    into a new user namespace and held until its maps are written and the namespace
    opened. As root; the caller is single-threaded (the fork server, the CLI's
    one-shot path)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        pid, pidfd = su.clone_pidfd(su.CLONE_NEWUSER)
        if pid == 0:  # the child: wait for the parent to be done, then go
            try:
                os.close(w)
                os.read(r, 1)
            finally:
                os._exit(0)
        try:
            _write(f"/proc/{pid}/setgroups", b"deny")
            _write(f"/proc/{pid}/uid_map", _id_map(uid, writer))
            _write(f"/proc/{pid}/gid_map", _id_map(gid, writer))
            return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(w)
            w = -1
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:  # SIGCHLD ignored: the kernel reaped it
                pass
            os.close(pidfd)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def fs_types(path: str) -> str:
    """The file system type of ``path``'s mount and of any mount below it, from
    /proc/self/mountinfo ("ext4", "overlay, with proc below" ...), for an error."""
    real = os.path.realpath(path).rstrip("/") or "/"
    best, below = ("", "?"), []
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for raw in f:
                line = raw.decode("utf-8", "replace").split()
                if "-" not in line:
                    continue
                point = line[4].replace("\\040", " ")
                fstype = line[line.index("-") + 1]
                if real == point or real.startswith(point.rstrip("/") + "/"):
                    if len(point) >= len(best[0]):
                        best = (point, fstype)
                elif point.startswith(real + "/"):
                    below.append(fstype)
    except OSError:
        return "?"
    more = sorted(set(below) - {best[1]})
    return best[1] + (f", with {', '.join(more)} mounted below" if more else "")


def _stage(sources: Iterable[str]) -> str:
    """A host dir to build the new root on; a tmpfs will hide what it holds, so it
    must not hold any path we are about to bind (a checkout under /tmp, say)."""
    srcs = [x.rstrip("/") + "/" for x in sources]
    for d in _STAGE_CANDIDATES:
        if (os.path.isdir(d) and not os.path.islink(d)
                and not any(x.startswith(d + "/") for x in srcs)):
            return d
    raise OSError(2, "no directory to stage the sandbox root in")


def _bind_rootfs(source: str, root: str, steps: list[Mapping[str, Any]],
                 spread: Sequence[str] = ()) -> None:
    """An image's rootfs under the new root: each top-level entry no other step
    mounts (the host's system dirs, /etc, /proc, /dev, /work, /tmp ...) is bound
    read-only; a top-level symlink is recreated with the same text. A dir named in
    ``spread`` (an image root's ``etc``) is not skipped but made in the new root and
    filled the same way, entry by entry, leaving out the names other steps write
    there (hosts, hostname, resolv.conf)."""
    targets = [s["target"] for s in steps if s["kind"] != "rootfs" and s["target"]]
    taken = {t.split("/")[1] for t in targets if t.startswith("/")}
    _bind_entries(source, root, taken | set(spread), dotfiles=False)
    for name in spread:
        sub = os.path.join(source, name)
        if os.path.islink(sub) or not os.path.isdir(sub):
            continue
        os.makedirs(f"{root}/{name}", exist_ok=True)
        inner = {t.split("/")[2] for t in targets if t.startswith(f"/{name}/")}
        _bind_entries(sub, f"{root}/{name}", inner, dotfiles=True)


def _bind_entries(source: str, root: str, taken: set[str], *, dotfiles: bool) -> None:
    for name in sorted(os.listdir(source)):
        if name in taken or (name.startswith(".") and not dotfiles):
            continue
        path = os.path.join(source, name)
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + "/" + name)
        elif os.path.isdir(path) or os.path.isfile(path):
            _bind(path, root + "/" + name, readonly=True)


def init_child(steps: Iterable[Mapping[str, Any]], *,
               source_fds: Mapping[str, int] | None = None,
               trees: Sequence[int] = ()) -> None:
    """Apply the plan's mount steps and pivot into the new root (sandbox side).

    ``trees``: one detached tree per bind or rootfs step, in order (from
    :func:`detach_sources`), attached instead of binding the source's host path.
    Without them, ``source_fds`` maps a bind source to an ``O_PATH`` descriptor
    opened before the sandbox took its own uid; binding from
    ``/proc/self/fd/N`` reaches a source whose host path that uid could not
    walk (a 0700 home dir).
    """
    fds = source_fds or {}
    steps = list(steps)
    attach = iter(trees) if trees else None
    su.mount(None, "/", None, su.MS_REC | su.MS_PRIVATE, None)
    root = _stage(s["source"] for s in steps if s["kind"] in _SOURCE_KINDS)
    su.mount("corral-root", root, "tmpfs", su.MS_NOSUID | su.MS_NODEV,
             "size=1m,nr_inodes=4096,mode=755")
    area = root + _AREA
    read_only: list[str] = []
    for s in steps:
        kind, target = s["kind"], root + s["target"]
        if kind == "rootfs":
            source = s["source"]
            if attach is not None:  # bound from where the tree is attached for a moment
                source = root + _IMAGE
                _attach(next(attach), source)
            spread = [x for x in str(s.get("data") or "").split(",") if x]
            _bind_rootfs(source, root, steps, spread)
            if attach is not None:
                su.umount2(source, su.MNT_DETACH)  # the binds of its entries keep it alive
                os.rmdir(source)
        elif kind == "bind":
            if attach is not None:
                _attach(next(attach), target)
                continue
            fd = fds.get(s["source"])
            _bind(s["source"] if fd is None else f"/proc/self/fd/{fd}", target,
                  readonly=s["readonly"],
                  extra=su.MS_NOSUID | su.MS_NODEV if s.get("nosuid_nodev") else 0)
        elif kind == "dir":
            os.makedirs(target, exist_ok=True)
            os.chmod(target, s["mode"])
        elif kind == "symlink":
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(s["source"], target)
        elif kind == "file":
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, s["mode"])
            try:
                os.write(fd, s["data"].encode("latin-1"))
            finally:
                os.close(fd)
        elif kind == "proc":
            os.makedirs(target, exist_ok=True)
            su.mount("proc", target, "proc", su.MS_NOSUID | su.MS_NODEV | su.MS_NOEXEC, None)
        elif kind == "tmpfs":
            os.makedirs(target, exist_ok=True)
            su.mount("tmpfs", target, "tmpfs", su.MS_NOSUID,
                     f"size={s['size_bytes']},mode={s['mode']:o}")
            if s["readonly"]:  # once the steps that fill it (/dev's nodes) are done
                read_only.append(target)
        elif kind == "area":
            os.mkdir(area, 0o700)
            su.mount("corral-rw", area, "tmpfs", su.MS_NOSUID | su.MS_NODEV,
                     f"size={s['size_bytes']},mode={s['mode']:o}")
        elif kind == "area_bind":
            sub = f"{area}/{s['source']}"
            os.mkdir(sub)
            os.chmod(sub, s["mode"])
            os.makedirs(target, exist_ok=True)
            _bind(sub, target, readonly=False)  # the area is nosuid,nodev already
        else:
            raise OSError(22, f"unknown mount step {kind!r}")
    for target in read_only:  # the binds on top (/dev/null ...) keep their own flags
        _remount(target, su.MS_RDONLY | su.MS_NOSUID | su.MS_NODEV | su.MS_NOEXEC)
    os.chdir(root)
    su.pivot_root(".", ".")          # the old root now sits on top of the new one ...
    su.umount2(".", su.MNT_DETACH)   # ... and is detached from it
    os.chdir("/")
    if os.path.isdir(_AREA):
        su.umount2(_AREA, su.MNT_DETACH)  # the binds of its subdirs keep it alive
        os.rmdir(_AREA)
    su.mount(None, "/", None, su.MS_BIND | su.MS_REMOUNT | su.MS_RDONLY | su.MS_NOSUID
             | su.MS_NODEV, None)
