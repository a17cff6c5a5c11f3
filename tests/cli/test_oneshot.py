"""``corral run --level strict``'s one-shot path (``_corral_cli`` + ``providers/linux/oneshot``).

Every run goes through the real entry point in a child process, as the console
script does, with ``CORRAL_CLI_TRACE=1`` so the entry says which path ran. The
boundary checks are the probe suite's (``tests/linux/probes``), fed to the
sandbox with ``python -c`` since this path has no copy-in.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.providers.linux import oneshot
from strict_tier import unavailable

pytestmark = pytest.mark.linux

PY = os.path.realpath(sys.executable)  # the real interpreter: its prefix is bound in
PROBES = Path(__file__).resolve().parents[1] / "linux" / "probes"
#: the console script's code, but with argv passed, so main() returns (it leaves the
#: process by os._exit otherwise) and the modules it loaded can be listed
ENTRY = ("import sys, _corral_cli; code = _corral_cli.main(sys.argv[1:]); "
         "sys.stderr.write('corral-test: asyncio %s\\n' % ('asyncio' in sys.modules)); "
         "sys.exit(code)")
TAKEN = b"corral: trace: one-shot path\n"


def cli(*args: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    """``corral ARGS`` through the entry point; skips when the host cannot sandbox."""
    env = {**os.environ, "CORRAL_CLI_TRACE": "1"}
    r = subprocess.run([sys.executable, "-c", ENTRY, *args], capture_output=True,
                       stdin=subprocess.DEVNULL, env=env, timeout=timeout, check=False, **kw)
    if TAKEN not in r.stderr and b"one-shot set-up failed" in r.stderr:
        unavailable(r.stderr.decode(errors="replace")[-500:])
    return r


def strict(*cmd: str, opts: tuple[str, ...] = (), **kw: Any) -> subprocess.CompletedProcess[bytes]:
    r = cli("run", "--level", "strict", *opts, "--", *cmd, **kw)
    assert TAKEN in r.stderr, r.stderr[-2000:]
    assert b"corral-test: asyncio False" in r.stderr, "the library path (asyncio) was loaded"
    return r


def probe(script: str, params: dict[str, Any], *, opts: tuple[str, ...] = ()
          ) -> dict[str, dict[str, Any]]:
    src = (PROBES / script).read_text()
    r = strict(PY, "-I", "-S", "-c", src, json.dumps({"mode": "sandbox", **params}), opts=opts)
    lines = [json.loads(x) for x in r.stdout.decode().splitlines() if x.startswith("{")]
    assert lines, r.stderr[-2000:]
    return {line["probe"]: line for line in lines}


def own_cgroups(pid: int) -> list[str]:
    """Every sandbox cgroup dir left behind by the CLI process ``pid``."""
    found: list[str] = []
    for root, dirs, _files in os.walk("/sys/fs/cgroup"):
        for d in dirs:
            if re.fullmatch(rf"corral-{pid}-\d+-\w+", d):
                found.append(os.path.join(root, d))
        if root.count("/") > 8:
            dirs[:] = []
    return found


def procs_with(marker: str) -> list[int]:
    out: list[int] = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                    out.append(int(p))
            except OSError:
                pass
    return out


# -- which path -----------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "taken"), [
    (["run", "--level", "strict", "--", "/bin/true"], True),
    (["run", "--level=strict", "--timeout=500", "--mem-mb", "64", "--cpu-ms", "9", "--",
      "/bin/echo", "--json"], True),
    (["run", "--", "/bin/true"], True),                           # strict: the default
    (["run", "--level", "context-isolated", "--", "/bin/true"], False),  # not strict
    (["run", "--level", "strict", "--json", "--", "/bin/true"], False),
    (["run", "--level", "strict", "--timeout", "5s", "--", "/bin/true"], False),
    (["run", "--level", "strict", "--", "true"], True),            # looked up on PATH
    (["run", "--level", "strict", "--", "corral-no-such-command"], False),  # the CLI says so
    (["run", "--level", "strict", "--", "sub/cmd"], False),        # a path inside the sandbox
    (["run", "--level", "strict", "--mem-mb", "0", "--", "/bin/true"], False),
    (["python", "--level", "strict", "--", "/bin/true"], False),
    (["run", "--level", "strict", "/bin/true"], False),
])
def test_only_the_simple_subset_takes_the_path(argv: list[str], taken: bool) -> None:
    assert (oneshot.parse_argv(argv) is not None) is taken


def test_defaults_match_the_library() -> None:
    from corral.core.result import DEFAULT_MAX_STDERR_BYTES, DEFAULT_MAX_STDOUT_BYTES
    assert (oneshot.MAX_STDOUT, oneshot.MAX_STDERR) == (DEFAULT_MAX_STDOUT_BYTES,
                                                        DEFAULT_MAX_STDERR_BYTES)
    from corral.cli.run import DEFAULT_TIMEOUT_MS
    assert oneshot.DEFAULT_TIMEOUT_MS == DEFAULT_TIMEOUT_MS


# -- what a command sees and what the caller gets ---------------------------------------
def test_exit_code_and_output_pass_through() -> None:
    r = strict("/bin/sh", "-c", "echo out; echo err >&2; exit 7")
    assert r.returncode == 7
    assert r.stdout == b"out\n"
    assert b"err\n" in r.stderr


def test_as_the_console_script_runs_it() -> None:
    """``from _corral_cli import main; sys.exit(main())``: main leaves by os._exit."""
    r = subprocess.run([sys.executable, "-c", "import sys; from _corral_cli import main; "
                        "sys.exit(main())", "run", "--level", "strict", "--", "/bin/sh", "-c",
                        "echo out; echo err >&2; exit 3"], capture_output=True,
                       stdin=subprocess.DEVNULL, env={**os.environ, "CORRAL_CLI_TRACE": "1"},
                       timeout=60, check=False)
    if TAKEN not in r.stderr:
        unavailable(r.stderr.decode(errors="replace")[-500:])
    assert (r.returncode, r.stdout) == (3, b"out\n") and b"err\n" in r.stderr


def test_bare_name_resolved_on_path_to_the_real_file() -> None:
    req = oneshot.parse_argv(["run", "--level", "strict", "--", "sh", "-c", "x"])
    assert req is not None and req.argv[1:] == ("-c", "x")
    assert req.argv[0] == os.path.realpath(shutil.which("sh") or "")
    r = strict("sh", "-c", "echo via-path")
    assert (r.returncode, r.stdout) == (0, b"via-path\n")


def test_signal_death_is_128_plus_n() -> None:
    assert strict("/bin/sh", "-c", "kill -TERM $$").returncode == 128 + signal.SIGTERM


def test_output_is_streamed_while_the_command_runs() -> None:
    env = {**os.environ, "CORRAL_CLI_TRACE": "1"}
    with subprocess.Popen([sys.executable, "-c", ENTRY, "run", "--level", "strict", "--",
                           "/bin/sh", "-c", "echo first; sleep 30"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env) as p:
        _streamed(p)


def _streamed(p: subprocess.Popen[bytes]) -> None:
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        if line != b"first\n":
            p.wait(30)
            unavailable(p.stderr.read().decode(errors="replace")[-500:] if p.stderr else "")
        assert p.poll() is None  # the command still runs: the line came as it was written
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 130
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_no_network_read_only_root_and_identity() -> None:
    code = ("import os, socket\n"
            "print(sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net')"
            " else 'no-sys')\n"
            "for path in ('/usr/corral-x', '/corral-x', '/etc/corral-x'):\n"
            "    try:\n"
            "        open(path, 'w'); print('wrote', path)\n"
            "    except OSError as e: print('ro', e.errno)\n"
            "open('/work/ok', 'w').write('x'); print('work ok')\n"
            "try:\n"
            "    socket.create_connection(('192.0.2.1', 80), timeout=2); print('net!')\n"
            "except OSError as e: print('no net', e.errno)\n"
            "print(os.getuid(), os.getcwd())\n")
    r = strict(PY, "-I", "-S", "-c", code)
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr
    assert "wrote" not in out and out.count("ro ") == 3
    assert "work ok" in out and "no net" in out and "net!" not in out
    assert "0 /work\n" in out
    env = strict("/usr/bin/env").stdout.decode().splitlines()
    assert sorted(v.split("=")[0] for v in env) == ["HOME", "PATH", "TMPDIR"]


RAW_SOCKETS = {"raw_icmp", "raw_inet6", "packet", "packet_dgram", "vsock", "alg",
               "netlink_netfilter", "inet_sock_packet", "inet_sock_packet_nonblock", "sctp",
               "sctp_seqpacket", "dccp", "l2tp_ip", "udplite"}  # as tests/linux/test_probes.py


def test_raw_sockets_refused_by_seccomp() -> None:
    lines = probe("raw_sockets.py", {})
    for name in RAW_SOCKETS:
        assert lines[name]["ok"] is False, lines[name]
        assert "Operation not permitted" in lines[name]["detail"], lines[name]
    assert lines["tcp_explicit"]["ok"] is True  # ordinary sockets still work (loopback)


def test_seccomp_and_kernel_surface() -> None:
    lines = probe("kernel_surface.py", {})
    for name in ("ptrace_traceme", "unshare_user", "mount_tmpfs", "keyctl", "bpf_map_create",
                 "userfaultfd", "io_uring_setup", "perf_event_open"):
        assert lines[name]["ok"] is False, lines[name]
        assert lines[name]["detail"].startswith("EPERM"), lines[name]


def test_capabilities_and_no_new_privs() -> None:
    r = strict("/bin/sh", "-c", "grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs|Seccomp):' "
               "/proc/self/status")
    status = dict(line.split(":\t") for line in r.stdout.decode().splitlines())
    assert int(status["CapEff"], 16) == int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"


# -- limits and how runs end, with cleanup --------------------------------------------------
def _after(r: subprocess.CompletedProcess[bytes] | subprocess.Popen[bytes], marker: str) -> None:
    assert own_cgroups(r.pid if isinstance(r, subprocess.Popen) else -1) == []
    assert procs_with(marker) == []
    assert "corral-root" not in Path("/proc/self/mountinfo").read_text()


def test_memory_limit() -> None:
    r = strict(PY, "-I", "-S", "-c", "x = bytearray(200 << 20); print('allocated')",
               opts=("--mem-mb", "64"))
    assert r.returncode == 137, r.stderr[-2000:]
    assert b"allocated" not in r.stdout
    assert b"corral: memory-limit:" in r.stderr and b"64" in r.stderr


def test_cpu_limit() -> None:
    r = strict(PY, "-I", "-S", "-c", "while True: pass", opts=("--cpu-ms", "300"))
    assert r.returncode == 137, r.stderr[-2000:]
    assert b"corral: cpu-limit:" in r.stderr


def test_output_cap() -> None:
    r = strict(PY, "-I", "-S", "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)")
    assert r.returncode == 137, r.stderr[-2000:]
    assert len(r.stdout) == oneshot.MAX_STDOUT
    assert b"corral: overflow-stdout:" in r.stderr


@pytest.mark.parametrize("how", ["success", "timeout", "sigint"])
def test_cleanup(how: str) -> None:
    marker = f"corral-oneshot-{os.getpid()}-{how}"
    # a command that leaves a double-forked daemon behind, then ends as asked
    tail = {"success": "exit 0", "timeout": "sleep 30", "sigint": "sleep 30"}[how]
    script = (f"(setsid sh -c 'exec -a {marker} sleep 60' &) ; echo started; {tail}")
    env = {**os.environ, "CORRAL_CLI_TRACE": "1"}
    opts = ["--timeout", "1000"] if how == "timeout" else []
    with subprocess.Popen([sys.executable, "-c", ENTRY, "run", "--level", "strict", *opts,
                           "--", "/bin/sh", "-c", script], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env) as p:
        code, err = _ended(p, how)
    assert TAKEN in err
    assert code == {"success": 0, "timeout": 124, "sigint": 130}[how], err
    if how != "success":
        assert {"timeout": b"corral: timeout:", "sigint": b"corral: cancelled:"}[how] in err
    _after(p, marker)


def _ended(p: subprocess.Popen[bytes], how: str) -> tuple[int, bytes]:
    try:
        assert p.stdout is not None and p.stderr is not None
        if p.stdout.readline() != b"started\n":
            p.wait(30)
            unavailable(p.stderr.read().decode(errors="replace")[-500:])
        if how == "sigint":
            p.send_signal(signal.SIGINT)
        code = p.wait(30)
        return code, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# -- the import set, the cache, the lean cgroup ------------------------------------------
_HEAVY = ("typing", "dataclasses", "enum", "re", "inspect", "socket", "signal", "asyncio",
          "shutil", "corral.core.spec", "corral.core.errors",
          "corral.providers.linux.policy.plan", "corral.providers.linux.policy.seccomp",
          "corral.providers.linux.host.cgroups",
          # a clean exit is no limit hit: the rules are loaded only for another exit
          "corral.providers.linux.policy.outcomes")


def _req(*opts: str) -> oneshot.OneShot:
    req = oneshot.parse_argv(["run", "--level", "strict", *opts, "--", "/bin/true"])
    assert req is not None
    return req


def test_the_corral_script_imports_nothing_before_the_entry() -> None:
    """``bin/corral`` (what an install puts on PATH) runs the one-shot path without
    importing ``re``, ``enum`` or ``typing`` first, as pip's wrapper for an entry point
    did (``import re`` before ``main``: about 5 ms of every run); the control run shows
    that ``-X importtime`` lists such an import when it happens."""
    script = Path(__file__).resolve().parents[2] / "bin" / "corral"
    env = {**os.environ, "CORRAL_CLI_TRACE": "1"}
    r = subprocess.run([sys.executable, "-X", "importtime", str(script), "run", "--level",
                        "strict", "--", "/bin/sh", "-c", "echo out; exit 3"],
                       capture_output=True, stdin=subprocess.DEVNULL, env=env, timeout=60,
                       check=False)
    if TAKEN not in r.stderr:
        unavailable(r.stderr.decode(errors="replace")[-500:])
    assert (r.returncode, r.stdout) == (3, b"out\n"), r.stderr[-2000:]

    def imported(err: bytes) -> set[str]:
        return {line.rpartition(b"|")[2].strip().decode() for line in err.splitlines()
                if line.startswith(b"import time:")}

    bare = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"],
                          capture_output=True, check=True)  # what the site of this venv loads
    assert not (imported(r.stderr) - imported(bare.stderr)) & {"re", "enum", "typing"}, \
        r.stderr[-2000:]
    control = subprocess.run([sys.executable, "-X", "importtime", "-c", "import re"],
                             capture_output=True, check=True)
    assert {"re", "enum"} <= imported(control.stderr)


def test_a_cached_run_loads_none_of_the_heavy_modules() -> None:
    """The second run of a command line (its plan, filter and cgroup facts cached by the
    first) loads no module a bare start does not, beyond ctypes and the path's own:
    no typing, dataclasses, enum, re, socket, nor the plan, spec or cgroup modules."""
    bare = subprocess.run([sys.executable, "-c", "import sys; print(' '.join(sys.modules))"],
                          capture_output=True, text=True, check=True).stdout.split()
    code = ("import sys, _corral_cli; code = _corral_cli.main(sys.argv[1:]); "
            f"heavy = [m for m in {_HEAVY!r} if m in sys.modules and m not in {bare!r}]; "
            "sys.stderr.write('corral-test: heavy %s\\n' % heavy); sys.exit(code)")
    env = {**os.environ, "CORRAL_CLI_TRACE": "1"}
    for _ in range(3):  # the first run of this command line fills the cache
        r = subprocess.run([sys.executable, "-c", code, "run", "--level", "strict", "--",
                            "/bin/true"], capture_output=True, stdin=subprocess.DEVNULL,
                           env=env, timeout=60, check=False)
        if TAKEN not in r.stderr:
            unavailable(r.stderr.decode(errors="replace")[-500:])
        if b"plan from the cache" in r.stderr:
            break
    assert r.returncode == 0, r.stderr[-2000:]
    if b"plan from the cache" not in r.stderr:
        assert oneshot.cache_dir() is None, "three runs, no cache hit"
        pytest.skip("no cache for this user (not root, no XDG_RUNTIME_DIR)")
    assert b"corral-test: heavy []" in r.stderr, r.stderr[-2000:]


def test_a_clean_exit_is_no_limit_hit_by_the_providers_rules() -> None:
    """``_limit_hit`` answers a clean exit without loading ``policy.outcomes``: that is
    what ``limit_hit`` says for exit 0 when the host did not kill the sandbox, even
    with every limit set, the cgroup's counters up and the writable area full."""
    from corral.providers.linux.policy.outcomes import limit_hit
    assert limit_hit(0, mem_mb=64, cpu_ms=10, max_processes=4, disk_mb=1, by_rlimit=False,
                     cpu_killed_at=0, cpu_used=lambda: 10**6, oom_rose=lambda: True,
                     peak_mb=lambda: 64, pids_refused=lambda: True, disk_free=0) is None
    lim = oneshot._Limits(64, 4, 10, 1)
    assert oneshot._limit_hit(lim, None, 0, 10**6, 0) is None
    assert oneshot._limit_hit(lim, None, -25, 0, 0) is not None  # SIGXFSZ: the disk


