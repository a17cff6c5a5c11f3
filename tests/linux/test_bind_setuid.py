"""A read-write bind leaves nothing a local user can use (issue 24, item 2).

The attack: a strict sandbox with a read-write bind copies an interpreter into it and
makes it setuid and setgid (``chmod 6755``), or creates it so (``open(O_CREAT, 06755)``,
``mknod``), or leaves a device node. The bind is nosuid inside; the host's file system
is not. Before: the file landed on the host owned by the sandbox's host uid with both
bits set, so any local user running it became that uid, and a later sandbox run as the
same uid (4094 first uids for one-shot runs; every sandbox of a provider with a fixed
``outside_uid``) was theirs to read (``/proc/PID/environ``) and kill.

Now: seccomp refuses the mode bits and device nodes (EPERM inside), and as root a
read-write bind is an idmapped mount, so what the sandbox writes lands on the host as
the bind writer (uid/gid 0x70000000), an identity no sandbox runs as, never as its own
uid; and root's files, setuid binaries among them, stay "other" to the sandbox. Each
test checks the host file's mode and owner, then has uid 65534 run everything the
sandbox left and try the second sandbox's environment and a signal (0) to it; the
control shows the same chmod working outside a sandbox and the same attacker
succeeding with a setuid file of that uid made by root on the host.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import ConfigInvalidError
from corral.core.spec import ExecOpts, SandboxSpec
from corral.providers.linux.policy.plan import Bind, LinuxOptions
from strict_tier import unavailable

pytestmark = pytest.mark.linux

#: the per-sandbox uids a root fork server hands out (host/uidpool.py): blocks of 65536
#: from the second on; the first id of the first is the bind writer's
FIRST_UID, LAST_UID, BLOCK = 0x70000000, 0x7FFDFFFF, 1 << 16
BIND_UID = FIRST_UID
#: where the bound dirs live: on disk, not a tmpfs /tmp (a rw bind as root is an
#: idmapped mount; tmpfs has them only since Linux 6.3, the v2 guest's kernel is 6.1)
BIND_TMP = "/var/tmp" if os.path.isdir("/var/tmp") else None
#: a fixed outside uid/gid for every sandbox of one provider (``outside_uid=``): the
#: reuse of a uid by a later sandbox, made certain
FIXED_UID = 0x6FFE4242
NOBODY = 65534
PYTHON = os.path.realpath("/usr/bin/python3")  # runnable by uid 65534, visible inside
SECRET = "corral-bind-secret-4c1d"
#: the source's setgid dir's group: a group the sandbox is not in
SGID_GROUP = 4242

#: run inside the sandbox (its root, uid 0 inside): every way to leave a setuid or
#: setgid file or a device node in the bind at /work/p; one JSON line, errno per try
INSIDE = r"""
import json, os, shutil, stat, struct, sys
P, src, out = "/work/p", sys.argv[1], {}
def attempt(name, f):
    try:
        f()
        out[name] = "ok"
    except OSError as e:
        out[name] = e.errno
def copy(dst, mode=0o755):
    shutil.copyfile(src, dst)
    os.chmod(dst, mode)
def created():
    fd = os.open(P + "/created", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o6755)
    try:
        with open(src, "rb") as f:
            os.write(fd, f.read())
    finally:
        os.close(fd)
def fchmod():
    fd = os.open(P + "/tool", os.O_RDONLY)
    try:
        os.fchmod(fd, 0o4755)
    finally:
        os.close(fd)
copy(P + "/tool")
attempt("chmod_6755", lambda: os.chmod(P + "/tool", 0o6755))
attempt("chmod_2755", lambda: os.chmod(P + "/tool", 0o2755))
attempt("fchmod_4755", fchmod)
attempt("open_creat_6755", created)
attempt("mknod_reg_4755", lambda: os.mknod(P + "/mknod_reg", stat.S_IFREG | 0o4755))
attempt("mknod_chr", lambda: os.mknod(P + "/null", stat.S_IFCHR | 0o666, os.makedev(1, 3)))
attempt("mknod_blk", lambda: os.mknod(P + "/loop", stat.S_IFBLK | 0o660, os.makedev(7, 0)))
# a file capability: CAP_SETUID permitted and effective (VFS_CAP_REVISION_2)
attempt("setcap", lambda: os.setxattr(P + "/tool", "security.capability",
                                      struct.pack("<5I", 0x02000001, 1 << 7, 0, 0, 0)))
