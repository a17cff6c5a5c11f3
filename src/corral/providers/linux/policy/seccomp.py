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
  address queries use); over ``AF_INET``/``AF_INET6`` only stream (TCP,
  MPTCP) and datagram (UDP, ping) sockets: the type is an allowlist, since
  the kernel turns ``(AF_INET, SOCK_PACKET)`` into a packet socket.
* ``ioctl`` ``TIOCSTI`` / ``TIOCLINUX`` / ``TIOCSETD`` -> ``EPERM``.
* ``personality``: only the values Docker allows.
* ``chmod``, ``fchmod``, ``fchmodat``, ``fchmodat2`` with ``S_ISUID`` or
  ``S_ISGID`` in the mode, ``open``/``openat``/``creat`` creating a file with
  them, and ``mknod``/``mknodat`` with them or of a device node -> ``EPERM``;
  ``openat2`` -> ``ENOSYS`` (its mode sits in a struct; libc falls back to
  ``openat``). A file a sandbox writes through a read-write bind lands on the
  host's file system, which is not nosuid: no such file may carry those bits.
* ``prlimit64``, ``setpriority``, ``ioprio_set`` and the ``sched_set*``
  calls aimed at pid 1 (or, for the priorities, at every process of the
  uid) -> ``EPERM``: pid 1 is corral's agent, with the same uid as the
  commands it runs, and a command must not be able to starve it. The agent
  only ever names its children's pids (and 0, itself).

This module only builds bytes (with the assembler in ``_bpf.py`` and the
numbers in ``_syscall_numbers.py``); installing them is
``_sys_unsafe.seccomp_install`` (after no_new_privs, as the last step before
the command runs). The program is built before anything is cloned, so a bad
policy fails early.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from corral.core.errors import LevelNotSupportedError
from corral.providers.linux.policy.bpf import JEQ_K, JGE_K, JSET_K, Program as _Program
from corral.providers.linux.policy.syscall_numbers import SYSCALL_NUMBERS

__all__ = [
    "ARG_RULES",
    "DENIED_SYSCALLS",
    "REVIEWED_ALLOWED",
    "SUPPORTED_ARCHES",
    "SYSCALL_NUMBERS",
    "PolicyRule",
    "build_filter",
    "describe_policy",
]

SUPPORTED_ARCHES: Final = frozenset({"x86_64", "aarch64"})

# -- seccomp constants (linux/seccomp.h, linux/audit.h)
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
# the kernel masks the type with SOCK_TYPE_MASK (0xf) after taking off SOCK_NONBLOCK
# and SOCK_CLOEXEC; then (AF_INET, SOCK_PACKET=10) becomes AF_PACKET (__sock_create)
_SOCK_TYPE_MASK, _SOCK_STREAM, _SOCK_DGRAM = 0xF, 1, 2
#: inet protocols allowed per type (0 is the type's default: TCP, UDP)
_INET_PROTOCOLS: Final = {
    _SOCK_STREAM: (0, 6, 262),      # IPPROTO_TCP, IPPROTO_MPTCP
    _SOCK_DGRAM: (0, 17, 1, 58),    # IPPROTO_UDP, ping: IPPROTO_ICMP, IPPROTO_ICMPV6
}
# the agent's own pid inside; which/who values of setpriority(2) and ioprio_set(2)
_AGENT_PID: Final = 1
_PRIO_PROCESS, _PRIO_PGRP, _PRIO_USER = 0, 1, 2
_IOPRIO_WHO_PROCESS, _IOPRIO_WHO_PGRP, _IOPRIO_WHO_USER = 1, 2, 3
# mode bits and file types (sys/stat.h) and the open flags that create a file; the same
# on x86_64 and aarch64 (asm-generic/fcntl.h)
_S_ISUID, _S_ISGID = 0o4000, 0o2000
_S_IFMT, _S_IFCHR, _S_IFBLK = 0o170000, 0o020000, 0o060000
_O_CREAT, _O_TMPFILE = 0o100, 0o20000000
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
_MOUNT_INFO = ("queries the mount table by mount id (newer kernels also reach other mount "
               "namespaces by id); /proc/self/mountinfo covers ordinary needs, and the rest "
               "of the new mount API is denied")

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
    "open_tree_attr": _MOUNT + " (open_tree and mount_setattr in one call, since 6.15)",
    "listmount": _MOUNT_INFO,
    "statmount": _MOUNT_INFO,
    "memfd_secret": "secret memory is taken out of the kernel's direct map (splitting its "
                    "large pages for the whole host) and hidden from the kernel's own "
                    "inspection; rarely used",
    "cachestat": "page-cache residency of a file: on the read-only binds shared with the "
                 "host and other sandboxes a side channel (older kernels answer for files the "
                 "caller cannot write; mincore was closed the same way)",
}

