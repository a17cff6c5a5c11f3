"""Pure: a SandboxSpec plus provider options and host facts -> a frozen SandboxPlan.

Like bubblewrap's list of setup operations, the plan is data: namespaces,
id maps, an ordered tuple of mount steps, hostname, rlimits, the env
allowlist base and the work dir. ``contain.py`` later applies it top to
bottom in the child. Every impossible combination is refused here, before
anything is forked, with one specific error each.

No I/O: host facts come in as a :class:`HostLayout` (gathered by
``mounts.detect_host_layout``).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal

from corral.core.errors import ConfigInvalidError, LevelNotSupportedError
from corral.core.spec import InvocationMode, Level, SandboxLimits, SandboxSpec

if TYPE_CHECKING:
    from corral.providers.linux.host.egress.policy import EgressPolicy

__all__ = [
    "DEFAULT_LIMITS",
    "ENV_BASE",
    "MIN_MEM_MB",
    "MIN_PROCESSES",
    "BIND_UID",
    "PER_SANDBOX_ID",
    "USER_SYSCTLS",
    "WORK_DIR",
    "Bind",
    "HostLayout",
    "ImageRoot",
    "LinuxOptions",
    "MountStep",
    "SandboxPlan",
    "build_plan",
    "check_spec",
]

WORK_DIR: Final = "/work"
#: what every command gets before the caller's env is laid over it (the host's is never merged)
ENV_BASE: Final[Mapping[str, str]] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK_DIR, "TMPDIR": "/tmp",
}
#: what the provider applies when a spec leaves a limit unset (documented on LinuxProvider)
DEFAULT_LIMITS: Final = SandboxLimits(mem_mb=512, max_processes=256, disk_mb=256)
#: how limits are enforced (LinuxOptions.limits_by)
LIMITS_BY: Final = ("cgroup", "rlimit")
#: the agent (a forked Python) must fit too
MIN_MEM_MB: Final = 16
#: the agent plus one command
MIN_PROCESSES: Final = 2
_FALLBACK_DISK_MB: Final = 256
_NOFILE: Final = 1024
#: an id map's outside id meaning "a host uid of this sandbox's own": the fork
#: server (as root) gives each sandbox one (see _uidpool.py) and maps uid/gid 0 to it
PER_SANDBOX_ID: Final = -1
#: the host uid and gid every write through a read-write bind lands as when the
#: provider runs as root (``host.uidpool.BIND_UID``): no sandbox may run as it
BIND_UID: Final = 0x70000000
#: per-user quotas the kernel charges to the sandbox's uid rather than to a process:
#: queued signals (sigqueue, real-time signals) and POSIX message queue bytes, as
#: rlimits every command inherits (the kernel's own default for the queues)
_SIGPENDING: Final = 1024
_MSGQUEUE: Final = 819200
#: the sandbox user namespace's own /proc/sys/user limits, written by the view
#: builder: inotify and fanotify (the host's limits apply on top, to the sandbox's
#: uid), and no namespaces beyond the ones the sandbox is made of (its mount, pid,
#: net, ipc and uts ones from the clone, the cgroup one pid 1 unshares after)
USER_SYSCTLS: Final = (
    ("max_inotify_instances", 128), ("max_inotify_watches", 8192),
    ("max_fanotify_groups", 0), ("max_fanotify_marks", 0),
    ("max_user_namespaces", 0), ("max_time_namespaces", 0),
    ("max_mnt_namespaces", 1), ("max_pid_namespaces", 1), ("max_net_namespaces", 1),
    ("max_ipc_namespaces", 1), ("max_uts_namespaces", 1), ("max_cgroup_namespaces", 1),
)

#: every namespace a sandbox gets (the kernel's CLONE_NEW* bits, the same numbers as
#: ``_sys_unsafe``'s constants: a test holds them equal; kept here so the plan stays pure)
NAMESPACES: Final = (0x10000000    # CLONE_NEWUSER
                     | 0x00020000  # CLONE_NEWNS
                     | 0x20000000  # CLONE_NEWPID
                     | 0x40000000  # CLONE_NEWNET
                     | 0x08000000  # CLONE_NEWIPC
                     | 0x04000000  # CLONE_NEWUTS
                     | 0x02000000)  # CLONE_NEWCGROUP
_RESERVED: Final = ("/proc", "/dev", "/etc", "/tmp", WORK_DIR)
_WRITABLE: Final = (WORK_DIR, "/tmp")

MountKind = Literal["bind", "tmpfs", "dir", "symlink", "file", "proc", "area", "area_bind",
                    "rootfs"]
#: the modes that take ``spec.image``: ``json-stdio`` as handler files over the host's
#: system dirs (unpacked by the provider, see images.py); ``handler-image`` (and no
#: mode) as the sandbox's root, the image's own userland
_IMAGE_MODES: Final = (InvocationMode.JSON_STDIO, InvocationMode.HANDLER_IMAGE)
_ROOT_MODES: Final = (None, InvocationMode.HANDLER_IMAGE)
#: an image root's top-level dirs whose entries are bound one by one into a dir of
#: the sandbox's own, so the plan's files (hosts, hostname, resolv.conf) sit among them
_SPREAD: Final = ("etc",)
#: where an environment's packages are bound (corral.envs.store.ENV_MOUNT, not imported
#: here): in an image root its top-level dir is spread too, the image's own entries of
#: /opt bound one by one beside it (an image's own /opt/corral is hidden)
_ENV_MOUNT: Final = "/opt/corral/env"
#: the image ``User`` values a strict sandbox runs as (its one mapped id is 0 inside)
_ROOT_USERS: Final = frozenset({"", "0", "root", "0:0", "root:root", "root:0", "0:root"})


@dataclass(frozen=True, slots=True, kw_only=True)
class MountStep:
    """One setup step, applied in order inside the new root.

    kinds: ``bind`` (host ``source`` -> ``target``, read-only unless ``readonly``
    is False), ``tmpfs`` (made read-only once every step is applied, unless
    ``readonly`` is False: what later steps bind on top of it keeps its own
    flags), ``dir``, ``symlink`` (``source`` is the link text),
    ``file`` (``data`` written, then made read-only with the root), ``proc``,
    ``area`` (a tmpfs of ``size_bytes`` outside the root, named ``source``,
    holding the writable subdirs), ``area_bind`` (``source`` = subdir of the area
    bound read-write at ``target``), ``rootfs`` (first, if at all: each top-level
    entry of the host dir ``source`` that no other step mounts is bound
    read-only into the new root; symlinks are copied as symlinks).
    """

    kind: MountKind
    target: str
    source: str = ""
    readonly: bool = True
    size_bytes: int = 0
    mode: int = 0o755
    data: bytes = b""
    #: a read-write ``bind`` that is nosuid and nodev all the same (a caller's
    #: :class:`Bind`; a read-only bind always is, the /dev node binds are not)
    nosuid_nodev: bool = False


@dataclass(frozen=True, slots=True)
class Bind:
    """A host path shown in every sandbox: bubblewrap's ``--ro-bind SRC DST``, or
    ``--bind SRC DST`` with ``rw=True``.

    ``src`` is an absolute host path (it must exist; the provider checks it, and
    refuses one that is or holds a unix socket). ``dst`` is where the sandbox sees
    it: a normalized absolute path, ``None`` (default) for the same path as
    ``src``. Read-only unless ``rw``; every bind is nosuid and nodev. A read-write
    bind's writes reach the host as ``BIND_UID`` (uid and gid 0x70000000, which no
    sandbox runs as) when the provider runs as root, through an idmapped mount;
    otherwise as the caller's own ids: the source must be writable by them, or the
    command's write fails with EACCES. No setuid or setgid bit and no device node
    gets there (the seccomp filter refuses them).
    """

    src: str
    dst: str | None = None
    rw: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.src, str) or not self.src.startswith("/") or "\0" in self.src:
            raise ConfigInvalidError("binds", f"src: not an absolute host path: {self.src!r}")
        if self.dst is None:
            object.__setattr__(self, "dst", posixpath.normpath(self.src))
        dst = self.dst
        if (not isinstance(dst, str) or not dst.startswith("/") or "\0" in dst
                or posixpath.normpath(dst) != dst or dst.startswith("//") or dst == "/"):
            raise ConfigInvalidError(
                "binds", f"dst: not a normalized absolute path other than '/': {dst!r}")
        if not isinstance(self.rw, bool):
            raise ConfigInvalidError("binds", f"rw: must be a bool, got {self.rw!r}")

    @property
    def target(self) -> str:
        """``dst`` (never None once made)."""
        assert self.dst is not None
        return self.dst


@dataclass(frozen=True, slots=True, kw_only=True)
class HostLayout:
    """Facts about the host the plan needs (gathered by mounts.detect_host_layout)."""

    euid: int
    egid: int
    #: top-level system dirs that are real directories (/usr, /lib64 ...)
    system_dirs: tuple[str, ...] = ("/usr",)
    #: top-level symlinks of a merged-/usr host: (path, link text)
    system_links: tuple[tuple[str, str], ...] = ()
    #: host /etc files worth binding read-only (ld.so.cache, localtime ...)
    etc_files: tuple[str, ...] = ()
    #: interpreter prefixes (sys.prefix, sys.base_prefix, dir of the real executable)
    prefixes: tuple[str, ...] = ()
    #: the directory holding the ``corral`` package (bound for handler runs)
    package_root: str = ""
    #: device nodes present on the host among null, zero, full, random, urandom
    dev_nodes: tuple[str, ...] = ("null", "zero", "full", "random", "urandom")


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageRoot:
    """An unpacked image that is the sandbox's root file system (``spec.image``
    without a handler mode), with the facts the provider read from it.

    Attributes:
        rootfs: the unpacked root file system (a host dir, read-only to the sandbox).
        env: the image config's ``Env`` (over :data:`ENV_BASE`; the caller's env over it).
        working_dir: the config's ``WorkingDir`` (``""``: /work); one under /work or
            /tmp is made there, any other must be a dir of the image (the provider
            checks: ``has_working_dir``).
        user: the config's ``User``: only root (``""``, ``0``, ``root``, ``0:0`` ...)
            maps; anything else is refused.
        has_passwd / has_group: the image has its own /etc/passwd, /etc/group (else
            the sandbox's minimal ones are written).
        has_working_dir: ``working_dir`` is a dir in the image (the provider looked).
        top_level: the names at the image's top level (a caller's bind may not hide one).
        uid / gid: the ids ``user`` names, resolved by the provider against the image's
            own /etc/passwd and /etc/group (``None``: ``user`` is not resolved, only
            root maps then); the sandbox runs as them inside.
        entrypoint / cmd: the config's ``Entrypoint`` and ``Cmd`` (what mode
            ``handler-image`` runs).
        key: the image's cache key (``sha256:<config digest>``, ``dir:<path>`` for a
            rootfs dir): an environment built on an image names it (corral.envs).
    """

    rootfs: str
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str = ""
    user: str = ""
    has_passwd: bool = False
    has_group: bool = False
    has_working_dir: bool = False
    top_level: frozenset[str] = frozenset()
    uid: int | None = None
    gid: int | None = None
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    key: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinuxOptions:
    """Provider options that shape every plan.

    Attributes:
        outside_uid / outside_gid: the host ids inside uid/gid 0 map to, and the
            owner of the sandbox's user namespace (the uid the kernel charges its
            per-user quotas to). ``None``: a host uid of the sandbox's own when
            running as root (PER_SANDBOX_ID: 0x70010000 and up, see _uidpool.py),
            the caller's own ids otherwise.
        default_limits: applied where a spec leaves a limit unset.
        hostname: the sandbox's hostname.
        extra_ro_binds: more host paths bound read-only at the same path (one
            under a bound dir is skipped: visible already).
        binds: :class:`Bind` values: a host path at a path of the caller's
            choosing, read-only or read-write (see ``_extra_binds`` for what a
            ``dst`` may not be).
        limits_by: how ``mem_mb``, ``max_processes`` and ``cpu_ms`` are enforced.
            ``"cgroup"``: for the whole sandbox, by its cgroup (refused where the
            host has no usable controller). ``"rlimit"``, chosen explicitly where
            there is no cgroup (a non-root user without a delegated one):
            ``mem_mb`` is each command's RLIMIT_AS (address space, per process,
            set before it runs), ``max_processes`` the sandbox's RLIMIT_NPROC
            (the kernel counts every process of the sandbox's user namespace,
            the agent included), ``cpu_ms`` each command's RLIMIT_CPU (per
            process). Weaker than a cgroup, and said so by the provider and doctor.
    """

    outside_uid: int | None = None
    outside_gid: int | None = None
    default_limits: SandboxLimits = DEFAULT_LIMITS
    hostname: str = "sandbox"
    extra_ro_binds: tuple[str, ...] = ()
    binds: tuple[Bind, ...] = ()
    limits_by: str = "cgroup"

    def __post_init__(self) -> None:
        for name in ("outside_uid", "outside_gid"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigInvalidError(name, f"must be a non-negative integer, got {v!r}")
            if v == BIND_UID:
                raise ConfigInvalidError(name, f"{v:#x} is what writes through a read-write "
                                               "bind land as on the host: no sandbox runs as it")
        if not isinstance(self.default_limits, SandboxLimits):
            raise ConfigInvalidError("default_limits", "must be a SandboxLimits")
        if (not isinstance(self.hostname, str) or not 0 < len(self.hostname) <= 64
                or not all(c.isalnum() or c in "-." for c in self.hostname)):
            raise ConfigInvalidError("hostname", f"not a usable hostname: {self.hostname!r}")
        object.__setattr__(self, "extra_ro_binds", tuple(self.extra_ro_binds))
        object.__setattr__(self, "binds", tuple(self.binds))
        for b in self.binds:
            if not isinstance(b, Bind):
                raise ConfigInvalidError("binds", f"must be Bind values, got {b!r}")
        if self.limits_by not in LIMITS_BY:
            raise ConfigInvalidError("limits_by", f"must be one of {', '.join(LIMITS_BY)}, "
                                     f"got {self.limits_by!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxPlan:
    """Everything the child needs to build one sandbox, decided up front."""

    namespaces: int
    uid_map: tuple[int, int, int]   # inside, outside, count
    gid_map: tuple[int, int, int]
    hostname: str
    mounts: tuple[MountStep, ...]
    work_dir: str
    limits: SandboxLimits           # with the provider defaults merged in
    rlimits: tuple[tuple[str, int, int], ...]   # (RLIMIT_* name, soft, hard), for every command
    cpu_rlimit_s: int | None        # RLIMIT_CPU per command (second line behind the cgroup poll)
    env_base: Mapping[str, str] = field(default_factory=lambda: dict(ENV_BASE))
    #: rlimits set in each command's own process before it runs (limits_by "rlimit")
    command_rlimits: tuple[tuple[str, int, int], ...] = ()
    #: "cgroup" or "rlimit": how the plan's limits are enforced (LinuxOptions.limits_by)
    limits_by: str = "cgroup"
    network: str = "none"
    #: (name under /proc/sys/user, value) for the sandbox's user namespace
    user_sysctls: tuple[tuple[str, int], ...] = USER_SYSCTLS
    #: the spec's network policy as the egress proxy reads it, parsed once here (None for
    #: ``none``: no proxy); host-side only, not in the wire form
    egress: EgressPolicy | None = None
    #: the root is an image's (:class:`ImageRoot`): no host file of corral's or its
    #: interpreter is in the view, so the agent loads no module from files
    image_root: bool = False
    #: where a command runs when the caller names no cwd (an image's WorkingDir)
    cwd: str = WORK_DIR
    #: an image root's ``Entrypoint`` and ``Cmd`` (what mode ``handler-image`` runs);
    #: host-side only, not in the wire form
    image_entrypoint: tuple[str, ...] = ()
    image_cmd: tuple[str, ...] = ()
    #: derived once when the plan is made (the bring-up and the provider read them,
    #: nothing recomputes them): the wire form (:meth:`to_wire`, read-only), what a
    #: pre-warmed spare must match (``shape``: the wire form minus what a claim
    #: applies) and what the sandbox's cgroup enforces of ``limits`` (none of the
    #: three that rlimits enforce under ``limits_by="rlimit"``)
    wire: Mapping[str, Any] = field(init=False, repr=False, compare=False)
    shape: str = field(init=False, repr=False, compare=False)
    cgroup_limits: SandboxLimits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        wire = self._wire()
        shape = {k: v for k, v in wire.items() if k != "cpu_rlimit_s"}
        object.__setattr__(self, "wire", MappingProxyType(wire))
        object.__setattr__(self, "shape",
                           json.dumps(shape, sort_keys=True, separators=(",", ":")))
        object.__setattr__(self, "cgroup_limits", self.limits if self.limits_by == "cgroup"
                           else SandboxLimits(disk_mb=self.limits.disk_mb))

    def to_wire(self) -> dict[str, Any]:
        """A JSON-safe dict for the zygote (mount data as latin-1 text); an image
        root adds ``image_root`` and ``cwd``. A copy of :attr:`wire`."""
        return dict(self.wire)

    def _wire(self) -> dict[str, Any]:
        wire = {
            "namespaces": self.namespaces,
            "uid_map": list(self.uid_map),
            "gid_map": list(self.gid_map),
            "hostname": self.hostname,
            "mounts": [
                {"kind": m.kind, "target": m.target, "source": m.source,
                 "readonly": m.readonly, "size_bytes": m.size_bytes, "mode": m.mode,
                 "data": m.data.decode("latin-1"), "nosuid_nodev": m.nosuid_nodev}
                for m in self.mounts
            ],
            "work_dir": self.work_dir,
            "rlimits": [list(r) for r in self.rlimits],
            "cpu_rlimit_s": self.cpu_rlimit_s,
            "command_rlimits": [list(r) for r in self.command_rlimits],
            "env_base": dict(self.env_base),
            "user_sysctls": [list(x) for x in self.user_sysctls],
        }
        if self.image_root:
            wire.update(image_root=True, cwd=self.cwd)
        return wire


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _check_level_and_network(spec: SandboxSpec) -> None:
    if spec.level is not Level.STRICT:
        raise LevelNotSupportedError(
            str(spec.level), ("strict",),
            "the linux provider gives only the strict level; use the subproc or inprocess "
            "provider for weaker levels")
    # network allowlist / unrestricted: the sandbox keeps its loopback-only namespace and
    # reaches out only through the host's egress proxy (host/netrelay.py); build_plan
    # parses the entries as the proxy reads them (SandboxPlan.egress)
    if spec.image is not None and spec.mode is not None and spec.mode not in _IMAGE_MODES:
        raise ConfigInvalidError(
            "image", "the linux provider takes an image as the sandbox's root (no mode, "
            "or 'handler-image') or as a handler's files (mode 'json-stdio'), not with "
            f"mode {getattr(spec.mode, 'value', None)!r}")


def check_spec(spec: SandboxSpec) -> EgressPolicy | None:
    """The refusals that need no host facts (level, network entries the egress proxy
    cannot read, an image with a mode that takes none); the provider runs them before
    unpacking an image. Returns the network policy as the egress proxy reads it (None
    for a spec without one)."""
    _check_level_and_network(spec)
    if spec.network.kind != "none" or spec.network.hosts or spec.network.secret_headers:
        # imported only for a sandbox with a network policy (the one-shot path has none)
        from corral.providers.linux.host.egress.policy import compile_network
        return compile_network(spec.network)
    return None


def is_image_root(spec: SandboxSpec) -> bool:
    """``spec.image`` is the sandbox's root (no mode, or ``handler-image``): :class:`ImageRoot`."""
    return spec.image is not None and spec.mode in _ROOT_MODES


