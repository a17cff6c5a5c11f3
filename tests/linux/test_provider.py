"""LinuxProvider end to end: boundary, exec, files, processes, limits, lifecycle, cleanup.

Every bomb here runs inside a sandbox with the matching limit set and is bounded
on its own (a loop count or a byte count), so it stops even if the sandbox failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

from cgroup_view import mine
from corral.core.cancel import CancelToken
from corral.core.errors import (
    ConfigInvalidError,
    CreateCancelledError,
    InvalidSnapshotHandleError,
    LevelNotSupportedError,
    LimitsExceededError,
    ProviderError,
    SandboxTimeoutError,
)
from corral.core.spec import ExecOpts, ProcessOpts, SandboxLimits, SandboxSpec, SnapshotHandle
from strict_tier import needs_cgroup_limits

pytestmark = pytest.mark.linux
PY = sys.executable


def make_spec(**limits: int) -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r", limits=SandboxLimits(**limits))


def py(code: str) -> list[str]:
    return [PY, "-I", "-S", "-c", textwrap.dedent(code)]


def test_boundary_basics(linux: Any) -> None:
    os.environ["CORRAL_TEST_SECRET"] = "leak"

    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["sh", "-c", "id -u; hostname; pwd; echo $HOME $TMPDIR; "
                               "echo ${CORRAL_TEST_SECRET:-unset}; ls /; "
                               "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; "
                               "ls /proc | grep -cE '^[0-9]+$'"])
            lines = r.stdout_text.split("\n")
            assert r.exit_code == 0, r
            assert lines[:5] == ["0", "sandbox", "/work", "/work /tmp", "unset"]
            assert "home" not in lines
            # /root exists inside only when the checkout's venv is bound from under it
            if "root" in lines:
                ls = await sb.exec(["sh", "-c", "ls -A /root"])
                # the venv's and its base interpreter's (a pyenv build in /root/.pyenv)
                under_root = {os.path.realpath(q).split("/")[2] for q in (
                    sys.prefix, sys.base_prefix) if os.path.realpath(q).startswith("/root/")}
                assert set(ls.stdout_text.split()) == under_root
            status = r.stdout_text
            assert "CapEff:\t0000000000000000" in status
            assert "CapBnd:\t0000000000000000" in status
            assert "NoNewPrivs:\t1" in status
            assert "Seccomp:\t2" in status
            # own pid namespace: the agent, sh, ls/grep at most
            assert int(lines[-2]) <= 5
            r = await sb.exec(["sh", "-c",
                               "touch /usr/x; touch /etc/x; echo ok > /tmp/t; cat /tmp/t"])
            assert "Read-only" in r.stderr_text and r.stdout == b"ok\n"
            with pytest.raises(ConfigInvalidError, match="no such file"):
                await sb.exec(["pwd"], ExecOpts(cwd="sub"))  # sub does not exist yet
            await sb.write_file("sub/f", b"x")
            r = await sb.exec(["sh", "-c", "pwd; echo $A"], ExecOpts(cwd="sub", env={"A": "b"}))
            assert r.stdout == b"/work/sub\nb\n"

    try:
        linux(test)
    finally:
        del os.environ["CORRAL_TEST_SECRET"]


def test_exec_stdin_exit_code_and_missing_command(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(py("import sys; d = sys.stdin.read(); print(d.upper()); "
                                 "sys.exit(3)"), ExecOpts(stdin=b"hello"))
            assert (r.stdout, r.exit_code) == (b"HELLO\n", 3)
            r = await sb.exec(["no-such-command-here"])
            assert r.exit_code == 127
            with pytest.raises(ConfigInvalidError, match="argv"):
                await sb.exec([])
            with pytest.raises(ConfigInvalidError, match="path"):
                await sb.exec(["true"], ExecOpts(cwd="../x"))

    linux(test)


def test_files_stay_inside(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            await sb.write_file("a/b.txt", "hi")
            assert await sb.read_file("/work/a/b.txt") == b"hi"
            r = await sb.exec(["cat", "a/b.txt"])
            assert r.stdout == b"hi"
            for bad in ("../etc/passwd", "/etc/passwd", "a/../../x"):
                with pytest.raises(ConfigInvalidError):
                    await sb.read_file(bad)
            await sb.exec(["ln", "-s", "/etc", "link"])
            with pytest.raises(ConfigInvalidError):
                await sb.read_file("link/passwd")
            with pytest.raises(FileNotFoundError):
                await sb.read_file("missing.txt")

    linux(test)


def test_streaming_process_with_stdin(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            proc = await sb.start_process(py("""
                import sys
                for line in sys.stdin:
                    print(line.strip()[::-1], flush=True)
                print("bye", file=sys.stderr)
                sys.exit(5)
            """))
            await proc.stdin.write(b"abc\n")
            first = await asyncio.wait_for(proc.stdout.__anext__(), 10)
            assert first == b"cba\n"
            await proc.stdin.close()
            rest = b"".join([c async for c in proc.stdout])
            err = b"".join([c async for c in proc.stderr])
            st = await proc.wait()
            assert (rest, err, st.exit_code) == (b"", b"bye\n", 5)

    linux(test)


def test_timeout_kills_the_command_tree_and_keeps_partial_output(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            with pytest.raises(SandboxTimeoutError) as ei:
                await sb.exec(["sh", "-c", "echo started; sleep 30 & sleep 30"],
                              ExecOpts(timeout_ms=300))
            assert ei.value.stdout == b"started\n"
            r = await sb.exec(["sh", "-c", "ps -e -o comm= 2>/dev/null | grep -c sleep || true"])
            assert r.stdout.strip() in (b"0", b"")

    linux(test)


@needs_cgroup_limits()
def test_memory_bomb_is_bounded(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec(mem_mb=64)) as sb:
            with pytest.raises(LimitsExceededError) as ei:
                await sb.exec(py("""
                    chunks = []
                    for _ in range(16):          # at most 256 MiB (4x the limit), then stop
                        chunks.append(bytearray(16 << 20))
                """))
            assert (ei.value.limit, ei.value.limit_value) == ("memory", 64)
            assert (await sb.exec(["true"])).exit_code == 0

    linux(test)


@needs_cgroup_limits()
def test_fork_bomb_is_bounded(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec(max_processes=16)) as sb:
            with pytest.raises(LimitsExceededError) as ei:
                await sb.exec(py("""
                    import os, time
                    kids = []
                    for _ in range(64):          # bounded: at most 64 forks
                        pid = os.fork()
                        if pid == 0:
                            time.sleep(2)
                            os._exit(0)
                        kids.append(pid)
                """), ExecOpts(timeout_ms=20000))
            assert ei.value.limit == "processes"

    linux(test)


def test_output_flood_is_capped(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            with pytest.raises(LimitsExceededError) as ei:
                await sb.exec(py("""
                    import sys
                    for _ in range(64):          # bounded: 4 MiB
                        sys.stdout.buffer.write(b"x" * 65536)
                """))
            assert (ei.value.limit, ei.value.limit_value) == ("output", 1 << 20)

    linux(test, stdout_cap=1 << 20)


@needs_cgroup_limits()
def test_cpu_and_disk_limits(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec(cpu_ms=300, disk_mb=8)) as sb:
            with pytest.raises(LimitsExceededError) as ei:
                await sb.exec(py("""
                    import time
                    end = time.monotonic() + 10   # bounded: 10 s of spinning
                    while time.monotonic() < end:
                        pass
                """))
            assert ei.value.limit == "cpu"
        async with await p.create(make_spec(disk_mb=8)) as sb:
            with pytest.raises(LimitsExceededError) as ei:
                await sb.exec(py("""
                    with open("/tmp/fill", "wb") as f:
                        for _ in range(32):       # bounded: 32 MiB
                            f.write(b"x" * (1 << 20))
                """))
            assert (ei.value.limit, ei.value.limit_value) == ("disk", 8)

    linux(test)


def test_pause_and_resume(linux: Any) -> None:
    async def test(p: Any) -> None:
        if "pause" not in p.capabilities:
            pytest.skip("no cgroup freezer")
        async with await p.create(make_spec()) as sb:
            await sb.pause()
            task = asyncio.ensure_future(sb.exec(["echo", "thawed"]))
            await asyncio.sleep(0.3)
            assert not task.done()
            await sb.resume()
            r = await asyncio.wait_for(task, 10)
            assert r.stdout == b"thawed\n"

    linux(test)


def test_snapshot_restore_and_bad_handles(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb, await p.create(make_spec()) as other:
            await sb.write_file("d/keep.txt", b"v1")
            h = await sb.snapshot()
            assert json.loads(json.dumps(h.to_json()))["adapterId"] == "linux"
            await sb.write_file("d/keep.txt", b"v2")
            await sb.write_file("new.txt", b"n")
            await sb.restore(h)
            assert await sb.read_file("d/keep.txt") == b"v1"
            with pytest.raises(FileNotFoundError):
                await sb.read_file("new.txt")
            await other.restore(h)   # any sandbox of the same provider
            assert await other.read_file("d/keep.txt") == b"v1"
            tampered = SnapshotHandle(adapter_id="linux", doc={**h.doc, "sha256": "0" * 64})
            foreign = SnapshotHandle(adapter_id="other", doc=dict(h.doc))
            for bad in (tampered, foreign):
                with pytest.raises(InvalidSnapshotHandleError):
                    await sb.restore(bad)
            p.snapshots.drop(h)
            with pytest.raises(InvalidSnapshotHandleError, match="stale"):
                await sb.restore(h)

    linux(test)


def test_refusals(linux: Any) -> None:
    async def test(p: Any) -> None:
        from corral.core.spec import NetworkPolicy
        with pytest.raises(LevelNotSupportedError):
            await p.create(SandboxSpec(tenant_id="t", run_id="r", level="context-isolated"))
        with pytest.raises(ConfigInvalidError, match=r"network\.hosts"):  # issue 13
            await p.create(SandboxSpec(tenant_id="t", run_id="r",
                                       network=NetworkPolicy.allowlist("example.org:0")))

    linux(test)


@needs_cgroup_limits()
def test_cancel_of_create_rolls_back(linux: Any) -> None:
    async def test(p: Any) -> None:
        tok = CancelToken()
        tok.cancel("early")
        with pytest.raises(CreateCancelledError):
            await p.create(make_spec(), cancel=tok)
        for delay in (0.0, 0.001, 0.003):
            tok = CancelToken()
            threading.Timer(delay, tok.cancel).start()
            try:
                sb = await p.create(make_spec(), cancel=tok)
            except CreateCancelledError:
                continue
            await sb.destroy()
        task = asyncio.ensure_future(p.create(make_spec()))
        await asyncio.sleep(0.002)
        task.cancel()
        try:
            sb = await task
            await sb.destroy()
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(0.1)
        spares = await p.wait_spares()
        assert spares <= p.spares
        assert await _settled(p, (spares, spares)) == (spares, spares)
        await p.aclose()
        assert await _settled(p, (0, 0)) == (0, 0)

    linux(test)


def test_destroy_is_idempotent_and_final(linux: Any) -> None:
    async def test(p: Any) -> None:
        sb = await p.create(make_spec())
        proc = await sb.start_process(["sleep", "30"], ProcessOpts(stdin=False))
        await sb.destroy()
        await sb.destroy()
        st = await asyncio.wait_for(proc.wait(), 5)
        assert st.exit_code != 0
        with pytest.raises(ProviderError):
            await sb.exec(["true"])
        with pytest.raises(ProviderError):
            await sb.read_file("x")

    linux(test)


async def _settled(p: Any, want: tuple[int, int], timeout: float = 10.0) -> tuple[int, int]:
    """_leaks once it equals ``want``, or its last value after ``timeout``: a killed
    sandbox's launcher or init may still be on its way out (the fork server reaps
    it on SIGCHLD; a launcher waits for the kernel to move its init into a cgroup),
    which is not a leak; one still there after 10 s is, and the failure says which."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (got := _leaks(p)) != want and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    if got != want:
        print("fork server children:", _children_of(p.zygote_pid))
        if p.zygote_pid is not None:
            z = _status(p.zygote_pid)
            print("fork server signals:", {k: z.get(k) for k in (
                "State", "SigBlk", "SigPnd", "ShdPnd", "SigIgn", "SigCgt")})
    return got


