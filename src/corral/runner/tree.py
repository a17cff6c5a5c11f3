"""Process trees for the bounded runner: spawn under a supervisor, kill, reap.

How a run's whole tree is held and killed (see ``docs/runner.md``): on Linux
a **supervisor** (a fork, no exec, of the runner's spawn helper, or of the
runner itself while the helper starts or where there is none: see
:class:`_SpawnHelper`) starts the command and holds its tree with kernel
primitives, no marker in the command's environment:

1. The supervisor is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): every
   descendant of the command that is orphaned (``setsid`` + double fork, the
   daemon trick, any scrubbed environment) is re-parented to it, not to init.
   "Everything below the supervisor" is then exactly the run's tree: to kill
   it, the supervisor SIGKILLs its children, reaps them, and repeats on the
   orphans they leave, until it has no child.
2. The command leads its own session and process group; the shutdown signal
   goes to that group (``killpg``), while the command is still unreaped.
3. The supervisor dies with the runner: ``PR_SET_PDEATHSIG`` (checked against
   ``getppid`` after setting it, for the race with a parent that already
   died) delivers SIGUSR2 when its parent ends (the runner, or the helper, which
   exits when the runner's end of their socket closes), on which it kills the
   tree and exits. So a SIGKILL of the calling process still ends the run's tree.
4. When the command exits, the supervisor kills what it left, reaps it, and
   reports the command's wait status and rusage and the number of strays
   (processes outside the command's group) it killed to the runner, then exits.

The supervisor runs only simple code (no imports, no threads, gc off, all
signals blocked and taken with ``sigwaitinfo``) and ends with ``os._exit``.
It costs one ``fork`` of the small helper (or of the runner, whose cost grows
with its size) on top of the command's spawn. It reports, with the command's
rusage, its own RSS high-water mark just after the spawn: Linux copies the
spawning process's mark into the command's at exec, so a ``maxrss`` not above
that floor is not the command's (``usage.peak_mem_mb`` is then 0, not measured).

What escapes: a descendant that SIGKILLs the supervisor itself (same user),
whose orphans then go to init; a setuid descendant the user cannot signal.
Elsewhere than Linux (no prctl) the command is started directly
(:func:`popen_process`) and only its process group is killed. The strict
provider (pid namespace + cgroup) has no such gap.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import functools
import gc
import marshal
import os
import resource
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn, Protocol, final

__all__ = [
    "Report",
    "Spawner",
    "Supervised",
    "kill_group",
    "limited_argv",
    "popen_process",
    "reap",
    "remove_tree",
    "spawn_helper_pid",
    "spawn_process",
    "warm_spawn_helper",
]

#: the supervisor's start record: (kind, value, where); kind 0 = started (value = pid),
#: 1 = could not start (value = errno; where 0 = command, 1 = cwd, 2 = supervisor)
_START: Final = struct.Struct("=iii")
#: the final record: (wait status of the command or -1, utime s, stime s, maxrss, strays,
#: floor: the supervisor's own peak RSS just after it spawned the command, KiB)
_FINAL: Final = struct.Struct("=iddqiq")
_WATCH: Final = frozenset({signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2,
                           signal.SIGTERM, signal.SIGHUP})
_STOP: Final = frozenset({signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP})
#: how long a supervisor stopped by a signal waits for a dying runner's fds to close
_DYING_WAIT_MS: Final = 1000
_MAX_PASSES: Final = 10_000
_REAP_WAIT_S: Final = 5.0


class Spawner(Protocol):
    """Starts ``argv``; the runner owns (and reaps) what it returns.

    Returns a :class:`Supervised` (the default, :func:`spawn_process`), or the
    pid of a direct child of this process in a new session (then only its
    process group is killed at the end). The child must have
    ``stdin``/``stdout``/``stderr`` as its fds 0, 1 and 2 and no other fds of
    ours. Raise ``OSError`` when it cannot be started: the run's outcome is
    then ``spawn-error``.
    """

    def __call__(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
                 stdin: int, stdout: int, stderr: int) -> Supervised | int: ...


@dataclass(frozen=True, slots=True)
class Report:
    """What the supervisor reported when the run's tree was gone.

    ``returncode`` is negative for a signal and ``None`` when the command's
    status is unknown (the supervisor was killed). ``cpu_s`` and
    ``maxrss_kib`` are the command's own rusage plus that of the descendants
    it waited for (``wait4``); ``strays`` counts the processes outside the
    command's process group that the supervisor killed.
    """

    returncode: int | None
    cpu_s: float
    maxrss_kib: int
    strays: int
    #: the high-water mark the command's ``maxrss_kib`` starts from (Linux copies the
    #: spawning process's into it at exec): a ``maxrss_kib`` not above it says nothing
    floor_kib: int = 0


@final
@dataclass(frozen=True, slots=True)
class Supervised:
    """A command started under a supervisor (see the module docstring).

    ``pid`` is the supervisor, the runner's direct child (watch it, reap it
    with :meth:`finish`); ``command_pid`` the command, the supervisor's child
    and leader of its own session. ``control`` and ``status`` are the
    runner's ends of the two pipes to the supervisor.
    """

    pid: int
    command_pid: int
    control: int
    status: int
    #: a pidfd of the supervisor when it is the spawn helper's child, not ours (then it
    #: is signalled and waited for through this fd, never by pid); -1 when ours
    pidfd: int = -1

    def _signal(self, sig: int) -> None:
        try:
            if self.pidfd >= 0:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def _gone(self, timeout: float = 0.0) -> bool:
        """Whether the supervisor has exited (ours: reaped), waiting up to ``timeout``."""
        if self.pidfd < 0:
            return _wait_bounded(self.pid) if timeout else os.waitpid(
                self.pid, os.WNOHANG)[0] != 0
        return bool(select.select([self.pidfd], [], [], timeout)[0])

    def send(self, sig: int) -> None:
        """Ask the supervisor to signal the command's group; SIGKILL: kill the whole tree.

        Harmless once the supervisor is gone (it is unreaped until
        :meth:`finish`, so the pid cannot be reused meanwhile).
        """
        try:
            os.write(self.control, bytes([sig]))
        except OSError:  # the supervisor is gone (EPIPE) or the pipe is full
            pass
        for s in (signal.SIGUSR1, signal.SIGCONT):
            self._signal(s)

    def finish(self) -> Report:
        """Reap the supervisor (told to kill the tree if it still runs) and read its report.

        Bounded: a supervisor that does not exit within 5 s of being told
        (stuck reaping a process that cannot die) is SIGKILLed, with the
        command's group.
        """
        try:
            if not self._gone():
                self.send(signal.SIGKILL)
                if not self._gone(_REAP_WAIT_S):
                    kill_group(self.command_pid)
                    self._signal(signal.SIGKILL)
                    if self.pidfd < 0:
                        os.waitpid(self.pid, 0)
                    else:
                        self._gone(_REAP_WAIT_S)
            try:
                data = os.read(self.status, _FINAL.size)
            except BlockingIOError:
                data = b""
            if len(data) == _FINAL.size:
                raw, utime, stime, maxrss, strays, floor = _FINAL.unpack(data)
                rc = os.waitstatus_to_exitcode(raw) if raw >= 0 else None
                return Report(rc, utime + stime, maxrss, strays, floor)
            # no report: the supervisor was killed; its orphans went to init
            kill_group(self.command_pid)
            return Report(None, 0.0, 0, 0)
        finally:
            os.close(self.control)
            os.close(self.status)
            if self.pidfd >= 0:
                os.close(self.pidfd)


def _wait_bounded(pid: int) -> bool:
    """Reap ``pid`` if it exits within 5 s; whether it did."""
    deadline = time.monotonic() + _REAP_WAIT_S
    pause = 0.0002
    while True:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


@functools.cache
def _kernel() -> Any:
    """The module with the ``prctl`` calls (libc resolved now, before any fork), or None.

    ``ctypes`` lives in ``corral.providers.linux._sys_unsafe`` only; it is
    imported on the first spawn, not with this module.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        from corral.providers.linux import _sys_unsafe
        _sys_unsafe.preresolve()
    except (ImportError, OSError, AttributeError):
        return None
    return _sys_unsafe


