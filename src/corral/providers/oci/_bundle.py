"""OCI bundles: the read-only root skeleton, ``config.json`` and each command's
``process.json`` (runtime-spec 1.0), built from a spec and the host's facts.

The container's root is a small skeleton directory owned by the provider: one mount
point per top-level entry of the root it shows (the host's ``/usr``, ``/lib*`` ... for
the default root, or an unpacked image's entries), each bound read-only, ``nosuid``,
``nodev``; symlinks copied as they are. So the runtime never creates a mount point
inside an image's files (the image cache stays untouched) and ``/work``, ``/tmp``,
``/proc``, ``/dev`` always exist. The root itself is read-only.
"""

from __future__ import annotations

import os
import platform
import stat as _st
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from corral.core.spec import SandboxLimits

__all__ = ["DEFAULT_PATH", "INIT_PATH", "Root", "container_config", "host_root",
           "image_root", "process_config", "seccomp_profile"]

INIT_PATH: Final = "/.corral/init"
WORK: Final = "/work"
DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: top-level names the provider mounts itself (an image's own are hidden)
_OWN: Final = frozenset({"proc", "dev", "sys", "tmp", "work", ".corral"})
#: the host's top-level entries the default root shows (read-only)
_HOST_TOP: Final = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: host /etc entries the default root binds (read-only) into its own small /etc
_HOST_ETC: Final = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl",
                    "localtime", "mime.types")
_ETC_FILES: Final = {
    "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    "resolv.conf": "",
}
_RO_BIND: Final = ("bind", "ro", "nosuid", "nodev")

# seccomp: deny what a sandboxed program never needs and what widens the kernel surface
_DENIED: Final = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "delete_module",
    "finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "init_module",
    "io_uring_enter", "io_uring_register", "io_uring_setup", "ioperm", "iopl", "kcmp",
    "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mount", "mount_setattr",
    "move_mount", "name_to_handle_at", "nfsservctl", "open_by_handle_at", "open_tree",
    "perf_event_open", "pivot_root", "process_madvise", "process_vm_readv",
    "process_vm_writev", "ptrace", "quotactl", "quotactl_fd", "reboot", "request_key",
    "setns", "settimeofday", "swapoff", "swapon", "syslog", "umount2", "unshare", "uselib",
    "userfaultfd", "vhangup",
)
#: clone flags that make namespaces: a clone asking for any is refused
_NS_FLAGS: Final = (0x00000080, 0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                    0x20000000, 0x40000000)
_ARCHES: Final = {"x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
                  "aarch64": ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]}
_EPERM: Final = 1
_ENOSYS: Final = 38


@dataclass(frozen=True, slots=True)
class Root:
    """A skeleton root and the read-only binds that fill it."""

    path: str
    mounts: tuple[dict[str, Any], ...]
    env: tuple[str, ...] = ()
    working_dir: str = ""
    #: the image config's ``Entrypoint`` and ``Cmd`` (mode ``handler-image`` runs them);
    #: None: not an image's root
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None


def _skeleton(path: str) -> None:
    os.makedirs(path, 0o755)
    for name in _OWN:
        os.mkdir(os.path.join(path, name), 0o755)
    with open(os.path.join(path, ".corral", "init"), "wb"):
        pass


def _bind(src: str, dst: str) -> dict[str, Any]:
    return {"destination": dst, "type": "bind", "source": src, "options": list(_RO_BIND)}


def _mirror(src_dir: str, names: Sequence[str], skel: str, prefix: str) -> list[dict[str, Any]]:
    """Mount points in ``skel`` for ``names`` of ``src_dir``: dirs and files bound
    read-only, symlinks copied (their text, never followed), anything else left out."""
    mounts = []
    for name in names:
        src = os.path.join(src_dir, name)
        dst = os.path.join(skel, name)
        try:
            st = os.lstat(src)
        except FileNotFoundError:
            continue
        if _st.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), dst)
        elif _st.S_ISDIR(st.st_mode):
            os.mkdir(dst, 0o755)
            mounts.append(_bind(src, f"{prefix}/{name}"))
        elif _st.S_ISREG(st.st_mode):
            with open(dst, "wb"):
                pass
            mounts.append(_bind(src, f"{prefix}/{name}"))
    return mounts


def host_root(path: str) -> Root:
    """The default root at ``path``: the host's ``/usr``, ``/bin``, ``/lib*``, ``/sbin``
    read-only (symlinks as the host has them) and a small ``/etc`` of the provider's own
    (users root and nobody, localhost, no resolvers) with the host's loader cache,
    alternatives and CA certificates bound read-only."""
    _skeleton(path)
    mounts = _mirror("/", _HOST_TOP, path, "")
    etc = os.path.join(path, "etc")
    os.mkdir(etc, 0o755)
    for name, text in _ETC_FILES.items():
        with open(os.path.join(etc, name), "w", encoding="utf-8") as f:
            f.write(text)
    mounts += _mirror("/etc", _HOST_ETC, etc, "/etc")
    return Root(path, tuple(mounts))