def _children_of(pid: int | None) -> list[str]:
    """The fork server's children and grandchildren (sandboxes are its template's)."""
    if pid is None:
        return []
    out = []
    for kid in _kids(pid):
        try:
            st = _status(kid)
            out.append(f"{kid} {st['Name']} {st['State']} NSpid {st.get('NSpid', '')} "
                       f"children {_kids(kid)}")
        except OSError:
            out.append(f"{kid} gone")
    return out


def _kids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(k) for k in f.read().split()]
    except OSError:
        return []


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as s:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in s if ":" in line)}


def _fork_server_tree(zpid: int) -> tuple[list[int], list[int]]:
    """(the pid 1s of sandboxes, the other processes) among the fork server's children
    and grandchildren: a pid 1's NSpid has two levels and ends in 1."""
    pid1s, others = [], []
    for kid in _kids(zpid):
        for pid in (kid, *_kids(kid)):
            try:
                nspid = _status(pid).get("NSpid", "").split()
            except OSError:
                continue
            (pid1s if len(nspid) == 2 and nspid[1] == "1" else others).append(pid)
    return pid1s, others


async def _template_pid(zpid: int) -> int:
    """The fork server's template: its one long-lived child outside any sandbox (once
    the launch helpers, which exit as a create returns, are gone)."""
    for _ in range(250):
        _pid1s, others = _fork_server_tree(zpid)
        if len(others) == 1:
            return others[0]
        await asyncio.sleep(0.02)
    raise AssertionError(_children_of(zpid))