_ALL_SIGNALS: Final = frozenset(signal.valid_signals())


def spawn_process(argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
                  stdin: int, stdout: int, stderr: int,
                  remove_cwd: bool = False) -> Supervised | int:
    """The real spawner: the command under a forked supervisor (Linux), else :func:`popen_process`.

    The command starts with ``posix_spawn`` from the supervisor: a new
    session, fds 0-2 the given ones and no other, SIGPIPE/SIGXFSZ reset to
    default, an empty signal mask. Start errors (missing command, bad cwd)
    come back here as ``OSError``, after the supervisor was reaped.

    ``remove_cwd`` (the runner's own temp dir): when the runner is gone by the
    time the tree is dead (its end of the report pipe is closed: it was
    SIGKILLed), the supervisor removes ``cwd`` itself, since nobody else will.
    """
    kernel = _kernel()
    if kernel is None:
        return popen_process(argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                             stderr=stderr)
    argv = list(argv)
    env = dict(env)
    ctl_r, ctl_w = os.pipe()
    st_r, st_w = os.pipe()
    fds = (stdin, stdout, stderr, st_w, ctl_r)
    try:
        helped = _HELPER.fork_supervisor(argv, cwd, env, fds, remove_cwd)
    except BaseException:
        for fd in (ctl_r, ctl_w, st_r, st_w):
            os.close(fd)
        raise
    pidfd = -1
    if helped is not None:
        pid, pidfd = helped
    else:  # no helper (yet): the supervisor is a fork of this process
        parent = os.getpid()
        # all signals blocked across the fork: the supervisor starts with them
        # blocked (it takes the ones it wants with sigwaitinfo; no Python handler
        # of the caller's ever runs in it)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _ALL_SIGNALS)
        try:
            pid = _fork()
            if pid == 0:  # the supervisor: never returns
                _supervise(kernel, argv, cwd, env, fds, parent, remove_cwd)
        except BaseException:
            for fd in (ctl_r, ctl_w, st_r, st_w):
                os.close(fd)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    os.close(ctl_r)
    os.close(st_w)
    sup = Supervised(pid, 0, ctl_w, st_r, pidfd)
    try:
        data = _read_full(st_r, _START.size)
    except BaseException:  # interrupted (KeyboardInterrupt): have the tree killed
        os.close(ctl_w)
        os.close(st_r)
        sup._signal(signal.SIGUSR2)
        if not sup._gone(_REAP_WAIT_S):
            sup._signal(signal.SIGKILL)
            if pidfd < 0:
                os.waitpid(pid, 0)
        if pidfd >= 0:
            os.close(pidfd)
        raise
    if len(data) == _START.size:
        kind, value, where = _START.unpack(data)
        if kind == 0:
            os.set_blocking(ctl_w, False)
            os.set_blocking(st_r, False)
            return Supervised(pid, value, ctl_w, st_r, pidfd)
    os.close(ctl_w)
    os.close(st_r)
    if pidfd < 0:
        os.waitpid(pid, 0)
    else:
        sup._gone(_REAP_WAIT_S)
        os.close(pidfd)
    if len(data) != _START.size:
        raise ChildProcessError(f"the run's supervisor died before starting {argv[0]!r}")
    name = (argv[0], cwd, "supervisor")[where]
    raise OSError(value, os.strerror(value), name)


