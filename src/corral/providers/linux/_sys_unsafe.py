"""Raw Linux syscalls for the strict provider: the ONLY module that calls into libc.

Every function raises ``OSError(errno)`` on failure and takes an optional
``libc`` handle (as pyroute2's ``netns`` functions do), so a test can inject a
fake. Syscall numbers are kept here for x86_64 and aarch64 only; on other
architectures the functions that need a raw number raise ``OSError(ENOSYS)``.
Nothing here allocates a Python object the caller must free, so the functions
are safe to call in a forked child.
"""

from __future__ import annotations

import _ctypes
import _signal  # type: ignore[import-not-found]  # signal.py's C module: no enums
import errno
import fcntl
import os
import struct

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing (the CLI's one-shot path)
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Final


class _CTypes:
    """The few pieces of ``ctypes`` this module uses, built on its C module ``_ctypes``.

    ``import ctypes`` runs ctypes/__init__.py, which defines every C type, CDLL,
    PyDLL, the Windows names, and more: 0.65 MiB of resident memory, which the CLI's
    one-shot path pays on every run (issue 16: under 10 MiB peak). The C module
    alone gives all that is needed: simple types are ``_SimpleCData`` subclasses
    named by a format code, a function is a ``CFuncPtr`` subclass called on
    ``(name, library)``. No array or structure type is made (the first of each
    costs another 0.25 and 0.13 MiB of _ctypes' pages): a struct the kernel only
    reads is passed as ``bytes`` (ctypes passes a bytes object's own buffer).
    """

    class c_int(_ctypes._SimpleCData):  # type: ignore[type-arg]  # ctypes' names
        _type_ = "i"

    class c_uint(_ctypes._SimpleCData):  # type: ignore[type-arg]
        _type_ = "I"

    class c_long(_ctypes._SimpleCData):  # type: ignore[type-arg]
        _type_ = "l"

    class c_ulong(_ctypes._SimpleCData):  # type: ignore[type-arg]
        _type_ = "L"

    class c_uint32(_ctypes._SimpleCData):  # type: ignore[type-arg]
        _type_ = "I"

    class c_void_p(_ctypes._SimpleCData):  # type: ignore[type-arg]
        _type_ = "P"

    class c_char_p(_ctypes._SimpleCData):  # type: ignore[type-arg]
        _type_ = "z"

    c_size_t = c_ulong  # LP64 (x86_64, aarch64: the only arches with syscall numbers here)
    byref = staticmethod(_ctypes.byref)
    addressof = staticmethod(_ctypes.addressof)
    get_errno = staticmethod(_ctypes.get_errno)

    class CDLL:
        """``ctypes.CDLL(None, use_errno=True)``: the process's own symbols (libc)."""

        def __init__(self) -> None:
            class _FuncPtr(_ctypes.CFuncPtr):
                _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
                _restype_ = _CTypes.c_int

            self._FuncPtr = _FuncPtr
            self._handle = _ctypes.dlopen(None, 0)  # type: ignore[arg-type]  # this process

        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            func = self._FuncPtr((name, self))  # type: ignore[arg-type]
            func.__name__ = name  # type: ignore[attr-defined]
            setattr(self, name, func)
            return func

    @staticmethod
    def memmove(dst: int, src: bytes, size: int) -> None:
        """memmove(3) of ``size`` bytes of ``src`` to the address ``dst``."""
        lc = _libc(None)
        lc.memmove.restype = _CTypes.c_void_p
        lc.memmove(_CTypes.c_void_p(dst), src, _CTypes.c_size_t(size))


ctypes = _CTypes

__all__ = [
    "CLONE_NEWCGROUP",
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "CLONE_NEWUTS",
    "MNT_DETACH",
    "MS_BIND",
    "MS_NODEV",
    "MS_NOEXEC",
    "MS_NOSUID",
    "MS_PRIVATE",
    "MS_RDONLY",
    "MS_REC",
    "MS_REMOUNT",
    "MS_SLAVE",
    "MOUNT_ATTR_IDMAP",
    "MOUNT_ATTR_NODEV",
    "MOUNT_ATTR_NOSUID",
    "MOUNT_ATTR_RDONLY",
    "clone_pidfd",
    "drop_capabilities",
    "fork_bare",
    "keep_caps_on_setuid",
    "landlock_abi_version",
    "loopback_up",
    "machine_arch",
    "mount",
    "mount_setattr",
    "move_mount",
    "open_tree_clone",
    "pivot_root",
    "preresolve",
    "Seccomp",
    "seccomp_install",
    "set_signal",
    "set_sigmask",
    "set_child_subreaper",
    "set_dumpable",
    "set_no_new_privs",
    "set_pdeathsig",
    "set_proctitle",
    "sethostname",
    "umount2",
    "unshare",
]

CLONE_NEWNS: Final = 0x00020000
CLONE_NEWCGROUP: Final = 0x02000000
CLONE_NEWUTS: Final = 0x04000000
CLONE_NEWIPC: Final = 0x08000000
CLONE_NEWUSER: Final = 0x10000000
CLONE_NEWPID: Final = 0x20000000
CLONE_NEWNET: Final = 0x40000000

MS_RDONLY: Final = 1
MS_NOSUID: Final = 2
MS_NODEV: Final = 4
MS_NOEXEC: Final = 8
MS_REMOUNT: Final = 32
MS_BIND: Final = 4096
MS_REC: Final = 16384
MS_PRIVATE: Final = 1 << 18
MS_SLAVE: Final = 1 << 19
MNT_DETACH: Final = 2
#: mount_setattr(2) attributes
MOUNT_ATTR_RDONLY: Final = 0x1
MOUNT_ATTR_NOSUID: Final = 0x2
MOUNT_ATTR_NODEV: Final = 0x4
MOUNT_ATTR_IDMAP: Final = 0x00100000

_SIGCHLD: Final = 17  # the same on x86_64 and aarch64
_CLONE_PIDFD: Final = 0x1000
_PR_SET_PDEATHSIG: Final = 1
_PR_SET_DUMPABLE: Final = 4
_PR_SET_SECCOMP: Final = 22
_PR_CAPBSET_DROP: Final = 24
_PR_SET_SECUREBITS: Final = 28
_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_SET_NO_NEW_PRIVS: Final = 38
_PR_CAP_AMBIENT: Final = 47
_PR_CAP_AMBIENT_CLEAR_ALL: Final = 4
_SECCOMP_MODE_FILTER: Final = 2
_LINUX_CAPABILITY_VERSION_3: Final = 0x20080522
# SECBIT_NOROOT | _LOCKED, SECBIT_NO_SETUID_FIXUP | _LOCKED, SECBIT_KEEP_CAPS_LOCKED,
# SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED: uid 0 never regains capabilities by execve.
_SECUREBITS_LOCKDOWN: Final = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
_SECBIT_NO_SETUID_FIXUP: Final = 0x04
_OPEN_TREE_CLONE: Final = 0x1
_OPEN_TREE_CLOEXEC: Final = 0o2000000  # O_CLOEXEC
_AT_FDCWD: Final = -100
_AT_EMPTY_PATH: Final = 0x1000
_AT_RECURSIVE: Final = 0x8000
_MOVE_MOUNT_F_EMPTY_PATH: Final = 0x4
_LANDLOCK_CREATE_RULESET_VERSION: Final = 1
_SIOCGIFFLAGS: Final = 0x8913
_SIOCSIFFLAGS: Final = 0x8914
_IFF_UP: Final = 0x1

#: raw syscall numbers, per architecture (only those glibc has no wrapper for)
_SYSCALLS: Final[dict[str, dict[str, int]]] = {
    "x86_64": {"pivot_root": 155, "landlock_create_ruleset": 444, "clone": 56,
               "open_tree": 428, "move_mount": 429, "mount_setattr": 442},
    "aarch64": {"pivot_root": 41, "landlock_create_ruleset": 444, "clone": 220,
                "open_tree": 428, "move_mount": 429, "mount_setattr": 442},
}

_default_libc: Any = None


def _libc(libc: Any) -> Any:
    global _default_libc
    if libc is not None:
        return libc
    if _default_libc is None:
        _default_libc = ctypes.CDLL()
    return _default_libc


def _check(ret: int, what: str) -> None:
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def machine_arch() -> str:
    """The CPU architecture, normalised: "x86_64", "aarch64" or the raw uname name."""
    m = os.uname().machine
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


#: this machine's syscall table, once looked up (a process never changes architecture)
_MY_SYSCALLS: dict[str, int] = {}


def _nr(name: str) -> int:
    if not _MY_SYSCALLS:
        nrs = _SYSCALLS.get(machine_arch())
        if nrs is None:
            raise OSError(errno.ENOSYS, f"{name}: no syscall number for {machine_arch()}")
        _MY_SYSCALLS.update(nrs)
    return _MY_SYSCALLS[name]


def preresolve() -> None:
    """Look up every libc function this module calls, in the default handle: a process
    forked afterwards finds them cached instead of building (and writing) its own."""
    lc = _libc(None)
    for name in ("fork", "unshare", "mount", "umount2", "syscall", "sethostname", "prctl",
                 "capset"):
        getattr(lc, name)
    lc.syscall.restype = ctypes.c_long
    global _cap_last, _clone_nr
    _cap_last = _read_last_cap()
    try:
        _clone_nr = _nr("clone")
    except OSError:
        pass  # clone_pidfd raises ENOSYS


def set_signal(sig: int, handler: Any) -> None:
    """signal.signal without signal.py's enum conversions (plain ints in and out):
    the wrappers run enough Python to dirty pages every sandbox would then copy.
    ``handler``: a callable, ``signal.SIG_DFL`` or ``signal.SIG_IGN``."""
    if handler == _signal.SIG_DFL:
        handler = _signal.SIG_DFL  # the C module wants its own objects, not the enums
    elif handler == _signal.SIG_IGN:
        handler = _signal.SIG_IGN
    _signal.signal(sig, handler)


def set_sigmask(how: int, sigs: Iterable[int]) -> None:
    """signal.pthread_sigmask without the enum conversions (see :func:`set_signal`)."""
    _signal.pthread_sigmask(how, sigs)


def fork_bare(*, libc: Any = None) -> int:
    """fork(2) through libc, without Python's at-fork machinery (``os.register_at_fork``
    hooks, thread and lock re-initialisation): the child dirties far fewer pages it
    shares with its parent. Only for a single-threaded caller that holds no lock
    (the fork server). Returns 0 in the child, the child's pid in the parent."""
    pid = int(_libc(libc).fork())
    _check(pid, "fork")
    return pid


_clone_nr: int | None = None
_clone_pidfd_out: Final = ctypes.c_int(-1)


def clone_pidfd(flags: int, *, libc: Any = None) -> tuple[int, int]:
    """clone(2) like a fork (a copy of this process, SIGCHLD to the parent) into the
    new namespaces of ``flags`` (CLONE_NEW*): with CLONE_NEWPID the child is pid 1
    of its own pid namespace at once, with no process in between that ran code
    first. Also CLONE_PIDFD: a pidfd for the child, made before anybody could
    reap it. A raw syscall, not glibc's fork: no at-fork handlers at all (the
    rules of :func:`fork_bare` apply), and the child must not rely on glibc's
    cached thread id (nothing in CPython's paths here does).

    Returns ``(0, -1)`` in the child, ``(pid, pidfd)`` in the parent."""
    nr = _clone_nr if _clone_nr is not None else _nr("clone")
    lc = _libc(libc)
    if lc.syscall.restype is not ctypes.c_long:
        lc.syscall.restype = ctypes.c_long
    # x86_64 and aarch64 both take parent_tid third: where CLONE_PIDFD puts the fd
    pid = int(lc.syscall(ctypes.c_long(nr), ctypes.c_ulong(flags | _CLONE_PIDFD | _SIGCHLD),
                         None, ctypes.byref(_clone_pidfd_out), None, None))
    _check(pid, "clone")
    return (pid, _clone_pidfd_out.value) if pid else (0, -1)


def unshare(flags: int, *, libc: Any = None) -> None:
    """unshare(2) the namespaces in ``flags``."""
    _check(_libc(libc).unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None, *, libc: Any = None) -> None:
    """mount(2)."""
    _check(_libc(libc).mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags),
                             _b(data)), f"mount {target}")