def _leaks(p: Any) -> tuple[int, int]:
    """(sandbox pid 1s and launch helpers under the zygote, corral cgroups of this
    process); idle spares count; the zygote's template does not."""
    kids = 0
    zpid = p.zygote_pid
    if zpid is not None:
        pid1s, others = _fork_server_tree(zpid)
        kids = len(pid1s) + max(0, len(others) - 1)
    return kids, len(mine())


def _mounts_and_fds() -> tuple[int, int]:
    with open("/proc/self/mountinfo") as f:
        mounts = len(f.readlines())
    return mounts, len(os.listdir("/proc/self/fd"))


def test_killed_template_is_replaced_and_sandboxes_live_on(linux: Any) -> None:
    async def test(p: Any) -> None:
        first = await p.create(make_spec())
        template = await _template_pid(p.zygote_pid)
        os.kill(template, signal.SIGKILL)  # a process this test's provider started
        for _ in range(100):
            try:
                if _status(template)["State"].startswith("Z"):
                    break
            except OSError:  # gone (reaped) between two reads: ESRCH or ENOENT
                break
            await asyncio.sleep(0.02)
        assert (await first.exec(py("print('still here')"))).stdout == b"still here\n"
        async with await p.create(make_spec()) as second:
            assert (await second.exec(py("import os; print(os.getpid())"))).stdout == b"3\n"
        await first.destroy()

    linux(test, spares=0)