#: the highest id an image's User may name (below 2^31: some programs keep ids in a
#: signed int; 65534, the kernel's overflow id, shows unmapped files and is refused too)
MAX_IMAGE_ID: Final = 0x7FFFFFFF - 1
_OVERFLOW_ID: Final = 65534


def check_image_root(image: ImageRoot) -> str:
    """Refuse what an image may not set; the commands' default cwd."""
    inside_ids(image)
    wd = _image_cwd(image)
    return wd


def inside_ids(image: ImageRoot) -> tuple[int, int]:
    """The (uid, gid) the sandbox of ``image`` runs as inside: its one mapped id pair,
    root unless the image's ``User`` names another (resolved by the provider into
    ``image.uid``/``gid``). A ``User`` that does not resolve, or names an id outside
    ``0..MAX_IMAGE_ID`` or the overflow id 65534, is refused: never run as root instead."""
    if image.uid is None or image.gid is None:
        if image.user.strip() not in _ROOT_USERS:
            raise ConfigInvalidError(
                "image", f"the image's User {image.user!r} does not map: it names no user "
                "or group of the image's /etc/passwd and /etc/group (a strict sandbox "
                "maps one id pair inside, the image's User; it never runs such an image "
                "as root instead)")
        return 0, 0
    for what, v in (("uid", image.uid), ("gid", image.gid)):
        if isinstance(v, bool) or not 0 <= v <= MAX_IMAGE_ID or v == _OVERFLOW_ID:
            raise ConfigInvalidError(
                "image", f"the image's User {image.user!r} does not map: {what} {v} is "
                f"outside 0..{MAX_IMAGE_ID} or the kernel's overflow id {_OVERFLOW_ID}")
    return image.uid, image.gid


