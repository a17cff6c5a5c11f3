"""The strict seccomp policy: byte layout, a BPF interpreter run over both
arches' programs, syscall numbers against the kernel headers, and (on x86_64)
the real kernel enforcing it in a forked child."""

from __future__ import annotations

import json
import os
import platform
import re
import struct
import sys
from pathlib import Path

import pytest

from corral.core.errors import LevelNotSupportedError
from corral.providers.linux.policy import seccomp
from corral.providers.linux.policy.seccomp import (
    ARG_RULES,
    DENIED_SYSCALLS,
    REVIEWED_ALLOWED,
    SUPPORTED_ARCHES,
    SYSCALL_NUMBERS,
    build_filter,
    describe_policy,
)

AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
KILL, ALLOW = 0x80000000, 0x7FFF0000
EPERM, ENOSYS = 0x00050001, 0x00050026
PROBES = Path(__file__).parent / "probes"
REPO = Path(__file__).resolve().parents[2]


def decode(prog: bytes) -> list[tuple[int, int, int, int]]:
    assert len(prog) % 8 == 0
    return [struct.unpack_from("<HBBI", prog, i) for i in range(0, len(prog), 8)]


def run_bpf(prog: bytes, *, arch: str, nr: int, args: tuple[int, ...] = ()) -> int:
    """Evaluate the program on one seccomp_data, like the kernel would."""
    full = (list(args) + [0] * 6)[:6]
    data = struct.pack("<iIQ6Q", nr, AUDIT.get(arch, 0x40000003), 0, *full)
    insns = decode(prog)
    a, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            a = struct.unpack_from("<I", data, k)[0]
        elif code == 0x54:
            a &= k
        elif code == 0x06:
            return k
        elif code in (0x15, 0x35, 0x45):
            hit = {0x15: a == k, 0x35: a >= k, 0x45: bool(a & k)}[code]
            pc += jt if hit else jf
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")
        pc += 1


# -- pure: layout and policy ----------------------------------------------

def test_unsupported_arch_is_refused_never_an_empty_filter() -> None:
    assert frozenset({"x86_64", "aarch64"}) == SUPPORTED_ARCHES
    for arch in ("riscv64", "i686", "armv7l", ""):
        with pytest.raises(LevelNotSupportedError) as info:
            build_filter(arch)
        assert info.value.missing == f"seccomp filter for {arch}"
        assert info.value.requested == "strict"


@pytest.mark.parametrize("arch", sorted(SUPPORTED_ARCHES))
def test_first_instructions_check_the_arch(arch: str) -> None:
    insns = decode(build_filter(arch))
    assert insns[0] == (0x20, 0, 0, 4)                # ld [4]  (seccomp_data.arch)
    assert insns[1] == (0x15, 1, 0, AUDIT[arch])      # jeq AUDIT_ARCH_*, +1
    assert insns[2] == (0x06, 0, 0, KILL)             # ret KILL_PROCESS
    assert insns[3] == (0x20, 0, 0, 0)                # ld [0]  (seccomp_data.nr)
    if arch == "x86_64":
        assert insns[4] == (0x35, 0, 2, 0x40000000)   # jge X32_SYSCALL_BIT
        assert insns[5] == (0x15, 1, 0, 0xFFFFFFFF)   # nr -1 passes (kernel: ENOSYS)
        assert insns[6] == (0x06, 0, 0, KILL)
    assert insns[-1] == (0x06, 0, 0, ALLOW)


@pytest.mark.parametrize("arch", sorted(SUPPORTED_ARCHES))
def test_program_is_well_formed(arch: str) -> None:
    insns = decode(build_filter(arch))
    assert 0 < len(insns) <= 4096
    for pc, (code, jt, jf, _k) in enumerate(insns):
        if code & 0x07 == 0x05:  # BPF_JMP
            assert pc + 1 + max(jt, jf) < len(insns), f"jump out of program at {pc}"
        else:
            assert jt == jf == 0
    assert insns[-1][0] == 0x06