def test_host_facts_are_the_plans_host_layout() -> None:
    from corral.providers.linux.init import mounts
    from corral.providers.linux.policy.plan import HostLayout
    assert HostLayout(**oneshot.host_facts()) == mounts.detect_host_layout()


def test_the_cached_value_is_the_library_plan_and_filter() -> None:
    """What a run cached is, under the current key, exactly the library's plan (default
    options, this host's layout), seccomp filter and cgroup facts."""
    from corral.core.spec import Level, SandboxLimits, SandboxSpec
    from corral.providers.linux import _sys_unsafe as su
    from corral.providers.linux.host.cgroups import CgroupManager
    from corral.providers.linux.init import mounts
    from corral.providers.linux.policy import seccomp
    from corral.providers.linux.policy.plan import LinuxOptions, build_plan
    r = strict("/bin/true", opts=("--mem-mb", "96", "--cpu-ms", "4000"))
    assert r.returncode == 0, r.stderr[-2000:]
    req = _req("--mem-mb", "96", "--cpu-ms", "4000")
    path = oneshot._cache_path(req)
    if path is None:
        pytest.skip("no cache for this user (not root, no XDG_RUNTIME_DIR)")
    got = oneshot._cache_load(path, oneshot.cache_key(req))
    assert got is not None, "the run left no cache entry for its own key"
    assert got == oneshot.compute(req)
    plan = build_plan(SandboxSpec(tenant_id="t", level=Level.STRICT,
                                  limits=SandboxLimits(mem_mb=96, cpu_ms=4000)),
                      options=LinuxOptions(), host=mounts.detect_host_layout())
    sup = CgroupManager().support
    lim = plan.limits
    assert got == (plan.to_wire(), (96, lim.max_processes, 4000, lim.disk_mb),
                   seccomp.build_filter(su.machine_arch()),
                   (sup.version, tuple(sup.parents.items()), sup.oom_source))


