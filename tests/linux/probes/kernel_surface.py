"""Reach kernel attack surface through raw syscalls (ctypes: attacker code).

ptrace (TRACEME and attach to an own child), unshare / clone of new
namespaces, setns, mount, keyctl, bpf, userfaultfd, io_uring, perf_event_open,
TIOCSTI, and the newer calls: memfd_secret, open_tree_attr, listmount,
statmount, cachestat. ``ok`` means the kernel did what was asked (a descriptor, a 0 return).
Everything made is released at once; the control run happens on the host, so
mount runs only in the throwaway mount namespace the test wraps it in.
"""

import ctypes
import errno
import json
import os
import platform
import signal
import sys
import tempfile
import time

NR = {
    "x86_64": {"ptrace": 101, "unshare": 272, "setns": 308, "mount": 165, "keyctl": 250,
               "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
               "perf_event_open": 298, "clone": 56, "clone3": 435, "memfd_secret": 447,
               "cachestat": 451, "statmount": 457, "listmount": 458, "open_tree_attr": 467},
    "aarch64": {"ptrace": 117, "unshare": 97, "setns": 268, "mount": 40, "keyctl": 219,
                "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425,
                "perf_event_open": 241, "clone": 220, "clone3": 435, "memfd_secret": 447,
                "cachestat": 451, "statmount": 457, "listmount": 458, "open_tree_attr": 467},
}[platform.machine()]

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def emit(probe: str, ok: bool, detail: str) -> None:
    print(json.dumps({"probe": probe, "ok": ok, "detail": detail}), flush=True)


def sys_call(name: str, *args: object) -> tuple[int, int]:
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(NR[name]), *args)
    return int(ret), ctypes.get_errno()


def report(probe: str, ret: int, err: int, *, close_fd: bool = False) -> None:
    if ret < 0:
        emit(probe, False, errno.errorcode.get(err, str(err)))
        return
    if close_fd:
        os.close(ret)
    emit(probe, True, f"returned {ret}")


