"""The zygote: a single-threaded fork server that builds sandboxes on request.

Started once per provider as ``python -I -S -c BOOT`` (no site: fast), it
imports everything a sandbox agent needs, freezes the GC and then serves
``create`` requests from the host over a unix socket (one JSON line plus the
agent's socket end as SCM_RIGHTS).

Memory first. Every sandbox's pid 1 is a copy of the zygote's pages, shared
until one side writes a page; a page written after the copy stays behind as
the sandbox's own. The zygote writes pages all the time (each request it
parses, each reply), and so would any launcher process that ran code before
forking pid 1 and then exited. So pid 1 is cloned by neither: the zygote
forks a *template* T once (again after each ``preload``), which does nothing
but wait for a descriptor, clone a pid 1 and send back its pidfd. Every
sandbox shares T's pages, and T writes a few pages per clone. Measured with
``benchmarks/bench_snippets.py`` (a warm snippet slot is one sandbox agent):
3.2 MiB of private pages per slot when an intermediate launcher forked pid 1,
1.4-1.6 MiB with the template.

For each create request:

(Steps 1-4 are the one bring-up both strict launchers share, the CLI's one-shot
path included: ``clone.py`` on the launcher's side, ``pid1.bring_up`` in pid 1.)

1. the zygote opens the sandbox's cgroup join files (as the caller, outside
   every new namespace: the kernel checks a move against the credentials a
   file was opened with); as root it picks the sandbox's own outside uid
   (``_uidpool``) and makes a detached, read-only copy of each bind source's
   mount tree (``clone.prepare``: the sandbox's uid need not reach a
   checkout under a 0700 home); it makes a socketpair for the new pid 1 and
   hands one end to T with the uid;
2. T clones C2, the sandbox's pid 1, straight into new user, mount, pid, net,
   ipc and uts namespaces with a pidfd (``clone.clone_pid1``: race-free,
   and T lets the kernel reap its children), with that uid as its effective
   uid, so the new user namespace is owned by it (see "Per-user kernel quotas"
   in docs/security-model.md), and sends the pidfd back;
3. the zygote writes C2's uid/gid maps (0 inside -> that uid), sends C2 its
   plan, agent socket end, the procs files and the trees, and replies to the
   host with the pidfd;
4. C2 (:mod:`pid1`) forks C3 (pid 2 of the new pid namespace), which becomes
   uid/gid 0 inside and builds the file system view (attaching the trees; not
   root: binding the sources it opened while it still had the caller's uid),
   the user namespace's quotas, hostname and loopback (``contain.build_view``:
   the namespaces are shared, so C2 need not run that code, and the pages C3
   dirties die with it).
   Meanwhile C2 moves itself into the sandbox's cgroups
   (``contain.join_cgroup``: each move waits for an RCU grace period on
   cgroup v1, or v2 without favordynmods; 9-19 ms measured), waits for C3,
   runs its per-process checklist (``contain.contain``: the cgroup namespace,
   rooted at the sandbox's cgroup, then the privilege drop), all in
   ``pid1.bring_up``, then serves as :func:`agent.main`.

Every fork here is bare (``clone_pidfd``, ``fork_bare``), without Python's
at-fork machinery (thread and lock re-initialisation, the ``threading``,
``logging`` and ``random`` hooks): the zygote and T are single-threaded and
hold no lock, and the hooks would dirty pages every agent then holds
privately. Processes the agent forks later (commands, ``fork_call``) go
through ``os.fork`` as usual.

A ``preload`` request (``{"op": "preload", "modules": [...], "entries": [...]}``)
imports modules into the zygote, registers the ``module:function`` entries an
agent may fork (``agent.register_fork_entries``; the host's caller names them,
e.g. the snippet pool its worker), freezes the GC again and retires T, so every
sandbox created afterwards shares their pages. A module that cannot be imported,
or an entry whose module is not loaded, is skipped and named in the reply.

The zygote exits when the host closes its socket (the host exited or
``aclose``; it waits up to 1.5 s for its sandboxes to go first, holding their
uids), and T when the zygote's end of their socket closes. The zygote
reaps every orphan (it is a child subreaper). It is started with an empty
environment, drops its supplementary groups and overwrites its argument
strings with ``PROCTITLE``: every sandbox process cloned from it, a python
template included, holds a copy of its memory and its credentials, and its
``/proc/1/cmdline`` would otherwise name the interpreter and corral's import
root, host paths.
"""