#: the spawn helper: imports this module and serves (argv: its corral root, its socket fd)
_HELPER_MAIN: Final = ("import sys\nsys.path.insert(0, sys.argv[1])\n"
                       "from corral.runner.tree import _serve_spawns\n"
                       "_serve_spawns(int(sys.argv[2]))\n")
#: a request larger than this (argv + env) takes the in-process fork instead
_HELPER_MAX_REQUEST: Final = 128 * 1024
_PID: Final = struct.Struct("=i")


@final
class _SpawnHelper:
    """A small process that forks each run's supervisor, so the command's peak RSS is
    its own in a large host (see :func:`_serve_spawns`).

    Started once per process on the first spawn (``posix_spawn`` of ``python -I -S``:
    a fresh, small address space), without waiting for it: until it says it is ready,
    runs fork their supervisor from this process as before. One request at a time
    (a lock): the argv, cwd and env (marshal) and the five fds (SCM_RIGHTS) go out; the
    supervisor's pid and a pidfd of it come back. It ends when this process closes its
    end (at exit, or dying: the kernel closes it), and its supervisors, whose parent it
    is, then get their PDEATHSIG and kill their trees. Any failure (it died, no pidfd
    here) turns it off for this process: runs fork their supervisor as before.
    """

    def __init__(self) -> None:
        self._identity = b""  # _identity() when it was started
        self._failures = 0  # helpers that died on us: after 3, none again
        self._lock = threading.Lock()
        self._owner = 0  # the pid that started it (a forked child starts its own)
        self._sock: socket.socket | None = None
        self.pid = 0
        self._ready = False
        # pidfds to hold its children by; and an interpreter to start it with (an
        # embedding program's sys.executable is not one: never start that)
        self._off = (not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal")
                     or not os.path.basename(sys.executable or "").startswith("python"))

    def fork_supervisor(self, argv: list[str], cwd: str, env: dict[str, str],
                        fds: tuple[int, int, int, int, int],
                        remove_cwd: bool = False) -> tuple[int, int] | None:
        """(pid, pidfd) of a supervisor the helper forked, or None: fork it here."""
        if self._off:
            return None
        try:
            msg = marshal.dumps((argv, os.path.abspath(cwd), env, remove_cwd))
        except ValueError:
            return None
        if len(msg) > _HELPER_MAX_REQUEST:
            return None
        with self._lock:
            if (self._sock is None or self._owner != os.getpid()
                    or _identity() != self._identity):
                # first use, one that died, a fork of the process that started it, or
                # this process changed what a command inherits (ids, rlimits, umask,
                # cgroup...) since: a fresh one, started from now; this run forks here
                self._stop()
                self._start()
                return None
            if not self._ready and not self._check_ready():
                return None
            sock = self._sock
            assert sock is not None
            try:
                socket.send_fds(sock, [msg], list(fds))
                data, got, _flags, _addr = socket.recv_fds(sock, _PID.size, 1)
            except OSError:
                got, data = [], b""
            if len(data) != _PID.size or len(got) != 1:  # it died (a command can kill it)
                for fd in got:
                    os.close(fd)
                self._failures += 1
                self._stop(off=self._failures >= 3)  # else a new one on the next run
                return None
            os.set_inheritable(got[0], False)
            return _PID.unpack(data)[0], got[0]

    def warm(self, timeout_s: float) -> bool:
        """Start the helper if need be and wait up to ``timeout_s`` until it is ready."""
        with self._lock:
            if self._off:
                return False
            if (self._sock is None or self._owner != os.getpid()
                    or _identity() != self._identity):
                self._stop()
                self._start()
            deadline = time.monotonic() + timeout_s
            while self._sock is not None and not self._ready and not self._check_ready():
                if self._off or time.monotonic() > deadline:
                    return False
                select.select([self._sock], [], [], max(0.0, deadline - time.monotonic()))
            return self._ready

    def after_fork_in_child(self) -> None:
        """A fork of this process: a lock another thread held at the fork is not held
        here (the helper is the parent's; the child starts its own on its first run)."""
        self._lock = threading.Lock()

    def _check_ready(self) -> bool:
        assert self._sock is not None
        try:
            data = self._sock.recv(16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data != b"ready":
            self._stop(off=True)
            return False
        self._ready = True
        return True

    def _start(self) -> None:
        if self._sock is not None:  # a fork's copy of the parent's: ours to close only
            self._sock.close()
        self._sock = None
        self._owner, self._ready, self.pid = os.getpid(), False, 0
        self._identity = _identity()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            self.pid = os.posix_spawn(
                sys.executable, [sys.executable, "-I", "-S", "-c", _HELPER_MAIN, root, "3"],
                dict(os.environ), setsid=True, setsigmask=(),
                file_actions=[(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1),
                              (os.POSIX_SPAWN_DUP2, null, 2),
                              (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3)])
        except OSError:
            mine.close()
            self._off = True
        else:
            mine.settimeout(_REAP_WAIT_S)  # a helper that does not answer is given up
            self._sock = mine
            atexit.register(self._stop)
        finally:
            theirs.close()
            os.close(null)

    def _stop(self, off: bool = False) -> None:
        """Close our end (the helper exits on it) and reap it; ``off``: no helper again."""
        self._off = self._off or off
        sock, self._sock, self._ready = self._sock, None, False
        if sock is not None:
            sock.close()
        if self.pid and self._owner == os.getpid():  # (a fork's: its parent's to reap)
            if not _wait_bounded(self.pid):
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(self.pid, 0)
            self.pid = 0


#: the lines of /proc/self/status that say what a child inherits beyond ids
_STATUS_KEYS: Final = (b"Umask:", b"Cap", b"NoNewPrivs:", b"Seccomp:")
_NAMESPACES: Final = ("mnt", "pid_for_children", "net", "user", "uts", "ipc", "cgroup")


def _identity() -> bytes:
    """What a command inherits from the process that spawns it, beyond argv, env and cwd:
    user and group ids, groups, rlimits, umask, capabilities, no_new_privs, seccomp,
    cgroups and namespaces. The helper serves only while this is what it started with."""
    parts = [repr((os.getresuid(), os.getresgid(), sorted(os.getgroups())))]
    parts += [repr(resource.getrlimit(getattr(resource, n))) for n in sorted(
        dir(resource)) if n.startswith("RLIMIT_")]
    for ns in _NAMESPACES:
        try:
            parts.append(str(os.stat(f"/proc/self/ns/{ns}").st_ino))
        except OSError:
            parts.append("-")
    out = "\n".join(parts).encode()
    for path in ("/proc/self/status", "/proc/self/cgroup"):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            data = b""
        if path.endswith("status"):
            data = b"".join(x for x in data.splitlines(keepends=True)
                            if x.startswith(_STATUS_KEYS))
        out += b"\n" + data
    return out


_HELPER: Final = _SpawnHelper()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_HELPER.after_fork_in_child)