def _image_cwd(image: ImageRoot) -> str:
    wd = image.working_dir or WORK_DIR
    if not wd.startswith("/") or "\0" in wd or wd.startswith("//") or (
            posixpath.normpath(wd) != (wd.rstrip("/") or "/")):
        raise ConfigInvalidError("image", f"WorkingDir {wd!r} is not a normalized "
                                          "absolute path")
    wd = posixpath.normpath(wd)
    if any(_under(wd, r) for r in ("/proc", "/dev")):
        raise ConfigInvalidError("image", f"WorkingDir {wd!r} is in the sandbox's own "
                                          f"{wd.split('/')[1]!r}")
    if not any(_under(wd, w) for w in _WRITABLE) and wd != "/" and not image.has_working_dir:
        raise ConfigInvalidError("image", f"WorkingDir {wd!r} is not a directory of the "
                                          "image (it is read-only: nothing is made there)")
    return wd


def _merged_limits(spec: SandboxSpec, options: LinuxOptions) -> SandboxLimits:
    limits = spec.limits.merged(options.default_limits)
    if limits.disk_mb is None:
        limits = limits.merged(SandboxLimits(disk_mb=_FALLBACK_DISK_MB))
    if limits.mem_mb is not None and limits.mem_mb < MIN_MEM_MB:
        raise ConfigInvalidError(
            "limits.mem_mb", f"{limits.mem_mb} MiB is below the {MIN_MEM_MB} MiB the "
            "sandbox's agent needs")
    if limits.max_processes is not None and limits.max_processes < MIN_PROCESSES:
        raise ConfigInvalidError(
            "limits.max_processes", f"{limits.max_processes} leaves no room for a command "
            f"next to the sandbox's agent (minimum {MIN_PROCESSES})")
    return limits