def test_the_cache_key_sees_the_limits_and_the_sources() -> None:
    base = oneshot.cache_key(_req())
    assert base == oneshot.cache_key(_req("--timeout", "5"))  # not part of the plan
    assert base != oneshot.cache_key(_req("--mem-mb", "64"))
    assert base != oneshot.cache_key(_req("--cpu-ms", "5"))
    sources = {s[0] for s in base[-1]}
    assert {"core/spec.py", "providers/linux/oneshot.py", "providers/linux/policy/plan.py",
            "providers/linux/policy/seccomp.py", "providers/linux/init/mounts.py",
            "providers/linux/host/cgroups.py"} <= sources


def test_a_cache_file_not_the_callers_own_is_not_read(tmp_path: Path) -> None:
    key = ("k", 1)
    value = ({"x": [1, "y"]}, (1, None), b"12345678", ("v1", (("memory", "/m"),), ""))
    path = tmp_path / "plan"
    oneshot._cache_store(str(path), key, value)  # type: ignore[arg-type]
    assert oneshot._cache_load(str(path), key) == value
    assert oneshot._cache_load(str(path), ("other",)) is None
    link = tmp_path / "link"
    link.symlink_to(path)
    assert oneshot._cache_load(str(link), key) is None   # never through a symlink
    os.chmod(path, 0o620)                                # writable by its group
    assert oneshot._cache_load(str(path), key) is None
    os.chmod(path, 0o600)
    if os.geteuid() == 0:
        os.chown(path, 65534, -1)                        # another user's
        assert oneshot._cache_load(str(path), key) is None
    path.write_bytes(b"garbage")
    assert oneshot._cache_load(str(path), key) is None


