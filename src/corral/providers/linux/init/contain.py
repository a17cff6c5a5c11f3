"""The child-side checklist, in two parts run by two processes.

:func:`build_view` runs in a short-lived helper the launcher forks into the
new namespaces right after the sandbox's pid 1: mounts and pivot (the
helper is in the new pid namespace, so its ``/proc`` shows the sandbox's
processes), the user namespace's quotas, hostname, loopback. Every
namespace it changes is shared with pid 1, so pid 1 need not run that code;
the pages the helper dirties die with it instead of being copied into pid 1
for the sandbox's whole life (see ``zygote.py``).

:func:`join_cgroup` and :func:`contain` run in pid 1 itself and hold what is
per process. ``contain`` reads top to bottom, like nsjail's ``containProc``:
uid/gid 0 inside, the cgroup namespace, the working directory, rlimits, stray
descriptors, then the privilege drop: no_new_privs, every capability, not
dumpable, and the seccomp filter last. Any step that fails raises; the agent
reports it and exits, so nothing half-built ever runs a command.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal.py's C module: no enums
import os
import resource

from corral.providers.linux import _sys_unsafe as su
from corral.providers.linux.init import mounts

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing (the CLI's one-shot path)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

__all__ = ["RESET_SIGNALS", "build_view", "contain", "join_cgroup", "limit_cpu",
           "set_user_quotas", "spawn"]

#: what a command starts with reset to default (the agent and the one-shot pid 1 ignore
#: or catch some of them)
RESET_SIGNALS = (_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGXCPU, _signal.SIGINT,
                 _signal.SIGTERM, _signal.SIGCHLD, _signal.SIGHUP)


def build_view(plan: Mapping[str, Any], *, source_fds: Mapping[str, int],
               trees: Sequence[int] = ()) -> None:
    """The namespaces' shared state (helper side): the file system view (private
    mounts, new read-only root, /work, /tmp, /proc, /dev), the user namespace's
    quotas, hostname, loopback."""
    os.umask(0o022)
    mounts.init_child(plan["mounts"], source_fds=source_fds, trees=trees)
    set_user_quotas(plan.get("user_sysctls", ()))
    su.sethostname(plan["hostname"])
    su.loopback_up()


def set_user_quotas(sysctls: Iterable[tuple[str, int]]) -> None:
    """Write the sandbox user namespace's own ``/proc/sys/user/max_*`` (the kernel
    lets a holder of CAP_SYS_RESOURCE in the namespace set them; they cap the
    namespace's users on top of what the host allows the uid that owns it). A
    name this kernel lacks is skipped."""
    for name, value in sysctls:
        try:
            fd = os.open(f"/proc/sys/user/{name}", os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            os.write(fd, b"%d" % value)
        finally:
            os.close(fd)


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
    # the host socket is the agent's alone: a command started with posix_spawn keeps
    # every inheritable descriptor, and with this one it could speak for the agent
    os.set_inheritable(keep, False)


def join_cgroup(procs: list[int]) -> None:
    """Move this process into the sandbox's cgroup: ``procs`` are its ``cgroup.procs``
    files, opened by the fork server as the caller (the kernel checks a move against
    the credentials a file was opened with); closed here."""
    try:
        for fd in procs:
            os.write(fd, b"0")  # 0: the writer itself
    except OSError as e:
        raise OSError(e.errno, f"cannot join the sandbox's cgroup: {e.strerror}") from None
    finally:
        for fd in procs:
            os.close(fd)


def contain(plan: Mapping[str, Any], *, keep_fd: int,
            seccomp_prog: bytes | su.Seccomp) -> None:
    """Apply the per-process part of ``plan`` (its wire form) to pid 1, ending with seccomp.

    Called once the file system view is built and this process is in the
    sandbox's cgroup (:func:`join_cgroup`): the cgroup namespace unshared here
    has that cgroup as its root.
    """
    if not seccomp_prog:
        raise OSError(22, "no seccomp filter: refusing to run unfiltered")
    # 1. identity: uid/gid 0 inside, or an image's User (cloned with the caller's ids,
    # mapped by now)
    uid, gid = plan["uid_map"][0], plan["gid_map"][0]
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    os.umask(0o022)
    # 2. the cgroup namespace, rooted at the sandbox's cgroup; the view's work dir
    if plan["namespaces"] & su.CLONE_NEWCGROUP:
        su.unshare(su.CLONE_NEWCGROUP)
    os.chdir(plan["work_dir"])
    # 3. resource limits inherited by every command (RLIMIT_CPU is set per command)
    for name, soft, hard in plan["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    # 4. descriptors: only the host socket survives, close-on-exec (0/1/2: /dev/null)
    _close_stray_fds(keep_fd)
    # 5. privileges: no_new_privs first, every capability gone, not ptraceable
    su.set_no_new_privs()
    su.drop_capabilities()
    su.set_dumpable(False)
    # 6. seccomp last: every command the agent starts inherits it
    su.seccomp_install(seccomp_prog)


def spawn(prog: str, argv: Sequence[str], env: Mapping[str, str],
          stdio: Sequence[int]) -> int:
    """Start one command as a contained pid 1 starts every command (the agent's
    ``spawn`` and the one-shot path's): posix_spawn in a new session (its own process
    group, no controlling terminal), ``stdio`` on 0/1/2 and no other descriptor of
    them (a copy left at its old number would be a fourth pipe end the command holds),
    default signal dispositions, nothing blocked. OSError if it cannot start."""
    actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, fd, n) for n, fd in enumerate(stdio)]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in dict.fromkeys(stdio) if fd > 2]
    return os.posix_spawn(prog, list(argv), env, file_actions=actions, setsid=True,
                          setsigmask=(), setsigdef=RESET_SIGNALS)


def limit_cpu(pid: int, cpu_s: int | None) -> None:
    """A started command's CPU rlimit (``cpu_s`` seconds; none: unlimited)."""
    if cpu_s:
        try:
            resource.prlimit(pid, resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        except OSError:
            pass  # already gone