from __future__ import annotations

import gc
import importlib
import os
import select
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

# wire 1's messages first, before the modules an agent runs: its objects then sit
# together in the fork server's heap instead of between the agent's hot ones (measured:
# imported later, every idle sandbox held ~60-90 KiB more of copied pages)
from corral.wire import agentmsg as _msg

# isort: split
from corral.providers.linux import _sys_unsafe as su, fdpass as _fdpass
from corral.providers.linux.host.uidpool import SandboxUids
from corral.providers.linux.init import (
    agent,
    clone,
    pid1,
)
from corral.providers.linux.policy.plan import NAMESPACES
from corral.wire import agent as _frames, fork as _fork, jsonline as _jsonline

__all__ = ["BOOT", "IDMAP_ERROR", "boot_argv", "serve"]

#: run by ``python -I -S -c``; ``{root}`` is corral's import root, ``{fd}`` the socket
BOOT: Final = ("import sys; sys.path.insert(0, {root!r}); "
               "from corral.providers.linux.init.zygote import serve; serve({fd})")
_CLONE_FLAGS: Final = NAMESPACES & ~su.CLONE_NEWCGROUP  # C2 unshares the cgroup one itself
#: what ``/proc/PID/cmdline`` shows for the zygote and every sandbox's pid 1: no host path
PROCTITLE: Final = b"corral"
#: SCM_RIGHTS carries at most 253 descriptors (SCM_MAX_FD): the agent socket, the
#: cgroup.procs files and one detached tree per bind source must fit
MAX_LAUNCH_FDS: Final = 253
#: how a create that needs an idmapped mount and cannot have one fails (the host turns
#: it into LevelNotSupportedError)
IDMAP_ERROR: Final = clone.IDMAP_ERROR


def boot_argv(import_root: str, fd: int) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", BOOT.format(root=import_root, fd=fd)]


def _reap(*_: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _ignore(*_: object) -> None:
    """SIGCHLD's handler: the wakeup fd tells the loop, which reaps."""


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 256):
            pass
    except BlockingIOError:
        pass


# -- the template T -------------------------------------------------------------------
def _template(sock_fd: int, prog: su.Seccomp) -> None:
    """T: per message ``G<uid> <gid>`` carrying a descriptor, clone a sandbox's pid 1
    that inherits it, and send back its pid and pidfd (or ``E`` and the errno). Runs
    as little Python per clone as it can: each page it writes after a clone stays
    behind in that sandbox. Never returns.

    As root, T clones with ``uid``/``gid`` as its effective ids, so the new user
    namespace is owned by (and its per-user quotas charged to) the sandbox's own
    outside uid, not root; it keeps uid 0 as real and saved uid and its capabilities
    (SECBIT_NO_SETUID_FIXUP) and switches back right after the clone."""
    signal.set_wakeup_fd(-1)  # the zygote's pipe is closed here
    su.set_signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps our children
    root = os.geteuid() == 0
    if root:
        su.keep_caps_on_setuid()
    sock = socket.socket(fileno=sock_fd)
    space = socket.CMSG_SPACE(4)
    while True:  # by hand, not _fdpass: one descriptor each way, fewer objects per clone
        data, anc, _f, _a = sock.recvmsg(32, space)
        if not data:
            os._exit(0)
        ctl = int.from_bytes(anc[0][2][:4], sys.byteorder) if anc else -1
        try:
            uid, gid = _fork.decode_clone(data)
            pid, pidfd = clone.clone_pid1(_CLONE_FLAGS, uid, gid,
                                          switch=root and (uid, gid) != (0, 0))
        except (OSError, ValueError) as e:
            sock.send(_fork.clone_failed(getattr(e, "errno", 0) or 0))
            os.close(ctl)
            continue
        if pid == 0:
            try:
                os.close(sock_fd)
                pid1.main(ctl, prog)
            finally:
                os._exit(70)
        sock.sendmsg([_fork.cloned(pid)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                      pidfd.to_bytes(4, sys.byteorder))])
        os.close(ctl)
        os.close(pidfd)