def test_the_lean_cgroup_is_the_managers() -> None:
    """The one-shot path's cgroup is made by the one cgroup layer (``CgroupDirs.make``)
    as ``CgroupManager.create`` makes one: the same hierarchies, name pattern and limit
    files with the same values."""
    from corral.core.errors import CorralError
    from corral.core.spec import SandboxLimits
    from corral.providers.linux.host.cgroups import CgroupManager
    mgr = CgroupManager()
    lim = SandboxLimits(mem_mb=96, max_processes=50)
    try:
        mgr.require(lim)
    except CorralError as e:
        unavailable(str(e))
    sup = mgr.support
    a = mgr.create("t" + os.urandom(4).hex(), lim)
    try:
        b = oneshot._make_cgroup((sup.version, tuple(sup.parents.items()), sup.oom_source),
                                 oneshot._Limits(96, 50, None, None))
    except BaseException:
        a.remove()
        raise
    made = list(b.dirs.values())
    try:
        assert sorted(a.dirs) == sorted(b.dirs)
        for key, d in a.dirs.items():
            assert os.path.dirname(d) == os.path.dirname(b.dirs[key])
            assert re.fullmatch(rf"corral-{os.getpid()}-\d+-[0-9a-f]{{12}}",
                                os.path.basename(b.dirs[key]))
        names = (("memory", "memory.max"), ("memory", "memory.swap.max"),
                 ("pids", "pids.max")) if sup.version == "v2" else (
            ("memory", "memory.limit_in_bytes"), ("memory", "memory.memsw.limit_in_bytes"),
            ("pids", "pids.max"))
        for key, name in names:
            k = "unified" if sup.version == "v2" else key
            want = Path(a.dirs[k], name).read_text()
            assert Path(b.dirs[k], name).read_text() == want, name
        assert (b.cpu_ms(), b.oom_kills(), b.pids_max_events()) == (
            a.cpu_ms(), a.oom_kills(), 0)
        assert b.join_files == [os.path.join(d, "tasks" if sup.version == "v1"
                                             else "cgroup.procs") for d in made]
    finally:
        a.remove()
        b.remove()
    assert not any(os.path.exists(d) for d in made)