def _id_maps(options: LinuxOptions, host: HostLayout) -> tuple[tuple[int, int, int],
                                                                 tuple[int, int, int]]:
    root = host.euid == 0
    out_uid = options.outside_uid if options.outside_uid is not None else (
        PER_SANDBOX_ID if root else host.euid)
    out_gid = options.outside_gid if options.outside_gid is not None else (
        PER_SANDBOX_ID if root else host.egid)
    if not root and out_uid != host.euid:
        raise ConfigInvalidError(
            "outside_uid", f"an unprivileged caller (uid {host.euid}) can map only its own uid")
    if not root and out_gid != host.egid:
        raise ConfigInvalidError(
            "outside_gid", f"an unprivileged caller (gid {host.egid}) can map only its own gid")
    return (0, out_uid, 1), (0, out_gid, 1)


def _etc_files(hostname: str) -> list[MountStep]:
    passwd = b"root:x:0:0:sandbox:/work:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
    group = b"root:x:0:\nnogroup:x:65534:\n"
    hosts = f"127.0.0.1 localhost {hostname}\n::1 localhost ip6-localhost\n".encode()
    return [
        MountStep(kind="dir", target="/etc"),
        MountStep(kind="file", target="/etc/passwd", data=passwd, mode=0o644),
        MountStep(kind="file", target="/etc/group", data=group, mode=0o644),
        MountStep(kind="file", target="/etc/hosts", data=hosts, mode=0o644),
        MountStep(kind="file", target="/etc/hostname", data=hostname.encode() + b"\n",
                  mode=0o644),
        MountStep(kind="file", target="/etc/resolv.conf", data=b"", mode=0o644),
    ]