def warm_spawn_helper(timeout_s: float = 5.0) -> bool:
    """Start this process's spawn helper now and wait until it serves (a long-lived
    host may call it at start; otherwise the first run starts it without waiting).
    Whether it is serving: False where there is none (no pidfd, it failed)."""
    return _HELPER.warm(timeout_s)


def spawn_helper_pid() -> int:
    """The pid of this process's spawn helper (0: none running); for tests and audits."""
    return _HELPER.pid if _HELPER._owner == os.getpid() else 0


def _serve_spawns(fd: int) -> NoReturn:
    """The spawn helper's loop (in ``python -I -S``): fork a supervisor per request.

    Its own address space is small and stays small, so the command a supervisor forked
    from it spawns starts with a small RSS high-water mark (Linux copies the spawning
    process's into the command's at exec), and the peak the supervisor reports is the
    command's own in any host. Signals are blocked across each fork, as in
    :func:`spawn_process`; supervisors that exit are reaped on SIGCHLD. It exits when
    the runner closes its end of the socket (EOF).
    """
    kernel = _kernel()
    sock = socket.socket(fileno=fd)
    if kernel is None:
        os._exit(2)

    def reap(_sig: int, _frame: object) -> None:
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return

    signal.signal(signal.SIGCHLD, reap)  # (its own session: no terminal's signals)
    me = os.getpid()
    gc.disable()
    try:
        sock.send(b"ready")
        while True:
            msg, fds, _flags, _addr = socket.recv_fds(sock, _HELPER_MAX_REQUEST + 1024, 5)
            if not msg:
                break
            argv, cwd, env, remove_cwd = marshal.loads(msg)
            old = signal.pthread_sigmask(signal.SIG_BLOCK, _ALL_SIGNALS)
            try:
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    _supervise(kernel, argv, cwd, env, (fds[0], fds[1], fds[2], fds[3],
                                                        fds[4]), me, remove_cwd)
                pidfd = os.pidfd_open(pid)  # before it can be reaped (SIGCHLD is blocked)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
            for f in fds:
                os.close(f)
            socket.send_fds(sock, [_PID.pack(pid)], [pidfd])
            os.close(pidfd)
    except BaseException:
        os._exit(70)
    os._exit(0)


