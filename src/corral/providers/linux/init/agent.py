"""The in-sandbox agent: pid 1 of the sandbox, serving the host over one socket.

Forked from the zygote with everything it needs already imported. It runs
the containment checklist, says ``ready`` (or one error line), then serves
requests until the host closes the socket; it exits then, and the kernel
kills every other process of the pid namespace with it.

Frames both ways: one JSON line, followed by ``len`` raw bytes when the
header has a ``len``. A ``spawn`` request carries the command's stdin,
stdout and stderr pipe ends as SCM_RIGHTS, so output flows straight from
the command to the host, never through the agent. Commands start with
posix_spawn in a new session (their own process group, no controlling
terminal), with fds 0/1/2 only and default signal dispositions.

A ``fork_call`` request starts a process the same way but without execve: the
agent forks and the child calls one of the registered fork entries (an
in-process entry point the host preloaded in the zygote and registered with
:func:`register_fork_entries`, e.g. a snippet worker that runs one snippet and
exits; the host's caller names it, this module names none), so the child shares
the zygote's loaded pages instead of starting an interpreter. When it exits, the
agent SIGKILLs its process group (whatever it started and left behind). The
child gets what a spawned command gets (new session, the passed pipes on 0/1/2
and no other descriptor, the request's env as ``os.environ``, the cwd, the CPU
rlimit, a fresh interpreter's signal dispositions) and keeps what the agent has
(namespaces, no capabilities, no_new_privs, seccomp, rlimits, not dumpable). Its
memory is a copy of the agent's; the zygote runs with an empty environment and
holds no secrets.

Imports: the zygote drops corral's import root from ``sys.path`` and
empties the ``__path__`` of corral's packages (:func:`seal_imports`) before
it forks any sandbox, so no import, lazy or not, in the agent or a forked
child can load code from the sandbox's writable area (where a host import
root under ``/work`` or ``/tmp`` would land).
"""

from __future__ import annotations

import _random
import errno
import io
import os
import resource
import select
import signal
import socket
import stat
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Final

from corral.core.errors import ConfigInvalidError
from corral.providers.confined import (
    list_dir_under,
    make_dir_under,
    read_file_under,
    remove_under,
    split_relative,
    stat_under,
    write_file_under,
)
from corral.providers.linux import _sys_unsafe as su, fdpass as _fdpass, snapshots
from corral.providers.linux.init import contain
from corral.wire import agent as _frames, agentmsg as _msg

__all__ = ["RAW_STDIO", "fork_entries", "main", "register_fork_entries", "seal_imports"]

_MAX_FDS: Final = 3
_RESET_SIGNALS: Final = contain.RESET_SIGNALS
#: a fork entry function with this attribute set true does its own I/O on descriptors
#: 0/1/2 (``os.read``/``os.write``): its child keeps the agent's ``sys.stdin``/``stdout``/
#: ``stderr`` objects (on the same descriptor numbers, buffers empty: the agent never uses
#: them) instead of building three text wrappers it would not use
RAW_STDIO: Final = "corral_raw_stdio"
_SIG_DFL: Final = int(signal.SIG_DFL)
_SIG_IGN: Final = int(signal.SIG_IGN)
_SIGINT: Final = int(signal.SIGINT)
_SIG_SETMASK: Final = int(signal.SIG_SETMASK)
#: a fork_call child's dispositions, as a fresh interpreter has them (plain ints: see _become)
_DFL_IN_CHILD: Final = tuple(int(s) for s in (signal.SIGCHLD, signal.SIGHUP, signal.SIGTERM,
                                              signal.SIGXCPU))
_IGN_IN_CHILD: Final = tuple(int(s) for s in (signal.SIGPIPE, signal.SIGXFSZ))
#: what ``fork_call`` may run: ``module:function``, called with the request's args (a
#: list of str); registered by the zygote's preload (its module loaded), inherited by
#: every agent forked after it
_FORK_ENTRIES: set[str] = set()


def register_fork_entries(entries: object) -> list[str]:
    """Register ``module:function`` entries whose module is loaded and whose function
    exists (in the zygote, after a preload); returns those refused."""
    refused: list[str] = []
    for entry in entries if isinstance(entries, list) else ():
        modname, sep, fname = str(entry).partition(":")
        module = sys.modules.get(modname) if sep and fname else None
        if module is None or not callable(getattr(module, fname, None)):
            refused.append(str(entry))
        else:
            _FORK_ENTRIES.add(str(entry))
    return refused