def _extra_binds(host: HostLayout, options: LinuxOptions,
                 with_package: bool) -> tuple[list[MountStep], list[MountStep]]:
    """The bind steps beyond the system dirs: (before the work dir, under the work
    dir or /tmp: bound on top of the sandbox's own writable area, after it).

    Same-path read-only ones first (the interpreter's prefixes, ``extra_ro_binds``
    named ``ro_binds`` in errors, corral for handler runs): one under a dir bound
    already is skipped. Then ``options.binds`` (named ``binds``): a ``dst`` is
    refused when it would hide the sandbox's own /proc, /dev, /etc, /tmp or /work
    (a dir under /work or /tmp is fine), when it is, holds or sits inside a host
    dir the sandbox runs from (the system dirs and their links, the
    interpreter's prefixes, corral's import root: read-only, so no mount point
    could be made there either), when another bind has it already, or when it
    sits inside another caller's bind (nested binds are not offered).
    """
    wanted = list(host.prefixes) + list(options.extra_ro_binds)
    if with_package and host.package_root:
        wanted.append(host.package_root)
    covered = list(host.system_dirs)
    before: list[MountStep] = []
    after: list[MountStep] = []

    def add(step: MountStep) -> None:
        # a host path under /work or /tmp (a checkout in /tmp, say) is bound on top
        # of the sandbox's own writable area, after that area is mounted
        (after if any(_under(step.target, w) for w in _WRITABLE) else before).append(step)

    def hides(p: str) -> str | None:
        if p in _WRITABLE or any(_under(p, r) for r in _RESERVED if r not in _WRITABLE):
            return f"{p!r} would hide the sandbox's own {p.split('/')[1]!r} dir"
        return None

    for raw in wanted:
        p = posixpath.normpath(raw)
        if not p.startswith("/") or p == "/":
            raise ConfigInvalidError("ro_binds", f"cannot bind {raw!r} into the sandbox")
        if any(_under(p, c) for c in covered):
            continue
        why = hides(p)
        if why:
            raise ConfigInvalidError("ro_binds", why)
        covered.append(p)
        add(MountStep(kind="bind", target=p, source=p))
    own = [posixpath.normpath(x) for x in (*host.system_dirs,
                                           *(path for path, _ in host.system_links),
                                           *host.prefixes, host.package_root) if x]
    others = [s.target for s in (*before, *after)]
    for b in options.binds:
        dst = b.target
        if not b.rw and dst == posixpath.normpath(b.src) and any(
                _under(dst, c) for c in covered):
            continue  # visible already, read-only, at this very path
        why = hides(dst)
        if why is None:
            runs = next((o for o in own if _under(dst, o) or _under(o, dst)), None)
            other = next((o for o in others if _under(dst, o) or _under(o, dst)), None)
            if runs is not None:
                why = (f"dst {dst!r} would hide or sit inside {runs!r}, which the sandbox "
                       "runs from (read-only)")
            elif other == dst:
                why = f"dst {dst!r} is bound twice"
            elif other is not None:
                why = f"dst {dst!r} nests with another bind at {other!r} (not offered)"
        if why:
            raise ConfigInvalidError("binds", why)
        others.append(dst)
        add(MountStep(kind="bind", target=dst, source=posixpath.normpath(b.src),
                      readonly=not b.rw, nosuid_nodev=b.rw))
    before.sort(key=lambda m: m.target)
    after.sort(key=lambda m: m.target)
    return before, after