def image_root(path: str, rootfs: str, *, env: Sequence[str] = (),
               working_dir: str = "", entrypoint: Sequence[str] = (),
               cmd: Sequence[str] = ()) -> Root:
    """The root of an unpacked image at ``path``: every top-level entry of ``rootfs``
    except the ones the provider mounts itself, bound read-only."""
    _skeleton(path)
    names = sorted(n for n in os.listdir(rootfs) if n not in _OWN)
    return Root(path, tuple(_mirror(rootfs, names, path, "")), tuple(env), working_dir,
                tuple(entrypoint), tuple(cmd))


def seccomp_profile() -> dict[str, Any]:
    """Allow by default; refuse (EPERM) the syscalls in the deny list and a ``clone`` that
    asks for a namespace; ``clone3`` gets ENOSYS (its flags are out of a filter's reach,
    so the C library falls back to ``clone``)."""
    rules: list[dict[str, Any]] = [
        {"names": list(_DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": _EPERM},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": _ENOSYS},
    ]
    for flag in _NS_FLAGS:
        rules.append({"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": _EPERM,
                      "args": [{"index": 0, "value": flag, "valueTwo": flag,
                                "op": "SCMP_CMP_MASKED_EQ"}]})
    return {"defaultAction": "SCMP_ACT_ALLOW",
            "architectures": _ARCHES.get(platform.machine(), []), "syscalls": rules}


def _tmpfs(dst: str, size_mb: int, uid: int, mode: str) -> dict[str, Any]:
    return {"destination": dst, "type": "tmpfs", "source": "tmpfs",
            "options": ["nosuid", "nodev", f"size={size_mb}m", f"uid={uid}", f"gid={uid}",
                        f"mode={mode}"]}


def container_config(root: Root, *, uid: int, init: str, cgroups_path: str,
                     limits: SandboxLimits, disk_mb: int, hostname: str = "sandbox",
                     seccomp: bool = True) -> dict[str, Any]:
    """``config.json`` of a sandbox: ``init`` (catatonit, static) bound at
    ``/.corral/init`` runs as pid 1 (``-P``: reap, wait); commands come by ``exec``."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=256k"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={disk_mb}m"]},
        *root.mounts,
        {"destination": INIT_PATH, "type": "bind", "source": init, "options": list(_RO_BIND)},
        _tmpfs(WORK, disk_mb, uid, "0700"),
        _tmpfs("/tmp", disk_mb, uid, "1777"),
    ]
    resources: dict[str, Any] = {"devices": [{"allow": False, "access": "rwm"}]}
    if limits.mem_mb is not None:
        n = limits.mem_mb << 20
        resources["memory"] = {"limit": n, "swap": n}
    if limits.max_processes is not None:
        resources["pids"] = {"limit": limits.max_processes + 1}  # + the init
    linux: dict[str, Any] = {
        "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount",
                                             "cgroup")],
        "cgroupsPath": cgroups_path,
        "resources": resources,
        "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
                        "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                        "/proc/sched_debug", "/proc/scsi", "/sys/firmware"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                          "/proc/sysrq-trigger"],
    }
    if seccomp:
        linux["seccomp"] = seccomp_profile()
    return {
        "ociVersion": "1.0.2",
        "process": {**_process_fields(uid), "args": [INIT_PATH, "-P"],
                    "env": [f"PATH={DEFAULT_PATH}"], "cwd": "/"},
        "root": {"path": root.path, "readonly": True},
        "hostname": hostname,
        "mounts": mounts,
        "linux": linux,
    }


def _process_fields(uid: int) -> dict[str, Any]:
    return {"terminal": False, "user": {"uid": uid, "gid": uid, "umask": 0o022},
            "capabilities": {"bounding": [], "effective": [], "inheritable": [],
                             "permitted": [], "ambient": []},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024},
                        {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}],
            "noNewPrivileges": True}


def process_config(argv: Sequence[str], *, uid: int, cwd: str, env: Mapping[str, str]
                   ) -> dict[str, Any]:
    """``process.json`` for ``exec --process``: the same user, no capabilities, no new
    privileges, the same rlimits as the init."""
    return {**_process_fields(uid), "args": list(argv), "cwd": cwd,
            "env": [f"{k}={v}" for k, v in env.items()]}