def fork_entries() -> frozenset[str]:
    """The entries ``fork_call`` may run here."""
    return frozenset(_FORK_ENTRIES)


def _reseed_random() -> None:
    """What ``random``'s at-fork hook does, which a bare fork (``fork_call``) skips: a
    child gets a fresh state from the OS, never the one its siblings share. The C
    seed straight, as ``Random.seed(None)`` does (its Python layer copies more pages)."""
    module = sys.modules.get("random")
    inst = getattr(module, "_inst", None) if module is not None else None
    if inst is not None:
        _random.Random.seed(inst, None)
        inst.gauss_next = None


def seal_imports() -> Callable[[], None]:
    """No import from corral's import root from now on (see the module docstring).

    The zygote seals itself once, so every agent forked from it starts sealed
    and touches none of these objects (each module it would touch costs every
    sandbox a copied page). Returns the undo, for the zygote's preloads."""
    import corral
    pkg = os.path.dirname(os.path.abspath(str(corral.__file__)))
    root = os.path.dirname(pkg)
    saved_path = list(sys.path)
    saved: dict[str, Any] = {}
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) not in (root, pkg)]
    for name, module in list(sys.modules.items()):
        if (name == "corral" or name.startswith("corral.")) and hasattr(module, "__path__"):
            saved[name] = module.__path__
            module.__path__ = []
    sys.path_importer_cache.clear()

    def unseal() -> None:
        sys.path[:] = saved_path
        for name, path in saved.items():
            sys.modules[name].__path__ = path
        sys.path_importer_cache.clear()

    return unseal