def in_child(probe: str, fn: object) -> None:
    """Run ``fn`` in a forked child so a success cannot change this process."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            ret, err = fn()  # type: ignore[operator]
            os.write(w, json.dumps([ret, err]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    if not data:
        emit(probe, False, "child died")
        return
    ret, err = json.loads(data)
    report(probe, ret, err)


def ptrace_probes() -> None:
    in_child("ptrace_traceme", lambda: sys_call("ptrace", 0, 0, 0, 0))  # PTRACE_TRACEME
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    try:
        ret, err = sys_call("ptrace", 16, pid, 0, 0)  # PTRACE_ATTACH
        if ret == 0:
            os.waitpid(pid, 0)  # the attach stop
            sys_call("ptrace", 17, pid, 0, 0)  # PTRACE_DETACH
        report("ptrace_attach_child", ret, err)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def namespace_probes() -> None:
    flags = {"user": 0x10000000, "mount": 0x00020000, "net": 0x40000000,
             "pid": 0x20000000, "uts": 0x04000000, "ipc": 0x08000000,
             "cgroup": 0x02000000}
    for name, flag in flags.items():
        in_child(f"unshare_{name}", lambda flag=flag: sys_call("unshare", flag))
    # setns to our own (or the sandbox's) net namespace: needs CAP_SYS_ADMIN
    def setns() -> tuple[int, int]:
        fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        return sys_call("setns", fd, 0)
    in_child("setns_net", setns)
    # raw clone with CLONE_NEWUSER|SIGCHLD, stack 0 = fork-like
    def clone_newuser() -> tuple[int, int]:
        ret, err = sys_call("clone", ctypes.c_ulong(0x10000000 | signal.SIGCHLD), 0, 0, 0, 0)
        if ret == 0:
            libc._exit(0)
        if ret > 0:
            os.waitpid(ret, 0)
            return 0, 0
        return ret, err
    in_child("clone_newuser", clone_newuser)
    def clone3() -> tuple[int, int]:
        args = (ctypes.c_uint64 * 11)()
        args[0] = 0x10000000  # flags: CLONE_NEWUSER
        args[4] = signal.SIGCHLD  # exit_signal
        ret, err = sys_call("clone3", ctypes.byref(args), ctypes.c_size_t(88))
        if ret == 0:
            libc._exit(0)
        if ret > 0:
            os.waitpid(ret, 0)
            return 0, 0
        return ret, err
    in_child("clone3_newuser", clone3)


def mount_probe(mode: str) -> None:
    """Mount a tmpfs. In control mode first enter a private mount namespace of
    the forked child's own, so the host's mount table is never touched."""
    target = tempfile.mkdtemp(prefix="corral-probe-mnt-")

    def do_mount() -> tuple[int, int]:
        if mode == "control":
            ret, err = sys_call("unshare", 0x00020000)  # CLONE_NEWNS
            if ret < 0:
                return ret, err
            ret, err = sys_call("mount", None, b"/", None,
                                ctypes.c_ulong((1 << 14) | (1 << 18)), None)  # MS_REC|MS_PRIVATE
            if ret < 0:
                return ret, err
        return sys_call("mount", b"none", target.encode(), b"tmpfs", 0, None)

    in_child("mount_tmpfs", do_mount)
    os.rmdir(target)


def surface_probes() -> None:
    # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, create=0)
    ret, err = sys_call("keyctl", 0, ctypes.c_int(-3), 0)
    report("keyctl", ret, err)
    # bpf(BPF_MAP_CREATE, {ARRAY, key 4, value 4, max 1}, sizeof attr)
    attr = (ctypes.c_uint32 * 32)(2, 4, 4, 1)
    ret, err = sys_call("bpf", 0, ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)))
    report("bpf_map_create", ret, err, close_fd=True)
    ret, err = sys_call("userfaultfd", os.O_CLOEXEC)
    report("userfaultfd", ret, err, close_fd=True)
    params = (ctypes.c_uint8 * 120)()
    ret, err = sys_call("io_uring_setup", 1, ctypes.byref(params))
    report("io_uring_setup", ret, err, close_fd=True)
    # perf_event_open: PERF_TYPE_SOFTWARE / PERF_COUNT_SW_CPU_CLOCK on self
    pattr = (ctypes.c_uint32 * 32)()
    pattr[0], pattr[1], pattr[2] = 1, ctypes.sizeof(pattr), 0
    ret, err = sys_call("perf_event_open", ctypes.byref(pattr), 0, -1, -1, 0)
    report("perf_event_open", ret, err, close_fd=True)


def tiocsti_probe() -> None:
    """Inject a byte into a terminal: a pty if one can be had, else fd 0."""
    fd, note = 0, "fd 0"
    master = -1
    try:
        master, fd = os.openpty()
        note = "pty"
    except OSError:
        pass
    ch = ctypes.c_char(b"\n")
    ctypes.set_errno(0)
    ret = libc.ioctl(fd, 0x5412, ctypes.byref(ch))  # TIOCSTI
    err = ctypes.get_errno()
    if ret < 0:
        emit("tiocsti", False, f"{errno.errorcode.get(err, str(err))} on {note}")
    else:
        emit("tiocsti", True, f"injected into {note}")
    if master >= 0:
        os.close(master)
        os.close(fd)


def newer_probes() -> None:
    """Calls added since 5.14. memfd_secret answers ENOSYS on a host that boots
    with secretmem off; in the sandbox seccomp answers EPERM before that."""
    ret, err = sys_call("memfd_secret", ctypes.c_uint(os.O_CLOEXEC))
    report("memfd_secret", ret, err, close_fd=True)
    # open_tree_attr(AT_FDCWD, "/", OPEN_TREE_CLOEXEC, NULL, 0): no clone, so no
    # privilege needed; an O_PATH-like descriptor of /
    ret, err = sys_call("open_tree_attr", ctypes.c_int(-100), b"/",
                        ctypes.c_uint(os.O_CLOEXEC), None, ctypes.c_size_t(0))
    report("open_tree_attr", ret, err, close_fd=True)
    # listmount({size 24, mnt_id LSMT_ROOT}, ids, 16, 0): the mount ids under the root
    req = (ctypes.c_uint64 * 4)()
    req[0], req[1] = 24, 0xFFFFFFFFFFFFFFFF  # size (u32) + spare (u32), mnt_id
    ids = (ctypes.c_uint64 * 16)()
    ret, err = sys_call("listmount", ctypes.byref(req), ctypes.byref(ids),
                        ctypes.c_size_t(16), ctypes.c_uint(0))
    report("listmount", ret, err)
    # statmount({size 24, mnt_id, STATMOUNT_SB_BASIC}, buf, size, 0) of the first id
    req[1], req[2] = ids[0] if ret > 0 else 0, 1
    buf = (ctypes.c_uint8 * 4096)()
    ret, err = sys_call("statmount", ctypes.byref(req), ctypes.byref(buf),
                        ctypes.c_size_t(4096), ctypes.c_uint(0))
    report("statmount", ret, err)
    # cachestat(fd, {0, 0}, out, 0) of a file we wrote: page-cache residency
    fd, path = tempfile.mkstemp(prefix="corral-probe-cs-")
    try:
        os.write(fd, b"x" * 4096)
        rng = (ctypes.c_uint64 * 2)()
        out = (ctypes.c_uint64 * 5)()
        ret, err = sys_call("cachestat", ctypes.c_uint(fd), ctypes.byref(rng),
                            ctypes.byref(out), ctypes.c_uint(0))
        report("cachestat", ret, err)
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    params = json.loads(sys.argv[1])
    groups = params.get("groups", ["ptrace", "namespaces", "mount", "surface", "tiocsti",
                                   "newer"])
    if "ptrace" in groups:
        ptrace_probes()
    if "namespaces" in groups:
        namespace_probes()
    if "mount" in groups:
        mount_probe(params["mode"])
    if "surface" in groups:
        surface_probes()
    if "tiocsti" in groups:
        tiocsti_probe()
    if "newer" in groups:
        newer_probes()


main()