class _TemplateGone(Exception):
    """T died (killed from outside): the zygote starts another."""


class _Template:
    """The zygote's end of T."""

    def __init__(self, prog: su.Seccomp) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = su.fork_bare()
        if pid == 0:
            try:
                keep = theirs.detach()
                os.closerange(3, keep)  # the host socket, a request's descriptors ...
                os.closerange(keep + 1, 1 << 20)
                _template(keep, prog)
            finally:
                os._exit(70)
        theirs.close()
        self.sock = mine

    def clone(self, ctl: int, uid: int, gid: int) -> tuple[int, int]:
        """A new pid 1 holding ``ctl``, in a user namespace owned by ``uid``/``gid``:
        (pid, pidfd). OSError if T could not clone, _TemplateGone if T is gone."""
        try:
            _fdpass.send(self.sock, _fork.encode_clone(uid, gid), [ctl])
            data, fds = _fdpass.recv(self.sock, 64)
        except OSError as e:
            raise _TemplateGone(str(e)) from None
        if not data:
            raise _TemplateGone("EOF")
        try:
            pid = _fork.decode_cloned(data)
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return pid, fds[0]

    def close(self) -> None:
        self.sock.close()  # T exits at EOF; the zygote reaps it


# -- the zygote's side of a launch ------------------------------------------------------
def _create(req: Mapping[str, Any], agent_fd: int, template: _Template, uids: SandboxUids
            ) -> tuple[dict[str, Any], int]:
    """Launch one sandbox: (reply, pidfd of its pid 1 or -1)."""
    plan = req["plan"]
    if (plan["namespaces"] & ~su.CLONE_NEWCGROUP) != _CLONE_FLAGS:
        return {"ok": False, "error": "bad create request: namespaces"}, -1
    procs: list[int] = []
    trees: list[int] = []
    ctl_z, ctl_c = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        try:
            procs = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in req["cgroup_procs"]]
        except OSError as e:
            return {"ok": False, "error": f"cgroup: {e}"}, -1
        try:
            uid, gid, pooled, trees = clone.prepare(plan, uids)
        except clone.LaunchError as e:
            return {"ok": False, "error": e.strerror or str(e)}, -1
        if 1 + len(procs) + len(trees) > MAX_LAUNCH_FDS:
            return {"ok": False, "error": f"too many bind sources ({len(trees)})"}, -1
        try:
            c2, pidfd = template.clone(ctl_c.fileno(), uid, gid)
        except OSError as e:
            return {"ok": False, "error": f"unshare: {e}"}, -1
        finally:
            ctl_c.close()  # _TemplateGone goes up: the caller retries with a new T
        stage = "id maps"
        try:
            clone.write_maps(c2, uid, gid, (plan["uid_map"][0], plan["gid_map"][0]))
            stage = "launch"
            head = {"plan": plan, "procs": len(procs), "trees": len(trees)}
            _fdpass.send(ctl_z, _jsonline.dumps(head), [agent_fd, *procs, *trees])
        except OSError as e:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
            return {"ok": False, "error": f"{stage}: {e}"}, -1
        if pooled:
            uids.hold(uid, pidfd)
        return {"ok": True, "pid": c2}, pidfd
    finally:
        ctl_z.close()
        for fd in (*procs, *trees):
            os.close(fd)


def _preload(modules: object, entries: object, unseal: Callable[[], None]
             ) -> tuple[list[str], Callable[[], None]]:
    """Import ``modules`` (names) here (``unseal`` lifts the import seal meanwhile),
    register the fork ``entries``, seal again and freeze the GC; returns the names that
    failed and the new undo."""
    unseal()
    missing: list[str] = []
    for name in modules if isinstance(modules, list) else ():
        try:
            importlib.import_module(str(name))
        except Exception:  # any failure: the module is not preloaded
            missing.append(str(name))
    missing += agent.register_fork_entries(entries)
    unseal = agent.seal_imports()
    gc.collect()
    gc.freeze()
    return missing, unseal


