"""The child-side checklist: turn a fresh pid 1 into a contained sandbox agent.

Runs in the sandbox's pid 1 after the namespaces exist and the id maps are
written (``zygote.py``). Reads top to bottom, like nsjail's ``containProc``:
mounts and pivot, hostname, loopback, the cgroup (namespace), rlimits, stray descriptors, then the
privilege drop: no_new_privs, every capability, not dumpable, and the seccomp
filter last. Any step that fails raises; the agent reports it and exits, so
nothing half-built ever runs a command.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from typing import Any

from . import _sys_unsafe as su, mounts

__all__ = ["contain"]


def _close_stray_fds(keep: int) -> None:
    """Leave exactly 0/1/2 (on /dev/null) and ``keep`` open."""
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd, inheritable=False)
    if null > 2:
        os.close(null)
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 20)


def _join_cgroup(plan: Mapping[str, Any], placed_fd: int) -> None:
    """Wait until the launcher moved us into the sandbox's cgroup, then make that
    cgroup the root of a new cgroup namespace."""
    try:
        msg = os.read(placed_fd, 512)
    finally:
        os.close(placed_fd)
    if msg[:1] != b"C":
        raise OSError(1, msg[1:].decode(errors="replace")
                      or "the launcher died before moving the sandbox into its cgroup")
    if plan["namespaces"] & su.CLONE_NEWCGROUP:
        su.unshare(su.CLONE_NEWCGROUP)


def contain(plan: Mapping[str, Any], *, keep_fd: int, seccomp_prog: bytes,
            placed_fd: int) -> None:
    """Apply ``plan`` (its wire form) to the current process, ending with seccomp.

    ``placed_fd`` is a pipe on which the launcher writes ``C`` once this
    process is in the sandbox's cgroup (or ``X`` and why not); the cgroup
    namespace is unshared only after that, and before any privilege is dropped.
    """
    if not seccomp_prog:
        raise OSError(22, "no seccomp filter: refusing to run unfiltered")
    os.umask(0o022)
    # 1. the file system view: private mounts, new read-only root, /work, /tmp, /proc, /dev
    mounts.init_child(plan["mounts"], source_fds=plan.get("source_fds", {}))
    # 2. identity and network
    su.sethostname(plan["hostname"])
    su.loopback_up()
    os.chdir(plan["work_dir"])
    # 3. the sandbox's cgroup (its move overlapped the steps above) and cgroup namespace
    _join_cgroup(plan, placed_fd)
    # 4. resource limits inherited by every command (RLIMIT_CPU is set per command)
    for name, soft, hard in plan["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    # 5. descriptors: only the host socket survives (0/1/2 point at /dev/null)
    _close_stray_fds(keep_fd)
    # 6. privileges: no_new_privs first, every capability gone, not ptraceable
    su.set_no_new_privs()
    su.drop_capabilities()
    su.set_dumpable(False)
    # 7. seccomp last: every command the agent starts inherits it
    su.seccomp_install(seccomp_prog)