def build_plan(spec: SandboxSpec, *, options: LinuxOptions, host: HostLayout,
               image: ImageRoot | None = None,
               rootfs: str | None = None, image_env: Mapping[str, str] | None = None,
               image_root: ImageRoot | None = None,
               env_vars: Mapping[str, str] | None = None) -> SandboxPlan:
    """Turn ``spec`` into a plan, or refuse it with one specific error.

    ``image``: the unpacked ``spec.image`` as the provider read it: the sandbox's
    root without a mode (``image_root``), its ``rootfs`` and ``env`` as handler files
    with one (``rootfs``, ``image_env``). The three keywords below say the same.

    ``rootfs`` is the unpacked ``spec.image`` (a host dir; required exactly when
    the spec names an image): its top-level entries are bound read-only under
    the host's system dirs, prefixes, corral, /etc, /proc, /dev, /work and /tmp,
    which all sit where they would without an image. ``image_env`` (the image
    config's ``Env``) goes over the env base.

    ``image_root``: a spec whose image has no handler mode takes the image as its
    root instead (:func:`_image_root_plan`): none of the host's dirs is shown.

    ``env_vars``: variables over the env base (and over the image's ``Env``), last:
    a built environment's ``PYTHONPATH`` (``corral.envs``), say.
    """
    egress = check_spec(spec)
    if image is not None:
        if is_image_root(spec):
            image_root = image
        else:
            rootfs, image_env = image.rootfs, image.env
    if is_image_root(spec) or image_root is not None:
        return _image_root_plan(spec, options=options, host=host, image=image_root,
                                egress=egress, env_vars=env_vars)
    if (spec.image is None) != (rootfs is None):
        raise ConfigInvalidError(
            "image", "the plan needs the unpacked rootfs of exactly the spec's image")
    if rootfs is not None and (not rootfs.startswith("/") or posixpath.normpath(rootfs) == "/"):
        raise ConfigInvalidError("image", f"not a usable rootfs dir: {rootfs!r}")
    limits = _merged_limits(spec, options)
    uid_map, gid_map = _id_maps(options, host)
    disk_bytes = (limits.disk_mb or _FALLBACK_DISK_MB) * 1024 * 1024
    before, after = _extra_binds(host, options, with_package=spec.mode is not None)

    steps: list[MountStep] = []
    if rootfs is not None:
        steps.append(MountStep(kind="rootfs", target="/", source=posixpath.normpath(rootfs)))
    for d in host.system_dirs:
        steps.append(MountStep(kind="bind", target=d, source=d))
    for path, link in host.system_links:
        steps.append(MountStep(kind="symlink", target=path, source=link))
    steps.extend(_etc_files(options.hostname))
    for f in host.etc_files:
        steps.append(MountStep(kind="bind", target=f, source=f))
    steps.extend(before)
    steps.extend(_own_dirs(host, disk_bytes))
    steps.extend(after)
    return _plan(spec, options, limits, uid_map, gid_map, steps, disk_bytes,
                 env_base={**ENV_BASE, **(image_env or {}), **(env_vars or {})},
                 egress=egress)


