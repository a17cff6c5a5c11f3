"""LinuxProvider(binds=[Bind(src, dst, rw=...)]): bubblewrap's --bind / --ro-bind SRC DST.

A read-write bind's writes land on the host as the provider's own uid (as root through
an idmapped mount: root, never a sandbox's uid; not root: the caller's); a read-only
bind of the same writable dir refuses them (EROFS); a bind at another path hides the
source's own path; a dst that would hide a sandbox dir or the interpreter is refused,
and so is a source holding a unix socket, read-write or not (issue 16).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import ConfigInvalidError
from corral.core.spec import SandboxSpec
from corral.providers.linux.policy.plan import (
    Bind,
    HostLayout,
    LinuxOptions,
    build_plan,
)

pytestmark = pytest.mark.linux

#: where the bound dirs live: on disk, not a tmpfs /tmp (a rw bind as root is an
#: idmapped mount; tmpfs has them only since Linux 6.3, the v2 guest's kernel is 6.1)
BIND_TMP = "/var/tmp" if os.path.isdir("/var/tmp") else None


def make_spec() -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable host dir (the sandbox's own uid must be able to write it),
    under a parent only root can walk (like a 0700 home); removed after the test."""
    outer = Path(tempfile.mkdtemp(prefix="corral-binds-", dir=BIND_TMP))
    try:
        os.chmod(outer, 0o700)
        d = outer / "proj"
        d.mkdir()
        os.chmod(d, 0o777)
        (d / "in.txt").write_text("from the host\n")
        os.chmod(d / "in.txt", 0o644)
        yield d
    finally:
        shutil.rmtree(outer, ignore_errors=True)


#: what a rw bind's writes are on the host as root (host/uidpool.py): no sandbox's uid
BIND_UID = 0x70000000


def _owner_ok(uid: int) -> bool:
    """As root the write went through an idmapped mount: the bind writer's, not the
    sandbox's own uid; not root: the caller's."""
    return uid == (BIND_UID if os.geteuid() == 0 else os.geteuid())


# -- in a sandbox ----------------------------------------------------------------

def test_a_rw_bind_is_writable_and_the_write_lands_on_the_host(linux: Any,
                                                                shared: Path) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["sh", "-c", "cat /work/proj/in.txt; echo out > /work/proj/new.txt"
                               "; mkdir /work/proj/sub && echo deep > /work/proj/sub/f"])
            assert (r.exit_code, r.stdout_text) == (0, "from the host\n"), r
            m = await sb.exec(["sh", "-c", "grep ' /work/proj ' /proc/self/mountinfo"])
            assert m.exit_code == 0, m
            opts = m.stdout_text.split()[5].split(",")
            assert "rw" in opts and "nosuid" in opts and "nodev" in opts, m.stdout_text
            if os.geteuid() == 0:
                assert "idmapped" in opts, m.stdout_text
        new = shared / "new.txt"
        assert new.read_text() == "out\n"
        assert (shared / "sub" / "f").read_text() == "deep\n"
        owner = new.stat().st_uid
        assert _owner_ok(owner), f"owner {owner:#x}"

    linux(test, spares=0, binds=[Bind(str(shared), "/work/proj", rw=True)])


def test_a_ro_bind_of_the_same_writable_dir_refuses_the_write(linux: Any,
                                                               shared: Path) -> None:
    """The control: the dir is world-writable, yet a read-only bind stays read-only."""
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["sh", "-c", "cat /work/proj/in.txt; echo out > /work/proj/new.txt"])
            assert r.stdout_text == "from the host\n", r
            assert r.exit_code != 0 and "Read-only file system" in r.stderr_text, r
            m = await sb.exec(["sh", "-c", "grep ' /work/proj ' /proc/self/mountinfo"])
            assert " ro," in m.stdout_text, m
        assert not (shared / "new.txt").exists()

    linux(test, spares=0, binds=[Bind(str(shared), "/work/proj")])


def test_a_rw_bind_of_a_dir_the_sandbox_cannot_write_is_eacces(linux: Any,
                                                               shared: Path) -> None:
    """As root the writes are the bind writer's (BIND_UID) through the idmapped mount:
    a 0755 root-owned dir refuses them with the command's own EACCES (not EROFS: the
    bind is writable; the sandbox has no capability to override it)."""
    if os.geteuid() != 0:
        pytest.skip("as the caller's own uid the dir is writable")
    os.chmod(shared, 0o755)

    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["sh", "-c", "echo out > /data/new.txt"])
            assert r.exit_code != 0 and "Permission denied" in r.stderr_text, r
        assert not (shared / "new.txt").exists()

    linux(test, spares=0, binds=[Bind(str(shared), "/data", rw=True)])