def umount2(target: str, flags: int, *, libc: Any = None) -> None:
    """umount2(2)."""
    _check(_libc(libc).umount2(_b(target), ctypes.c_int(flags)), f"umount {target}")


def pivot_root(new_root: str, put_old: str, *, libc: Any = None) -> None:
    """pivot_root(2) (raw syscall: glibc has no wrapper)."""
    lc = _libc(libc)
    lc.syscall.restype = ctypes.c_long
    _check(lc.syscall(ctypes.c_long(_nr("pivot_root")), _b(new_root), _b(put_old)),
           "pivot_root")


def _syscall(name: str, *args: Any, libc: Any = None) -> int:
    lc = _libc(libc)
    if lc.syscall.restype is not ctypes.c_long:
        lc.syscall.restype = ctypes.c_long
    ret = int(lc.syscall(ctypes.c_long(_nr(name)), *args))
    _check(ret, name)
    return ret


def open_tree_clone(path: str, *, libc: Any = None) -> int:
    """A detached copy of the mount tree at ``path`` (submounts included), as a
    close-on-exec descriptor: open_tree(2) with OPEN_TREE_CLONE | AT_RECURSIVE.

    The copy belongs to no mount namespace until :func:`move_mount` attaches it,
    which works in any mount namespace the caller may mount in; closing the
    descriptor of a tree never attached unmounts it."""
    return _syscall("open_tree", ctypes.c_int(_AT_FDCWD), _b(path),
                    ctypes.c_uint(_OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE),
                    libc=libc)