def _own_dirs(host: HostLayout, disk_bytes: int) -> list[MountStep]:
    """/proc, /dev and the writable /work and /tmp: every sandbox's own."""
    steps = [MountStep(kind="proc", target="/proc"),
             # read-only once its nodes and links are in: nothing else is written there
             MountStep(kind="tmpfs", target="/dev", size_bytes=64 * 1024, mode=0o755,
                       readonly=True)]
    for node in host.dev_nodes:
        steps.append(MountStep(kind="bind", target=f"/dev/{node}", source=f"/dev/{node}",
                               readonly=False))
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                       ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        steps.append(MountStep(kind="symlink", target=f"/dev/{name}", source=link))
    # one tmpfs holds both writable dirs, so disk_mb bounds them together
    steps.append(MountStep(kind="area", target="", source="rw", size_bytes=disk_bytes,
                           mode=0o755))
    steps.append(MountStep(kind="area_bind", target=WORK_DIR, source="work", mode=0o755,
                           readonly=False))
    steps.append(MountStep(kind="area_bind", target="/tmp", source="tmp", mode=0o1777,
                           readonly=False))
    return steps


def _image_root_plan(spec: SandboxSpec, *, options: LinuxOptions, host: HostLayout,
                     image: ImageRoot | None, egress: EgressPolicy | None,
                     env_vars: Mapping[str, str] | None = None) -> SandboxPlan:
    """The plan of a sandbox whose root is ``image`` (see docs/images.md, "The image
    as the root"): the image's top-level entries bound read-only (``rootfs`` step,
    its /etc entry by entry among the sandbox's hosts, hostname and resolv.conf),
    then the sandbox's own /proc, /dev, /work, /tmp and the caller's binds; none of
    the host's system dirs, interpreter prefixes or corral. The image's ``Env`` over
    the env base, its ``WorkingDir`` as the commands' default cwd."""
    if image is None or not is_image_root(spec):
        raise ConfigInvalidError(
            "image", "an image root needs a spec with an image and no mode (or mode "
            "'handler-image'), and the unpacked image (ImageRoot)")
    rootfs = image.rootfs
    if not rootfs.startswith("/") or posixpath.normpath(rootfs) == "/":
        raise ConfigInvalidError("image", f"not a usable rootfs dir: {rootfs!r}")
    cwd = check_image_root(image)
    limits = _merged_limits(spec, options)
    uid_map, gid_map = _id_maps(options, host)
    uid, gid = inside_ids(image)  # the image's User: the one id pair inside
    uid_map, gid_map = (uid, uid_map[1], uid_map[2]), (gid, gid_map[1], gid_map[2])
    disk_bytes = (limits.disk_mb or _FALLBACK_DISK_MB) * 1024 * 1024
    # the caller's binds, checked as without an image but against no host dir
    bare = HostLayout(euid=host.euid, egid=host.egid, system_dirs=(), dev_nodes=host.dev_nodes)
    before, after = _extra_binds(bare, options, with_package=False)
    spread = list(_SPREAD)
    for b in before:  # (``after``: under /work or /tmp)
        top = b.target.split("/")[1]
        if b.target == _ENV_MOUNT and top in image.top_level and top not in spread:
            spread.append(top)  # an environment's packages, among the image's /opt
            continue
        if top in image.top_level:
            raise ConfigInvalidError(
                "binds", f"dst {b.target!r} would hide the image's /{top} (a bind takes its "
                "top-level name in an image root): bind under /work, /tmp or a top-level "
                "name the image does not have")
    steps = [MountStep(kind="rootfs", target="/", source=posixpath.normpath(rootfs),
                       data=",".join(spread).encode())]
    etc = _etc_files(options.hostname)
    drop = {"/etc/passwd"} if image.has_passwd else set()
    drop |= {"/etc/group"} if image.has_group else set()
    steps.extend(s for s in etc if s.target not in drop)
    steps.extend(before)
    steps.extend(_own_dirs(host, disk_bytes))
    if cwd != WORK_DIR and any(_under(cwd, w) for w in _WRITABLE):
        steps.append(MountStep(kind="dir", target=cwd, mode=0o755))
    steps.extend(after)
    return _plan(spec, options, limits, uid_map, gid_map, steps, disk_bytes,
                 env_base={**ENV_BASE, **image.env, **(env_vars or {})}, egress=egress,
                 image_root=True, cwd=cwd,
                 image_command=(tuple(image.entrypoint), tuple(image.cmd)))