@pytest.mark.parametrize("arch", sorted(SUPPORTED_ARCHES))
def test_policy_by_interpretation(arch: str) -> None:
    prog, nrs = build_filter(arch), SYSCALL_NUMBERS[arch]

    def verdict(name: str, *args: int) -> int:
        return run_bpf(prog, arch=arch, nr=nrs[name], args=args)

    for name in DENIED_SYSCALLS:
        if name in nrs:
            assert verdict(name) == EPERM, name
    getpid = {"x86_64": 39, "aarch64": 172}[arch]
    assert run_bpf(prog, arch=arch, nr=getpid) == ALLOW
    assert run_bpf(prog, arch="i386", nr=getpid) == KILL
    other = "aarch64" if arch == "x86_64" else "x86_64"
    assert run_bpf(prog, arch=other, nr=getpid) == KILL
    # clone: plain fork and threads pass, any CLONE_NEW* flag is refused
    assert verdict("clone", 0x11) == ALLOW                      # SIGCHLD (fork)
    assert verdict("clone", 0x003D0F00) == ALLOW                # pthread_create flags
    for flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000,
                 0x10000000, 0x20000000, 0x40000000):
        assert verdict("clone", flag | 0x11) == EPERM, hex(flag)
    assert verdict("clone3", 0) == ENOSYS
    # sockets
    assert verdict("socket", 2, 1, 0) == ALLOW                  # AF_INET stream
    assert verdict("socket", 10, 2 | 0x80000, 0) == ALLOW       # AF_INET6 dgram|CLOEXEC
    assert verdict("socket", 1, 5, 0) == ALLOW                  # AF_UNIX seqpacket
    assert verdict("socket", 16, 3 | 0x80000, 0) == ALLOW       # netlink route, raw
    assert verdict("socket", 16, 3, 12) == EPERM                # netlink netfilter
    assert verdict("socket", 2, 3, 1) == EPERM                  # raw ICMP
    assert verdict("socket", 10, 3 | 0x800, 58) == EPERM        # raw v6, NONBLOCK
    assert verdict("socket", 17, 3, 0) == EPERM                 # AF_PACKET
    assert verdict("socket", 40, 1, 0) == EPERM                 # AF_VSOCK
    assert verdict("socket", 38, 5, 0) == EPERM                 # AF_ALG
    assert verdict("socketpair", 1, 1, 0) == ALLOW
    assert verdict("socketpair", 2, 1, 0) == EPERM
    # inet: only stream and datagram types, with the protocols ordinary programs name
    # (getaddrinfo hands out IPPROTO_TCP / IPPROTO_UDP); the flag bits are masked off
    for fam in (2, 10):
        for kind in (1, 1 | 0x800, 1 | 0x80000, 1 | 0x80800, 1 | (1 << 32)):
            for proto in (0, 6, 262):                           # default, TCP, MPTCP
                assert verdict("socket", fam, kind, proto) == ALLOW, (fam, kind, proto)
        for proto in (0, 17, 1, 58):                            # default, UDP, ping
            assert verdict("socket", fam, 2 | 0x80000, proto) == ALLOW, (fam, proto)
        for kind in (3, 4, 5, 6, 10, 0, 7, 15):                 # raw rdm seqpacket dccp
            for flags in (0, 0x800, 0x80000):                   # packet, and nonsense
                assert verdict("socket", fam, kind | flags, 0) == EPERM, (fam, kind)
        assert verdict("socket", fam, 1, 132) == EPERM          # SCTP
        assert verdict("socket", fam, 1, 6 | (1 << 32)) == ALLOW  # high bits ignored
        assert verdict("socket", fam, 2, 115) == EPERM          # L2TP over IP
        assert verdict("socket", fam, 2, 136) == EPERM          # UDP-Lite
        assert verdict("socket", fam, 6, 33) == EPERM           # DCCP
    assert verdict("socket", 2, 10, 0x300) == EPERM             # SOCK_PACKET -> AF_PACKET
    assert verdict("socket", 2, 10 | 0x80800, 0x300) == EPERM
    assert verdict("socket", 1, 3, 0) == ALLOW                  # unix: raw is dgram
    # ioctl: only terminal injection / line disciplines refused; high bits ignored
    assert verdict("ioctl", 0, 0x5412) == EPERM                 # TIOCSTI
    assert verdict("ioctl", 0, 0x5412 | (1 << 32)) == EPERM
    assert verdict("ioctl", 0, 0x541C) == EPERM                 # TIOCLINUX
    assert verdict("ioctl", 0, 0x5401) == ALLOW                 # TCGETS
    assert verdict("ioctl", 0, 0x5421) == ALLOW                 # FIONBIO
    # personality
    for ok in (0, 8, 0x20000, 0x20008, 0xFFFFFFFF):
        assert verdict("personality", ok) == ALLOW, hex(ok)
    assert verdict("personality", 0x0040000) == EPERM           # ADDR_NO_RANDOMIZE
    assert verdict("personality", 0x0400000) == EPERM           # READ_IMPLIES_EXEC
    # the agent (pid 1 of the sandbox) is out of its commands' reach
    for name in ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam",
                 "sched_setattr"):
        assert verdict(name, 1, 7) == EPERM, name
        assert verdict(name, 1 | (1 << 32), 7) == EPERM, name    # pid_t: low 32 bits
        for pid in (0, 2, 17, 0xFFFFFFFF):
            assert verdict(name, pid, 7) == ALLOW, (name, pid)
    for which, who, want in ((0, 1, EPERM), (1, 1, EPERM), (2, 0, EPERM), (2, 1000, EPERM),
                             (0, 0, ALLOW), (0, 5, ALLOW), (1, 0, ALLOW), (1, 5, ALLOW),
                             (3, 1, ALLOW)):                     # 3: the kernel says EINVAL
        assert verdict("setpriority", which, who, 19) == want, (which, who)
    for which, who, want in ((1, 1, EPERM), (2, 1, EPERM), (3, 0, EPERM), (3, 1000, EPERM),
                             (1, 0, ALLOW), (1, 5, ALLOW), (2, 0, ALLOW), (2, 5, ALLOW),
                             (4, 1, ALLOW)):
        assert verdict("ioprio_set", which, who, 3 << 13) == want, (which, who)
    # no setuid/setgid bits, no device nodes (a file written through a rw bind lands
    # on the host's file system, which is not nosuid): issue 24
    for name, pre in (("chmod", (0,)), ("fchmod", (3,)), ("fchmodat", (3, 0)),
                      ("fchmodat2", (3, 0)), ("creat", (0,))):
        if name not in nrs:
            continue
        for mode in (0o755, 0o1777, 0o644, 0o777 | (1 << 32)):
            assert verdict(name, *pre, mode) == ALLOW, (name, oct(mode))
        for mode in (0o4755, 0o2755, 0o6755, 0o4000, 0o2000 | 0o1000):
            assert verdict(name, *pre, mode) == EPERM, (name, oct(mode))
    for name, pre in (("open", (0,)), ("openat", (3, 0))):
        if name not in nrs:
            continue
        for flags in (0o101, 0o1101, 0o20200002):                # O_CREAT..., O_TMPFILE
            assert verdict(name, *pre, flags, 0o644) == ALLOW, (name, oct(flags))
            assert verdict(name, *pre, flags, 0o4755) == EPERM, (name, oct(flags))
            assert verdict(name, *pre, flags, 0o2711) == EPERM, (name, oct(flags))
        assert verdict(name, *pre, 0, 0o6755) == ALLOW           # no create: mode unread
    assert verdict("openat2", 3, 0, 0, 24) == ENOSYS
    for name, pre in (("mknod", (0,)), ("mknodat", (3, 0))):
        if name not in nrs:
            continue
        for mode in (0o010644, 0o140755, 0o100644, 0o644):     # fifo, socket, regular
            assert verdict(name, *pre, mode, 0) == ALLOW, (name, oct(mode))
        for mode in (0o020666, 0o060660, 0o020000, 0o104755, 0o102755, 0o4644):
            assert verdict(name, *pre, mode, 0) == EPERM, (name, oct(mode))