def test_preload_retires_the_template(linux: Any) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()):
            pass
        old = await _template_pid(p.zygote_pid)
        assert await p.preload_python(["colorsys"]) == []
        async with await p.create(make_spec()):
            pass
        assert await _template_pid(p.zygote_pid) != old
        assert await _settled(p, (0, 0)) == (0, 0)

    linux(test, spares=0)


@pytest.mark.slow
def test_no_leaks_after_50_cycles(linux: Any) -> None:
    async def test(p: Any) -> None:
        sb = await p.create(make_spec())   # warm the zygote first
        await sb.destroy()
        await p.wait_spares()
        before = _mounts_and_fds()
        for _ in range(50):
            async with await p.create(make_spec()) as sb:
                await sb.exec(["true"])
        await asyncio.sleep(0.2)
        spares = await p.wait_spares()
        assert spares <= p.spares
        assert await _settled(p, (spares, spares)) == (spares, spares)
        assert _mounts_and_fds() == before
        await p.aclose()
        assert await _settled(p, (0, 0)) == (0, 0)

    linux(test)


_UNPRIV = r"""
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
from corral.providers.linux import LinuxProvider
from corral.core.errors import LevelNotSupportedError
from corral.core.spec import SandboxLimits, SandboxSpec

async def main():
    out = {}
    p = LinuxProvider(default_limits=SandboxLimits(disk_mb=16))
    try:
        sb = await p.create(SandboxSpec(tenant_id="t", run_id="r"))
        r = await sb.exec(["sh", "-c", "id -u; cat /proc/self/uid_map; hostname"])
        out["exec"] = r.stdout.decode()
        await sb.write_file("f", b"x")
        out["file"] = (await sb.read_file("f")).decode()
        await sb.destroy()
        try:
            await p.create(SandboxSpec(tenant_id="t", run_id="r",
                                       limits=SandboxLimits(mem_mb=64)))
            out["mem"] = "accepted"
        except LevelNotSupportedError as e:
            out["mem"] = "refused: " + e.missing
    finally:
        await p.aclose()
    print(json.dumps(out))

asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to uid 65534")
def test_core_as_unprivileged_uid(linux: Any, nobody_python: tuple[str, str]) -> None:
    py, src = nobody_python
    r = subprocess.run([py, "-c", _UNPRIV, src], user=65534, group=65534, extra_groups=[],
                       capture_output=True, timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    lines = out["exec"].split("\n")
    assert lines[0] == "0"
    assert lines[1].split() == ["0", "65534", "1"]
    assert lines[2] == "sandbox"
    assert out["file"] == "x"
    if out["mem"] != "accepted":
        assert out["mem"].startswith("refused: ") and "memory" in out["mem"]


# -- leftover processes: a zombie leader with a live thread (issue 24, item 3) ------------

#: the main thread leaves with exit(2) (not exit_group): the process's leader is a zombie
#: while its other thread runs (bounded: it sleeps 30 s)
_ZOMBIE_LEADER = """
import ctypes, platform, threading, time
threading.Thread(target=time.sleep, args=(30,)).start()
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)  # SYS_exit
"""


def _state(stat_path: str) -> bytes | None:
    try:
        with open(stat_path, "rb") as f:
            return f.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return None


def _zombie_leaders(pids: list[int]) -> list[int]:
    """Those of ``pids`` whose leader is a zombie while another of their threads runs."""
    out = []
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        if _state(f"/proc/{pid}/stat") == b"Z" and any(
                _state(f"/proc/{pid}/task/{t}/stat") not in (None, b"Z") for t in tids):
            out.append(pid)
    return out


async def _start_zombie_leader(sb: Any) -> int:
    r = await sb.exec(["/bin/sh", "-c", f"{PY} -I -S -c '{_ZOMBIE_LEADER}' "
                       ">/dev/null 2>&1 </dev/null &"])
    assert r.exit_code == 0, r
    for _ in range(400):
        found = _zombie_leaders(sb.host_pids()[1:])
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no zombie leader with a live thread in {sb.host_pids()}")


@needs_cgroup_limits()
def test_process_count_counts_a_zombie_leader_whose_thread_runs(linux: Any) -> None:
    """The warm slot's leftover check (``process_count``): a process whose main thread
    exited while another runs is still there. On cgroup v2 (the v2 guest runs this
    file) cgroup.procs lists only that zombie leader; v1's tasks file lists the thread."""
    async def test(p: Any) -> None:
        async with await p.create(make_spec(max_processes=16, mem_mb=128)) as sb:
            assert sb.process_count() == 0
            await _start_zombie_leader(sb)
            assert sb.process_count() >= 1, sb.host_pids()

    linux(test, spares=0)


@needs_cgroup_limits()
def test_process_count_counts_it_from_the_leaders_alone(linux: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with the sandbox's cgroup listing only leaders (cgroup.procs), as cgroup
    v2 does, on any host: the count reads the zombie leader's threads (this failed
    before: it read the leader's own state only)."""
    from corral.providers.linux.host.cgroupfiles import read_text

    async def test(p: Any) -> None:
        async with await p.create(make_spec(max_processes=16, mem_mb=128)) as sb:
            leader = await _start_zombie_leader(sb)
            cg = sb._cg
            procs = [os.path.join(d, "cgroup.procs") for d in cg.dirs.values()]
            monkeypatch.setattr(cg, "pids", lambda: sorted(
                {int(x) for f in procs for x in read_text(f).split()}))
            assert sb.host_pids()[1:] == [leader]  # what v2 shows: the zombie leader only
            assert sb.process_count() == 1, sb.host_pids()

    linux(test, spares=0)