copy(P + "/sgid/inherit")  # in a setgid dir of the host whose group we are not in
attempt("chmod_sgid_dir_file", lambda: os.chmod(P + "/sgid/inherit", 0o2755))
attempt("link", lambda: os.link(P + "/tool", P + "/sgid/tool.link"))
attempt("mkfifo", lambda: os.mkfifo(P + "/fifo"))
with open("/proc/self/uid_map") as f:
    out["uid"] = int(f.read().split()[1])
print(json.dumps(out))
"""

#: run as uid 65534 through each file the sandbox left: which ids it got, and whether
#: it could read the second sandbox's process environment or signal it
ATTACKER = r"""
import json, os, sys
pid = int(sys.argv[1])
out = {"uids": list(os.getresuid()), "gids": list(os.getresgid())}
try:
    g, u = os.getegid(), os.geteuid()
    os.setresgid(g, g, g)
    os.setresuid(u, u, u)
except OSError as e:
    out["setres"] = e.errno
try:
    with open("/proc/%d/environ" % pid, "rb") as f:
        out["environ"] = "SECRET" if b"__SECRET__" in f.read() else "read"
except OSError as e:
    out["environ"] = e.errno
try:
    os.kill(pid, 0)
    out["signal"] = "ok"
except OSError as e:
    out["signal"] = e.errno
print(json.dumps(out))
""".replace("__SECRET__", SECRET)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A host dir uid 65534 can reach, writable by anyone (so the code before the fix,
    which wrote as the sandbox's uid, could write it too), with a setgid subdir of a
    group the sandbox is not in; removed after the test."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the sandbox's own host uid and a local user to attack it")
    outer = Path(tempfile.mkdtemp(prefix="corral-bind-setuid-", dir=BIND_TMP))
    try:
        os.chmod(outer, 0o755)
        d = outer / "proj"
        d.mkdir()
        os.chmod(d, 0o777)
        sgid = d / "sgid"
        sgid.mkdir()
        os.chown(sgid, 0, SGID_GROUP)
        os.chmod(sgid, 0o2777)
        yield d
    finally:
        shutil.rmtree(outer, ignore_errors=True)


def _sandbox_uid(uid: int) -> bool:
    return FIRST_UID + BLOCK <= uid <= LAST_UID or uid == FIXED_UID


def check_host_files(d: Path, ran: dict[str, Any],
                     expect: frozenset[str] = frozenset({"tool", "inherit"})) -> list[Path]:
    """What the sandbox left in ``d``: no setuid or setgid file, no device node, no
    file capability, nothing owned by a sandbox's uid: everything is the bind
    writer's (through the idmapped mount; in the setgid dir the group is the dir's).
    Returns the regular files (for the attacker)."""
    assert ran["uid"] != os.geteuid() and _sandbox_uid(ran["uid"]), ran
    files = []
    for root, dirs, names in os.walk(d):
        for name in dirs + names:
            p = Path(root) / name
            st = p.lstat()
            assert not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)), p
            if p.parent == d / "sgid" and p.is_dir():
                continue
            if stat.S_ISREG(st.st_mode):
                assert st.st_mode & 0o6000 == 0, f"{p}: {oct(st.st_mode)}"
                assert "security.capability" not in os.listxattr(p), p
                files.append(p)
            if p != d / "sgid":
                groups = {BIND_UID, SGID_GROUP} if p.parent == d / "sgid" else {BIND_UID}
                assert st.st_uid == BIND_UID and st.st_gid in groups, \
                    f"{p}: owned by {st.st_uid:#x}:{st.st_gid:#x}"
    assert {f.name for f in files} >= expect, files
    return files


def check_refused_inside(ran: dict[str, Any]) -> None:
    eperm = 1
    for name in ("chmod_6755", "chmod_2755", "fchmod_4755", "open_creat_6755",
                 "mknod_reg_4755", "mknod_chr", "mknod_blk", "setcap",
                 "chmod_sgid_dir_file"):
        assert ran[name] == eperm, (name, ran)
    assert ran["mkfifo"] == "ok" and ran["link"] == "ok", ran  # ordinary work still works


def attack(tool: Path | str, pid: int) -> dict[str, Any]:
    """uid 65534 runs ``tool`` (an interpreter) against the process ``pid``."""
    proc = subprocess.run([str(tool), "-I", "-S", "-c", ATTACKER, str(pid)], user=NOBODY,
                          group=NOBODY, extra_groups=[], capture_output=True, text=True,
                          timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return out


def assert_not_attackable(files: list[Path], pid: int, target_uid: int) -> None:
    for f in files:
        if not os.access(f, os.X_OK):
            continue
        got = attack(f, pid)
        ids = set(got["uids"]) | set(got["gids"])
        assert ids == {NOBODY}, (f, got)
        assert not _sandbox_uid(target_uid) or target_uid not in ids, (f, got)
        assert got["environ"] != "SECRET" and got["signal"] != "ok", (f, got)


def control(tmp: Path, pid: int, uid: int) -> None:
    """Outside a sandbox the same chmod works, and the attacker is real: a setuid and
    setgid copy of the interpreter owned by the target's uid, made by root on the
    host, gives uid 65534 that uid and the target's environment."""
    tool = tmp / "control-tool"
    shutil.copyfile(PYTHON, tool)
    try:
        os.chmod(tool, 0o6755)
        assert tool.stat().st_mode & 0o6000 == 0o6000
        os.chown(tool, uid, uid)  # chown clears the bits: set them again
        os.chmod(tool, 0o6755)
        got = attack(tool, pid)
        assert uid in got["uids"] and got["environ"] == "SECRET", got
        assert got["signal"] == "ok", got
    finally:
        tool.unlink()