#: Newer syscalls reviewed and left allowed, and why (shown in the docs, not a rule).
REVIEWED_ALLOWED: Final[dict[str, str]] = {
    "process_mrelease": "only speeds up freeing a process that already has SIGKILL pending",
    "futex_waitv / futex_wake / futex_wait / futex_requeue": "futexes on the caller's memory",
    "landlock_*": "restricts the caller itself (unprivileged by design)",
    "lsm_get_self_attr / lsm_set_self_attr / lsm_list_modules": "the caller's own LSM "
        "attributes, within what the LSM's policy allows",
    "mseal / map_shadow_stack": "the caller's own mappings",
    "fchmodat2 / setxattrat / getxattrat / listxattrat / removexattrat / file_getattr / "
    "file_setattr": "file operations with the same permission checks as their older forms",
    "pidfd_open / pidfd_send_signal": "signals as kill(2) sends them; pid 1 of the sandbox "
        "gets only the signals it handles",
    "uretprobe / uprobe (x86_64)": "act only when called from the kernel's probe trampoline "
        "(else SIGILL); the kernel lets them past seccomp anyway",
}

_SUID = ("EPERM when the mode has S_ISUID or S_ISGID: a file written through a read-write "
         "bind lands on the host's file system, which is not nosuid, where a setuid or "
         "setgid file would hand its owner's ids to any local user")
_SUID_OPEN = ("EPERM when O_CREAT or O_TMPFILE is set and the mode has S_ISUID or S_ISGID "
              "(see chmod)")
_SUID_MKNOD = ("EPERM for a character or block device (a device node written through a "
               "read-write bind would reach the host's devices) and for a mode with S_ISUID "
               "or S_ISGID (see chmod); FIFOs, sockets and plain files pass")

#: Syscalls filtered by argument, with what is refused and why.
ARG_RULES: Final[dict[str, str]] = {
    "clone": "EPERM when args[0] has any CLONE_NEW* flag: no new namespaces "
             "(plain fork and threads still work)",
    "clone3": "ENOSYS always: its flags are in memory BPF cannot read, so libc "
              "falls back to clone, which is checked",
    "socket": "EPERM unless the family is AF_UNIX, AF_INET, AF_INET6 or AF_NETLINK "
              "with NETLINK_ROUTE; over AF_INET/AF_INET6 only SOCK_STREAM with TCP or "
              "MPTCP and SOCK_DGRAM with UDP or ICMP (ping), flag bits masked off: no "
              "packet sniffing or forging (SOCK_RAW, SOCK_PACKET which the kernel turns "
              "into AF_PACKET), no vsock to the hypervisor, no rarely used protocol code "
              "(AF_ALG, AF_RDS, AF_TIPC, SCTP, DCCP, L2TP, UDP-Lite, ...)",
    "socketpair": "EPERM unless the family is AF_UNIX",
    "ioctl": "EPERM for TIOCSTI and TIOCLINUX (typing into a terminal) and TIOCSETD "
             "(loading a line discipline)",
    "personality": "EPERM except PER_LINUX, PER_LINUX32, UNAME26 and the query: "
                   "no ADDR_NO_RANDOMIZE (ASLR off) or READ_IMPLIES_EXEC",
    "prlimit64": "EPERM for pid 1 (the agent, same uid as the commands): a command must "
                 "not lower its limits (RLIMIT_NOFILE 3 breaks every later exec)",
    "setpriority": "EPERM for PRIO_PROCESS or PRIO_PGRP 1 and for any PRIO_USER (which "
                   "reaches the agent too): no renicing the agent",
    "ioprio_set": "EPERM for IOPRIO_WHO_PROCESS or IOPRIO_WHO_PGRP 1 and any "
                  "IOPRIO_WHO_USER: no idle I/O class for the agent",
    "sched_setaffinity": "EPERM for pid 1: no pinning the agent to a busy CPU",
    "sched_setscheduler": "EPERM for pid 1: no SCHED_IDLE for the agent",
    "sched_setparam": "EPERM for pid 1, like sched_setscheduler",
    "sched_setattr": "EPERM for pid 1, like sched_setscheduler",
    "chmod": _SUID,
    "fchmod": _SUID,
    "fchmodat": _SUID,
    "fchmodat2": _SUID,
    "open": _SUID_OPEN,
    "openat": _SUID_OPEN,
    "creat": "EPERM when the mode has S_ISUID or S_ISGID (see chmod)",
    "openat2": "ENOSYS always: its mode is in memory BPF cannot read, so libc falls back "
               "to openat, which is checked",
    "mknod": _SUID_MKNOD,
    "mknodat": _SUID_MKNOD,
}
#: ARG_RULES answered ENOSYS outright (libc falls back to a call that is checked)
_ENOSYS_RULES: Final = ("clone3", "openat2")

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
                               action="ENOSYS" if name in _ENOSYS_RULES else "by argument",
                               reason=reason, arches=_arches_of(name)))
    for name, reason in DENIED_SYSCALLS.items():
        rows.append(PolicyRule(syscall=name, action="EPERM", reason=reason,
                               arches=_arches_of(name)))
    return tuple(rows)


