"""One strict run set up from the calling process itself: ``corral run``'s fast path.

The library path (``run_strict``) starts a fork server, an asyncio loop and an
agent that serves requests; for a CLI that runs one command and exits, that
costs most of the run. This module builds the *same* sandbox straight from the
caller, synchronously, through the same bring-up (docs/architecture.md, "One
bring-up sequence"):

- the same plan (:func:`~corral.providers.linux.policy.plan.build_plan` with
  the provider's default options and ``mounts.detect_host_layout``), seccomp
  filter (``policy.seccomp.build_filter``) and host cgroup facts
  (``host.cgroups.CgroupManager``, its ``require`` check), cached (below);
- the one cgroup layer (``host.cgroupfiles.CgroupDirs.make``, what
  ``CgroupManager.create`` makes), the launcher's steps (``init.clone``: the
  per-sandbox outside uid as root, detached read-only bind trees, pid 1 cloned
  into the namespaces as the sandbox's uid, its id maps);
- pid 1 (C2) drops what is the caller's (its signal handlers, its descriptors,
  its command line: ``/proc/1/cmdline`` shows ``corral``) and runs
  ``init.pid1.bring_up`` with ``builder=False``: C2 joins its cgroup and builds the
  view itself (no C3: this pid 1 lives for one command), then
  ``contain.contain`` (cgroup namespace, rlimits, stray descriptors,
  no_new_privs, every capability dropped, not dumpable, the seccomp filter);
- C2 then starts the one command as the agent does (``contain.spawn``: a new
  session, the caller's pipes on 0/1/2 and nothing else, default signal
  dispositions, the plan's env base; ``contain.limit_cpu``), reaps everything,
  reports the command's exit and rusage and exits: the kernel kills whatever is
  left in the pid namespace.

What is this module's own: the argv subset it takes (:func:`parse_argv`), its
plan cache, and its relay loop (:func:`_relay`).

The caller relays the output as it arrives (capped like the library's
defaults), enforces the timeout, cpu_ms (polling the cgroup, like
``host.cpuwatch``) and SIGINT/SIGTERM by SIGKILLing pid 1 through its pidfd,
and removes the cgroup and the uid block on every path. A ``corral run`` killed by
SIGKILL cannot; so each run, once its own cgroup is gone, removes the sandbox
cgroups whose owner died (``cgroupfiles.listing(orphaned=True, by_first=True)``), as a library
``LinuxProvider()`` start does.

:func:`run` returns ``None`` when it could not set the sandbox up before
anything of the command ran (the host lacks a primitive, say): the caller then
takes the library path, which reports the cause. Whatever it reports, the
boundary is never weaker: every step above either happens or the run does not
start.

The cache. The plan, the filter and the cgroup facts are what the library
computes (:func:`compute`); building them needs ``core.spec``, the plan, seccomp
and cgroup modules and with them ``typing``, ``dataclasses``, ``enum`` and
``re``: more time than the rest of the run. So the first run of a command line
stores them (``marshal``) under a key (:func:`cache_key`: the request's limits,
the caller's ids, the host layout, the caller's cgroups and the cgroup mounts,
boot, kernel, architecture, and the size, mtime and inode of every source file
they come from), and later runs with the same key load them instead. The file
(one per limits and installed corral: :func:`_cache_path`) lives in
``/run/corral/oneshot`` (root) or ``$XDG_RUNTIME_DIR/corral-oneshot``, a 0700
directory of the caller's own, and is read only if it is the caller's own regular
file writable by nobody else; a set-up that fails after a cache hit drops the
entry. Without such a directory every run computes.

Imports. Besides a bare interpreter's start, the path loads ``ctypes`` (the
syscalls), ``_signal`` and ``_socket`` (the C modules, without ``signal.py``'s
and ``socket.py``'s enums), ``zlib`` (built in: the cache file's name) and
corral's own modules it runs (not ``policy.outcomes`` after a clean exit); every
module here, in ``init/``, ``_sys_unsafe`` and ``uidpool`` keeps ``typing`` and
``collections.abc`` for annotations only (``TYPE_CHECKING = False``). A test
holds the set.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal.py's C module: no enums
import _socket
import errno
import os
import select
import sys
import time

from corral.providers.linux.host.cgroupfiles import CgroupDirs, listing, sandbox_name

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing (see "Imports" above)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Final

    #: (plan wire form, limits (mem_mb, max_processes, cpu_ms, disk_mb), seccomp program,
    #: cgroup facts (version, ((hierarchy, parent dir), ...), oom source))
    Prepared = tuple[dict[str, Any], tuple[Any, ...], bytes,
                     tuple[str, tuple[tuple[str, str], ...], str]]

__all__ = ["DEFAULT_TIMEOUT_MS", "MAX_STDERR", "MAX_STDOUT", "OneShot", "Report", "finish",
           "parse_argv", "run", "trace"]

#: ``corral run --timeout`` when not given (the CLI's; a test holds them equal)
DEFAULT_TIMEOUT_MS: Final = 60_000
#: the library's default output caps (``core.result``; a test holds them equal)
MAX_STDOUT: Final = 8 * 1024 * 1024
MAX_STDERR: Final = 1024 * 1024
_SIGINT: Final = _signal.SIGINT
_SIGTERM: Final = _signal.SIGTERM
_SIGKILL: Final = _signal.SIGKILL
_SIGCHLD: Final = _signal.SIGCHLD
_SIGXCPU: Final = _signal.SIGXCPU
_SIGXFSZ: Final = _signal.SIGXFSZ
#: what ``/proc/1/cmdline`` shows inside: the library's pid 1's (``zygote.PROCTITLE``;
#: a test holds them equal), never the caller's command line with its host paths
PROCTITLE: Final = b"corral"
_CPU_POLL_S: Final = 0.02
#: the CLI's flags this path takes (each with one integer value); anything else -> the
#: full CLI
_INT_FLAGS: Final = {"--timeout": "timeout_ms", "--mem-mb": "mem_mb", "--cpu-ms": "cpu_ms"}
_TRACE_VAR: Final = "CORRAL_CLI_TRACE"


class OneShot:
    """What ``corral run [--level strict] [--timeout MS] [--mem-mb N] [--cpu-ms MS]
    [--image REF] -- CMD`` asked for (a plain class: no dataclasses on this path, see
    "Imports")."""

    __slots__ = ("argv", "cpu_ms", "image", "mem_mb", "timeout_ms")

    def __init__(self, argv: tuple[str, ...], timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 mem_mb: int | None = None, cpu_ms: int | None = None,
                 image: str | None = None) -> None:
        self.argv = argv
        self.timeout_ms = timeout_ms
        self.mem_mb = mem_mb
        self.cpu_ms = cpu_ms
        self.image = image

    def __repr__(self) -> str:
        return (f"OneShot(argv={self.argv!r}, timeout_ms={self.timeout_ms}, "
                f"mem_mb={self.mem_mb}, cpu_ms={self.cpu_ms}, image={self.image!r})")


class Report:
    """How the run ended, in the terms ``RunResult`` takes."""

    __slots__ = ("cpu_ms", "detail", "exit_code", "limit", "maxrss_kb", "observed", "outcome",
                 "wall_ms")

    def __init__(self, outcome: str, exit_code: int | None, cpu_ms: int = 0,
                 maxrss_kb: int = 0, wall_ms: int = 0, limit: int | None = None,
                 observed: int | None = None, detail: str = "") -> None:
        self.outcome = outcome           # an Outcome value: exit, timeout, memory-limit ...
        self.exit_code = exit_code       # raw: negative = killed by that signal
        self.cpu_ms = cpu_ms
        self.maxrss_kb = maxrss_kb
        self.wall_ms = wall_ms
        self.limit = limit
        self.observed = observed
        self.detail = detail

    def __repr__(self) -> str:
        return f"Report({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"


def trace(msg: str) -> None:
    """With ``CORRAL_CLI_TRACE=1``: say on stderr which path ran (for tests) and, with
    ``CORRAL_CLI_TRACE=2``, when (ms since the process started, from its start time)."""
    level = os.environ.get(_TRACE_VAR)
    if level == "1":
        os.write(2, f"corral: trace: {msg}\n".encode())
    elif level == "2":
        os.write(2, f"corral: trace: {msg} (at {_since_start():.1f} ms)\n".encode())


def _since_start() -> float:
    """ms since this process started (its start time in /proc/self/stat, clock ticks)."""
    with open("/proc/self/stat", "rb") as f:
        start = int(f.read().rpartition(b")")[2].split()[19])
    with open("/proc/uptime", "rb") as f:
        up = float(f.read().split()[0])
    return (up - start / os.sysconf("SC_CLK_TCK")) * 1000


def parse_argv(argv: Sequence[str]) -> OneShot | None:
    """The request, if ``argv`` (without the program name) is in the subset this path
    takes; else None (the full CLI parses it)."""
    if len(argv) < 3 or argv[0] != "run":
        return None
    vals: dict[str, Any] = {}
    # the level: strict, given or the default (where strict cannot run here, the set-up
    # fails and the full CLI decides the fallback, with its warning)
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            cmd = argv[i + 1:]
            if "image" in vals:  # the image's command: a bare name on its PATH, inside
                if not cmd or not cmd[0] or ("/" in cmd[0] and not cmd[0].startswith("/")):
                    return None
                return OneShot(argv=tuple(cmd), **vals)
            path = _resolve(cmd[0]) if cmd else None
            if path is None:
                return None
            return OneShot(argv=(path, *cmd[1:]), **vals)
        name, eq, value = a.partition("=")
        if not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        i += 1
        if name == "--level":
            if value != "strict":
                return None
        elif name in _INT_FLAGS and value.isdigit() and value[0] != "0":
            vals[_INT_FLAGS[name]] = int(value)
        elif name == "--image" and value and "image" not in vals:
            vals["image"] = value
        else:
            return None
    return None


def _resolve(cmd: str) -> str | None:
    """The command as ``corral run --level strict`` runs it: a bare name looked up on
    this PATH (as ``shutil.which`` does), then the real file (the sandbox shows the
    host's /usr, not a venv's links). None for what the CLI resolves otherwise (a
    relative path with a slash is a path inside the sandbox) or reports (not found)."""
    if "/" not in cmd:
        found = _which(cmd)
        return None if found is None else os.path.realpath(os.path.abspath(found))
    return os.path.realpath(cmd) if os.path.isabs(cmd) else None


def _which(cmd: str) -> str | None:
    """``shutil.which(cmd)`` for a name without a slash, on POSIX, without loading shutil
    (a test holds them equal)."""
    path = os.environ.get("PATH")
    if path is None:
        path = os.confstr("CS_PATH") or os.defpath
    seen: set[str] = set()
    for d in path.split(os.pathsep) if path else ():
        if d not in seen:
            seen.add(d)
            name = os.path.join(d, cmd)
            if os.path.exists(name) and os.access(name, os.X_OK) and not os.path.isdir(name):
                return name
    return None


# -- the sandbox's side (C2, pid 1; C3, the view builder) ----------------------------------
def _send(sock: _socket.socket, text: str) -> None:
    try:
        sock.send(text.encode(errors="replace")[:4000])
    except OSError:
        pass


def _pid1(sock: _socket.socket, plan: Mapping[str, Any], prog: Any, procs: list[int],
          trees: list[int]) -> None:
    """C2: drop what is the caller's (its handlers, its descriptors), wait for the id
    maps, run the one bring-up (``pid1.bring_up``: view, cgroup, contain; its command line
    shown as the library's pid 1's), then start the command and report its exit. Never
    returns."""
    from corral.providers.linux import _sys_unsafe as su
    from corral.providers.linux.init import pid1
    for sig in (_SIGINT, _SIGTERM, _SIGCHLD):  # the caller's handlers are the caller's
        su.set_signal(sig, _signal.SIG_DFL)
    su.set_sigmask(_signal.SIG_SETMASK, ())
    try:
        _signal.set_wakeup_fd(-1)
        os.setsid()
        # only what C2 and C3 use stays open (not the caller's ends, not whatever else the
        # caller had open); contain() later leaves C2 the socket and /dev/null on 0/1/2
        low = 3
        for fd in sorted({sock.fileno(), *procs, *trees}):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 20)
        if sock.recv(16) != b"go":  # the maps are written (or the caller gave up)
            os._exit(72)
    except BaseException:
        os._exit(72)
    pid1.bring_up(plan, keep_fd=sock.fileno(), procs=procs, trees=trees, prog=prog,
                  report=lambda why: _send(sock, f"E {why}"), proctitle=PROCTITLE,
                  builder=False)
    if plan.get("image_root"):
        # as the library's pid 1: the image may hold files at the host interpreter's
        # paths, and no lazy import may run them here (_serve_one needs none)
        pid1.seal_file_imports()
    try:
        _serve_one(sock, plan)
    except BaseException as e:
        _send(sock, f"F {e}")  # after the set-up: the command may have run
    os._exit(0)


def _lookup(prog: str, path_env: str) -> str:
    """A bare command name as the agent's spawn finds it (``init.agent._resolve``): the
    first executable regular file of that name on ``path_env``; else ``prog`` as given
    (spawning it then fails: not found)."""
    if "/" in prog:
        return prog
    for d in path_env.split(":"):  # no import here: C2's imports are sealed by now
        cand = os.path.join(d or ".", prog)
        try:
            if os.stat(cand).st_mode & 0o170000 == 0o100000 and os.access(cand, os.X_OK):
                return cand
        except OSError:
            continue
    return prog


def _serve_one(sock: _socket.socket, plan: Mapping[str, Any]) -> None:
    """C2, contained: take the command and its three pipe ends, start it as the agent's
    ``spawn`` does, reap until it exits (pid 1 reaps every orphan), report."""
    from corral.providers.linux.init import contain
    # close-on-exec from the start (as ``fdpass`` receives): never a command's fd 3-5
    msg, anc, _f, _a = sock.recvmsg(1 << 16, _socket.CMSG_SPACE(3 * 4),
                                    _socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, data in anc:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(data[i:i + 4], sys.byteorder)
                    for i in range(0, len(data) - len(data) % 4, 4)]
    if len(fds) != 3 or not msg:
        raise OSError(errno.EBADF, "the command needs three descriptors")
    argv = msg.decode("utf-8", "surrogateescape").split("\0")
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    _signal.set_wakeup_fd(wake_w)
    _signal.signal(_SIGCHLD, lambda *_: None)
    _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)
    env = dict(plan["env_base"])
    try:
        if plan.get("image_root"):  # the image's WorkingDir; a bare name on its PATH
            os.chdir(plan["cwd"])
        pid = contain.spawn(_lookup(argv[0], env.get("PATH", "")), argv, env, fds)
    except OSError as e:
        _send(sock, f"S {e.errno or 0} {argv[0]}: {e.strerror}")
        return
    finally:
        for fd in fds:
            os.close(fd)
    contain.limit_cpu(pid, plan.get("cpu_rlimit_s"))
    while True:
        try:
            got, status, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if got == pid:
            free = -1
            try:
                st = os.statvfs(plan["work_dir"])
                free = st.f_bavail * st.f_frsize
            except OSError:
                pass
            cpu_ms = int((ru.ru_utime + ru.ru_stime) * 1000)
            _send(sock, f"X {os.waitstatus_to_exitcode(status)} {cpu_ms} {ru.ru_maxrss} {free}")
            return
        if got:
            continue
        if _woken([sock.fileno()], wake_r, None) and not sock.recv(16):
            os._exit(0)  # the caller is gone: the pid namespace dies with us


def _woken(fds: list[int], wake_r: int, timeout: float | None) -> list[int]:
    """Wait until one of ``fds`` is readable or a signal arrives (``wake_r``, the wakeup
    fd's pipe, is then drained); the readable ones among ``fds``."""
    try:
        ready, _, _ = select.select([*fds, wake_r], [], [], timeout)
    except InterruptedError:
        return []
    if wake_r in ready:
        try:
            while os.read(wake_r, 4096):
                pass
        except BlockingIOError:
            pass
    return [fd for fd in ready if fd != wake_r]


# -- the caller's side ------------------------------------------------------------------
class _Limits:
    """The plan's merged limits (``SandboxPlan.limits``), as the run needs them."""

    __slots__ = ("cpu_ms", "disk_mb", "max_processes", "mem_mb")

    def __init__(self, mem_mb: int | None, max_processes: int | None, cpu_ms: int | None,
                 disk_mb: int | None) -> None:
        self.mem_mb = mem_mb
        self.max_processes = max_processes
        self.cpu_ms = cpu_ms
        self.disk_mb = disk_mb


def _make_cgroup(facts: tuple[str, tuple[tuple[str, str], ...], str], limits: _Limits
                 ) -> CgroupDirs:
    """The sandbox's cgroup, as ``CgroupManager.create`` makes it (``CgroupDirs.make``,
    the same name and limits); OSError on any failure (nothing left)."""
    full = sandbox_name("corral", os.getpid(), os.urandom(6).hex())
    try:
        return CgroupDirs.make(full, facts[0], facts[1], facts[2], limits.mem_mb,
                               limits.max_processes)
    except OSError:
        raise
    except Exception as err:  # v2_enable's ProviderError: the library path says why
        raise OSError(errno.EIO, f"cannot create cgroup {full}: {err}") from err


def _reap_orphans(facts: tuple[str, tuple[tuple[str, str], ...], str]) -> None:
    """Remove the sandbox cgroups whose owner died (a ``corral run`` killed by SIGKILL
    cannot remove its own; a library ``LinuxProvider()`` start does the same), each
    emptied first. Said on stderr, never fatal."""
    for name, dirs in listing(facts[1], orphaned=True, by_first=True).items():
        try:
            CgroupDirs(name, facts[0], dirs, facts[2]).remove()
        except OSError as e:
            os.write(2, f"corral: warning: {e}\n".encode(errors="replace"))


class _Setup:
    """What the caller made for one run, undone by :meth:`close` on every path."""

    def __init__(self) -> None:
        self.cg: CgroupDirs | None = None
        #: the host's cgroup facts, once a cgroup was made: close() reaps orphans then
        self.cg_facts: tuple[str, tuple[tuple[str, str], ...], str] | None = None
        self.uids: Any = None
        self.fds: list[int] = []
        self.pidfd = -1
        self.pid = 0

    def kill(self) -> None:
        if self.pidfd >= 0:
            try:
                _signal.pidfd_send_signal(self.pidfd, _SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        if self.pid:
            self.kill()
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = 0
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        try:
            if self.cg is not None:
                cg, self.cg = self.cg, None
                try:
                    cg.remove()
                except OSError as e:  # said, never silent
                    os.write(2, f"corral: warning: {e}\n".encode(errors="replace"))
            if self.cg_facts is not None:
                facts, self.cg_facts = self.cg_facts, None
                _reap_orphans(facts)
        finally:
            if self.uids is not None:
                self.uids.close()
                self.uids = None


def _cpu_of(cg: CgroupDirs | None) -> int:
    try:
        return cg.cpu_ms() if cg is not None else 0
    except (OSError, ValueError):
        return 0


# -- the plan, the filter and the host's cgroup facts: computed once, then cached ---------
#: bump when the cached value's shape changes
_CACHE_FORMAT: Final = 1
#: the sources the cached value comes from (under the ``corral`` package): any change
#: to one of them (mtime, size, inode) makes the cache miss
_KEY_SOURCES: Final = (
    "core/spec.py", "core/errors.py", "providers/linux/oneshot.py",
    "providers/linux/_sys_unsafe.py", "providers/linux/policy/plan.py",
    "providers/linux/policy/seccomp.py", "providers/linux/policy/bpf.py",
    "providers/linux/policy/syscall_numbers.py", "providers/linux/init/mounts.py",
    "providers/linux/host/cgroups.py", "providers/linux/host/cgroupfs.py",
    "providers/linux/host/cgroupfiles.py")

_PACKAGE_DIR: list[str] = []  # _package_dir's answer, once found


def _package_dir() -> str:
    if not _PACKAGE_DIR:
        import corral  # the package itself (its __init__ may not have run: see _corral_cli)
        _PACKAGE_DIR.append(os.path.dirname(os.path.realpath(str(corral.__file__))))
    return _PACKAGE_DIR[0]


def host_facts() -> dict[str, Any]:
    """``mounts.detect_host_layout()``'s fields, without building the ``HostLayout`` (a
    dataclass of the plan module)."""
    from corral.providers.linux.init import mounts
    return mounts.host_fields()


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def cache_key(req: OneShot) -> tuple[Any, ...]:
    """Everything the cached value depends on: the request's limits, the caller's ids,
    the host layout the plan is built from, this process's cgroups and the cgroup
    mounts (what cgroup detection reads), the boot, kernel and architecture, and the
    sources that compute it."""
    here = _package_dir()
    srcs = []
    for rel in _KEY_SOURCES:
        st = os.stat(os.path.join(here, rel))
        srcs.append((rel, st.st_mtime_ns, st.st_size, st.st_ino))
    mountinfo = b"\n".join(line for line in _read_bytes("/proc/self/mountinfo").splitlines()
                           if b" - cgroup" in line)
    uts = os.uname()
    return (_CACHE_FORMAT, req.mem_mb, req.cpu_ms, tuple(sorted(host_facts().items())),
            _read_bytes("/proc/self/cgroup"), mountinfo,
            _read_bytes("/proc/sys/kernel/random/boot_id"), uts.release, uts.machine,
            tuple(srcs))


def cache_dir() -> str | None:
    """Where this caller's cache lives: ``/run/corral/oneshot`` for root,
    ``$XDG_RUNTIME_DIR/corral-oneshot`` otherwise (none without it). Made 0700; used
    only if it is the caller's own, a real directory, and writable by nobody else."""
    euid = os.geteuid()
    if euid == 0:
        base, name = "/run/corral", "oneshot"
        try:
            os.makedirs(base, mode=0o755, exist_ok=True)
        except OSError:
            return None
    else:
        base, name = os.environ.get("XDG_RUNTIME_DIR", ""), "corral-oneshot"
        if not base.startswith("/"):
            return None
    d = os.path.join(base, name)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(d)
    except OSError:
        return None
    import stat
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != euid or st.st_mode & 0o077:
        return None
    return d


def _cache_path(req: OneShot) -> str | None:
    """The request's cache file: one slot of at most 64, picked by the limits and by
    the installed corral it comes from (its package directory), so two checkouts or
    venvs used in turn (a benchmark against main, several worktrees) keep a file each
    instead of overwriting one another's on every run."""
    d = cache_dir()
    if d is None:
        return None
    import zlib  # a built-in C module: no Python file to load
    seed = f"{_package_dir()}\0{req.mem_mb or 0}\0{req.cpu_ms or 0}".encode(errors="replace")
    return os.path.join(d, f"plan-{zlib.crc32(seed) % 64}")


def _cache_load(path: str, key: tuple[Any, ...]) -> Prepared | None:
    """The cached value for ``key``; None if absent, for another key, or not the
    caller's own file (owned by it, writable by nobody else)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        data = b""
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    finally:
        os.close(fd)
    import marshal
    try:
        got_key, value = marshal.loads(data)
    except (ValueError, EOFError, TypeError):
        return None
    return value if got_key == key else None


def _cache_store(path: str, key: tuple[Any, ...], value: Prepared) -> None:
    """Best effort: a new file, renamed over the old one."""
    import marshal
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return
    try:
        try:
            os.write(fd, marshal.dumps((key, value)))
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def compute(req: OneShot) -> Prepared | None:
    """What the library path decides for this request: the plan
    (``policy.plan.build_plan`` with the provider's default options and
    ``mounts.detect_host_layout``), the seccomp filter (``policy.seccomp.build_filter``),
    and the cgroup facts (``CgroupManager().support``, the plan's limits checked by
    ``require``). None when this path does not run it (limits set per command), or the
    library path would refuse it (it then says why)."""
    from corral.core.errors import CorralError
    from corral.core.spec import Level, SandboxLimits, SandboxSpec
    from corral.providers.linux import _sys_unsafe as su
    from corral.providers.linux.host.cgroups import CgroupManager
    from corral.providers.linux.init import mounts
    from corral.providers.linux.policy import seccomp
    from corral.providers.linux.policy.plan import LinuxOptions, build_plan
    try:
        host = mounts.detect_host_layout()
        spec = SandboxSpec(tenant_id="corral-run", run_id=os.urandom(8).hex(),
                           level=Level.STRICT, image=req.image,
                           limits=SandboxLimits(mem_mb=req.mem_mb, cpu_ms=req.cpu_ms))
        options = LinuxOptions()
        if req.image is None:
            plan = build_plan(spec, options=options, host=host)
        else:
            plan = build_plan(spec, options=options, host=host,
                              image_root=_image_root(req.image, options, host))
        if plan.command_rlimits or plan.limits_by != "cgroup":
            # limits set per command: the agent's spawn applies them, this path not
            trace("the plan sets rlimits per command; library path")
            return None
        cgroups = CgroupManager()
        cgroups.require(plan.limits)
        prog = seccomp.build_filter(su.machine_arch())
    except CorralError as e:
        trace(f"one-shot set-up failed ({e}); library path")
        return None
    lim = plan.limits
    sup = cgroups.support
    return (plan.to_wire(), (lim.mem_mb, lim.max_processes, lim.cpu_ms, lim.disk_mb), prog,
            (sup.version, tuple(sup.parents.items()), sup.oom_source))


def _image_root(image: str, options: Any, host: Any) -> Any:
    """``--image``: the image as the library's provider takes it (the default image
    cache, reachable by the sandbox's uid; ``host.imageroot``), pulled never: a
    reference not in the cache is the library path's to pull (and report)."""
    from corral.images.cache import ImageCache
    from corral.providers.linux.host.imageroot import image_root_of, reachable
    from corral.providers.linux.policy.plan import _id_maps
    (_u, uid_out, _n), (_g, gid_out, _m) = _id_maps(options, host)
    return image_root_of(reachable(image, ImageCache(), uid_out, gid_out,
                                   pull_policy="never"))


def _prepare(req: OneShot) -> tuple[Prepared | None, str | None]:
    """(:func:`compute`'s value, from the cache when its key matches; the cache file
    that gave it, if one did). A run with ``--image`` always computes: its plan
    depends on the image (its files, its config, the image cache's state), which the
    key does not see, and unpacking records the image's use for the cache's eviction."""
    if req.image is not None:
        return compute(req), None
    key = cache_key(req)
    path = _cache_path(req)
    got = _cache_load(path, key) if path is not None else None
    if got is not None:
        return got, path
    got = compute(req)
    if got is not None and path is not None:
        _cache_store(path, key, got)
    return got, None


def run(req: OneShot, *, out_fd: int = 1, err_fd: int = 2) -> Report | None:
    """Run ``req`` in a fresh strict sandbox made by this process; the command's
    output goes to ``out_fd``/``err_fd`` as it arrives. None: the sandbox could not be
    set up (nothing of the command ran); take the library path."""
    from corral.providers.linux import _sys_unsafe as su
    from corral.providers.linux.host.uidpool import SandboxUids
    from corral.providers.linux.init import clone, contain, mounts, pid1  # noqa: F401  # C2 runs them

    started = time.monotonic()
    trace("one-shot imported")
    s = _Setup()
    stop: list[int] = []  # SIGINT/SIGTERM received: cancel (the relay kills the sandbox)

    def on_signal(signum: int, _frame: object) -> None:
        stop.append(signum)

    old = {sig: _signal.signal(sig, on_signal) for sig in (_SIGINT, _SIGTERM)}
    cached: str | None = None
    try:
        try:
            prepared, cached = _prepare(req)
            if prepared is None:
                return None
            trace("plan from the cache" if cached else "plan computed")
            wire, lims, prog_bytes, cg_facts = prepared
            limits = _Limits(*lims)
            prog = su.Seccomp(prog_bytes)
            del prepared, prog_bytes
            su.preresolve()
            if cg_facts[0] != "none":
                s.cg_facts = cg_facts
                s.cg = _make_cgroup(cg_facts, limits)
            procs = [os.open(p, os.O_WRONLY | os.O_CLOEXEC)
                     for p in (s.cg.join_files if s.cg is not None else ())]
            s.fds += procs
            s.uids = SandboxUids()
            uid, gid, _pooled, trees = clone.prepare(wire, s.uids)
            s.fds += trees
            mine, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
            s.fds += [mine.fileno(), theirs.fileno()]
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            s.fds += [in_r, in_w, out_r, out_w, err_r, err_w]
            flags = wire["namespaces"] & ~su.CLONE_NEWCGROUP  # C2 unshares that one itself
            switch = s.uids.root and (uid, gid) != (0, 0)
            if switch:  # the new user namespace is owned by the sandbox's own uid
                su.keep_caps_on_setuid()
            pid, pidfd = clone.clone_pid1(flags, uid, gid, switch=switch)
            if pid == 0:
                try:
                    _pid1(theirs, wire, prog, procs, trees)
                finally:
                    os._exit(70)
            s.pid, s.pidfd = pid, pidfd
            for fd in (*procs, *trees, theirs.detach()):
                os.close(fd)
                s.fds.remove(fd)
            clone.write_maps(pid, uid, gid, (wire["uid_map"][0], wire["gid_map"][0]))
            mine.send(b"go")
            mine.sendmsg([b"\0".join(os.fsencode(a) for a in req.argv)],
                         [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                           b"".join(fd.to_bytes(4, sys.byteorder)
                                    for fd in (in_r, out_w, err_w)))])
            for fd in (in_r, in_w, out_w, err_w):  # stdin: closed, as the library's default
                os.close(fd)
                s.fds.remove(fd)
            del wire, prog
        except OSError as e:
            _forget(cached)
            trace(f"one-shot set-up failed ({e}); library path")
            return None
        trace("one-shot path")
        set_up = time.monotonic()
        try:
            return _relay(req, s, mine, out_r, err_r, limits, started, stop,
                          out_fd=out_fd, err_fd=err_fd)
        except _SetupFailed as e:
            _forget(cached)
            trace(f"one-shot sandbox set-up failed ({e}); library path")
            return None
        finally:
            ran = time.monotonic()
            s.close()
            trace(f"one-shot ms: set-up {(set_up - started) * 1000:.1f}, run "
                  f"{(ran - set_up) * 1000:.1f}, clean-up {(time.monotonic() - ran) * 1000:.1f}"
                  f"{_peak_rss()}")
    finally:
        s.close()
        for sig, h in old.items():
            _signal.signal(sig, h)


def _peak_rss() -> str:
    """With ``CORRAL_CLI_TRACE=2``: this process's peak resident set so far."""
    if os.environ.get(_TRACE_VAR) != "2":
        return ""
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                return f"; peak RSS {int(line.split()[1]) / 1024:.1f} MiB"
    return ""


def _forget(cached: str | None) -> None:
    """A set-up from a cached value failed: drop it, so the next run computes afresh
    (the host changed in a way the key does not see, say)."""
    if cached is not None:
        try:
            os.unlink(cached)
        except OSError:
            pass


class _SetupFailed(Exception):
    """pid 1 said the sandbox could not be built (nothing of the command ran)."""




def _write_all(fd: int, data: bytes) -> bool:
    """Write ``data`` to ``fd``; False once the reader is gone (the rest is dropped)."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        return False
    return True


def _relay(req: OneShot, s: _Setup, sock: _socket.socket, out_r: int, err_r: int,
           limits: _Limits, started: float, stop: list[int], *, out_fd: int, err_fd: int
           ) -> Report | None:
    """Stream the output, wait for the exit report; timeout, cpu_ms, output caps and
    SIGINT/SIGTERM (``stop``, filled by the caller's handlers) kill the whole sandbox."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    s.fds += [wake_r, wake_w]
    old_wake = _signal.set_wakeup_fd(wake_w)
    try:
        return _loop(req, s, sock, out_r, err_r, limits, started, wake_r, stop,
                     out_fd=out_fd, err_fd=err_fd)
    finally:
        _signal.set_wakeup_fd(old_wake)


def _loop(req: OneShot, s: _Setup, sock: _socket.socket, out_r: int, err_r: int,
          limits: _Limits, started: float, wake_r: int, stop: list[int], *,
          out_fd: int, err_fd: int) -> Report | None:
    deadline = started + req.timeout_ms / 1000
    streams = {out_r: [out_fd, MAX_STDOUT, 0, True], err_r: [err_fd, MAX_STDERR, 0, True]}
    live = [out_r, err_r]
    report: str | None = None
    killed = ""          # why we killed the sandbox: timeout, cpu, output, cancelled
    over = 0             # the pipe that passed its cap first
    cpu_over = 0
    sock_open = True
    failure = ""         # pid 1 failed after its set-up
    eof_deadline: float | None = None
    while live or (sock_open and report is None):
        now = time.monotonic()
        if report is not None or not sock_open:  # the end is near: a short grace for EOF
            eof_deadline = eof_deadline or now + 0.5
            if now >= eof_deadline:
                break
        if not killed:
            if stop:
                killed = "cancelled"
                s.kill()
            elif now >= deadline:
                killed = "timeout"
                s.kill()
            elif req.cpu_ms is not None and s.cg is not None:
                used = _cpu_of(s.cg)
                if used >= req.cpu_ms:
                    killed, cpu_over = "cpu", max(used, req.cpu_ms, 1)
                    s.kill()
        wait = 0.5 if killed else max(0.0, deadline - now)
        if req.cpu_ms is not None and not killed:
            wait = min(wait, _CPU_POLL_S)
        if eof_deadline is not None:
            wait = min(wait, max(0.0, eof_deadline - now))
        watch = [*live] + ([sock.fileno()] if sock_open and report is None else [])
        for fd in _woken(watch, wake_r, wait):
            if fd in streams:
                chunk = os.read(fd, 65536)
                if not chunk:
                    live.remove(fd)
                    continue
                st = streams[fd]
                room = st[1] - st[2]
                st[2] += len(chunk)
                if st[3] and room > 0:
                    st[3] = _write_all(st[0], chunk[:room])
                if st[2] > st[1] and not over:
                    over = 1 if fd == out_r else 2
                    if not killed:
                        killed = "output"
                        s.kill()
            elif fd == sock.fileno():
                try:
                    msg = sock.recv(8192)
                except ConnectionResetError:
                    # pid 1 exited with our message unread: the kernel reports that
                    # first, then what pid 1 sent before it went (its "E ...")
                    continue
                if not msg:
                    sock_open = False
                elif msg.startswith(b"E "):  # set-up failed: nothing of the command ran
                    if report is None and not killed:
                        raise _SetupFailed(msg[2:].decode(errors="replace"))
                elif msg.startswith(b"F "):
                    failure = msg[2:].decode(errors="replace")
                else:
                    report = msg.decode(errors="replace")
    wall = int((time.monotonic() - started) * 1000)
    if report is not None and report.startswith("S "):  # could not start: as a shell says
        _no, _, reason = report[2:].partition(" ")
        _write_all(err_fd, reason.encode() + b"\n")
        status = 127 if "not found" in reason or "No such file" in reason else 126
        return Report("exit", status, wall_ms=wall, detail=reason)
    code: int | None = None
    cpu = rss = 0
    free = -1
    if report is not None and report.startswith("X "):
        c, cpu, rss, free = (int(x) for x in report[2:].split())
        code = c
    if killed == "cancelled":
        return Report("cancelled", code, cpu, rss, wall)
    if killed == "timeout":
        return Report("timeout", code, cpu, rss, wall, limit=req.timeout_ms)
    if over:
        cap = streams[out_r if over == 1 else err_r]
        return Report("overflow-stdout" if over == 1 else "overflow-stderr", code, cpu, rss,
                      wall, limit=cap[1], observed=cap[2],
                      detail="the command wrote more than the output cap; it was killed")
    if killed == "cpu":
        return Report("cpu-limit", -_SIGKILL, cpu, rss, wall, limit=req.cpu_ms,
                      observed=cpu_over, detail=_cpu_killed())
    if code is None:  # pid 1 died without a report
        if limits.mem_mb is not None and s.cg is not None and _oom_kills(s.cg):
            return Report("memory-limit", -_SIGKILL, wall_ms=wall, limit=limits.mem_mb,
                          observed=_peak_mb(s.cg),
                          detail="the sandbox was killed by the out-of-memory killer")
        return Report("provider-error", None, wall_ms=wall,
                      detail=f"the sandbox's pid 1 failed: {failure}" if failure else
                      "the sandbox's pid 1 died before the command's exit was reported")
    hit = _limit_hit(limits, s.cg, code, cpu, free)
    if hit is not None:
        outcome, limit, observed, detail = hit
        return Report(outcome, code, cpu, rss, wall, limit=limit, observed=observed,
                      detail=detail)
    return Report("exit", code, cpu, rss, wall)


def _oom_kills(cg: CgroupDirs) -> int:
    try:
        return cg.oom_kills()
    except (OSError, ValueError):
        return 0


def _peak_mb(cg: CgroupDirs) -> int | None:
    try:
        return cg.peak_mb() or None
    except (OSError, ValueError):
        return None


def _pids_max_events(cg: CgroupDirs) -> int:
    try:
        return cg.pids_max_events()
    except (OSError, ValueError):
        return 0


def _cpu_killed() -> str:
    from corral.providers.linux.policy.outcomes import CPU_KILLED
    return CPU_KILLED


def _limit_hit(lim: _Limits, cg: CgroupDirs | None, code: int, cpu_ms: int, disk_free: int
               ) -> tuple[str, int, int | None, str] | None:
    """Which limit ended the command, if one did: the provider's rules
    (:func:`corral.providers.linux.policy.outcomes.limit_hit`), on this path's facts (a
    fresh cgroup: any OOM kill or refused fork is this command's). A clean exit (0) is
    none, by those rules when the host did not kill the sandbox (``cpu_killed_at=0``
    here: that kill is reported before this): answered without loading them, the
    common case (a test holds the two equal)."""
    if code == 0:
        return None
    from corral.providers.linux.policy.outcomes import limit_hit
    return limit_hit(
        code, mem_mb=lim.mem_mb, cpu_ms=lim.cpu_ms, max_processes=lim.max_processes,
        disk_mb=lim.disk_mb, by_rlimit=False, cpu_killed_at=0,
        cpu_used=lambda: max(cpu_ms, _cpu_of(cg)),
        oom_rose=lambda: cg is not None and _oom_kills(cg) > 0,
        peak_mb=lambda: _peak_mb(cg) if cg is not None else None,
        pids_refused=lambda: cg is not None and _pids_max_events(cg) > 0,
        disk_free=disk_free)


def finish(report: Report) -> int:
    """Say how a run that did not simply exit ended (as ``corral run`` does) and return
    the exit status from the one table."""
    if report.outcome == "exit":
        rc = report.exit_code or 0
        return 128 - rc if rc < 0 else rc
    if report.outcome == "provider-error":
        from corral.core.errors import ProviderError
        err = ProviderError(report.detail)
        os.write(2, f"corral: {err.code}: {err.message}\n".encode())
        return err.exit_status
    from corral.core.result import Outcome, RunResult, exit_status_of
    from corral.core.spec import ResourceUsage
    result = RunResult(outcome=Outcome(report.outcome), exit_code=report.exit_code,
                       duration_ms=float(report.wall_ms), limit_value=report.limit,
                       observed=report.observed, detail=report.detail, cwd="/work",
                       usage=ResourceUsage(cpu_ms=report.cpu_ms, wall_ms=report.wall_ms,
                                           peak_mem_mb=-(-report.maxrss_kb // 1024)))
    error = result.error()
    os.write(2, f"corral: {result.outcome}: {error.message if error else ''}\n".encode())
    return exit_status_of(result)