def test_x32_abi_is_killed_on_x86_64() -> None:
    prog = build_filter("x86_64")
    assert run_bpf(prog, arch="x86_64", nr=0x40000000 | 39) == KILL
    assert run_bpf(prog, arch="x86_64", nr=0x40000000 | 101) == KILL
    assert run_bpf(prog, arch="x86_64", nr=-1) == ALLOW


def test_known_syscall_numbers() -> None:
    x86, arm = SYSCALL_NUMBERS["x86_64"], SYSCALL_NUMBERS["aarch64"]
    assert (x86["ptrace"], x86["mount"], x86["unshare"], x86["bpf"]) == (101, 165, 272, 321)
    assert (x86["clone"], x86["clone3"], x86["socket"], x86["ioctl"]) == (56, 435, 41, 16)
    assert (x86["keyctl"], x86["userfaultfd"], x86["io_uring_setup"]) == (250, 323, 425)
    assert (arm["ptrace"], arm["mount"], arm["unshare"], arm["bpf"]) == (117, 40, 97, 280)
    assert (arm["clone"], arm["clone3"], arm["socket"], arm["ioctl"]) == (220, 435, 198, 29)
    assert (arm["keyctl"], arm["userfaultfd"], arm["perf_event_open"]) == (219, 282, 241)
    for name in ("iopl", "ioperm", "modify_ldt", "uselib"):
        assert name not in arm  # x86-only syscalls
    # newer than Debian 12's headers: from the kernel's syscall_64.tbl and
    # scripts/syscall.tbl (the same numbers on both arches from 424 on)
    newer = {"memfd_secret": 447, "cachestat": 451, "statmount": 457, "listmount": 458,
             "open_tree_attr": 467}
    for name, nr in newer.items():
        assert x86[name] == arm[name] == nr, name
    assert (x86["prlimit64"], x86["setpriority"], x86["ioprio_set"]) == (302, 141, 251)
    assert (arm["prlimit64"], arm["setpriority"], arm["ioprio_set"]) == (261, 140, 30)
    assert (x86["sched_setparam"], x86["sched_setscheduler"], x86["sched_setaffinity"],
            x86["sched_setattr"]) == (142, 144, 203, 314)
    assert (arm["sched_setparam"], arm["sched_setscheduler"], arm["sched_setaffinity"],
            arm["sched_setattr"]) == (118, 119, 122, 274)