def _arches_of(name: str) -> tuple[str, ...]:
    return tuple(a for a in sorted(SUPPORTED_ARCHES) if name in SYSCALL_NUMBERS[a])


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
    p.jump(JEQ_K, _AUDIT_ARCH[arch], "arch_ok")
    p.ret(RET_KILL_PROCESS)
    p.label("arch_ok")
    p.load(_OFF_NR)
    if arch == "x86_64":
        p.jump(JGE_K, _X32_SYSCALL_BIT, None, "abi_ok")
        # nr -1 (as libseccomp allows): the kernel itself answers ENOSYS
        p.jump(JEQ_K, 0xFFFFFFFF, "abi_ok")
        p.ret(RET_KILL_PROCESS)
        p.label("abi_ok")

    for name in _ENOSYS_RULES:
        skip = p.fresh()
        p.jump(JEQ_K, nrs[name], None, skip)
        p.ret(RET_ERRNO | ENOSYS)
        p.label(skip)
    _rule(p, nrs["clone"], _clone_rule(p))
    _rule(p, nrs["socket"], _socket_rule(p))
    _rule(p, nrs["socketpair"], _socketpair_rule(p))
    _rule(p, nrs["ioctl"], _ioctl_rule(p))
    _rule(p, nrs["personality"], _personality_rule(p))
    for name in ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam",
                 "sched_setattr"):
        _rule(p, nrs[name], _not_the_agent_rule(p))
    _rule(p, nrs["setpriority"], _priority_rule(p, process=_PRIO_PROCESS, pgrp=_PRIO_PGRP,
                                                user=_PRIO_USER))
    _rule(p, nrs["ioprio_set"], _priority_rule(p, process=_IOPRIO_WHO_PROCESS,
                                               pgrp=_IOPRIO_WHO_PGRP, user=_IOPRIO_WHO_USER))
    # no setuid/setgid bits and no device nodes (x86_64 also has the old path-only calls)
    for name, arg in (("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("fchmodat2", 2),
                      ("creat", 1)):
        if name in nrs:
            _rule(p, nrs[name], _mode_rule(p, arg))
    for name, flags in (("open", 1), ("openat", 2)):
        if name in nrs:
            _rule(p, nrs[name], _create_rule(p, flags))
    for name, arg in (("mknod", 1), ("mknodat", 2)):
        if name in nrs:
            _rule(p, nrs[name], _mknod_rule(p, arg))
    # outright denials: "jeq nr, 0, 1; ret EPERM"
    for name in DENIED_SYSCALLS:
        nr = nrs.get(name)
        if nr is None:
            continue
        skip = p.fresh()
        p.jump(JEQ_K, nr, None, skip)
        p.ret(RET_ERRNO | EPERM)
        p.label(skip)
    p.ret(RET_ALLOW)
    return p.assemble()


_Body = Callable[[str, str], None]


def _rule(p: _Program, nr: int, body: _Body) -> None:
    """``if nr == <nr>: body``; the body ends in a jump to ``allow`` or ``deny``."""
    skip, allow, deny = p.fresh(), p.fresh(), p.fresh()
    p.jump(JEQ_K, nr, None, skip)
    body(allow, deny)
    p.label(deny)
    p.ret(RET_ERRNO | EPERM)
    p.label(allow)
    p.ret(RET_ALLOW)
    p.label(skip)  # not this syscall: A still holds the number


def _clone_rule(p: _Program) -> _Body:
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(0))
        p.jump(JSET_K, CLONE_NEW_MASK, deny, allow)
    return body