def test_the_command_runs_inside_the_sandbox_cgroup() -> None:
    """pid 1 joins every hierarchy of the sandbox's cgroup before it starts anything of
    the caller's (on v1 through ``tasks``: see ``CgroupDirs.join_files``): the command, seen
    from the host, is in the sandbox's cgroup in each one."""
    from corral.providers.linux.host.cgroups import CgroupManager
    sup = CgroupManager().support
    marker = f"corral-oneshot-cg-{os.getpid()}"
    env = {**os.environ, "CORRAL_CLI_TRACE": "1"}
    with subprocess.Popen([sys.executable, "-c", ENTRY, "run", "--level", "strict", "--", PY,
                           "-I", "-S", "-c", "import time; print('up', flush=True); "
                           "time.sleep(30)", marker], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env) as p:
        try:
            assert p.stdout is not None and p.stderr is not None
            if p.stdout.readline() != b"up\n":
                p.wait(30)
                unavailable(p.stderr.read().decode(errors="replace")[-500:])
            # the command (PY -I -S ...), not the CLI nor pid 1 (a clone of the CLI)
            (pid,) = [x for x in procs_with(marker)
                      if Path(f"/proc/{x}/cmdline").read_bytes().split(b"\0")[1] == b"-I"]
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        finally:
            p.send_signal(signal.SIGINT)
            p.wait(30)
    by_ctrl: dict[str, str] = {}
    for line in lines:
        _hid, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            by_ctrl[c] = path
    keys = ["" if k == "unified" else k for k in sup.parents]
    assert keys
    for k in keys:
        assert re.search(rf"/corral-{p.pid}-\d+-\w+$", by_ctrl[k]), (k, lines)


