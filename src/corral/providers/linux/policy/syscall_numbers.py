"""Syscall numbers of the calls the seccomp policy names, per supported arch (data).

Checked against the installed kernel headers by ``tests/linux/test_seccomp.py``;
a call newer than those headers is pinned there from the kernel's own tables.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SYSCALL_NUMBERS"]

#: x86_64 from arch/x86/entry/syscalls/syscall_64.tbl; aarch64 from
#: include/uapi/asm-generic/unistd.h (scripts/syscall.tbl since 6.11). Only the
#: syscalls the policy names; from 424 on both arches share one number.
SYSCALL_NUMBERS: Final[dict[str, dict[str, int]]] = {
    "x86_64": {
        "ioctl": 16, "socket": 41, "socketpair": 53, "clone": 56, "ptrace": 101,
        "syslog": 103, "uselib": 134, "personality": 135, "ustat": 136, "sysfs": 139,
        "setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144,
        "vhangup": 153, "modify_ldt": 154, "pivot_root": 155, "_sysctl": 156,
        "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165,
        "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170,
        "setdomainname": 171, "iopl": 172, "ioperm": 173, "create_module": 174,
        "init_module": 175, "delete_module": 176, "get_kernel_syms": 177,
        "query_module": 178, "quotactl": 179, "nfsservctl": 180, "sched_setaffinity": 203,
        "lookup_dcookie": 212, "clock_settime": 227, "mbind": 237,
        "set_mempolicy": 238, "get_mempolicy": 239, "kexec_load": 246, "add_key": 248,
        "request_key": 249, "keyctl": 250, "ioprio_set": 251, "migrate_pages": 256,
        "unshare": 272, "move_pages": 279, "perf_event_open": 298, "fanotify_init": 300,
        "prlimit64": 302, "name_to_handle_at": 303, "open_by_handle_at": 304,
        "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
        "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "sched_setattr": 314,
        "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "clone3": 435, "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442,
        "quotactl_fd": 443, "memfd_secret": 447, "set_mempolicy_home_node": 450,
        "cachestat": 451, "statmount": 457, "listmount": 458, "open_tree_attr": 467,
        "open": 2, "creat": 85, "chmod": 90, "fchmod": 91, "mknod": 133, "openat": 257,
        "mknodat": 259, "fchmodat": 268, "openat2": 437, "fchmodat2": 452,
    },
    "aarch64": {
        "lookup_dcookie": 18, "ioctl": 29, "ioprio_set": 30, "umount2": 39, "mount": 40,
        "pivot_root": 41, "nfsservctl": 42, "chroot": 51, "vhangup": 58, "quotactl": 60,
        "acct": 89, "personality": 92, "unshare": 97, "kexec_load": 104,
        "init_module": 105, "delete_module": 106, "clock_settime": 112, "syslog": 116,
        "ptrace": 117, "sched_setparam": 118, "sched_setscheduler": 119,
        "sched_setaffinity": 122, "setpriority": 140, "reboot": 142, "sethostname": 161,
        "setdomainname": 162, "settimeofday": 170, "adjtimex": 171, "socket": 198,
        "socketpair": 199, "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220,
        "swapon": 224, "swapoff": 225, "mbind": 235, "get_mempolicy": 236,
        "set_mempolicy": 237, "migrate_pages": 238, "move_pages": 239,
        "perf_event_open": 241, "prlimit64": 261, "fanotify_init": 262,
        "name_to_handle_at": 264, "open_by_handle_at": 265, "clock_adjtime": 266,
        "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "finit_module": 273, "sched_setattr": 274, "bpf": 280, "userfaultfd": 282,
        "kexec_file_load": 294, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "pidfd_getfd": 438,
        "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443,
        "memfd_secret": 447, "set_mempolicy_home_node": 450, "cachestat": 451,
        "statmount": 457, "listmount": 458, "open_tree_attr": 467,
        "mknodat": 33, "fchmod": 52, "fchmodat": 53, "openat": 56, "openat2": 437,
        "fchmodat2": 452,
    },
}
