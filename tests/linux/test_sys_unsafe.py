"""_sys_unsafe: each raw syscall, exercised in a forked child so the test process is untouched."""

from __future__ import annotations

import os
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

import pytest

from corral.providers.linux import _sys_unsafe as su
from strict_tier import unavailable

pytestmark = [
    pytest.mark.linux,
    pytest.mark.skipif(sys.platform != "linux", reason="Linux only"),
]

ROOT = os.geteuid() == 0


def in_child(fn: Callable[[], int]) -> int:
    """Run ``fn`` in a forked child; return its exit code (99 = it raised)."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = fn()
        except BaseException as e:  # report, never return into pytest in the child
            os.write(2, f"child failed: {e!r}\n".encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _status_field(name: str) -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def _userns_flags() -> int:
    return 0 if ROOT else su.CLONE_NEWUSER


def _become_ns_root() -> None:
    """As non-root, enter a user namespace mapping our uid to 0, so namespaces may be made."""
    if ROOT:
        return
    uid, gid = os.geteuid(), os.getegid()
    su.unshare(su.CLONE_NEWUSER)
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def test_machine_arch_is_normalised() -> None:
    assert su.machine_arch() in {"x86_64", "aarch64"} or su.machine_arch() == os.uname().machine


def test_uts_namespace_hostname_is_private() -> None:
    before = socket.gethostname()

    def child() -> int:
        _become_ns_root()
        su.unshare(su.CLONE_NEWUTS)
        su.sethostname("corral-test-uts")
        return 0 if socket.gethostname() == "corral-test-uts" else 1

    assert in_child(child) == 0
    assert socket.gethostname() == before


def test_mount_namespace_tmpfs_is_private() -> None:
    def child() -> int:
        _become_ns_root()
        su.unshare(su.CLONE_NEWNS)
        su.mount(None, "/", None, su.MS_REC | su.MS_PRIVATE, None)
        su.mount("corral-t", "/mnt", "tmpfs", su.MS_NOSUID | su.MS_NODEV, "size=1m")
        with open("/proc/self/mountinfo") as f:
            seen = "corral-t" in f.read()
        su.umount2("/mnt", su.MNT_DETACH)
        return 0 if seen else 1

    assert in_child(child) == 0
    with open("/proc/self/mountinfo") as f:
        assert "corral-t" not in f.read()


def test_mount_failure_raises_oserror_with_errno() -> None:
    def child() -> int:
        _become_ns_root()
        su.unshare(su.CLONE_NEWNS)
        try:
            su.mount(None, "/nonexistent-corral-dir", "tmpfs", 0, None)
        except OSError as e:
            return 0 if e.errno == 2 else 1
        return 2

    assert in_child(child) == 0


def test_no_new_privs_and_dumpable() -> None:
    def child() -> int:
        su.set_no_new_privs()
        su.set_dumpable(False)
        return 0 if _status_field("NoNewPrivs") == "1" else 1

    assert in_child(child) == 0


def test_drop_capabilities_empties_every_set() -> None:
    def child() -> int:
        _become_ns_root()
        su.drop_capabilities()
        sets = [_status_field(k) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
        return 0 if all(int(s, 16) == 0 for s in sets) else 1

    assert in_child(child) == 0


def _deny_uname_filter() -> bytes:
    nr = {"x86_64": 63, "aarch64": 160}[su.machine_arch()]
    ins = struct.Struct("=HBBI")
    return b"".join([
        ins.pack(0x20, 0, 0, 0),                # ld  [0]  (seccomp_data.nr)
        ins.pack(0x15, 0, 1, nr),               # jeq nr, deny, allow
        ins.pack(0x06, 0, 0, 0x00050000 | 1),   # ret ERRNO(EPERM)
        ins.pack(0x06, 0, 0, 0x7FFF0000),       # ret ALLOW
    ])


@pytest.mark.skipif(su.machine_arch() not in {"x86_64", "aarch64"}, reason="no syscall table")
def test_seccomp_install_denies_a_syscall() -> None:
    def child() -> int:
        su.set_no_new_privs()
        su.seccomp_install(_deny_uname_filter())
        try:
            os.uname()
        except OSError as e:
            return 0 if e.errno == 1 else 1
        return 2

    assert in_child(child) == 0
    os.uname()  # the parent is unfiltered


def test_seccomp_rejects_malformed_program() -> None:
    with pytest.raises(OSError, match="multiple of 8"):
        su.seccomp_install(b"\x00" * 7)


def test_loopback_up_in_new_net_namespace() -> None:
    def child() -> int:
        _become_ns_root()
        su.unshare(su.CLONE_NEWNET)
        su.loopback_up()
        with socket.socket() as srv, socket.socket() as cli:
            srv.bind(("127.0.0.1", 0))
            srv.listen(1)
            cli.connect(srv.getsockname())
        return 0

    assert in_child(child) == 0


def test_pivot_root_in_private_mount_namespace() -> None:
    def child() -> int:
        _become_ns_root()
        su.unshare(su.CLONE_NEWNS)
        su.mount(None, "/", None, su.MS_REC | su.MS_PRIVATE, None)
        su.mount("corral-pr", "/mnt", "tmpfs", 0, "size=1m")
        os.mkdir("/mnt/old")
        su.pivot_root("/mnt", "/mnt/old")
        os.chdir("/")
        su.umount2("/old", su.MNT_DETACH)
        return 0 if sorted(os.listdir("/")) == ["old"] else 1

    assert in_child(child) == 0


def test_landlock_abi_version_is_an_int() -> None:
    assert su.landlock_abi_version() >= 0


class _FakeLibc:
    def __init__(self, ret: int) -> None:
        self.ret = ret
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Callable[..., int]:
        def call(*args: Any) -> int:
            self.calls.append((name, args))
            return self.ret
        return call


def test_libc_handle_is_injectable() -> None:
    fake = _FakeLibc(0)
    su.unshare(su.CLONE_NEWUTS, libc=fake)
    su.sethostname("x", libc=fake)
    assert [c[0] for c in fake.calls] == ["unshare", "sethostname"]
    assert fake.calls[0][1][0].value == su.CLONE_NEWUTS


def test_failing_libc_raises_oserror() -> None:
    with pytest.raises(OSError, match="unshare"):
        su.unshare(su.CLONE_NEWUTS, libc=_FakeLibc(-1))


def test_clone_pidfd_makes_pid_1_of_new_namespaces_with_a_pidfd() -> None:
    def child() -> int:
        import select
        import signal

        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # as the fork server's template
        r, w = os.pipe()
        try:
            pid, pidfd = su.clone_pidfd(su.CLONE_NEWUSER | su.CLONE_NEWPID | su.CLONE_NEWNS)
        except OSError:
            return 77  # no user namespaces for this user here
        if pid == 0:
            os.write(w, str(os.getpid()).encode())
            os._exit(0)
        os.close(w)
        seen = os.read(r, 16)
        exited, _, _ = select.select([pidfd], [], [], 10)  # the pidfd says when it exits
        try:
            os.waitpid(pid, 0)
            reaped_by_kernel = False
        except ChildProcessError:
            reaped_by_kernel = True
        return 0 if (seen == b"1" and exited == [pidfd] and reaped_by_kernel) else 1

    code = in_child(child)
    if code == 77:
        unavailable("no user namespaces here")
    assert code == 0


def test_a_detached_tree_is_attached_in_another_mount_namespace(tmp_path: Any) -> None:
    """open_tree_clone in one mount namespace, mount_setattr (read-only, private) on
    the detached copy, move_mount in a new mount namespace."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("tree\n")
    os.chmod(tmp_path, 0o700)
    os.chmod(src, 0o755)
    os.chmod(src / "f.txt", 0o644)

    def child() -> int:
        _become_ns_root()
        tree = su.open_tree_clone(str(src))
        su.mount_setattr(tree, su.MOUNT_ATTR_RDONLY | su.MOUNT_ATTR_NOSUID,
                         propagation=su.MS_PRIVATE)
        su.unshare(su.CLONE_NEWNS)
        su.mount(None, "/", None, su.MS_REC | su.MS_PRIVATE, None)
        su.mount("corral-mm", "/mnt", "tmpfs", 0, "size=1m")
        os.mkdir("/mnt/t")
        su.move_mount(tree, "/mnt/t")
        os.close(tree)
        with open("/mnt/t/f.txt") as f:
            if f.read() != "tree\n":
                return 1
        try:
            open("/mnt/t/new", "w").close()
        except OSError as e:
            return 0 if e.errno == 30 else 2  # EROFS
        return 3

    assert in_child(child) == 0
    assert not (src / "new").exists()


def test_open_tree_of_a_missing_path_raises() -> None:
    def child() -> int:
        _become_ns_root()
        su.unshare(su.CLONE_NEWNS)
        try:
            su.open_tree_clone("/nonexistent-corral-dir")
        except OSError as e:
            return 0 if e.errno == 2 else 1
        return 2

    assert in_child(child) == 0


def test_set_proctitle_rewrites_cmdline_in_place() -> None:
    def child() -> int:
        su.set_proctitle(b"corral-test-title")
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read()
        return 0 if raw.rstrip(b"\0") == b"corral-test-title" and b"/" not in raw else 1

    assert in_child(child) == 0
    with open("/proc/self/cmdline", "rb") as f:
        assert b"corral-test-title" not in f.read()


@pytest.mark.skipif(not ROOT, reason="switches the effective uid from root")
def test_keep_caps_on_setuid_keeps_capabilities_with_another_euid() -> None:
    def child() -> int:
        su.keep_caps_on_setuid()
        os.setresuid(-1, 54321, -1)
        kept = int(_status_field("CapEff"), 16) != 0
        os.setresuid(-1, 0, -1)
        return 0 if kept and os.geteuid() == 0 else 1

    assert in_child(child) == 0