def test_which_is_shutils() -> None:
    for name in ("sh", "true", "env", "python3", "corral-no-such-command"):
        assert oneshot._which(name) == shutil.which(name)


def test_per_sandbox_id_is_the_plans() -> None:
    from corral.providers.linux.host import uidpool
    from corral.providers.linux.policy import plan
    assert uidpool.PER_SANDBOX_ID == plan.PER_SANDBOX_ID


def test_the_lean_cgroup_removal_kills_what_is_left() -> None:
    from corral.core.errors import CorralError
    from corral.core.spec import SandboxLimits
    from corral.providers.linux.host.cgroups import CgroupManager
    mgr = CgroupManager()
    try:
        mgr.require(SandboxLimits(max_processes=10))
    except CorralError as e:
        unavailable(str(e))
    sup = mgr.support
    cg = oneshot._make_cgroup((sup.version, tuple(sup.parents.items()), sup.oom_source),
                              oneshot._Limits(None, 10, None, None))
    made = list(cg.dirs.values())
    with subprocess.Popen(["sleep", "60"]) as child:
        try:
            for d in made:
                Path(d, "cgroup.procs").write_text(str(child.pid))
            cg.remove()
            assert child.wait(5) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
    assert not any(os.path.exists(d) for d in made)


def test_importing_the_packages_runs_no_other_module() -> None:
    """``corral``, ``corral.providers`` and ``corral.providers.linux`` load their public
    names on first use, so the one-shot entry needs no trick to skip them; the names
    still resolve."""
    code = ("import sys; before = set(sys.modules); import corral.providers.linux; "
            "new = sorted(set(sys.modules) - before); print(' '.join(new)); "
            "print(corral.SandboxSpec.__module__, corral.providers.DEFAULT_FOR_LEVEL["
            "corral.Level.STRICT], corral.providers.linux.Bind.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert set(out[0].split()) <= {"__future__", "corral", "corral.providers",
                                   "corral.providers.linux"}, out[0]
    assert out[1] == "corral.core.spec linux corral.providers.linux.policy.plan"