def test_a_bind_at_another_path_hides_the_source_path(linux: Any, shared: Path) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["cat", "/opt/shown/in.txt"])
            assert (r.exit_code, r.stdout_text) == (0, "from the host\n"), r
            for path in (str(shared), str(shared.parent)):
                r = await sb.exec(["sh", "-c", f"test -e {path}"])
                assert r.exit_code != 0, (path, r)

    linux(test, spares=0, binds=[Bind(str(shared), "/opt/shown")])


def test_ro_binds_still_bind_at_the_same_path(linux: Any, shared: Path) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["sh", "-c", f"cat {shared}/in.txt; cat /work/rw/in.txt"])
            assert r.stdout_text == "from the host\nfrom the host\n", r

    linux(test, spares=0, ro_binds=[str(shared)],
          binds=[Bind(str(shared), "/work/rw", rw=True)])


# -- refusals --------------------------------------------------------------------

def _host() -> HostLayout:
    from corral.providers.linux.init import mounts
    return mounts.detect_host_layout()


def _bad_dsts() -> list[str]:
    host = _host()
    bad = ["/proc", "/proc/self", "/etc", "/etc/x", "/dev", "/dev/shm", "/tmp", "/work",
           "/usr", "/usr/lib/x", os.path.dirname(host.package_root), host.package_root,
           *host.prefixes]
    return sorted(set(bad))


@pytest.mark.parametrize("dst", _bad_dsts())
def test_a_dst_that_would_hide_a_sandbox_dir_is_refused(linux: Any, shared: Path,
                                                         dst: str) -> None:
    from corral.providers.linux import LinuxProvider
    with pytest.raises(ConfigInvalidError) as info:
        LinuxProvider(spares=0, binds=[Bind(str(shared), dst, rw=True)])
    assert info.value.field == "binds"
    assert repr(dst) in info.value.message or dst.split("/")[1] in info.value.message


@pytest.mark.parametrize("dst", ["relative", "/", "/work/../etc", "/work/proj/", "//x", 7])
def test_a_dst_not_normalized_and_absolute_is_refused(dst: object) -> None:
    with pytest.raises(ConfigInvalidError) as info:
        Bind("/srv", dst)  # type: ignore[arg-type]
    assert info.value.field == "binds" and "dst" in info.value.message


def test_a_missing_source_and_a_non_bind_are_refused(linux: Any) -> None:
    from corral.providers.linux import LinuxProvider
    with pytest.raises(ConfigInvalidError, match="does not exist") as info:
        LinuxProvider(spares=0, binds=[Bind("/no/such/corral/dir", "/data")])
    assert info.value.field == "binds"
    with pytest.raises(ConfigInvalidError) as info:
        LinuxProvider(spares=0, binds=["/usr"])  # type: ignore[list-item]
    assert info.value.field == "binds"


@pytest.mark.parametrize("rw", [True, False])
def test_a_source_holding_a_unix_socket_is_refused_rw_too(linux: Any, shared: Path,
                                                          rw: bool) -> None:
    from corral.providers.linux import LinuxProvider
    sock = shared / "sub" / "api.sock"
    sock.parent.mkdir()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        with pytest.raises(ConfigInvalidError, match="unix socket") as info:
            LinuxProvider(spares=0, binds=[Bind(str(shared), "/work/proj", rw=rw)])
    assert info.value.field == "binds" and str(sock) in info.value.message


def test_the_plan_carries_the_binds_and_separates_their_shapes() -> None:
    from corral.providers.linux.host.spares import shape_key
    host = HostLayout(euid=0, egid=0, system_dirs=("/usr",), prefixes=("/opt/venv",),
                      package_root="/srv/corral/src")

    def plan(*binds: Bind) -> Any:
        return build_plan(make_spec(), options=LinuxOptions(binds=binds), host=host)

    p = plan(Bind("/home/u/proj", "/work/proj", rw=True), Bind("/data/set", "/data"))
    steps = {m.target: m for m in p.mounts if m.kind == "bind"}
    rw, ro = steps["/work/proj"], steps["/data"]
    assert (rw.source, rw.readonly, rw.nosuid_nodev) == ("/home/u/proj", False, True)
    assert (ro.source, ro.readonly) == ("/data/set", True)
    names = [(m.kind, m.target) for m in p.mounts]
    # under /work: bound on top of the sandbox's own writable area, after it
    assert names.index(("bind", "/work/proj")) > names.index(("area_bind", "/work"))
    assert names.index(("bind", "/data")) < names.index(("area_bind", "/work"))
    t = [(m.kind, m.target) for m in plan(Bind("/a", "/tmp/x", rw=True)).mounts]
    assert t.index(("bind", "/tmp/x")) > t.index(("area_bind", "/tmp"))
    keys = {shape_key(plan(*b)) for b in (
        (), (Bind("/home/u/proj", "/work/proj", rw=True),),
        (Bind("/home/u/proj", "/work/proj"),), (Bind("/home/u/proj", "/work/other"),))}
    assert len(keys) == 4
    # same path, read-only, under a dir bound already: visible already, no step
    assert plan(Bind("/usr/share")).mounts == plan().mounts
    for binds, words in (
            ((Bind("/a", "/work/x"), Bind("/b", "/work/x")), "twice"),
            ((Bind("/a", "/work/x"), Bind("/b", "/work/x/y")), "nests"),
            ((Bind("/a", "/opt/venv/lib", rw=True),), "runs from"),
            ((Bind("/a", "/opt", rw=True),), "runs from")):
        with pytest.raises(ConfigInvalidError, match=words) as info:
            plan(*binds)
        assert info.value.field == "binds"