def _socket_rule(p: _Program) -> _Body:
    def body(allow: str, deny: str) -> None:
        inet, netlink = p.fresh(), p.fresh()
        p.load(_arg_lo(0))
        p.jump(JEQ_K, _AF_UNIX, allow)
        p.jump(JEQ_K, _AF_NETLINK, netlink)
        p.jump(JEQ_K, _AF_INET, inet)
        p.jump(JEQ_K, _AF_INET6, inet, deny)
        p.label(inet)  # stream and datagram only, with the usual protocols
        labels = {kind: p.fresh() for kind in _INET_PROTOCOLS}
        p.load(_arg_lo(1))
        p.and_(_SOCK_TYPE_MASK)
        for kind, label in labels.items():
            p.jump(JEQ_K, kind, label)
        p.jump(JEQ_K, 0, deny, deny)  # SOCK_RAW, SOCK_PACKET, SOCK_SEQPACKET, ...
        for kind, label in labels.items():
            p.label(label)
            p.load(_arg_lo(2))
            for proto in _INET_PROTOCOLS[kind]:
                p.jump(JEQ_K, proto, allow)
            p.jump(JEQ_K, 0, deny, deny)
        p.label(netlink)  # glibc's route queries use SOCK_RAW netlink: allowed
        p.load(_arg_lo(2))
        p.jump(JEQ_K, _NETLINK_ROUTE, allow, deny)
    return body


def _socketpair_rule(p: _Program) -> _Body:
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(0))
        p.jump(JEQ_K, _AF_UNIX, allow, deny)
    return body


def _ioctl_rule(p: _Program) -> _Body:
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(1))
        for req in _DENIED_IOCTLS:
            p.jump(JEQ_K, req, deny)
        p.jump(JEQ_K, 0, allow, allow)  # unconditional: "ja allow"
    return body


def _personality_rule(p: _Program) -> _Body:
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(0))
        for value in _ALLOWED_PERSONALITIES:
            p.jump(JEQ_K, value, allow)
        p.jump(JEQ_K, 0, deny, deny)
    return body


def _mode_rule(p: _Program, arg: int) -> _Body:
    """EPERM when args[arg] (a mode) has S_ISUID or S_ISGID."""
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(arg))
        p.jump(JSET_K, _S_ISUID | _S_ISGID, deny, allow)
    return body


def _create_rule(p: _Program, flags: int) -> _Body:
    """open/openat: EPERM when args[flags] creates a file (O_CREAT, O_TMPFILE) and the
    mode after it has S_ISUID or S_ISGID (without those flags the kernel ignores it)."""
    def body(allow: str, deny: str) -> None:
        creates = p.fresh()
        p.load(_arg_lo(flags))
        p.jump(JSET_K, _O_CREAT | _O_TMPFILE, creates, allow)
        p.label(creates)
        p.load(_arg_lo(flags + 1))
        p.jump(JSET_K, _S_ISUID | _S_ISGID, deny, allow)
    return body


def _mknod_rule(p: _Program, arg: int) -> _Body:
    """EPERM for a character or block device and for S_ISUID/S_ISGID in args[arg]."""
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(arg))
        p.jump(JSET_K, _S_ISUID | _S_ISGID, deny)
        p.and_(_S_IFMT)
        p.jump(JEQ_K, _S_IFCHR, deny)
        p.jump(JEQ_K, _S_IFBLK, deny, allow)
    return body


def _not_the_agent_rule(p: _Program) -> _Body:
    """EPERM when args[0] (a pid) is the agent's."""
    def body(allow: str, deny: str) -> None:
        p.load(_arg_lo(0))
        p.jump(JEQ_K, _AGENT_PID, deny, allow)
    return body


def _priority_rule(p: _Program, *, process: int, pgrp: int, user: int) -> _Body:
    """``(which, who)``: EPERM for the whole uid, or the agent's pid or process group
    (pid 1 leads its own session); any other ``which`` is the kernel's EINVAL."""
    def body(allow: str, deny: str) -> None:
        who = p.fresh()
        p.load(_arg_lo(0))
        p.jump(JEQ_K, user, deny)
        p.jump(JEQ_K, process, who)
        p.jump(JEQ_K, pgrp, who, allow)
        p.label(who)
        p.load(_arg_lo(1))
        p.jump(JEQ_K, _AGENT_PID, deny, allow)
    return body