def test_trace_2_gives_phase_times_and_the_peak() -> None:
    r = subprocess.run([sys.executable, "-c", ENTRY, "run", "--level", "strict", "--",
                        "/bin/true"], capture_output=True, stdin=subprocess.DEVNULL,
                       env={**os.environ, "CORRAL_CLI_TRACE": "2"}, timeout=60, check=False)
    if b"trace: one-shot path" not in r.stderr:
        unavailable(r.stderr.decode(errors="replace")[-500:])
    assert r.returncode == 0
    assert re.search(rb"one-shot ms: set-up [\d.]+, run [\d.]+, clean-up [\d.]+; "
                     rb"peak RSS [\d.]+ MiB \(at [\d.]+ ms\)", r.stderr), r.stderr


# -- issue 25: what the one-shot path got wrong, now the library path's bring-up ----------
_OPEN_FDS = ("import os\nopen_fds = []\nfor fd in range(64):\n    try:\n        os.fstat(fd)\n"
             "    except OSError:\n        continue\n    open_fds.append(fd)\n"
             "print(' '.join(map(str, open_fds)))")


def test_the_command_holds_only_fds_0_to_2() -> None:
    """The command starts with its three pipes on 0/1/2 and nothing else (no copy of a
    pipe end, nothing of pid 1's); the control run shows the probe sees a descriptor
    its parent passed down."""
    r = strict(PY, "-I", "-S", "-c", _OPEN_FDS)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [b"0", b"1", b"2"], r.stdout
    extra_r, extra_w = os.pipe()
    try:  # control: unsandboxed, an inherited descriptor is seen
        c = subprocess.run([PY, "-I", "-S", "-c", _OPEN_FDS], capture_output=True,
                           pass_fds=(extra_w,), check=True)
    finally:
        os.close(extra_r)
        os.close(extra_w)
    assert str(extra_w).encode() in c.stdout.split(), c.stdout