# -- the CLI ---------------------------------------------------------------------

def test_the_cli_rw_bind_round_trip(linux: Any, shared: Path,
                                    capfd: pytest.CaptureFixture[str]) -> None:
    from corral.cli import main
    status = main(["run", "--level", "strict", "--bind", f"{shared}:/work/proj:rw", "--",
                   "/bin/sh", "-c", "echo x > /work/proj/f; cat /work/proj/in.txt"])
    out, err = capfd.readouterr()
    assert (status, out) == (0, "from the host\n"), err
    assert (shared / "f").read_text() == "x\n"
    assert _owner_ok((shared / "f").stat().st_uid)
    # the default is read-only, at the same path
    status = main(["run", "--level", "strict", "--bind", str(shared), "--",
                   "/bin/sh", "-c", f"echo y > {shared}/g"])
    out, err = capfd.readouterr()
    assert status != 0 and "Read-only file system" in err, err
    assert not (shared / "g").exists()


@pytest.mark.parametrize(("spec", "words"), [
    ("{d}:/proc", "'/proc'"), ("{d}:relative:rw", "absolute"), ("{d}::rw", "expected"),
])
def test_the_cli_refuses_a_bad_dst(linux: Any, shared: Path, spec: str, words: str,
                                   capfd: pytest.CaptureFixture[str]) -> None:
    from corral.cli import main
    status = main(["run", "--level", "strict", "--bind", spec.format(d=shared), "--",
                   "/bin/true"])
    err = capfd.readouterr().err
    assert status == 64 and "config-invalid" in err and words in err, err


# -- not root: the writes are the caller's own --------------------------------------

RW_AS_CALLER = """
import asyncio, os, sys
from corral.core.spec import SandboxSpec
from corral.providers.linux import Bind, LinuxProvider

async def main() -> None:
    p = LinuxProvider(spares=0, binds=[Bind(sys.argv[1], "/work/proj", rw=True)])
    try:
        async with await p.create(SandboxSpec(tenant_id="t", run_id="r")) as sb:
            r = await sb.exec(["sh", "-c", "echo mine > /work/proj/f; chmod 6755 /work/proj/f"
                               " && echo setuid-allowed"])
            print(r.exit_code, r.stderr_text)
    finally:
        await p.aclose()

asyncio.run(main())
"""


@pytest.fixture
def as_nobody(nobody_python: tuple[str, str]) -> Callable[[list[str]], str]:
    if os.geteuid() != 0:
        pytest.skip("needs root, to become an unprivileged user")
    py, src = nobody_python

    def run(args: list[str]) -> str:
        proc = subprocess.run([py, "-I", "-c", f"import sys; sys.path.insert(0, {src!r})\n"
                               + RW_AS_CALLER, *args], user=65534, group=65534,
                              extra_groups=[], capture_output=True, text=True, timeout=60,
                              cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
        return proc.stdout + proc.stderr
    return run


def test_not_root_a_rw_bind_writes_as_the_caller_and_never_setuid(
        linux: Any, as_nobody: Callable[[list[str]], str]) -> None:
    own = Path(tempfile.mkdtemp(prefix="corral-binds-nobody-"))
    try:
        os.chmod(own, 0o700)
        os.chown(own, 65534, 65534)
        out = as_nobody([str(own)])
        if "level-not-supported" in out or "LevelNotSupported" in out:
            pytest.skip(f"no unprivileged sandbox here: {out[-300:]}")
        assert out.startswith("1 ") and "Operation not permitted" in out, out
        f = own / "f"
        assert f.read_text() == "mine\n"
        assert f.stat().st_uid == 65534
        # a setuid file of the caller's uid would hand it to any local user: refused
        assert f.stat().st_mode & 0o6000 == 0, oct(f.stat().st_mode)
    finally:
        shutil.rmtree(own, ignore_errors=True)
