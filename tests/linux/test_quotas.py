"""Per-user kernel quotas: a sandbox charges its own host uid, never root's or a neighbour's.

The kernel charges inotify instances, POSIX message queue bytes and queued
signals to the uid that created a user namespace (up the chain), and pipe
buffers to the real uid outside. Each test fills one of them from inside a
sandbox, holds it there, and checks from the host (as root, in a separate
process) or from a second sandbox that the quota is still there. Every fill is
a bounded loop, and the sandbox is destroyed at the end, which gives it all back.

Also here: /dev is read-only, pid 1's command line names no host path, bind
sources arrive as private, recursively read-only trees, the uid pool.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.core.spec import ProcessOpts, SandboxSpec
from corral.providers.linux import _sys_unsafe as su
from corral.providers.linux.host.uidpool import BLOCK, FIRST_UID, LAST_UID, UidPool

pytestmark = [
    pytest.mark.linux,
    pytest.mark.skipif(os.geteuid() != 0, reason="the quotas at stake are root's"),
]
PY = os.path.realpath(sys.executable)
_NS_GET_OWNER_UID = 0xB704  # _IO(0xb7, 0x4)


def make_spec() -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r")


def _sysctl(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def _on_host(code: str) -> str:
    """Run ``code`` in a fresh root interpreter on the host; its stdout."""
    r = subprocess.run([PY, "-I", "-S", "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


async def _holding(sb: Any, code: str) -> tuple[Any, str]:
    """Start ``code`` in ``sb``: it fills a quota, prints one line and holds what it
    took until its stdin closes. Returns (the process, that line)."""
    proc = await sb.start_process([PY, "-I", "-S", "-c", textwrap.dedent(code)],
                                  ProcessOpts(stdin=True, timeout_ms=60_000))
    line = await asyncio.wait_for(proc.stdout.__anext__(), 60)
    return proc, line.decode().strip()


async def _release(proc: Any) -> None:
    await proc.stdin.close()
    await asyncio.wait_for(proc.wait(), 30)


def _ns_owner(pid: int) -> int:
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        buf = fcntl.ioctl(fd, _NS_GET_OWNER_UID, b"\0" * 4)
    finally:
        os.close(fd)
    return int.from_bytes(buf, sys.byteorder)


def _outside_uid(uid_map: str) -> int:
    inside, outside, count = (int(x) for x in uid_map.split())
    assert (inside, count) == (0, 1), uid_map
    return outside


# -- (a) inotify instances --------------------------------------------------------------
_INOTIFY_FILL = """
    import ctypes, sys
    libc = ctypes.CDLL(None, use_errno=True)
    fds = []
    for _ in range({bound}):
        fd = libc.inotify_init1(0o2000000)
        if fd < 0:
            break
        fds.append(fd)
    print(len(fds), ctypes.get_errno(), flush=True)
    sys.stdin.read()
"""
_INOTIFY_HOST = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    print(fd, ctypes.get_errno())
"""


def test_inotify_instances_inside_are_not_root_s(linux: Any) -> None:
    host_max = _sysctl("/proc/sys/fs/inotify/max_user_instances")
    bound = min(host_max + 64, 900)  # under the sandbox's 1024 descriptors

    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            proc, line = await _holding(sb, _INOTIFY_FILL.format(bound=bound))
            try:
                made, err = (int(x) for x in line.split())
                assert made >= 1 and err == 24, line  # stopped by EMFILE, not the bound
                fd, errno = (int(x) for x in _on_host(_INOTIFY_HOST).split())
                assert fd >= 0, f"host root's inotify_init1 failed (errno {errno}) while " \
                    f"the sandbox held {made} instances"
                assert made <= 128, line  # the sandbox's own cap
            finally:
                await _release(proc)
            # the kernel charged them to the uid that owns the sandbox's user namespace
            owner = _ns_owner(sb.host_pids()[0])
            assert owner != 0 and FIRST_UID <= owner <= LAST_UID, owner

    linux(test, spares=0)


# -- (b) POSIX message queue bytes and queued signals ------------------------------------
_MQ_FILL = """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    made = 0
    for i in range(300):
        q = libc.mq_open(b"/corral-q%d" % i, os.O_CREAT | os.O_RDWR, 0o600, None)
        if q < 0:
            break
        made += 1
    print(made, ctypes.get_errno(), flush=True)
    sys.stdin.read()
"""
_MQ_HOST = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    name = b"/corral-quota-test-%d" % os.getpid()
    q = libc.mq_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600, None)
    err = ctypes.get_errno()
    if q >= 0:
        libc.mq_unlink(name)
    print(q, err)
"""
_SIG_FILL = """
    import ctypes, os, signal, sys
    libc = ctypes.CDLL(None, use_errno=True)
    sig = signal.SIGRTMIN + 2
    signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
    queued = 0
    for _ in range(200_000):
        if libc.sigqueue(os.getpid(), sig, ctypes.c_void_p(0)) != 0:
            break
        queued += 1
    print(queued, ctypes.get_errno(), flush=True)
    sys.stdin.read()