def mount_setattr(fd: int, attr_set: int, *, propagation: int = 0, userns_fd: int = 0,
                  libc: Any = None) -> None:
    """mount_setattr(2) on the tree ``fd`` (from :func:`open_tree_clone`) and every
    mount under it: set ``attr_set`` (MOUNT_ATTR_*) and, if given, the propagation
    type (``MS_PRIVATE``, ``MS_SLAVE`` ...). With ``MOUNT_ATTR_IDMAP``, ``userns_fd``
    is a user namespace descriptor whose id maps become the tree's idmapping (a tree
    not yet attached anywhere, on a file system that allows idmapped mounts)."""
    attr = struct.pack("=4Q", attr_set, 0, propagation, userns_fd)  # set, clr, prop, userns
    _syscall("mount_setattr", ctypes.c_int(fd), b"",
             ctypes.c_uint(_AT_EMPTY_PATH | _AT_RECURSIVE), attr,
             ctypes.c_size_t(len(attr)), libc=libc)


def move_mount(fd: int, target: str, *, libc: Any = None) -> None:
    """Attach the detached tree ``fd`` at ``target`` in the caller's mount namespace
    (move_mount(2) with MOVE_MOUNT_F_EMPTY_PATH)."""
    _syscall("move_mount", ctypes.c_int(fd), b"", ctypes.c_int(_AT_FDCWD), _b(target),
             ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH), libc=libc)


