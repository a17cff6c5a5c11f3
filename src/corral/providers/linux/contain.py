"""The child-side checklist: turn a fresh pid 1 into a contained sandbox agent.

Runs in the sandbox's pid 1 after the namespaces exist and the id maps are
written (``zygote.py``). Reads top to bottom, like nsjail's ``containProc``:
mounts and pivot, hostname, loopback, rlimits, stray descriptors, then the
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


def contain(plan: Mapping[str, Any], *, keep_fd: int, seccomp_prog: bytes) -> None:
    """Apply ``plan`` (its wire form) to the current process, ending with seccomp."""
    if not seccomp_prog:
        raise OSError(22, "no seccomp filter: refusing to run unfiltered")
    os.umask(0o022)
    # 1. the file system view: private mounts, new read-only root, /work, /tmp, /proc, /dev
    mounts.init_child(plan["mounts"])
    # 2. identity and network
    su.sethostname(plan["hostname"])
    su.loopback_up()
    os.chdir(plan["work_dir"])
    # 3. resource limits inherited by every command (RLIMIT_CPU is set per command)
    for name, soft, hard in plan["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    # 4. descriptors: only the host socket survives (0/1/2 point at /dev/null)
    _close_stray_fds(keep_fd)
    # 5. privileges: no_new_privs first, every capability gone, not ptraceable
    su.set_no_new_privs()
    su.drop_capabilities()
    su.set_dumpable(False)
    # 6. seccomp last: every command the agent starts inherits it
    su.seccomp_install(seccomp_prog)