"""
_SIG_HOST = """
    import ctypes, os, signal
    libc = ctypes.CDLL(None, use_errno=True)
    sig = signal.SIGRTMIN + 2
    signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
    print(libc.sigqueue(os.getpid(), sig, ctypes.c_void_p(0)), ctypes.get_errno())
"""


def test_message_queue_bytes_inside_are_not_root_s(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            proc, line = await _holding(sb, _MQ_FILL)
            try:
                made, err = (int(x) for x in line.split())
                assert made >= 1 and err == 24, line  # EMFILE: RLIMIT_MSGQUEUE reached
                q, errno = (int(x) for x in _on_host(_MQ_HOST).split())
                assert q >= 0, f"host root's mq_open failed (errno {errno}) while the " \
                    f"sandbox held {made} queues"
            finally:
                await _release(proc)

    linux(test, spares=0)


def test_queued_signals_inside_are_not_root_s(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            proc, line = await _holding(sb, _SIG_FILL)
            try:
                queued, err = (int(x) for x in line.split())
                assert err == 11 and queued >= 1, line  # EAGAIN: a quota, not the bound
                ret, errno = (int(x) for x in _on_host(_SIG_HOST).split())
                assert ret == 0, f"host root's sigqueue failed (errno {errno}) while the " \
                    f"sandbox held {queued} signals"
                assert queued <= 1024, line  # the sandbox's RLIMIT_SIGPENDING
            finally:
                await _release(proc)

    linux(test, spares=0)


# -- (c) pipe buffers, charged to the real uid outside -----------------------------------
_PIPE_FILL = """
    import fcntl, os, sys
    grown = []
    for _ in range({bound}):
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, {size})
        except OSError as e:
            print(len(grown), e.errno, flush=True)
            break
        grown.append((r, w))
    else:
        print(len(grown), 0, flush=True)
    sys.stdin.read()
"""
_PIPE_ONE = """
    import fcntl, os
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, {size})
        print(0)
    except OSError as e:
        print(e.errno)