def sethostname(name: str, *, libc: Any = None) -> None:
    """sethostname(2) in the current UTS namespace."""
    raw = name.encode()
    _check(_libc(libc).sethostname(raw, ctypes.c_size_t(len(raw))), "sethostname")


def _prctl(option: int, arg2: int, what: str, libc: Any,
           arg3: int = 0, arg4: int = 0, arg5: int = 0) -> None:
    _check(_libc(libc).prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
                             ctypes.c_ulong(arg4), ctypes.c_ulong(arg5)), what)


def set_no_new_privs(*, libc: Any = None) -> None:
    """PR_SET_NO_NEW_PRIVS: execve can never grant privileges again."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, "prctl(NO_NEW_PRIVS)", libc)


def set_pdeathsig(sig: int, *, libc: Any = None) -> None:
    """PR_SET_PDEATHSIG: get ``sig`` when the parent thread dies."""
    _prctl(_PR_SET_PDEATHSIG, sig, "prctl(PDEATHSIG)", libc)


def set_dumpable(flag: bool, *, libc: Any = None) -> None:
    """PR_SET_DUMPABLE (also governs who may ptrace or read /proc/PID of this process)."""
    _prctl(_PR_SET_DUMPABLE, 1 if flag else 0, "prctl(DUMPABLE)", libc)


def set_child_subreaper(*, libc: Any = None) -> None:
    """PR_SET_CHILD_SUBREAPER: orphaned descendants are reparented to this process."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1, "prctl(CHILD_SUBREAPER)", libc)


def keep_caps_on_setuid(*, libc: Any = None) -> None:
    """SECBIT_NO_SETUID_FIXUP: changing the effective uid between 0 and another uid
    leaves the capability sets alone (the fork server's template switches its euid
    around each clone and must stay privileged). Not inherited into a new user
    namespace: the kernel resets the securebits there."""
    _prctl(_PR_SET_SECUREBITS, _SECBIT_NO_SETUID_FIXUP, "prctl(SET_SECUREBITS)", libc)