@pytest.mark.parametrize(("arch", "header"), [
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    ("aarch64", "/usr/include/asm-generic/unistd.h"),
])
def test_numbers_match_kernel_headers(arch: str, header: str) -> None:
    if not os.path.exists(header):
        pytest.skip(f"{header} not installed (linux-libc-dev)")
    text = Path(header).read_text()
    found = {m[0]: int(m[1]) for m in re.findall(r"#define __NR_(\w+)\s+(\d+)", text)}
    found.pop("syscalls", None)  # asm-generic's __NR_syscalls is a count
    newest = max(found.values())
    for name, nr in SYSCALL_NUMBERS[arch].items():
        if name in found:
            assert found[name] == nr, name
        else:  # only a call newer than these headers may be missing from them
            assert nr > newest, f"{name} ({nr}) is not in {header}"
    named = set(DENIED_SYSCALLS) | set(ARG_RULES)
    assert named >= set(SYSCALL_NUMBERS[arch])
    for name in named:  # every policy name the arch has is in our table
        if name in found:
            assert name in SYSCALL_NUMBERS[arch], name


def test_every_named_syscall_has_a_number_somewhere() -> None:
    for name in list(DENIED_SYSCALLS) + list(ARG_RULES):
        assert any(name in SYSCALL_NUMBERS[a] for a in SUPPORTED_ARCHES), name
    x86_only = {"chmod", "open", "creat", "mknod"}  # aarch64 has only their *at forms
    for name in ARG_RULES:
        arches = {"x86_64"} if name in x86_only else SUPPORTED_ARCHES
        assert all(name in SYSCALL_NUMBERS[a] for a in arches), name


def policy_table() -> str:
    """The seccomp table of docs/security-model.md, as describe_policy() renders it."""
    lines = ["| syscall | action | arches | why |", "|---|---|---|---|"]
    for r in describe_policy():
        name = r.syscall if r.syscall.startswith("(") else f"`{r.syscall}`"
        lines.append(f"| {name} | {r.action} | {', '.join(r.arches)} | {r.reason} |")
    return "\n".join(lines) + "\n"


def reviewed_table() -> str:
    """The "reviewed and allowed" table of docs/security-model.md."""
    lines = ["| syscall | why it stays allowed |", "|---|---|"]
    lines += [f"| {name} | {why} |" for name, why in REVIEWED_ALLOWED.items()]
    return "\n".join(lines) + "\n"