_PIDS = ("import os; print(os.getpid(), "
         "sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")


def test_pid_1_builds_the_view_itself() -> None:
    """The one-shot pid 1 builds the view in place (``bring_up(builder=False)``): no
    builder process is forked, so the command is the sandbox's pid 2 and the only other
    process is pid 1. Control: the library path's pid 1 forks its builder first (pid 2),
    so its first command gets a later pid; the probe tells the two apart."""
    r = strict(PY, "-I", "-S", "-c", _PIDS)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split(maxsplit=1) == [b"2", b"[1, 2]\n"], r.stdout
    lib = subprocess.run([sys.executable, "-m", "corral", "run", "--level", "strict", "--",
                          PY, "-I", "-S", "-c", _PIDS], capture_output=True, timeout=120,
                         stdin=subprocess.DEVNULL, check=False)
    assert lib.returncode == 0, lib.stderr[-2000:]
    assert int(lib.stdout.split()[0]) > 2, lib.stdout


def test_pid_1_title_is_the_zygotes() -> None:
    from corral.providers.linux.init import zygote
    assert oneshot.PROCTITLE == zygote.PROCTITLE


def test_pid_1_cmdline_shows_no_host_path() -> None:
    """``/proc/1/cmdline`` inside names no host path (pid 1 is a clone of the CLI, whose
    argv names the interpreter, the entry and the command): it says ``corral``, as the
    library path's pid 1 does (``zygote.PROCTITLE``)."""
    import corral
    package = Path(corral.__file__).resolve().parent
    host_paths = {str(package.parent), str(package), sys.prefix, sys.executable, PY,
                  os.path.realpath(sys.prefix), "_corral_cli"}
    r = strict("/bin/cat", "/proc/1/cmdline")
    assert r.returncode == 0, r.stderr[-2000:]
    cmdline = r.stdout.rstrip(b"\0").decode(errors="replace")
    assert cmdline == "corral", cmdline
    for path in host_paths:
        assert path not in cmdline, cmdline
    # control: unsandboxed, the same read shows a python's host path
    control = subprocess.run([sys.executable, "-c", "import sys; sys.stdout.buffer.write("
                              "open('/proc/self/cmdline', 'rb').read())"],
                             capture_output=True, check=True).stdout.decode(errors="replace")
    assert sys.executable in control, control


def _dirs_of(pids: list[int]) -> list[str]:
    return [d for pid in pids for d in own_cgroups(pid)]


def _remove_dirs(dirs: list[str]) -> None:
    """Clean-up of whatever a failed assertion left (kill what is inside, rmdir)."""
    for d in sorted(dirs, key=len, reverse=True):
        for _ in range(200):
            try:
                for pid in Path(d, "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                import time
                time.sleep(0.01)


def test_kill_9_leaves_no_cgroup_the_next_run_does_not_reap() -> None:
    """``kill -9`` of ``corral run`` at random points of 20 runs (before, during and
    after the set-up), then one more run: no memory (or any) cgroup of the killed runs
    is left behind. The killed process cannot clean up; the next one-shot run reaps the
    cgroups whose owner is dead, as a library ``LinuxProvider()`` start does."""
    import random
    import time
    rng = random.Random(25)
    env = {**os.environ, "CORRAL_CLI_TRACE": "1"}
    killed: list[int] = []
    try:
        for _ in range(20):
            with subprocess.Popen([sys.executable, "-c", ENTRY, "run", "--level", "strict",
                                   "--mem-mb", "64", "--", "/bin/sleep", "5"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  stdin=subprocess.DEVNULL, env=env) as p:
                time.sleep(rng.uniform(0.0, 0.3))
                p.kill()
                p.wait(30)
                killed.append(p.pid)
        r = strict("/bin/true", opts=("--mem-mb", "64"))
        assert r.returncode == 0, r.stderr[-2000:]
        left = _dirs_of(killed)
        assert left == [], left
    finally:
        _remove_dirs(_dirs_of(killed))