def set_proctitle(title: bytes) -> None:
    """Overwrite this process's argument strings in place with ``title`` (cut to fit,
    the rest zeroed), as setproctitle does: ``/proc/PID/cmdline`` and ``ps`` then
    show ``title``, in this process and in every process forked from it afterwards.
    The area's bounds come from ``/proc/self/stat`` (arg_start, arg_end)."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()  # fields from the 3rd (state) on
    start, end = int(fields[48 - 3]), int(fields[49 - 3])  # proc(5): (48) arg_start, (49) arg_end
    size = end - start
    if start <= 0 or size <= 0:
        raise OSError(errno.EINVAL, "no argument area to overwrite")
    data = title[: size - 1].ljust(size, b"\0")
    ctypes.memmove(start, data, size)


_cap_last: int | None = None


def _read_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


def drop_capabilities(*, libc: Any = None) -> None:
    """Drop every capability for good.

    Locks the securebits (uid 0 gains nothing from execve), clears the
    bounding and ambient sets, then sets effective, permitted and inheritable
    to empty with capset(2). Raises OSError if any step fails.
    """
    lc = _libc(libc)
    _prctl(_PR_SET_SECUREBITS, _SECUREBITS_LOCKDOWN, "prctl(SET_SECUREBITS)", lc)
    for cap in range((_read_last_cap() if _cap_last is None else _cap_last) + 1):
        try:
            _prctl(_PR_CAPBSET_DROP, cap, "prctl(CAPBSET_DROP)", lc)
        except OSError as e:
            raise OSError(e.errno, f"prctl(CAPBSET_DROP {cap}): {e.strerror}") from None
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, "prctl(CAP_AMBIENT_CLEAR_ALL)", lc)
    _check(lc.capset(_CAP_HEADER, _CAP_DATA), "capset")


# the kernel only reads these (it writes the header back only for a version it does
# not know, and V3 is known since 2.6.26), so plain bytes serve
_CAP_HEADER: Final = struct.pack("=2I", _LINUX_CAPABILITY_VERSION_3, 0)
_CAP_DATA: Final = bytes(24)  # two struct __user_cap_data_struct, all zero


class Seccomp:
    """A seccomp program (struct sock_filter items, 8 bytes each) made ready to
    install: the struct sock_fprog and its buffer, built once (in the fork
    server) instead of in every sandbox."""

    __slots__ = ("_buf", "fprog")

    def __init__(self, prog: bytes) -> None:
        if not prog or len(prog) % 8:
            raise OSError(errno.EINVAL,
                          "seccomp program must be a non-empty multiple of 8 bytes")
        # struct sock_fprog { unsigned short len; struct sock_filter *filter; } (LP64):
        # the program's address is that of the bytes held by a c_char_p (kept alive here)
        self._buf = ctypes.c_char_p(prog)
        addr = ctypes.c_void_p.from_address(_ctypes.addressof(self._buf)).value
        self.fprog = struct.pack("=H6xQ", len(prog) // 8, addr)


def seccomp_install(prog: bytes | Seccomp, *, libc: Any = None) -> None:
    """Install a seccomp BPF filter (``prog``: struct sock_filter items, 8 bytes each,
    or those made ready as a :class:`Seccomp`).

    Needs no_new_privs first (or CAP_SYS_ADMIN).
    """
    ready = prog if isinstance(prog, Seccomp) else Seccomp(prog)
    lc = _libc(libc)
    _check(lc.prctl(ctypes.c_int(_PR_SET_SECCOMP), ctypes.c_ulong(_SECCOMP_MODE_FILTER),
                    ready.fprog, ctypes.c_ulong(0), ctypes.c_ulong(0)),
           "prctl(SET_SECCOMP)")


def landlock_abi_version(*, libc: Any = None) -> int:
    """The Landlock ABI version the kernel offers; 0 when unavailable."""
    try:
        nr = _nr("landlock_create_ruleset")
    except OSError:
        return 0
    lc = _libc(libc)
    lc.syscall.restype = ctypes.c_long
    ret = lc.syscall(ctypes.c_long(nr), None, ctypes.c_size_t(0),
                     ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return int(ret) if ret > 0 else 0


def loopback_up() -> None:
    """Bring ``lo`` up in the current network namespace (SIOCSIFFLAGS)."""
    import _socket  # socket.py's C module: no enums, no selectors
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sH14x", b"lo", 0)
        res = fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req)
        flags = struct.unpack("16sH14x", res)[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
    finally:
        s.close()