def test_describe_policy_and_docs_cover_every_rule() -> None:
    rows = describe_policy()
    assert {r.syscall for r in rows} >= set(DENIED_SYSCALLS) | set(ARG_RULES)
    assert all(r.reason for r in rows)
    doc = (REPO / "docs" / "security-model.md").read_text()
    for name in list(DENIED_SYSCALLS) + list(ARG_RULES):
        assert f"`{name}`" in doc, f"docs/security-model.md does not explain {name}"
    # the whole table, row for row (regenerate: print(policy_table()))
    assert policy_table() in doc, "docs/security-model.md's seccomp table is out of date"
    assert reviewed_table() in doc, "docs/security-model.md's reviewed table is out of date"
    assert not set(REVIEWED_ALLOWED) & (set(DENIED_SYSCALLS) | set(ARG_RULES))


def test_module_is_pure() -> None:
    src = Path(seccomp.__file__).read_text()
    imports = set(re.findall(r"^(?:from|import) ([\w.]+)", src, re.M))
    assert imports <= {"__future__", "struct", "dataclasses", "typing", "enum",
                       "collections.abc", "corral.core.errors",
                       "corral.providers.linux.policy.bpf",
                       "corral.providers.linux.policy.syscall_numbers"}


# -- the real kernel (x86_64 here) ------------------------------------------

def _in_filtered_child(script: str, params: dict[str, object]) -> list[dict[str, object]]:
    """Fork; in the child enter a private mount namespace (so even a broken
    filter cannot touch the host's mounts), set no_new_privs, install the
    filter via _sys_unsafe, and exec the probe. Returns its JSON lines."""
    from corral.providers.linux import _sys_unsafe as su

    prog = build_filter(su.machine_arch())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            os.dup2(w, 1)
            su.unshare(su.CLONE_NEWNS)
            su.mount(None, "/", None, su.MS_REC | su.MS_PRIVATE, None)
            su.set_no_new_privs()
            su.seccomp_install(prog)
            os.execv(sys.executable, [sys.executable, "-I", "-S", str(PROBES / script),
                                      json.dumps(params)])
        except BaseException as e:
            os.write(2, f"child setup failed: {e!r}\n".encode())
        os._exit(99)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return [json.loads(line) for line in out.decode().splitlines()]


needs_x86_64_root = pytest.mark.skipif(
    platform.machine() != "x86_64" or os.geteuid() != 0,
    reason="runs the filter on this kernel: x86_64 and root (private mount ns)")


@pytest.mark.linux
@needs_x86_64_root
def test_kernel_refuses_attack_surface_with_eperm() -> None:
    lines = _in_filtered_child("kernel_surface.py", {"mode": "sandbox"})
    got = {line["probe"]: line for line in lines}
    expected = {"ptrace_traceme", "ptrace_attach_child", "unshare_user", "unshare_mount",
                "unshare_net", "unshare_pid", "setns_net", "clone_newuser", "mount_tmpfs",
                "keyctl", "bpf_map_create", "userfaultfd", "io_uring_setup",
                "perf_event_open", "tiocsti", "memfd_secret", "open_tree_attr", "listmount",
                "statmount", "cachestat"}
    assert expected <= set(got)
    for name in expected:
        assert got[name]["ok"] is False, got[name]
        assert str(got[name]["detail"]).startswith("EPERM"), got[name]
    assert got["clone3_newuser"]["ok"] is False
    assert got["clone3_newuser"]["detail"] == "ENOSYS"


@pytest.mark.linux
@needs_x86_64_root
def test_kernel_refuses_raw_and_packet_sockets() -> None:
    got = {line["probe"]: line for line in _in_filtered_child("raw_sockets.py", {})}
    for name in ("raw_icmp", "raw_inet6", "packet", "packet_dgram", "vsock", "alg",
                 "netlink_netfilter", "inet_sock_packet", "inet_sock_packet_nonblock",
                 "sctp", "sctp_seqpacket", "dccp", "l2tp_ip", "udplite"):
        assert got[name]["ok"] is False, got[name]
        assert "Operation not permitted" in str(got[name]["detail"]), got[name]
    for name in ("tcp_explicit", "tcp6_nonblock", "udp_explicit", "udp6", "unix_raw"):
        assert got[name]["ok"] is True, got[name]


@pytest.mark.linux
@needs_x86_64_root
def test_kernel_still_allows_ordinary_work() -> None:
    lines = _in_filtered_child("baseline.py", {})
    assert {line["probe"] for line in lines} >= {"getpid", "file_io", "fork", "thread",
                                                   "tcp_loopback", "subprocess"}
    for line in lines:
        assert line["ok"] is True, line
