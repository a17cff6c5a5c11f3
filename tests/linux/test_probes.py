"""The in-sandbox probe suite (issue 4, "Must show").

Every probe in ``probes/`` runs twice: as a CONTROL on the host (plain
``sys.executable``), which must show the forbidden thing works or is
reachable there, and SANDBOXED in a strict ``LinuxProvider`` sandbox, which
must refuse it. Dangerous probes use a harmless control variant (a small
bound, ``access()`` instead of a write, a private mount namespace). Bombs are
bounded by their own loops and by ``timeout_ms`` on every exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import ConfigInvalidError, LimitsExceededError
from corral.core.result import ExecResult
from corral.core.spec import ExecOpts, SandboxLimits, SandboxSpec
from strict_tier import unavailable

pytestmark = pytest.mark.linux

PROBES = Path(__file__).parent / "probes"
IS_ROOT = os.geteuid() == 0
EXEC_TIMEOUT_MS = 20_000
# the interpreter itself (not a venv symlink, which lives outside the sandbox)
SANDBOX_PY = os.path.realpath(sys.executable)
SECRET_ENV = "CORRAL_PROBE_SECRET"
#: the sandboxes' root image (None: the host's dirs); test_image_root_probes.py sets it
IMAGE: str | None = None

Lines = dict[str, dict[str, Any]]


def parse(out: bytes | str) -> Lines:
    text = out.decode("utf-8", "replace") if isinstance(out, bytes) else out
    lines = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    return {line["probe"]: line for line in lines}


def control(script: str, params: dict[str, Any], *, env: dict[str, str] | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
    """Run a probe on the host, unsandboxed."""
    params = {"mode": "control", **params}
    return subprocess.run([sys.executable, "-I", "-S", str(PROBES / script), json.dumps(params)],
                          capture_output=True, timeout=timeout, env=env, check=True)


def control_lines(script: str, params: dict[str, Any], **kw: Any) -> Lines:
    return parse(control(script, params, **kw).stdout)


@contextlib.asynccontextmanager
async def strict_sandbox(limits: SandboxLimits | None = None) -> AsyncIterator[Any]:
    from corral.providers.linux import LinuxProvider

    provider = LinuxProvider()
    try:
        spec = SandboxSpec(tenant_id="probes", run_id=f"probe-{secrets.token_hex(4)}",
                           level="strict", limits=limits or SandboxLimits(), image=IMAGE)
        sb = await provider.create(spec)
        try:
            yield sb
        finally:
            await sb.destroy()
    finally:
        await provider.aclose()


async def sandboxed(sb: Any, script: str, params: dict[str, Any],
                    timeout_ms: int = EXEC_TIMEOUT_MS) -> ExecResult:
    await sb.write_file(script, (PROBES / script).read_bytes())
    params = {"mode": "sandbox", **params}
    result: ExecResult = await sb.exec(
        [SANDBOX_PY, "-I", "-S", f"/work/{script}", json.dumps(params)],
        ExecOpts(timeout_ms=timeout_ms))
    return result


def run_sandboxed(script: str, params: dict[str, Any],
                  limits: SandboxLimits | None = None) -> ExecResult:
    async def go() -> ExecResult:
        async with strict_sandbox(limits) as sb:
            return await sandboxed(sb, script, params)
    return asyncio.run(go())


def sandbox_lines(script: str, params: dict[str, Any],
                  limits: SandboxLimits | None = None) -> Lines:
    res = run_sandboxed(script, params, limits)
    lines = parse(res.stdout)
    assert lines, f"probe printed nothing: exit {res.exit_code}, stderr {res.stderr_text[-2000:]}"
    return lines


def assert_all(lines: Lines, names: set[str], ok: bool) -> None:
    missing = names - set(lines)
    assert not missing, f"probe lines missing: {missing}; got {lines}"
    wrong = {n: lines[n]["detail"] for n in names if lines[n]["ok"] is not ok}
    assert not wrong, f"expected ok={ok}: {wrong}"


def need_provider() -> None:
    """Called after a test's control half: skip the sandboxed half if there is
    no provider to run it in (yet)."""
    try:
        from corral.providers.linux import LinuxProvider  # noqa: F401
    except ImportError as e:
        unavailable(f"control passed; LinuxProvider not importable: {e}")


needs_root = pytest.mark.skipif(not IS_ROOT, reason="the control needs root on the host")


# -- host-side fixtures: things the sandbox must not reach -----------------

@pytest.fixture
def canary(tmp_path: Path) -> tuple[Path, str]:
    content = f"canary-{secrets.token_hex(16)}"
    path = tmp_path / "canary.txt"
    path.write_text(content)
    return path, content


@pytest.fixture
def host_listeners() -> Iterator[tuple[int, str]]:
    """A TCP listener on 127.0.0.1 and an abstract unix listener, both answering."""
    tcp = socket.create_server(("127.0.0.1", 0))
    uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract = f"corral-probe-{secrets.token_hex(6)}"
    uds.bind("\0" + abstract)
    uds.listen()
    stop = threading.Event()

    def serve(srv: socket.socket) -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"host-listener")

    threads = [threading.Thread(target=serve, args=(s,), daemon=True) for s in (tcp, uds)]
    for t in threads:
        t.start()
    try:
        yield tcp.getsockname()[1], abstract
    finally:
        stop.set()
        for t in threads:
            t.join(2)
        tcp.close()
        uds.close()


@pytest.fixture
def host_sleeper() -> Iterator[tuple[int, str]]:
    token = f"corral-host-{secrets.token_hex(6)}"
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", "import time; time.sleep(60)",
                             token])
    try:
        yield proc.pid, token
    finally:
        proc.kill()
        proc.wait()


def host_pids_with(token: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(name))
        except OSError:
            pass
    return found


# -- the boundary probes: (script, params, names) --------------------------

def test_canary_read(canary: tuple[Path, str]) -> None:
    path, content = canary
    names = {"canary_read", "canary_via_proc_self_root"}
    ctl = control_lines("canary_read.py", {"canary": str(path)})
    assert ctl["canary_read"]["detail"] == content
    if IS_ROOT:
        assert_all(ctl, names | {"host_passwd_shadow"}, ok=True)
    # /proc/1/root: on the host, pid 1 may be out of reach (a container); inside,
    # pid 1 is the sandbox's own init, so it must not lead out either
    need_provider()
    box = sandbox_lines("canary_read.py", {"canary": str(path)})
    assert_all(box, names | {"host_passwd_shadow", "canary_via_proc1_root"}, ok=False)


def test_write_outside_work_dir(tmp_path: Path) -> None:
    token = secrets.token_hex(6)
    dirs = ["/", "/usr", "/etc", "/usr/lib", str(tmp_path)]
    params = {"dirs": dirs, "token": token, "safe_dir": str(tmp_path)}
    ctl = control_lines("write_outside.py", params)
    assert ctl[f"write:{tmp_path}"]["ok"] is True
    if IS_ROOT:
        assert_all(ctl, {f"write:{d}" for d in dirs}, ok=True)
    need_provider()
    box = sandbox_lines("write_outside.py", params)
    assert_all(box, {f"write:{d}" for d in dirs}, ok=False)
    assert not list(tmp_path.iterdir())
    for d in dirs:
        assert not os.path.exists(os.path.join(d, f"corral-probe-{token}"))


def test_symlink_out(canary: tuple[Path, str], tmp_path: Path) -> None:
    path, content = canary
    names = {"symlink_to_canary", "symlink_via_proc_self_root"}
    work = tmp_path / "work"
    work.mkdir()
    token = secrets.token_hex(4)
    ctl = control_lines("symlink_out.py", {"canary": str(path), "workdir": str(work),
                                           "token": token})
    assert ctl["symlink_to_canary"]["detail"] == content
    if IS_ROOT:
        assert_all(ctl, names, ok=True)

    need_provider()
    async def go() -> None:
        async with strict_sandbox() as sb:
            res = await sandboxed(sb, "symlink_out.py", {"canary": str(path), "workdir": "/work",
                                                        "token": token})
            assert_all(parse(res.stdout), names | {"symlink_via_proc1_root"}, ok=False)
            # the host side must not follow a link the sandbox planted
            with pytest.raises(ConfigInvalidError):
                await sb.read_file("escape-link")
            await sb.exec([SANDBOX_PY, "-I", "-S", "-c",
                           "import os; os.symlink('/etc', '/work/etc-link')"],
                          ExecOpts(timeout_ms=EXEC_TIMEOUT_MS))
            with pytest.raises(ConfigInvalidError):
                await sb.write_file("etc-link/corral-probe", b"x")
            with pytest.raises(ConfigInvalidError):
                await sb.read_file("etc-link/passwd")
    asyncio.run(go())


def test_connect_host_loopback(host_listeners: tuple[int, str]) -> None:
    port, abstract = host_listeners
    names = {"connect_host_loopback_tcp", "connect_host_abstract_unix"}
    params = {"port": port, "abstract": abstract}
    ctl = control_lines("loopback_connect.py", params)
    assert_all(ctl, names, ok=True)
    assert ctl["connect_host_loopback_tcp"]["detail"] == "host-listener"
    need_provider()
    assert_all(sandbox_lines("loopback_connect.py", params), names, ok=False)


def test_host_processes(host_sleeper: tuple[int, str]) -> None:
    pid, token = host_sleeper
    names = {"proc_entry_visible", "signal_host_pid", "ps_sees_host_process"}
    params = {"pid": pid, "token": token}
    assert_all(control_lines("host_processes.py", params), names, ok=True)
    need_provider()
    box = sandbox_lines("host_processes.py", params)
    assert_all(box, names, ok=False)


KERNEL_SURFACE = {"ptrace_traceme", "ptrace_attach_child", "unshare_user", "unshare_mount",
                  "unshare_net", "unshare_pid", "unshare_uts", "unshare_ipc", "unshare_cgroup",
                  "setns_net", "clone_newuser", "clone3_newuser", "mount_tmpfs", "keyctl",
                  "bpf_map_create", "userfaultfd", "io_uring_setup", "perf_event_open",
                  "tiocsti", "memfd_secret", "open_tree_attr", "listmount", "statmount",
                  "cachestat"}


#: calls newer than some kernels corral runs on (6.1 lacks cachestat 6.5, statmount and
#: listmount 6.8, open_tree_attr 6.15), and memfd_secret, ENOSYS where secretmem is off
NEWER_CALLS = {"memfd_secret", "cachestat", "statmount", "listmount", "open_tree_attr"}


def test_kernel_surface() -> None:
    if IS_ROOT:
        ctl = control_lines("kernel_surface.py", {})
        # a call this kernel lacks (ENOSYS unsandboxed) has nothing to show in the control;
        # the sandbox must still refuse it with EPERM (the filter checks the number first)
        absent = {n for n in NEWER_CALLS if ctl[n]["detail"].startswith("ENOSYS")}
        assert_all(ctl, KERNEL_SURFACE - absent, ok=True)
    need_provider()
    box = sandbox_lines("kernel_surface.py", {})
    assert_all(box, KERNEL_SURFACE, ok=False)
    for name in KERNEL_SURFACE - {"clone3_newuser", "tiocsti"}:
        assert box[name]["detail"].startswith("EPERM"), box[name]


RAW_SOCKETS = {"raw_icmp", "raw_inet6", "packet", "packet_dgram", "vsock", "alg",
               "netlink_netfilter", "inet_sock_packet", "inet_sock_packet_nonblock", "sctp",
               "sctp_seqpacket", "dccp", "l2tp_ip", "udplite"}
#: may simply be absent from the host kernel (no module, removed, not built)
MAYBE_ABSENT = {"alg", "vsock", "sctp", "sctp_seqpacket", "dccp", "l2tp_ip", "udplite"}
ORDINARY_SOCKETS = {"tcp_explicit", "tcp6_nonblock", "udp_explicit", "udp6", "unix_raw"}


def test_raw_sockets() -> None:
    if IS_ROOT:
        ctl = control_lines("raw_sockets.py", {})
        assert_all(ctl, RAW_SOCKETS - MAYBE_ABSENT, ok=True)
        assert_all(ctl, ORDINARY_SOCKETS, ok=True)
    need_provider()
    box = sandbox_lines("raw_sockets.py", {})
    assert_all(box, RAW_SOCKETS, ok=False)
    for name in RAW_SOCKETS:  # refused by seccomp, not by a missing module
        assert "Operation not permitted" in box[name]["detail"], box[name]
    assert_all(box, ORDINARY_SOCKETS, ok=True)


IDENTITY = {"env_secret_visible", "host_interfaces_visible", "hostname_not_sandbox",
            "capabilities_present", "no_new_privs_unset", "seccomp_off",
            "uid_map_is_host_identity"}


def test_env_network_and_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = secrets.token_hex(8)
    monkeypatch.setenv(SECRET_ENV, secret)
    params = {"secret_name": SECRET_ENV}
    ctl = control_lines("env_and_identity.py", params, env=dict(os.environ))
    assert ctl["env_secret_visible"]["ok"] is True
    if IS_ROOT and socket.gethostname() != "sandbox":
        host_ifaces = [n for _, n in socket.if_nameindex()]
        expect = set(IDENTITY) if len(host_ifaces) > 1 else IDENTITY - {"host_interfaces_visible"}
        assert_all(ctl, expect, ok=True)
    need_provider()
    box = sandbox_lines("env_and_identity.py", params)
    assert_all(box, IDENTITY, ok=False)
    assert box["host_interfaces_visible"]["detail"] == "lo"
    assert '"CapEff": "0000000000000000"' in box["capabilities_present"]["detail"]
    assert box["seccomp_off"]["detail"] == "Seccomp: 2"
    assert box["no_new_privs_unset"]["detail"] == "NoNewPrivs: 1"


def test_baseline_still_works() -> None:
    names = {"getpid", "file_io", "fork", "thread", "tcp_loopback", "unix_socketpair",
             "subprocess", "if_nameindex"}
    assert_all(control_lines("baseline.py", {}), names, ok=True)
    need_provider()
    assert_all(sandbox_lines("baseline.py", {}), names, ok=True)


# -- limits: bounded bombs ---------------------------------------------------

def expect_limit(script: str, params: dict[str, Any], limits: SandboxLimits,
                 kind: str) -> LimitsExceededError | ExecResult:
    try:
        return run_sandboxed(script, params, limits)
    except LimitsExceededError as e:
        err = e
    assert err.limit == kind, err
    return err


def test_memory_limit() -> None:
    assert control_lines("limit_memory.py", {"mb": 16})["memory"]["ok"] is True
    need_provider()
    out = expect_limit("limit_memory.py", {"mb": 256}, SandboxLimits(mem_mb=64), "memory")
    assert isinstance(out, LimitsExceededError), f"allocated past mem_mb=64: {out}"


def test_cpu_limit() -> None:
    assert control_lines("limit_cpu.py", {"cpu_ms": 100})["cpu"]["ok"] is True
    need_provider()
    out = expect_limit("limit_cpu.py", {"cpu_ms": 900}, SandboxLimits(cpu_ms=300), "cpu")
    assert isinstance(out, LimitsExceededError), f"spun past cpu_ms=300: {out}"


@pytest.mark.slow
def test_process_limit() -> None:
    assert control_lines("limit_processes.py", {"n": 4, "sleep_s": 0.1})["processes"]["ok"]
    need_provider()
    out = expect_limit("limit_processes.py", {"n": 16, "sleep_s": 1},
                       SandboxLimits(max_processes=8), "processes")
    if isinstance(out, ExecResult):
        line = parse(out.stdout)["processes"]
        assert line["ok"] is False, line
        forked = int(line["detail"].split()[1])
        assert forked < 8, line


def test_disk_limit(tmp_path: Path) -> None:
    ctl = control_lines("limit_disk.py", {"mb": 4, "path": str(tmp_path / "fill")})
    assert ctl["disk"]["ok"] is True
    need_provider()
    out = expect_limit("limit_disk.py", {"mb": 32, "path": "/work/fill"},
                       SandboxLimits(disk_mb=16), "disk")
    if isinstance(out, ExecResult):
        line = parse(out.stdout)["disk"]
        assert line["ok"] is False, line
        assert "No space left" in line["detail"] or "too large" in line["detail"], line


def test_output_flood() -> None:
    ctl = control("flood_output.py", {"bytes": 1 << 20})
    assert len(ctl.stdout) == 1 << 20
    assert parse(ctl.stderr)["output"]["ok"] is True
    total = 32 << 20  # 4x the runner's 8 MiB stdout cap
    need_provider()
    out = expect_limit("flood_output.py", {"bytes": total}, SandboxLimits(), "output")
    if isinstance(out, ExecResult):  # truncation instead of an error
        assert len(out.stdout) < total, "the whole flood was delivered: no output cap"


def test_double_forked_survivor_dies_with_the_sandbox() -> None:
    token = f"corral-survivor-{secrets.token_hex(6)}"
    # control: unsandboxed, the survivor outlives the probe
    control("survivor.py", {"token": token, "sleep_s": 20})
    pids = []
    for _ in range(50):
        pids = host_pids_with(token)
        if pids:
            break
        time.sleep(0.02)
    try:
        assert pids, "control survivor not found on the host"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    token = f"corral-survivor-{secrets.token_hex(6)}"

    need_provider()
    async def go() -> None:
        async with strict_sandbox() as sb:
            res = await sandboxed(sb, "survivor.py", {"token": token, "sleep_s": 20})
            assert parse(res.stdout)["survivor"]["ok"] is True
    asyncio.run(go())
    deadline = time.monotonic() + 3
    while (left := host_pids_with(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # clean up even when the assertion below fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"survivor outlived destroy: host pids {left}"


# -- the agent (pid 1) is out of its commands' reach -------------------------

REACH_AGENT = {"prlimit_nofile", "prlimit_nproc", "setpriority_process", "setpriority_pgrp",
               "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr",
               "ioprio_process", "ioprio_pgrp", "oom_score_adj", "timerslack_ns"}


def test_commands_cannot_reach_the_agent() -> None:
    """A command lowers pid 1's rlimits and priority (the agent: same uid as the
    command), then the next exec in the same sandbox must still work."""
    # control: the same calls on a same-uid process of our own succeed
    target = subprocess.Popen([sys.executable, "-I", "-S", "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    try:
        ctl = control_lines("reach_agent.py", {"target": target.pid})
    finally:
        target.kill()
        target.wait()
    assert_all(ctl, REACH_AGENT, ok=True)
    assert "nice 19" in ctl["target_state"]["detail"], ctl["target_state"]

    need_provider()
    async def go() -> None:
        async with strict_sandbox() as sb:
            res = await sandboxed(sb, "reach_agent.py", {"target": 1})
            box = parse(res.stdout)
            assert box, f"probe printed nothing: {res.exit_code} {res.stderr_text[-2000:]}"
            assert_all(box, REACH_AGENT | {"setpriority_user", "ioprio_user", "target_threads"},
                       ok=False)
            assert "nice 0" in box["target_state"]["detail"], box["target_state"]
            # signals: pid 1 of a pid namespace gets only those it handles (SIGCHLD)
            sig = await sb.exec([SANDBOX_PY, "-I", "-S", "-c",
                                 "import os, signal\n"
                                 "for s in ('SIGINT', 'SIGTERM', 'SIGHUP', 'SIGUSR1', 'SIGSTOP',"
                                 " 'SIGKILL', 'SIGCHLD', 'SIGPIPE', 'SIGXCPU'):\n"
                                 "    os.kill(1, getattr(signal, s))\n"],
                                ExecOpts(timeout_ms=EXEC_TIMEOUT_MS))
            assert sig.exit_code == 0, sig
            # later execs still work: stdio descriptors reach the agent, it spawns
            for _ in range(3):
                r = await sb.exec([SANDBOX_PY, "-I", "-S", "-c", "print('alive')"],
                                  ExecOpts(timeout_ms=EXEC_TIMEOUT_MS, stdin=b"x"))
                assert (r.exit_code, r.stdout_text) == (0, "alive\n"), r
            lim = await sb.exec(["cat", "/proc/1/limits"], ExecOpts(timeout_ms=EXEC_TIMEOUT_MS))
            assert "Max open files            3 " not in lim.stdout_text, lim.stdout_text
    asyncio.run(go())