def _warm_codec() -> None:
    """Run wire 1's codec here until the interpreter has specialised its code, so every
    agent forked later shares those code pages instead of writing its own copy of them
    (a function's first runs rewrite its bytecode in place)."""
    decoder = _frames.Decoder.trusted()
    for _ in range(64):
        decoder.feed(b'{"op":"ping","id":0}\n{"op":"write","path":"x","id":0,"len":1}\nx')
        for header, _payload, _nfds in decoder.frames():
            _msg.decode_request(header)
            _frames.encode({"id": header["id"], **_msg.encode_reply(_msg.DONE)}, b"x")
        _frames.encode(_msg.encode_event(_msg.Exit(1, 0, 0, 0, -1)))


def _warm_environ() -> None:
    """Set and clear ``os.environ`` here until its code is specialised, leaving it empty
    as it was: a ``fork_call`` child sets the request's environment as it sets up
    (``agent._Agent._become``), and then copies fewer pages of it."""
    for _ in range(16):
        os.environ.update({"PATH": "/", "HOME": "/", "TMPDIR": "/"})
        os.environ.clear()


def serve(fd: int) -> None:
    """Serve create requests on the socket ``fd`` until it closes."""
    su.set_child_subreaper()
    try:  # the boot argv names the interpreter and corral's import root: host paths
        su.set_proctitle(PROCTITLE)  # every sandbox's pid 1 is a copy of this memory
    except (OSError, ValueError):
        pass
    su.preresolve()  # shared by every sandbox, not built in each
    if os.geteuid() == 0:
        os.setgroups([])  # every sandbox inherits them and could not drop them inside
    unseal = agent.seal_imports()  # every sandbox starts sealed
    sock = socket.socket(fileno=fd)
    # SIGCHLD only wakes the loop up, which reaps: a handler alone would miss a child
    # that exits between its last check and the blocking recvmsg (the zombie then
    # waited for the next request)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, _ignore)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _warm_codec()
    _warm_environ()
    gc.freeze()
    decoder = _frames.Decoder.trusted()
    fds: list[int] = []
    prog: su.Seccomp | None = None
    template: _Template | None = None
    uids = SandboxUids()
    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            _drain(wake_r)
            _reap()
        if sock.fileno() not in ready:
            continue
        data, more = _fdpass.recv(sock)
        fds.extend(more)
        if not data:
            uids.wait_idle(1.5)  # keep the uid block until its sandboxes are gone
            uids.close()
            os._exit(0)
        decoder.feed(data)
        for req, _payload, _nfds in decoder.frames():
            if (bpf := _fork.seccomp_of(req)) is not None:
                prog = su.Seccomp(bpf)
                if template is not None:
                    template.close()
                    template = None
            if req.get("op") == "preload":
                if template is not None:  # its pages predate the modules
                    template.close()
                    template = None
                missing, unseal = _preload(req.get("modules", ()), req.get("entries", ()),
                                           unseal)
                sock.sendall(_fork.preload_reply(req.get("id"), missing))
                continue
            if req.get("op") != "create":
                continue
            agent_fd = fds.pop(0) if fds else -1
            pidfd = -1
            try:
                if agent_fd < 0 or prog is None:
                    reply: dict[str, Any] = {"ok": False, "error": "bad create request"}
                else:
                    for _attempt in (1, 2):  # once more with a new T if it is gone
                        try:
                            t = template = template or _Template(prog)
                            reply, pidfd = _create(req, agent_fd, t, uids)
                            break
                        except _TemplateGone as e:
                            t.close()
                            template = None
                            reply = {"ok": False, "error": f"fork server: template: {e}"}
                        except OSError as e:
                            reply = {"ok": False, "error": f"fork server: {e}"}
                            break
                if pidfd >= 0:
                    _fdpass.send(sock, _fork.create_ok(req.get("id"), reply["pid"]), [pidfd])
                else:
                    sock.sendall(_fork.create_failed(req.get("id"), str(reply["error"])))
            finally:
                for f in (agent_fd, pidfd):
                    if f >= 0:
                        os.close(f)
            _reap()