def host_pid(uid: int, comm: str, timeout: float = 30) -> int:
    """The host pid of the process named ``comm`` running as host uid ``uid``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if (fields.get("Name", "").strip() == comm
                    and int(fields.get("Uid", "-1").split()[1]) == uid):
                return int(entry)
        time.sleep(0.05)
    raise AssertionError(f"no {comm} process of uid {uid:#x}")


def _outer_tmp(d: Path) -> Path:
    return d.parent


# -- the library path ------------------------------------------------------------------

@pytest.mark.parametrize("fixed", [False, True], ids=["pooled-uids", "fixed-outside-uid"])
def test_a_rw_bind_leaves_no_setuid_file_and_no_sandbox_uid(
        linux: Any, shared: Path, fixed: bool) -> None:
    """provider.create with a rw bind: the attack refused inside, nothing usable on the
    host, and a second sandboxes (the same uid as the first with a fixed outside uid)
    not reachable by a local user through anything the first left."""
    async def test(p: Any) -> None:
        async with await p.create(SandboxSpec(tenant_id="t", run_id="a")) as sb:
            r = await sb.exec([PYTHON, "-I", "-S", "-c", INSIDE, PYTHON])
            assert r.exit_code == 0, r
            ran = json.loads(r.stdout_text.splitlines()[-1])
            sh = await sb.exec(["/bin/sh", "-c", "cp /usr/bin/python3 /work/p/sh-tool && "
                                "chmod 6755 /work/p/sh-tool"])
            assert sh.exit_code != 0 and "Operation not permitted" in sh.stderr_text, sh
        check_refused_inside(ran)
        files = check_host_files(shared, ran)
        async with await p.create(SandboxSpec(tenant_id="t", run_id="b")) as sb2:
            r = await sb2.exec(["/bin/sh", "-c", f"SECRET={SECRET} sleep 60 </dev/null "
                                ">/dev/null 2>&1 & cat /proc/self/uid_map"],
                               ExecOpts(timeout_ms=30_000))
            uid2 = int(r.stdout_text.split()[1])
            if fixed:
                assert uid2 == ran["uid"] == FIXED_UID, (uid2, ran)
            pid = host_pid(uid2, "sleep")
            control(_outer_tmp(shared), pid, uid2)
            assert_not_attackable(files, pid, uid2)

    kwargs: dict[str, Any] = {"outside_uid": FIXED_UID, "outside_gid": FIXED_UID} if fixed \
        else {}
    linux(test, spares=0, binds=[Bind(str(shared), "/work/p", rw=True)], **kwargs)


def test_run_strict_with_a_rw_bind_leaves_no_setuid_file(linux: Any, shared: Path) -> None:
    """corral.run_strict_async with a provider made with the bind: the same attack."""
    from corral.run.strict import run_strict_async

    async def test(p: Any) -> None:
        res = await run_strict_async(PYTHON, ["-I", "-S", "-c", INSIDE, PYTHON],
                                     timeout_ms=60_000, provider=p)
        assert res.exit_code == 0, res
        ran = json.loads(res.stdout_text.splitlines()[-1])
        check_refused_inside(ran)
        check_host_files(shared, ran)

    linux(test, spares=0, binds=[Bind(str(shared), "/work/p", rw=True)])


def test_a_rw_bind_as_root_writes_as_the_bind_writer_only(linux: Any, shared: Path) -> None:
    """The idmapped mount maps the sandbox to the bind writer and nothing more: a dir
    the writer owns is the sandbox's (its root's, inside); root's files stay "other"
    (a root-owned setuid binary cannot be opened for writing: a shared mapping's
    writes keep its setuid bit, as the control shows); another user's file is not
    writable, their world-writable dir is; a file some sandbox uid owns on the host is
    not writable at all (that uid is unmapped), even world-writable."""
    os.chmod(shared, 0o755)
    other = shared / "other.txt"
    other.write_text("theirs\n")
    os.chown(other, 4321, 4321)
    os.chmod(other, 0o644)
    public = shared / "public"
    public.mkdir()
    os.chown(public, 4321, 4321)
    os.chmod(public, 0o777)
    mine = shared / "mine"
    mine.mkdir()
    os.chown(mine, BIND_UID, BIND_UID)
    suid = shared / "suid-root"
    shutil.copyfile("/usr/bin/true", suid)
    os.chmod(suid, 0o4755)
    before = suid.read_bytes()
    mmap_write = ("import mmap, os; fd = os.open('{}', os.O_RDWR); m = mmap.mmap(fd, 0); "
                  "m[100] = m[100] ^ 1; m.flush()")

    async def test(p: Any) -> None:
        async with await p.create(SandboxSpec(tenant_id="t", run_id="r")) as sb:
            r = await sb.exec(["/bin/sh", "-c", "echo m > /work/p/mine/f && "
                               "echo pub > /work/p/public/f && "
                               "stat -c '%u:%g' /work/p/mine/f /work/p/other.txt "
                               "/work/p/public/f /work/p/suid-root; cat /proc/self/uid_map"])
            assert r.exit_code == 0, r
            assert r.stdout_text.startswith("0:0\n65534:65534\n0:0\n65534:65534\n"), r
            uid = int(r.stdout_text.split()[5])
            for target in ("/work/p/new.txt", "/work/p/other.txt"):
                r = await sb.exec(["/bin/sh", "-c", f"echo x >> {target}"])
                assert r.exit_code != 0 and "Permission denied" in r.stderr_text, r
            r = await sb.exec([PYTHON, "-I", "-S", "-c",
                               mmap_write.format("/work/p/suid-root")])
            assert r.exit_code != 0 and "PermissionError" in r.stderr_text, r
            left = shared / "left-by-an-earlier-sandbox"
            left.write_text("old\n")
            os.chown(left, uid, uid)
            os.chmod(left, 0o666)
            r = await sb.exec(["/bin/sh", "-c", f"echo x >> /work/p/{left.name}"])
            assert r.exit_code != 0 and "Permission denied" in r.stderr_text, r
        for f in (mine / "f", public / "f"):
            st = f.stat()
            assert (st.st_uid, st.st_gid) == (BIND_UID, BIND_UID), f
        assert not (shared / "new.txt").exists()
        assert other.read_text() == "theirs\n" and left.read_text() == "old\n"
        assert suid.read_bytes() == before and suid.stat().st_mode & 0o4000
        # the control: a shared mapping's write (by root here) keeps the setuid bit
        proc = subprocess.run([PYTHON, "-I", "-S", "-c", mmap_write.format(suid)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        assert suid.read_bytes() != before and suid.stat().st_mode & 0o4000

    linux(test, spares=0, binds=[Bind(str(shared), "/work/p", rw=True)])


def test_a_rw_bind_on_a_file_system_without_idmapped_mounts_is_refused(linux: Any) -> None:
    """overlayfs has no idmapped mounts (Linux 6.18 here): a rw bind of a dir on it is
    refused at create with LevelNotSupportedError naming what is missing and the file
    system; read-only it still works."""
    if os.geteuid() != 0:
        pytest.skip("needs root (an overlay mount, and the idmapped path)")
    from corral.core.errors import LevelNotSupportedError
    base = Path(tempfile.mkdtemp(prefix="corral-bind-ovl-"))
    for sub in ("lower", "upper", "work", "merged"):
        (base / sub).mkdir()
    (base / "lower" / "in.txt").write_text("lower\n")
    merged = base / "merged"
    mounted = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={base}/lower,upperdir={base}/upper,workdir={base}/work", str(merged)],
        capture_output=True, text=True, check=False)
    try:
        if mounted.returncode != 0:
            pytest.skip(f"no overlay mount here: {mounted.stderr}")

        async def refused(p: Any) -> None:
            with pytest.raises(LevelNotSupportedError) as info:
                await p.create(SandboxSpec(tenant_id="t", run_id="r"))
            e = info.value
            assert e.field == "binds" and e.missing == "idmapped mount", e
            assert str(merged) in e.detail and "(overlay)" in e.detail, e.detail

        async def read_only(p: Any) -> None:
            async with await p.create(SandboxSpec(tenant_id="t", run_id="r")) as sb:
                r = await sb.exec(["cat", "/work/p/in.txt"])
                assert (r.exit_code, r.stdout_text) == (0, "lower\n"), r

        linux(refused, spares=0, binds=[Bind(str(merged), "/work/p", rw=True)])
        linux(read_only, spares=0, binds=[Bind(str(merged), "/work/p")])
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", str(merged)], check=False)
        shutil.rmtree(base, ignore_errors=True)


# -- the CLI: --bind (library path), then a one-shot run as the second sandbox ------------

ENTRY = ("import sys, _corral_cli; code = _corral_cli.main(sys.argv[1:]); "
         "sys.exit(code)")
TAKEN = "corral: trace: one-shot path"


def cli(*args: str, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "CORRAL_CLI_TRACE": "1"}
    return subprocess.Popen([sys.executable, "-c", ENTRY, *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, **kw)


def test_the_cli_rw_bind_attack_and_a_one_shot_run_after_it(linux: Any, shared: Path) -> None:
    """The issue's command line: ``corral run --level strict --bind DIR:/work/p:rw --
    sh -c 'cp ... && chmod 6755 ...'``; then a one-shot run (no --bind: the CLI's fast
    path, a pool uid of its own) holding a secret, which uid 65534 cannot reach through
    what the first run left."""
    first = cli("run", "--level", "strict", "--bind", f"{shared}:/work/p:rw", "--",
                "/bin/sh", "-c", "cat /proc/self/uid_map; cp /usr/bin/python3 /work/p/tool "
                "&& chmod 6755 /work/p/tool")
    out, err = first.communicate(timeout=120)
    if "one-shot set-up failed" in err and "uid_map" not in out and not out:
        unavailable(err[-500:])
    assert first.returncode != 0 and "Operation not permitted" in err, (out, err)
    uid1 = int(out.split()[1])
    files = check_host_files(shared, {"uid": uid1}, frozenset({"tool"}))
    second = cli("run", "--level", "strict", "--timeout", "90000", "--", "/bin/sh", "-c",
                 f"cat /proc/self/uid_map; export SECRET={SECRET}; exec sleep 60")
    try:
        assert second.stdout is not None
        line = second.stdout.readline()
        assert line, second.stderr.read() if second.stderr else ""
        uid2 = int(line.split()[1])
        assert _sandbox_uid(uid2) and uid2 != os.geteuid()
        pid = host_pid(uid2, "sleep")
        control(_outer_tmp(shared), pid, uid2)
        assert_not_attackable(files, pid, uid2)
    finally:
        second.send_signal(signal.SIGTERM)  # the CLI kills its sandbox and exits
        _out, err2 = second.communicate(timeout=60)
    assert TAKEN in err2, err2[-2000:]


def test_check_host_files_catches_a_setuid_file(shared: Path) -> None:
    """The host-side check itself: a setuid file of a sandbox uid in the dir fails it."""
    bad = shared / "tool"
    shutil.copyfile(PYTHON, bad)
    os.chown(bad, FIRST_UID + 7, FIRST_UID + 7)
    os.chmod(bad, 0o6755)
    (shared / "sgid" / "inherit").write_text("x")
    with pytest.raises(AssertionError):
        check_host_files(shared, {"uid": FIRST_UID + 7})


# -- the pieces ---------------------------------------------------------------------------

def test_the_idmapping_sends_the_sandbox_to_the_writer_and_nothing_else() -> None:
    from corral.providers.linux.host import uidpool
    from corral.providers.linux.init.mounts import _id_map
    from corral.providers.linux.policy import plan
    assert uidpool.BIND_UID == plan.BIND_UID == BIND_UID
    assert uidpool._FIRST_BLOCK * uidpool.BLOCK > BIND_UID  # no pool hands it out
    for own in (0x70001234 + BLOCK, 5, 0, 0x7FFDFFFF):
        lines = [tuple(int(x) for x in line.split())
                 for line in _id_map(own, BIND_UID).decode().splitlines()]
        assert (BIND_UID, own, 1) in lines
        inside = [(s, s + n) for s, _o, n in lines]
        outside = [(o, o + n) for _s, o, n in lines]
        for ranges in (inside, outside):  # the kernel refuses overlapping lines
            assert all(a[1] <= b[0] or b[1] <= a[0] for a in ranges for b in ranges
                       if a != b), lines
        assert not any(s <= own < e for s, e in inside)      # its files: unmapped
        assert not any(s <= BIND_UID < e for s, e in outside)  # nothing else is the writer
        covered = sum(e - s for s, e in inside)
        assert covered == (1 << 32) - 2, lines                  # every other id: itself
    with pytest.raises(ConfigInvalidError):
        LinuxOptions(outside_uid=BIND_UID)
    with pytest.raises(ConfigInvalidError):
        LinuxOptions(outside_gid=BIND_UID)


def test_no_detached_trees_refuses_a_rw_bind_as_root() -> None:
    """Where the fork server gets no detached trees (a container's seccomp denies
    open_tree) a read-write bind cannot be idmapped: refused, not bound as the sandbox."""
    from corral.providers.linux.init.mounts import idmap_trees
    rw = [{"kind": "bind", "source": "/srv/x", "target": "/work/x", "readonly": False,
           "nosuid_nodev": True}]
    with pytest.raises(OSError, match="no detached mount trees"):
        idmap_trees(rw, [], 0x70010001, 0x70010001, BIND_UID)
    idmap_trees([{**rw[0], "readonly": True, "nosuid_nodev": False}], [], 0x70010001,
                0x70010001, BIND_UID)  # read-only: nothing to map
    idmap_trees(rw, [], 0, 0, BIND_UID)  # a sandbox run as root itself writes as root