def _fork() -> int:
    """``os.fork``; from 3.12 without its warning about threads.

    The warning is about a child that runs Python code which may need a lock
    another thread held at the fork; the supervisor only makes system calls
    (``os``, ``signal``, ``struct``, two ``prctl`` through ``ctypes``) and ends in
    ``os._exit`` (see :func:`_supervise`).
    """
    if sys.version_info < (3, 12):
        return os.fork()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _read_full(fd: int, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _supervise(kernel: Any, argv: list[str], cwd: str,
               env: dict[str, str], fds: tuple[int, int, int, int, int],
               parent: int, remove_cwd: bool = False) -> NoReturn:
    """The supervisor, in the forked child. Every path ends in ``os._exit``."""
    try:
        gc.disable()  # no finalizers of the runner's objects run here
        os.setsid()  # out of the caller's process group and terminal
        # move our five fds out of the way, then to 0-2 (the command's) and 3-4
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds]
        for i in range(3):
            os.dup2(high[i], i, inheritable=True)
        os.dup2(high[3], 3, inheritable=False)
        os.dup2(high[4], 4, inheritable=False)
        os.closerange(5, os.sysconf("SC_OPEN_MAX"))
        try:
            kernel.set_child_subreaper()
            kernel.set_pdeathsig(signal.SIGUSR2)
        except OSError as e:
            _exit_start(1, e.errno or errno.EINVAL, 2)
        if os.getppid() != parent:  # the runner died before PDEATHSIG was set
            os._exit(0)
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # never auto-reap
        except (ValueError, OSError):
            pass
        try:
            os.chdir(cwd)
        except OSError as e:
            _exit_start(1, e.errno or 0, 1)
        try:
            pid = os.posix_spawn(argv[0], argv, env, setsid=True, setsigmask=(),
                                 setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        except OSError as e:
            _exit_start(1, e.errno or 0, 0)
        # what the command's maxrss starts from: our own mark (exec copies it in)
        floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        os.write(3, _START.pack(0, pid, 0))
        for fd in (0, 1, 2):
            os.close(fd)
        os.set_blocking(4, False)
        told = _watch(pid)
        raw, ru, strays = _kill_all(pid)
        utime, stime, maxrss = (ru.ru_utime, ru.ru_stime, ru.ru_maxrss) if ru else (0., 0., 0)
        # Stopped by a signal, not by the command's end nor the runner's word: the runner
        # may be dying (SIGKILLed: the kernel closes its fds a moment after the first of
        # its threads ends, which may be the one our PDEATHSIG follows). Nobody will read
        # the report then, nor remove the run's own temp dir: we do.
        if remove_cwd and not told and _reader_gone(3, _DYING_WAIT_MS):
            _remove_cwd(cwd)
        try:
            os.write(3, _FINAL.pack(raw, utime, stime, maxrss, strays, floor))
        except BrokenPipeError:  # the runner is gone
            if remove_cwd:
                _remove_cwd(cwd)
    except BaseException:
        os._exit(70)
    os._exit(0)


def _exit_start(kind: int, value: int, where: int) -> NoReturn:
    os.write(3, _START.pack(kind, value, where))
    os._exit(0)


def _watch(pid: int) -> bool:
    """Wait until the command exits (unreaped) or the runner / our parent's death says
    stop. True when the command exited or the runner asked (it is there to read the
    report); False when a stop signal or the control pipe's EOF ended the watch."""
    first = True
    sig: int = signal.SIGCHLD
    while True:
        if sig == signal.SIGCHLD:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            if not first:
                _reap_orphans(pid)
            first = False
        sig = signal.sigwaitinfo(_WATCH).si_signo
        if sig in _STOP:
            return False
        if sig == signal.SIGUSR1:
            try:
                asked = os.read(4, 256)
            except BlockingIOError:  # a SIGUSR1 whose bytes an earlier one read
                continue
            if not asked:  # EOF: the runner closed the pipe (gone)
                return False
            for s in asked:
                if s == signal.SIGKILL:
                    return True
                kill_group(pid, s)


def _reader_gone(fd: int, timeout_ms: int) -> bool:
    """Whether the read end of the pipe ``fd`` writes to is closed (POLLERR), waiting up
    to ``timeout_ms`` for it."""
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR / POLLHUP are always reported
    return any(ev & select.POLLERR for _fd, ev in poller.poll(timeout_ms))


def _remove_cwd(cwd: str) -> None:
    """The run's own temp dir, once nobody else will remove it; then exit."""
    os.chdir("/")
    remove_tree(cwd)
    os._exit(0)


def _reap_orphans(pid: int) -> None:
    """Reap adopted orphans that ended, never the command (it is reaped last)."""
    for k in _children():
        if k != pid:
            try:
                os.waitpid(k, os.WNOHANG)
            except ChildProcessError:
                pass


def _children() -> list[int]:
    me = os.getpid()
    try:
        fd = os.open(f"/proc/{me}/task/{me}/children", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return _children_by_scan(me)
    try:
        data = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    return [int(x) for x in data.split()]


def _children_by_scan(me: int) -> list[int]:  # kernels without CONFIG_PROC_CHILDREN
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st[1] == me:
                out.append(int(name))
    return out


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of ``pid`` from /proc, or None if it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    f = data[data.rfind(b")") + 2:].split()
    return f[0].decode(), int(f[1]), int(f[2])


def _kill_all(pid: int) -> tuple[int, resource.struct_rusage | None, int]:
    """SIGKILL the command's group and every process below us; reap all of it.

    Returns the command's raw wait status (-1 if unknown), its rusage and the
    number of strays: processes outside its group that were killed.
    """
    kill_group(pid)  # the command is unreaped here: its pgid is still ours to use
    raw, ru = -1, None
    strays: set[int] = set()
    for _ in range(_MAX_PASSES):
        acted = False
        for k in _children():
            st = _stat(k)
            if st is None:
                continue
            if st[0] != "Z":
                try:
                    os.kill(k, signal.SIGKILL)
                except PermissionError:  # not ours to kill (setuid): left running
                    continue
                if st[2] != pid:
                    strays.add(k)
            try:
                got, status, usage = os.wait4(k, 0)
            except ChildProcessError:
                continue
            acted = True
            if got == pid:
                raw, ru = status, usage
        if not acted:
            break
    return raw, ru, len(strays)


def popen_process(argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
                  stdin: int, stdout: int, stderr: int) -> int:
    """The command as a direct child, no supervisor: ``subprocess.Popen`` (vfork + exec).

    New session, every fd above 2 closed, SIGPIPE/SIGXFSZ reset to default.
    Exec errors (missing command, bad cwd) come back as ``OSError``. Only the
    process group is killed at the end of such a run.
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


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to process group ``pgid``; a group already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


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
            if p == path:  # the top itself: its parent is not ours to chmod
                return
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
        except OSError:
            pass

    if not os.path.lexists(path):  # never "fix" the parent of a path already gone
        return
    shutil.rmtree(path, onerror=fix)
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)