class _Agent:
    def __init__(self, sock: socket.socket, plan: Mapping[str, Any]) -> None:
        self.sock = sock
        self.work = str(plan["work_dir"])
        self.cwd = str(plan.get("cwd") or self.work)  # an image root's WorkingDir
        self.cpu_s: int | None = plan.get("cpu_rlimit_s")
        #: rlimits each command gets in its own process before it runs (limits_by "rlimit")
        self.command_rlimits = [(getattr(resource, str(n)), int(a), int(b))
                                for n, a, b in plan.get("command_rlimits", ())]
        self.decoder = _frames.Decoder.trusted()
        self.fds: list[int] = []
        self.children: set[int] = set()
        self.forked: set[int] = set()  # fork_call children: their group dies with them
        self.nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]

    # -- I/O ------------------------------------------------------------------
    def send(self, header: Mapping[str, Any], payload: bytes = b"") -> None:
        self.sock.sendall(_frames.encode(header, payload))

    def _fill(self) -> bool:
        data, fds = _fdpass.recv(self.sock, max_fds=_MAX_FDS)
        for fd in fds:
            os.set_inheritable(fd, False)
        self.fds.extend(fds)
        self.decoder.feed(data)  # descriptors are taken per request (_take_stdio)
        return bool(data)

    # -- requests ---------------------------------------------------------------
    def handle(self, h: dict[str, Any], payload: bytes) -> None:
        """Serve one request (:mod:`corral.wire.agentmsg`) and send its reply."""
        rid = h.get("id")
        req: _msg.Request | None = None
        out = b""
        try:
            req = _msg.decode_request(h)
            if type(req) is _msg.SocketReq:
                self.new_socket(rid, req)
                return
            reply, out = _SERVE[type(req)](self, req, payload)
        except _msg.BadMessage as e:
            reply = _msg.Failed(ConfigInvalidError("op", e.reason).to_dict())
        except ConfigInvalidError as e:
            reply = _msg.Failed(e.to_dict())
        except OSError as e:
            path = getattr(req, "path", "") if req is not None else ""
            if type(e) is FileNotFoundError and type(req) not in _FILE_OPS:
                # a spawn's cwd, a restore's dir: the caller's input names nothing here
                reply = _msg.Failed(ConfigInvalidError(
                    "path", f"no such file: {e.filename or path!r}").to_dict())
            else:
                reply = _msg.OsFailed(e.errno or 0, e.strerror or str(e), str(path))
        self.send({"id": rid, **_msg.encode_reply(reply)}, out)

    def _done(self, _req: object, _payload: bytes) -> tuple[_msg.Reply, bytes]:
        return _msg.DONE, b""

    def _kill_req(self, req: _msg.Kill, _payload: bytes) -> tuple[_msg.Reply, bytes]:
        self.kill(req.pid, req.sig)
        return _msg.DONE, b""

    def _write(self, req: _msg.Write, payload: bytes) -> tuple[_msg.Reply, bytes]:
        write_file_under(self.work, req.path, payload, root_alias=self.work)
        return _msg.DONE, b""

    def _read(self, req: _msg.Read, _payload: bytes) -> tuple[_msg.Reply, bytes]:
        return _msg.DONE, read_file_under(self.work, req.path, root_alias=self.work)

    def _list(self, req: _msg.ListDir, _payload: bytes) -> tuple[_msg.Reply, bytes]:
        entries = list_dir_under(self.work, req.path, root_alias=self.work,
                                 max_entries=_msg.MAX_ENTRIES)
        return _msg.Listing(len(entries)), _msg.encode_listing(
            [_msg.EntryInfo(*e) for e in entries])

    def _remove(self, req: _msg.Remove, _payload: bytes) -> tuple[_msg.Reply, bytes]:
        remove_under(self.work, req.path, recursive=req.recursive, root_alias=self.work)
        return _msg.DONE, b""

    def _mkdir(self, req: _msg.MakeDir, _payload: bytes) -> tuple[_msg.Reply, bytes]:
        created = make_dir_under(self.work, req.path, parents=req.parents,
                                 root_alias=self.work)
        return _msg.Made(created), b""

    def _stat(self, req: _msg.Stat, _payload: bytes) -> tuple[_msg.Reply, bytes]:
        return _msg.EntryInfo(*stat_under(self.work, req.path, root_alias=self.work)), b""

    def _snapshot(self, _req: _msg.Snapshot, _payload: bytes) -> tuple[_msg.Reply, bytes]:
        return _msg.DONE, snapshots.tar_dir(self.work)

    def _restore(self, _req: _msg.Restore, payload: bytes) -> tuple[_msg.Reply, bytes]:
        snapshots.replace_dir(self.work, payload)
        return _msg.DONE, b""

    def _spawn_req(self, req: _msg.Spawn, _payload: bytes) -> tuple[_msg.Reply, bytes]:
        return self.spawn(req), b""

    def _fork_req(self, req: _msg.ForkCall, _payload: bytes) -> tuple[_msg.Reply, bytes]:
        return self.fork_call(req), b""

    def new_socket(self, rid: Any, req: _msg.SocketReq) -> None:
        """Reply with a fresh, unbound TCP socket of the sandbox's network namespace
        (``family``: 4 or 6), passed to the host as SCM_RIGHTS. The host binds or
        connects it itself: a socket stays in the namespace it was made in, so the
        host's egress listener on 127.0.0.1 and its preview-URL connections to a port
        inside live here while the host drives them. The agent keeps no copy."""
        family = socket.AF_INET6 if req.family == 6 else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            data = _frames.encode({"id": rid, **_msg.encode_reply(_msg.DONE), "nfds": 1})
            n = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            s.fileno().to_bytes(4, sys.byteorder))])
            if n < len(data):
                self.sock.sendall(data[n:])
        finally:
            s.close()

    def _resolve(self, prog: str, path_env: str) -> str:
        if "/" in prog:
            return prog
        for d in path_env.split(":"):
            cand = os.path.join(d or ".", prog)
            try:
                if stat.S_ISREG(os.stat(cand).st_mode) and os.access(cand, os.X_OK):
                    return cand
            except OSError:
                continue
        raise FileNotFoundError(errno.ENOENT, f"command not found: {prog}", prog)

    def _take_stdio(self, op: str) -> list[int]:
        """The three descriptors the request came with (the caller closes them)."""
        fds, self.fds = self.fds[:_MAX_FDS], self.fds[_MAX_FDS:]
        if len(fds) != _MAX_FDS:
            for fd in fds:
                os.close(fd)
            raise OSError(errno.EBADF, f"{op} needs three descriptors")
        return fds

    @staticmethod
    def _limit_cpu(pid: int, cpu_s: int | None) -> None:
        """The CPU rlimit of a started command, in place before the reply."""
        contain.limit_cpu(pid, cpu_s)

    def spawn(self, req: _msg.Spawn) -> _msg.Reply:
        fds = self._take_stdio("spawn")
        try:
            argv, env = req.argv, req.env
            if not argv:
                raise ConfigInvalidError("argv", "must not be empty")
            cwd = self._cwd(req.cwd)
            try:
                prog = self._resolve(argv[0], env.get("PATH", ""))
            except FileNotFoundError:
                return _msg.StartFailed(errno.ENOENT, f"command not found: {argv[0]}")
            os.chdir(cwd)
            try:
                if self.command_rlimits:  # set in the child before it runs: no window
                    pid = self._fork_exec(prog, argv, env, fds)
                else:
                    pid = contain.spawn(prog, argv, env, fds)
            except OSError as e:
                return _msg.StartFailed(e.errno or 0, f"{argv[0]}: {e.strerror}")
            finally:
                os.chdir(self.work)
            self.children.add(pid)
            self._limit_cpu(pid, req.cpu_s if req.cpu_s is not None else self.cpu_s)
            return _msg.Started(pid)
        finally:
            for fd in fds:
                os.close(fd)

    def _fork_exec(self, prog: str, argv: list[str], env: dict[str, str],
                   fds: list[int]) -> int:
        """posix_spawn's work, by hand, with the command rlimits set in the child before
        the exec (posix_spawn cannot set rlimits; a prlimit after it would leave a
        window in which the command runs unlimited). An exec that fails exits 127
        with the reason on stderr."""
        pid = os.fork()
        if pid:
            return pid
        try:
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0] + 1)
            for sig in _RESET_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            for which, soft, hard in self.command_rlimits:
                resource.setrlimit(which, (soft, hard))
            os.execve(prog, argv, env)
        except BaseException as e:
            try:
                os.write(2, f"{argv[0]}: {e}\n".encode(errors="replace"))
            finally:
                os._exit(127)
        raise AssertionError("unreachable")

    def _cwd(self, cwd: str) -> str:
        if cwd:
            return os.path.join(self.work, *split_relative(cwd, root_alias=self.work))
        return self.cwd

    def fork_call(self, req: _msg.ForkCall) -> _msg.Reply:
        fds = self._take_stdio("fork_call")
        try:
            entry = req.entry
            if entry not in _FORK_ENTRIES:
                raise ConfigInvalidError("entry", f"not an in-process entry point: {entry!r}")
            modname, _, fname = entry.partition(":")
            module = sys.modules.get(modname)
            if module is None:
                raise ConfigInvalidError("entry", f"{modname} is not preloaded in this sandbox")
            func = getattr(module, fname)
            args, env = req.args, req.env
            cwd = self._cwd(req.cwd)
            cpu_s = req.cpu_s if req.cpu_s is not None else self.cpu_s
            os.chdir(cwd)  # the child inherits it
            try:
                # bare: no at-fork hooks (threading, logging) to run on either side, the
                # agent is single-threaded and holds no lock; random's is _reseed_random
                pid = su.fork_bare()
                if pid == 0:
                    self._become(func, [entry, *args], env, fds, cpu_s)
            finally:
                os.chdir(self.work)
            self.children.add(pid)
            self.forked.add(pid)
            self._limit_cpu(pid, cpu_s)
            return _msg.Started(pid)
        finally:
            for fd in fds:
                os.close(fd)

    def _become(self, func: Callable[[list[str]], object], argv: list[str],
                env: dict[str, str], fds: list[int], cpu_s: int | None) -> None:
        """The forked child of ``fork_call``: set up like a spawned command, call
        ``func(argv[1:])``, exit. Never returns.

        Every page this writes is copied from the agent first (~3 us each), so it runs
        as little Python as it can: plain ints to the C signal calls (no enums), no
        chdir (the agent's cwd is the request's during the fork), and no text wrappers
        for an entry that does its own I/O on 0/1/2 (:data:`RAW_STDIO`). The environment
        is set here, not in the agent: the agent would keep the pages that costs (~200
        KiB) for its whole life; the zygote ran the same code first (``zygote.serve``)."""
        code = 70
        try:
            signal.set_wakeup_fd(-1)
            self.sock.detach()  # closed below: the object must not close a reused number
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            os.closerange(3, self.nofile + 1)
            for sig in _DFL_IN_CHILD:
                su.set_signal(sig, _SIG_DFL)
            for sig in _IGN_IN_CHILD:  # as a fresh interpreter has them
                su.set_signal(sig, _SIG_IGN)
            su.set_signal(_SIGINT, signal.default_int_handler)
            su.set_sigmask(_SIG_SETMASK, ())
            if cpu_s:
                resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
            for which, soft, hard in self.command_rlimits:
                resource.setrlimit(which, (soft, hard))
            _reseed_random()
            if os.environ:  # the agent's is empty (the zygote's is)
                os.environ.clear()
            os.environ.update(env)
            sys.argv = argv
            if not getattr(func, RAW_STDIO, False):
                sys.stdin = io.TextIOWrapper(
                    io.BufferedReader(io.FileIO(0, "rb", closefd=False)), encoding="utf-8")
                sys.stdout = io.TextIOWrapper(
                    io.BufferedWriter(io.FileIO(1, "wb", closefd=False)), encoding="utf-8")
                sys.stderr = io.TextIOWrapper(
                    io.BufferedWriter(io.FileIO(2, "wb", closefd=False)), encoding="utf-8",
                    errors="backslashreplace", line_buffering=True)
            self.decoder.reset()
            func(argv[1:])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            try:
                traceback.print_exc()
            except BaseException:
                pass
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
            os._exit(code)

    def kill(self, pid: int, sig: int) -> None:
        if pid <= 1:
            raise ConfigInvalidError("pid", "not a command of this sandbox")
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def reap(self) -> None:
        while True:
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            forked = pid in self.forked
            if forked:  # whatever it started and left behind
                self.forked.discard(pid)
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            if pid in self.children:
                self.children.discard(pid)
                cpu_ms = int((ru.ru_utime + ru.ru_stime) * 1000)
                free = -1  # a fork_call's caller reads no disk attribution (see exec)
                if not forked:
                    try:
                        st = os.statvfs(self.work)
                        free = st.f_bavail * st.f_frsize
                    except OSError:
                        pass
                self.send(_msg.encode_event(_msg.Exit(
                    pid, os.waitstatus_to_exitcode(status), cpu_ms, ru.ru_maxrss, free)))

    def _warm(self) -> None:
        """Run the framing every request takes once on a dummy frame, sending nothing, so
        its copy-on-write faults are taken now (off the caller's path for a spare). Not
        the command lookup nor statvfs: a sandbox that only forks (a snippet slot) never
        needs them, and each page they touch would be its own for its whole life."""
        self.decoder.feed(b'{"op":"ping","id":0}\n')
        for header, _payload, _nfds in self.decoder.frames():
            _msg.decode_request(header)
            _frames.encode({"id": header["id"], **_msg.encode_reply(_msg.Started(0))})

    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        su.set_signal(signal.SIGCHLD, lambda *_: None)
        su.set_signal(signal.SIGPIPE, signal.SIG_IGN)
        su.set_sigmask(signal.SIG_SETMASK, ())
        self._warm()
        self.send({"ready": True})
        while True:
            try:
                ready, _, _ = select.select([self.sock.fileno(), wake_r], [], [])
            except InterruptedError:
                continue
            if wake_r in ready:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                self.reap()
            if self.sock.fileno() in ready:
                if not self._fill():
                    os._exit(0)  # host gone: the pid namespace dies with us
                for header, payload, _nfds in self.decoder.frames():
                    self.handle(header, payload)
                self.reap()