"""


def test_two_sandboxes_have_their_own_uid_and_pipe_quota(linux: Any) -> None:
    soft = _sysctl("/proc/sys/fs/pipe-user-pages-soft")
    size = _sysctl("/proc/sys/fs/pipe-max-size")
    if soft == 0:
        pytest.skip("pipe-user-pages-soft is 0: no per-user pipe quota on this host")
    bound = soft * 4096 // size + 8  # pipes of ``size`` bytes that fill the quota, and some
    if 2 * bound > 1000:
        pytest.skip(f"the quota needs {bound} pipes: more than a sandbox's descriptors")

    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as a, await p.create(make_spec()) as b:
            proc, line = await _holding(a, _PIPE_FILL.format(bound=bound, size=size))
            try:
                grown, err = (int(x) for x in line.split())
                assert err == 1 and grown >= 1, line  # EPERM: a's quota is used up
                r = await b.exec([PY, "-I", "-S", "-c",
                                  textwrap.dedent(_PIPE_ONE.format(size=size))])
                assert r.stdout_text.strip() == "0", \
                    f"F_SETPIPE_SZ in b failed with errno {r.stdout_text.strip()} " \
                    f"while a held {grown} grown pipes"
            finally:
                await _release(proc)
            maps = [(await sb.exec(["cat", "/proc/self/uid_map"])).stdout_text
                    for sb in (a, b)]
            uids = [_outside_uid(m) for m in maps]
            assert uids[0] != uids[1], maps
            assert all(FIRST_UID <= u <= LAST_UID for u in uids), uids

    linux(test, spares=0)


def test_an_explicit_outside_uid_still_wins(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["cat", "/proc/self/uid_map", "/proc/self/gid_map"])
            assert [_outside_uid(x) for x in r.stdout_text.splitlines()] == [54321, 54322]
            assert _ns_owner(sb.host_pids()[0]) == 54321

    linux(test, spares=0, outside_uid=54321, outside_gid=54322)


def test_the_namespace_quotas_are_set_and_cannot_be_raised(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["sh", "-c", "cd /proc/sys/user; for f in max_*; do "
                               "echo $f $(cat $f); done; echo 99 > max_inotify_instances"])
            got = dict(line.split() for line in r.stdout_text.splitlines())
            assert got["max_user_namespaces"] == "0" and got["max_mnt_namespaces"] == "1", got
            assert got["max_inotify_instances"] == "128", got
            assert r.exit_code != 0, r  # no capability left to write them

    linux(test, spares=0)


# -- (d) /dev ---------------------------------------------------------------------------
def test_dev_is_read_only_and_its_nodes_work(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            w = await sb.exec(["sh", "-c", "echo x > /dev/x"])
            assert w.exit_code != 0 and "Read-only file system" in w.stderr_text, w
            m = await sb.exec(["mkdir", "/dev/shm"])
            assert m.exit_code != 0 and "Read-only file system" in m.stderr_text, m
            ok = await sb.exec(["sh", "-c", "echo hi > /dev/null && head -c 4 /dev/zero | "
                                "wc -c && head -c 4 /dev/urandom | wc -c && ls /dev/fd/"])
            assert ok.exit_code == 0 and ok.stdout_text.split()[:2] == ["4", "4"], ok

    linux(test, spares=0)


# -- (e) pid 1's command line -------------------------------------------------------------
def test_pid_1_cmdline_shows_no_host_path(linux: Any) -> None:
    package = Path(corral.__file__).resolve().parent
    host_paths = {str(package.parent), str(package), sys.prefix, sys.executable, PY,
                  os.path.realpath(sys.prefix)}

    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["cat", "/proc/1/cmdline"])
            assert r.exit_code == 0, r
            cmdline = r.stdout.rstrip(b"\0").decode(errors="replace")
            assert cmdline, r
            for path in host_paths:
                assert path not in cmdline, cmdline
            assert "/" not in cmdline, cmdline

    linux(test, spares=0)


# -- bind sources: detached, private, read-only down to every submount -------------------
@pytest.fixture
def tree_with_submount() -> Iterator[Path]:
    """A 0755 dir under a root-only 0700 dir, with a world-writable tmpfs mounted
    inside it on the host (unmounted afterwards)."""
    outer = Path(tempfile.mkdtemp(prefix="corral-quota-"))
    sub = outer / "src" / "sub"
    mounted = False
    try:
        os.chmod(outer, 0o700)
        sub.mkdir(parents=True)
        os.chmod(outer / "src", 0o755)
        (outer / "src" / "file.txt").write_text("host\n")
        os.chmod(outer / "src" / "file.txt", 0o644)
        su.mount("corral-quota-test", str(sub), "tmpfs", su.MS_NOSUID | su.MS_NODEV,
                 "size=64k,mode=1777")
        mounted = True
        yield outer / "src"
    finally:
        if mounted:
            su.umount2(str(sub), su.MNT_DETACH)
        shutil.rmtree(outer, ignore_errors=True)


def test_a_bind_is_private_and_read_only_down_to_its_submounts(
        linux: Any, tree_with_submount: Path) -> None:
    path = str(tree_with_submount)

    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["cat", f"{path}/file.txt"])
            assert (r.exit_code, r.stdout_text) == (0, "host\n"), r
            w = await sb.exec(["sh", "-c", f"echo x > {path}/sub/new"])
            assert w.exit_code != 0 and "Read-only file system" in w.stderr_text, w
            m = await sb.exec(["cat", "/proc/self/mountinfo"])
            assert " shared:" not in m.stdout_text and " master:" not in m.stdout_text, \
                m.stdout_text
        assert not (tree_with_submount / "sub" / "new").exists()

    linux(test, spares=0, ro_binds=(path,))


# -- the uid pool ------------------------------------------------------------------------
@pytest.fixture
def lock_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="corral-uidpool-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_two_pools_never_share_a_block(lock_dir: str) -> None:
    pools = [UidPool(lock_dir) for _ in range(8)]
    try:
        bases = {p.base for p in pools}
        assert len(bases) == 8
        for base in bases:
            assert base % BLOCK == 0 and base >= FIRST_UID and base + BLOCK - 1 <= LAST_UID
    finally:
        for p in pools:
            p.close()
    assert os.listdir(lock_dir) == []  # each closed pool removed its lock file
    again = UidPool(lock_dir)
    assert len(os.listdir(lock_dir)) == 1
    again.close()


def test_a_pool_skips_a_block_whose_lock_file_went_meanwhile(
        lock_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a removed lock file opens: its last holder removes it between our
    open and our flock; the lock we then get is on a file nobody else will see."""
    from corral.providers.linux.host import uidpool as _uidpool

    real = fcntl.flock
    raced: list[str] = []

    def flock(fd: int, op: int) -> None:
        if not raced:
            raced.append(os.readlink(f"/proc/self/fd/{fd}"))
            os.unlink(raced[0])  # as a closing pool does, under its lock
        real(fd, op)

    monkeypatch.setattr(_uidpool.fcntl, "flock", flock)
    pool = UidPool(lock_dir)
    try:
        assert raced and pool.base // BLOCK != int(os.path.basename(raced[0]), 16)
        assert os.listdir(lock_dir) == [f"{pool.base // BLOCK:04x}"]
    finally:
        pool.close()


def test_a_uid_is_held_until_its_sandbox_exits(lock_dir: str) -> None:
    pool = UidPool(lock_dir)
    child = subprocess.Popen(["sleep", "30"])
    pidfd = os.pidfd_open(child.pid)
    try:
        first = pool.allocate()
        pool.hold(first, pidfd)
        seen = {pool.allocate() for _ in range(BLOCK - 1)}
        assert first not in seen and len(seen) == BLOCK - 1
        assert pool.live() == 1
        child.kill()
        child.wait()
        assert pool.live() == 0
        assert pool.allocate() == first  # round robin came back to it, now free
    finally:
        child.kill()
        child.wait()
        os.close(pidfd)
        pool.close()
