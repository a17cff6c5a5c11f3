"""Process trees for the bounded runner: spawn, mark, kill, reap.

How a run's whole tree is found and killed (see ``docs/runner.md``):

1. The child starts in a new session, so it leads its own process group;
   ``killpg`` reaches every descendant that stayed in that group.
2. Every child gets one extra environment variable, ``CORRAL_RUN_TOKEN``,
   holding a random per-run token. Descendants inherit it across ``fork`` and
   ``exec`` and keep it after ``setsid``/``setpgid`` and after being
   re-parented to init (the double-fork daemon trick). At the end of the run
   the runner lists the pids that appeared in ``/proc`` since the spawn, reads
   their ``environ`` and kills those that carry the token, repeating until a
   pass finds no new one (a stray that forks while being killed is caught on
   the next pass). Linux only; elsewhere step 1 alone applies.

What escapes: a descendant that leaves the process group AND execs with an
environment without the token (``env -i``), or whose pid was already in use
when the run began (pid reuse during the run). The strict provider (pid
namespace + cgroup) has no such gap.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Final, Protocol, final

__all__ = [
    "TOKEN_VAR",
    "PidWindow",
    "Spawner",
    "kill_group",
    "kill_tree",
    "limited_argv",
    "pid_snapshot",
    "reap",
    "remove_tree",
    "spawn_process",
]

TOKEN_VAR: Final = "CORRAL_RUN_TOKEN"
_HAVE_PROC: Final = os.path.isdir("/proc/self")
_MAX_PASSES: Final = 50
_LAST_PID: Final = "/proc/sys/kernel/ns_last_pid"
_PROBE_MAX: Final = 1024


class Spawner(Protocol):
    """Starts ``argv`` and returns its pid; the runner owns (and reaps) it.

    The child must be a direct child of this process, in a new session, with
    ``stdin``/``stdout``/``stderr`` as its fds 0, 1 and 2 and no other fds of
    ours. Raise ``OSError`` when it cannot be started: the run's outcome is
    then ``spawn-error``.
    """

    def __call__(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
                 stdin: int, stdout: int, stderr: int) -> int: ...


def spawn_process(argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
                  stdin: int, stdout: int, stderr: int) -> int:
    """The real spawner: ``subprocess.Popen`` (vfork + exec, no shell, no preexec_fn).

    New session, every fd above 2 closed, SIGPIPE/SIGXFSZ reset to default.
    Exec errors (missing command, bad cwd) come back as ``OSError``.
    """
    proc = subprocess.Popen(
        list(argv), executable=argv[0], stdin=stdin, stdout=stdout, stderr=stderr,
        cwd=cwd, env=dict(env), close_fds=True, start_new_session=True,
        restore_signals=True)
    # The runner reaps this pid itself with wait4 (for its rusage); mark the
    # Popen object finished so it never waits on, or warns about, the pid.
    proc.returncode = 0
    return proc.pid


# Sets rlimits, resets the signals Python ignores, then becomes the command.
# Runs as `python -I -S -c`: no site, no environment-driven imports.
_TRAMPOLINE: Final = (
    "import os,resource as r,signal as s,sys\n"
    "a=sys.argv\n"
    "m=int(a[1]);c=int(a[2])\n"
    "r.setrlimit(r.RLIMIT_CORE,(0,0))\n"
    "if m>0:r.setrlimit(r.RLIMIT_AS,(m,m))\n"
    "if c>0:r.setrlimit(r.RLIMIT_CPU,(c,c+1))\n"
    "s.signal(s.SIGPIPE,s.SIG_DFL)\n"
    "s.signal(s.SIGXFSZ,s.SIG_DFL)\n"
    "try:os.execv(a[3],a[3:])\n"
    "except OSError as e:\n"
    " os.write(2,('corral: cannot run %s: %s\\n'%(a[3],e.strerror)).encode());os._exit(127)\n"
)


def limited_argv(argv: Sequence[str], *, mem_mb: int | None, cpu_ms: int | None) -> list[str]:
    """``argv`` behind a small trampoline that sets RLIMIT_AS / RLIMIT_CPU first.

    rlimits must be set in the child before it execs; ``preexec_fn`` is not
    safe with threads, and ``prlimit`` after the spawn races with the child.
    The trampoline costs one interpreter start (about 8 ms), paid only when
    a limit is asked for. RLIMIT_CPU counts whole seconds: ``cpu_ms`` is
    rounded up (soft limit, SIGXCPU) and the hard limit one second later
    (SIGKILL). RLIMIT_CORE is set to 0 so a killed child leaves no core file.
    """
    mem = (mem_mb or 0) * 1024 * 1024
    cpu = -(-(cpu_ms or 0) // 1000)
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(mem), str(cpu), *argv]


def _read_int(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        return int(os.read(fd, 32))
    except (OSError, ValueError):
        return -1
    finally:
        os.close(fd)


def pid_snapshot() -> frozenset[int]:
    """The pids alive now (empty where there is no /proc)."""
    if not _HAVE_PROC:
        return frozenset()
    return frozenset(int(n) for n in os.listdir("/proc") if n.isdigit())


@final
class PidWindow:
    """The pids handed out since it was made: where a run's descendants are.

    Linux hands out pids in order, cyclically, and ``ns_last_pid`` says the
    last one, so a run's descendants lie between the value read just before
    the spawn and the value read at the end. A small window is probed pid by
    pid; a large or wrapped one is matched against a ``/proc`` listing.
    Without ``ns_last_pid`` it falls back to a listing taken before the spawn.
    """

    __slots__ = ("_before", "_mark")

    def __init__(self) -> None:
        self._mark = _read_int(_LAST_PID) if _HAVE_PROC else -1
        self._before = pid_snapshot() if self._mark < 0 else frozenset()

    def candidates(self) -> list[int] | range:
        if not _HAVE_PROC:
            return []
        if self._mark < 0:
            return sorted(pid_snapshot() - self._before)
        mark, now = self._mark, _read_int(_LAST_PID)
        if now < 0:
            return []
        if mark <= now <= mark + _PROBE_MAX:
            return range(mark + 1, now + 1)
        live = [int(n) for n in os.listdir("/proc") if n.isdigit()]
        if now > mark:
            return [p for p in live if mark < p <= now]
        return [p for p in live if p > mark or p <= now]


def _carries(pid: int, marker: bytes) -> bool:
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # gone, or not ours to read
        return False
    try:
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
    except OSError:
        return False
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return data.startswith(marker) or (b"\0" + marker) in data


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to process group ``pgid``; a group already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tgid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return pid


def kill_tree(pgid: int, token: str, window: PidWindow) -> int:
    """SIGKILL the group ``pgid`` and every stray carrying ``token``.

    ``window`` was made just before the spawn: only pids handed out since
    are read. Returns how many strays (processes outside the group) were
    killed. Call it while the group leader is still unreaped (a zombie keeps
    its pgid from being reused).
    """
    kill_group(pgid)
    if not _HAVE_PROC:
        return 0
    marker = f"{TOKEN_VAR}={token}\0".encode()
    seen: set[int] = set()
    victims: set[int] = set()
    for _ in range(_MAX_PASSES):
        fresh = False
        for pid in window.candidates():
            if pid in seen or pid == pgid or not _carries(pid, marker):
                continue
            seen.add(pid)
            try:
                if os.getpgid(pid) == pgid:  # in the group: killpg got it
                    continue
            except ProcessLookupError:
                continue
            tgid = _tgid(pid)
            try:
                os.kill(tgid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            victims.add(tgid)
            fresh = True
        if not fresh:
            break
    return len(victims)


def reap(pid: int) -> tuple[int, float, int]:
    """Wait for ``pid`` and return (returncode, cpu seconds, peak RSS KiB).

    ``returncode`` is negative for a signal. The rusage is the child's own
    plus that of the descendants it waited for (Linux ``wait4``).
    """
    _, status, ru = os.wait4(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    maxrss = ru.ru_maxrss if sys.platform != "darwin" else ru.ru_maxrss // 1024
    return rc, ru.ru_utime + ru.ru_stime, maxrss


def remove_tree(path: str) -> None:
    """Remove ``path`` recursively, also where the child took write permission away."""

    def fix(func: object, p: str, exc: object) -> None:
        del func, exc
        try:
            parent = os.path.dirname(p)
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)