def _plan(spec: SandboxSpec, options: LinuxOptions, limits: SandboxLimits,
          uid_map: tuple[int, int, int], gid_map: tuple[int, int, int],
          steps: list[MountStep], disk_bytes: int, *, env_base: Mapping[str, str],
          egress: EgressPolicy | None, image_root: bool = False, cwd: str = WORK_DIR,
          image_command: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
          ) -> SandboxPlan:
    rlimits: tuple[tuple[str, int, int], ...] = (
        ("RLIMIT_CORE", 0, 0), ("RLIMIT_NOFILE", _NOFILE, _NOFILE),
        ("RLIMIT_FSIZE", disk_bytes, disk_bytes),
        ("RLIMIT_SIGPENDING", _SIGPENDING, _SIGPENDING),
        ("RLIMIT_MSGQUEUE", _MSGQUEUE, _MSGQUEUE))
    command_rlimits: tuple[tuple[str, int, int], ...] = ()
    cpu_s = None if limits.cpu_ms is None else -(-limits.cpu_ms // 1000) + 1
    if options.limits_by == "rlimit":
        if limits.max_processes is not None:
            n = limits.max_processes
            rlimits += (("RLIMIT_NPROC", n, n),)
        if limits.mem_mb is not None:
            mem = limits.mem_mb * 1024 * 1024
            command_rlimits += (("RLIMIT_AS", mem, mem),)
        if limits.cpu_ms is not None:  # the first line here: no cgroup to watch
            cpu_s = -(-limits.cpu_ms // 1000)
            command_rlimits += (("RLIMIT_CPU", cpu_s, cpu_s + 1),)
    return SandboxPlan(
        namespaces=NAMESPACES, uid_map=uid_map, gid_map=gid_map, hostname=options.hostname,
        mounts=tuple(steps), work_dir=WORK_DIR, limits=limits, rlimits=rlimits,
        cpu_rlimit_s=cpu_s, env_base=env_base,
        network=spec.network.kind, command_rlimits=command_rlimits,
        limits_by=options.limits_by, egress=egress, image_root=image_root, cwd=cwd,
        image_entrypoint=image_command[0], image_cmd=image_command[1],
    )