#: how the agent serves each request type
_SERVE: Final[dict[type, Callable[[_Agent, Any, bytes], tuple[_msg.Reply, bytes]]]] = {
    _msg.Spawn: _Agent._spawn_req, _msg.ForkCall: _Agent._fork_req, _msg.Kill: _Agent._kill_req,
    _msg.Write: _Agent._write, _msg.Read: _Agent._read, _msg.ListDir: _Agent._list,
    _msg.Remove: _Agent._remove, _msg.MakeDir: _Agent._mkdir, _msg.Stat: _Agent._stat,
    _msg.Snapshot: _Agent._snapshot, _msg.Restore: _Agent._restore, _msg.Ping: _Agent._done,
}
#: requests whose OS errors are the caller's (the builtin OSError on the host)
_FILE_OPS: Final = (_msg.Read, _msg.ListDir, _msg.Remove, _msg.MakeDir, _msg.Stat)


def main(sock_fd: int, plan: Mapping[str, Any]) -> None:
    """Serve ``plan``'s sandbox on ``sock_fd``; this process is contained already
    (``pid1.bring_up``: view, cgroup, contain). Never returns."""
    sock = socket.socket(fileno=sock_fd)
    try:
        _Agent(sock, plan).serve()
    except BaseException:
        pass
    os._exit(0)
