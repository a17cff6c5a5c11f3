"""The strict level's seccomp policy, as a classic-BPF program (pure data).

The policy is *default allow, deny a list*: every syscall that opens kernel
attack surface a sandboxed program has no business with returns ``EPERM``
(so probes and programs see a refusal, not a crash). Before anything else
the program checks ``seccomp_data.arch``: a foreign ABI (i386 via
``int 0x80``, x32, or any arch we hold no table for) kills the process,
since its syscall numbers would slip past the table.

A few syscalls are filtered by argument (the low 32 bits, which is all the
kernel reads for these ``int``-typed arguments):

* ``clone`` with any ``CLONE_NEW*`` flag -> ``EPERM``; ``clone3`` ->
  ``ENOSYS`` (its flags sit in a struct BPF cannot read; libc then falls
  back to ``clone``, which we can check).
* ``socket`` / ``socketpair``: only ``AF_UNIX``, ``AF_INET``, ``AF_INET6``
  and ``AF_NETLINK`` with ``NETLINK_ROUTE`` (what libc's interface and
  address queries use); ``SOCK_RAW`` over ``AF_INET``/``AF_INET6`` ->
  ``EPERM``.
* ``ioctl`` ``TIOCSTI`` / ``TIOCLINUX`` / ``TIOCSETD`` -> ``EPERM``.
* ``personality``: only the values Docker allows.

This module only builds bytes; installing them is
``_sys_unsafe.seccomp_install`` (after no_new_privs, as the last step before
the command runs). The program is built before anything is cloned, so a bad
policy fails early. Both supported arches are little-endian, so the
``struct sock_filter`` layout is ``<HBBI`` for either.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from ...errors import LevelNotSupportedError

__all__ = [
    "ARG_RULES",
    "DENIED_SYSCALLS",
    "SUPPORTED_ARCHES",
    "SYSCALL_NUMBERS",
    "PolicyRule",
    "build_filter",
    "describe_policy",
]

SUPPORTED_ARCHES: Final = frozenset({"x86_64", "aarch64"})

# -- BPF and seccomp constants (linux/filter.h, linux/seccomp.h, linux/audit.h)
_LD_W_ABS: Final = 0x20   # BPF_LD | BPF_W | BPF_ABS
_JEQ_K: Final = 0x15      # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K: Final = 0x35      # BPF_JMP | BPF_JGE | BPF_K
_JSET_K: Final = 0x45     # BPF_JMP | BPF_JSET | BPF_K
_AND_K: Final = 0x54      # BPF_ALU | BPF_AND | BPF_K
_RET_K: Final = 0x06      # BPF_RET | BPF_K
_MAX_INSNS: Final = 4096  # BPF_MAXINSNS

RET_KILL_PROCESS: Final = 0x80000000
RET_ERRNO: Final = 0x00050000
RET_ALLOW: Final = 0x7FFF0000
EPERM: Final = 1
ENOSYS: Final = 38

_AUDIT_ARCH: Final = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT: Final = 0x40000000

# offsets into struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6];}
_OFF_NR: Final = 0
_OFF_ARCH: Final = 4


def _arg_lo(index: int) -> int:
    return 16 + 8 * index  # low 32 bits of args[index] (little-endian)


# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET.
# (CLONE_NEWTIME, 0x80, is not a clone() flag: that byte is the exit signal.)
CLONE_NEW_MASK: Final = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 \
    | 0x10000000 | 0x20000000 | 0x40000000
_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK = 1, 2, 10, 16
_NETLINK_ROUTE: Final = 0
_SOCK_TYPE_MASK, _SOCK_RAW = 0xF, 3
_DENIED_IOCTLS: Final = {0x5412: "TIOCSTI", 0x541C: "TIOCLINUX", 0x5423: "TIOCSETD"}
# personality(2) values Docker's default profile allows: PER_LINUX, PER_LINUX32,
# UNAME26, PER_LINUX32|UNAME26, and the 0xffffffff query.
_ALLOWED_PERSONALITIES: Final = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

_MOUNT = "mounts are the boundary; a mount could reveal or replace what the sandbox sees"
_TIME = "the system clock is not namespaced: setting it changes the host's time"
_NUMA = "NUMA memory placement acts host-wide; Docker denies it without CAP_SYS_NICE"
_MODULE = "loads or removes kernel code"
_KEYS = "the kernel keyring is not namespaced; keys would be shared with the host"
_DEAD = "obsolete, removed from current kernels; denied so an old kernel cannot expose it"

#: Syscalls denied outright with EPERM, and why. A name missing from an arch's
#: table does not exist there (e.g. iopl on aarch64).
DENIED_SYSCALLS: Final[dict[str, str]] = {
    "ptrace": "inspects and controls other processes (and is a frequent kernel bug site)",
    "process_vm_readv": "reads another process's memory",
    "process_vm_writev": "writes another process's memory",
    "process_madvise": "acts on another process's memory",
    "kcmp": "compares kernel objects of other processes (address-layout probe)",
    "pidfd_getfd": "steals a file descriptor from another process",
    "bpf": "eBPF programs are large kernel attack surface (verifier bugs)",
    "perf_event_open": "performance counters leak kernel state and have many CVEs",
    "userfaultfd": "lets an attacker stall the kernel mid-copy, a standard exploit aid",
    "io_uring_setup": "io_uring is a large, frequently exploited kernel interface",
    "io_uring_enter": "io_uring is a large, frequently exploited kernel interface",
    "io_uring_register": "io_uring is a large, frequently exploited kernel interface",
    "keyctl": _KEYS,
    "add_key": _KEYS,
    "request_key": _KEYS,
    "kexec_load": "replaces the running kernel",
    "kexec_file_load": "replaces the running kernel",
    "init_module": _MODULE,
    "finit_module": _MODULE,
    "delete_module": _MODULE,
    "create_module": _DEAD,
    "get_kernel_syms": _DEAD,
    "query_module": _DEAD,
    "mount": _MOUNT,
    "umount2": _MOUNT + " (unmounting could uncover what a mount hides)",
    "pivot_root": _MOUNT,
    "move_mount": _MOUNT,
    "fsopen": _MOUNT,
    "fsmount": _MOUNT,
    "fsconfig": _MOUNT,
    "fspick": _MOUNT,
    "open_tree": _MOUNT,
    "mount_setattr": _MOUNT,
    "chroot": "changing root is a classic step in escaping a chroot-style jail",
    "unshare": "new namespaces (above all a user namespace) give back capabilities "
               "and reach kernel code unprivileged users should not",
    "setns": "joining another namespace leaves the sandbox",
    "swapon": "host-wide swap configuration",
    "swapoff": "host-wide swap configuration",
    "reboot": "reboots or halts the host (or the pid namespace)",
    "settimeofday": _TIME,
    "clock_settime": _TIME,
    "clock_adjtime": _TIME,
    "adjtimex": _TIME + " (even reading via it is not needed)",
    "sethostname": "the hostname is fixed to 'sandbox' by the provider",
    "setdomainname": "the domain name is fixed by the provider",
    "acct": "process accounting is host-wide",
    "quotactl": "disk quotas are host-wide",
    "quotactl_fd": "disk quotas are host-wide",
    "syslog": "the kernel log leaks kernel addresses and host activity",
    "lookup_dcookie": _DEAD,
    "nfsservctl": _DEAD,
    "uselib": _DEAD,
    "ustat": _DEAD,
    "sysfs": _DEAD,
    "_sysctl": _DEAD,
    "vhangup": "hangs up the controlling terminal",
    "ioperm": "direct I/O port access",
    "iopl": "direct I/O port access",
    "modify_ldt": "LDT manipulation: old 16-bit code only, with a history of kernel bugs",
    "name_to_handle_at": "file handles can open files outside the mount namespace "
                         "(the 'shocker' container escape)",
    "open_by_handle_at": "file handles can open files outside the mount namespace "
                         "(the 'shocker' container escape)",
    "mbind": _NUMA,
    "set_mempolicy": _NUMA,
    "get_mempolicy": _NUMA,
    "migrate_pages": _NUMA,
    "move_pages": _NUMA,
    "set_mempolicy_home_node": _NUMA,
    "fanotify_init": "filesystem-wide event monitoring (Docker gates it on CAP_SYS_ADMIN)",
}

#: Syscalls filtered by argument, with what is refused and why.
ARG_RULES: Final[dict[str, str]] = {
    "clone": "EPERM when args[0] has any CLONE_NEW* flag: no new namespaces "
             "(plain fork and threads still work)",
    "clone3": "ENOSYS always: its flags are in memory BPF cannot read, so libc "
              "falls back to clone, which is checked",
    "socket": "EPERM unless the family is AF_UNIX, AF_INET, AF_INET6 or AF_NETLINK "
              "with NETLINK_ROUTE, and EPERM for SOCK_RAW over AF_INET/AF_INET6: no "
              "packet sniffing or forging (AF_PACKET), no vsock to the hypervisor, "
              "no rarely used protocol code (AF_ALG, AF_RDS, AF_TIPC, ...)",
    "socketpair": "EPERM unless the family is AF_UNIX",
    "ioctl": "EPERM for TIOCSTI and TIOCLINUX (typing into a terminal) and TIOCSETD "
             "(loading a line discipline)",
    "personality": "EPERM except PER_LINUX, PER_LINUX32, UNAME26 and the query: "
                   "no ADDR_NO_RANDOMIZE (ASLR off) or READ_IMPLIES_EXEC",
}

#: x86_64 from arch/x86/entry/syscalls/syscall_64.tbl; aarch64 from
#: include/uapi/asm-generic/unistd.h. Only the syscalls this policy names.
SYSCALL_NUMBERS: Final[dict[str, dict[str, int]]] = {
    "x86_64": {
        "ioctl": 16, "socket": 41, "socketpair": 53, "clone": 56, "ptrace": 101,
        "syslog": 103, "uselib": 134, "personality": 135, "ustat": 136, "sysfs": 139,
        "vhangup": 153, "modify_ldt": 154, "pivot_root": 155, "_sysctl": 156,
        "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165,
        "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170,
        "setdomainname": 171, "iopl": 172, "ioperm": 173, "create_module": 174,
        "init_module": 175, "delete_module": 176, "get_kernel_syms": 177,
        "query_module": 178, "quotactl": 179, "nfsservctl": 180, "lookup_dcookie": 212,
        "clock_settime": 227, "mbind": 237, "set_mempolicy": 238, "get_mempolicy": 239,
        "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
        "migrate_pages": 256, "unshare": 272, "move_pages": 279, "perf_event_open": 298,
        "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304,
        "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
        "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
        "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "clone3": 435, "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442,
        "quotactl_fd": 443, "set_mempolicy_home_node": 450,
    },
    "aarch64": {
        "lookup_dcookie": 18, "ioctl": 29, "umount2": 39, "mount": 40, "pivot_root": 41,
        "nfsservctl": 42, "chroot": 51, "vhangup": 58, "quotactl": 60, "acct": 89,
        "personality": 92, "unshare": 97, "kexec_load": 104, "init_module": 105,
        "delete_module": 106, "clock_settime": 112, "syslog": 116, "ptrace": 117,
        "reboot": 142, "sethostname": 161, "setdomainname": 162, "settimeofday": 170,
        "adjtimex": 171, "socket": 198, "socketpair": 199, "add_key": 217,
        "request_key": 218, "keyctl": 219, "clone": 220, "swapon": 224, "swapoff": 225,
        "mbind": 235, "get_mempolicy": 236, "set_mempolicy": 237, "migrate_pages": 238,
        "move_pages": 239, "perf_event_open": 241, "fanotify_init": 262,
        "name_to_handle_at": 264, "open_by_handle_at": 265, "clock_adjtime": 266,
        "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "finit_module": 273, "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "clone3": 435, "pidfd_getfd": 438,
        "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443,
        "set_mempolicy_home_node": 450,
    },
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRule:
    """One line of the policy, for docs and ``corral doctor``."""

    syscall: str
    action: Literal["EPERM", "ENOSYS", "by argument", "KILL"]
    reason: str
    arches: tuple[str, ...]


def describe_policy() -> tuple[PolicyRule, ...]:
    """The whole policy as rows: arch check, argument rules, outright denials."""
    rows = [
        PolicyRule(syscall="(any, foreign arch or x32 ABI)", action="KILL",
                   reason="syscall numbers of another ABI would bypass the table",
                   arches=tuple(sorted(SUPPORTED_ARCHES))),
    ]
    for name, reason in ARG_RULES.items():
        rows.append(PolicyRule(syscall=name,
                               action="ENOSYS" if name == "clone3" else "by argument",
                               reason=reason, arches=_arches_of(name)))
    for name, reason in DENIED_SYSCALLS.items():
        rows.append(PolicyRule(syscall=name, action="EPERM", reason=reason,
                               arches=_arches_of(name)))
    return tuple(rows)


def _arches_of(name: str) -> tuple[str, ...]:
    return tuple(a for a in sorted(SUPPORTED_ARCHES) if name in SYSCALL_NUMBERS[a])


# -- a tiny assembler: instructions with symbolic jump targets -------------

@dataclass(frozen=True, slots=True)
class _Insn:
    code: int
    k: int
    jt: str | None = None  # label names; None = next instruction
    jf: str | None = None


class _Program:
    def __init__(self) -> None:
        self.insns: list[_Insn] = []
        self.labels: dict[str, int] = {}
        self._n = 0

    def label(self, name: str) -> None:
        self.labels[name] = len(self.insns)

    def fresh(self) -> str:
        self._n += 1
        return f"_L{self._n}"

    def load(self, offset: int) -> None:
        self.insns.append(_Insn(_LD_W_ABS, offset))

    def jump(self, code: int, k: int, jt: str | None, jf: str | None = None) -> None:
        self.insns.append(_Insn(code, k, jt, jf))

    def and_(self, k: int) -> None:
        self.insns.append(_Insn(_AND_K, k))

    def ret(self, k: int) -> None:
        self.insns.append(_Insn(_RET_K, k))

    def assemble(self) -> bytes:
        if not 0 < len(self.insns) <= _MAX_INSNS:
            raise ValueError(f"seccomp program has {len(self.insns)} instructions")
        out = bytearray()
        for pc, insn in enumerate(self.insns):
            jt = self._offset(pc, insn.jt)
            jf = self._offset(pc, insn.jf)
            out += struct.pack("<HBBI", insn.code, jt, jf, insn.k & 0xFFFFFFFF)
        return bytes(out)

    def _offset(self, pc: int, target: str | None) -> int:
        if target is None:
            return 0
        off = self.labels[target] - pc - 1
        if not 0 <= off <= 255:
            raise ValueError(f"jump from {pc} to {target} out of range ({off})")
        return off


def build_filter(arch: str) -> bytes:
    """The strict policy for ``arch`` as concatenated ``struct sock_filter``.

    Raises:
        LevelNotSupportedError: no syscall table for ``arch``; corral never
            runs a strict sandbox without a filter.
    """
    if arch not in SUPPORTED_ARCHES:
        raise LevelNotSupportedError("strict", missing=f"seccomp filter for {arch}",
                                     detail=f"supported: {', '.join(sorted(SUPPORTED_ARCHES))}")
    nrs = SYSCALL_NUMBERS[arch]
    p = _Program()

    # Every jump is local (to the next few instructions), so the program can
    # grow without chaining blocks; the assembler still checks each offset.
    p.load(_OFF_ARCH)
    p.jump(_JEQ_K, _AUDIT_ARCH[arch], "arch_ok")
    p.ret(RET_KILL_PROCESS)
    p.label("arch_ok")
    p.load(_OFF_NR)
    if arch == "x86_64":
        p.jump(_JGE_K, _X32_SYSCALL_BIT, None, "abi_ok")
        # nr -1 (as libseccomp allows): the kernel itself answers ENOSYS
        p.jump(_JEQ_K, 0xFFFFFFFF, "abi_ok")
        p.ret(RET_KILL_PROCESS)
        p.label("abi_ok")

    skip = p.fresh()
    p.jump(_JEQ_K, nrs["clone3"], None, skip)
    p.ret(RET_ERRNO | ENOSYS)
    p.label(skip)
    _rule(p, nrs["clone"], _clone_rule(p))
    _rule(p, nrs["socket"], _socket_rule(p))
    _rule(p, nrs["socketpair"], _socketpair_rule(p))
    _rule(p, nrs["ioctl"], _ioctl_rule(p))
    _rule(p, nrs["personality"], _personality_rule(p))
    # outright denials: "jeq nr, 0, 1; ret EPERM"
    for name in DENIED_SYSCALLS:
        nr = nrs.get(name)
        if nr is None:
            continue
        skip = p.fresh()
        p.jump(_JEQ_K, nr, None, skip)
        p.ret(RET_ERRNO | EPERM)
        p.label(skip)
    p.ret(RET_ALLOW)
    return p.assemble()


_Body = Callable[[str, str], None]


def _rule(p: _Program, nr: int, body: _Body) -> None:
    """``if nr == <nr>: body``; the body ends in a jump to ``allow`` or ``deny``."""
    skip, allow, deny = p.fresh(), p.fresh(), p.fresh()
    p.jump(_JEQ_K, nr, None, skip)
    body(allow, deny)
    p.label(deny)
    p.ret(RET_ERRNO | EPERM)
    p.label(allow)
    p.ret(RET_ALLOW)
    p.label(skip)  # not this syscall: A still holds the number


def _clone_rule(p: _Program) -> _Body:
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(0))
        p.jump(_JSET_K, CLONE_NEW_MASK, deny, allow)
    return body


def _socket_rule(p: _Program) -> _Body:
    def body(allow: str, deny: str) -> None:
        inet, netlink = p.fresh(), p.fresh()
        p.load(_arg_lo(0))
        p.jump(_JEQ_K, _AF_UNIX, allow)
        p.jump(_JEQ_K, _AF_NETLINK, netlink)
        p.jump(_JEQ_K, _AF_INET, inet)
        p.jump(_JEQ_K, _AF_INET6, inet, deny)
        p.label(inet)  # no SOCK_RAW: no forging or sniffing packets
        p.load(_arg_lo(1))
        p.and_(_SOCK_TYPE_MASK)
        p.jump(_JEQ_K, _SOCK_RAW, deny, allow)
        p.label(netlink)  # glibc's route queries use SOCK_RAW netlink: allowed
        p.load(_arg_lo(2))
        p.jump(_JEQ_K, _NETLINK_ROUTE, allow, deny)
    return body


def _socketpair_rule(p: _Program) -> _Body:
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(0))
        p.jump(_JEQ_K, _AF_UNIX, allow, deny)
    return body


def _ioctl_rule(p: _Program) -> _Body:
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(1))
        for req in _DENIED_IOCTLS:
            p.jump(_JEQ_K, req, deny)
        p.jump(_JEQ_K, 0, allow, allow)  # unconditional: "ja allow"
    return body


def _personality_rule(p: _Program) -> _Body:
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(0))
        for value in _ALLOWED_PERSONALITIES:
            p.jump(_JEQ_K, value, allow)
        p.jump(_JEQ_K, 0, deny, deny)
    return body
