"""The zygote: a single-threaded fork server that builds sandboxes on request.

Started once per provider as ``python -I -S -c BOOT`` (no site: fast), it
imports everything a sandbox agent needs, freezes the GC and then serves
``create`` requests from the host over a unix socket (one JSON line plus the
agent's socket end as SCM_RIGHTS). For each request:

1. fork C1: new session, open the sandbox's cgroup procs files, drop
   supplementary groups (root), unshare every namespace of the plan but the
   cgroup one, wait while the zygote writes the uid/gid maps;
2. C1 forks C2, the pid 1 of the new pid namespace, and reports C2's host
   pid; then forks C3, which builds the file system view, hostname and
   loopback (shared namespaces: C2 need not run that code), moves C2 into the
   sandbox's cgroups meanwhile, waits for C3, tells C2 and exits; C2 runs
   :func:`agent.main` (its per-process checklist, which waits for C1 before it
   unshares the cgroup namespace, then serve);
3. the zygote opens a pidfd for C2 (race-free: nobody can reap C2 before the
   zygote, which is its subreaper) and sends it to the host.

Both forks are bare libc forks (``_sys_unsafe.fork_bare``), without Python's
at-fork machinery (thread and lock re-initialisation, the ``threading``,
``logging`` and ``random`` hooks): the zygote is single-threaded and holds no
lock, and the hooks would dirty ~0.2 MiB of pages that every agent then
holds privately. Processes the agent forks later (commands, ``fork_call``)
go through ``os.fork`` as usual.

A ``preload`` request (``{"op": "preload", "modules": [...]}``) imports
modules into the zygote and freezes the GC again, so every sandbox forked
afterwards shares their pages; the snippet pool preloads its worker this way
(see ``agent.FORK_ENTRIES``). A module that cannot be imported is skipped and
named in the reply.

The zygote exits when the host closes its socket (the host exited or
``aclose``). It reaps every orphan (it is a child subreaper). It is started
with an empty environment (``client.Zygote``): every sandbox process forked
from it, a python template included, holds a copy of its memory.
"""

from __future__ import annotations

import array
import base64
import gc
import importlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from . import _jsonline, _sys_unsafe as su, agent, contain, mounts, snapshots  # noqa: F401  (pre-imported for the agent)

__all__ = ["BOOT", "boot_argv", "serve"]

#: run by ``python -I -S -c``; ``{root}`` is corral's import root, ``{fd}`` the socket
BOOT: Final = ("import sys; sys.path.insert(0, {root!r}); "
               "from corral.providers.linux.zygote import serve; serve({fd})")


_SIGCHLD_ONLY: Final = (signal.SIGCHLD,)


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


def _read_line(fd: int) -> bytes:
    out = bytearray()
    while not out.endswith(b"\n"):
        b = os.read(fd, 256)
        if not b:
            break
        out += b
    return bytes(out)


def _write_maps(pid: int, plan: Mapping[str, Any]) -> None:
    _write_proc(f"/proc/{pid}/setgroups", b"deny")
    for name in ("uid_map", "gid_map"):
        inside, outside, count = plan[name]
        _write_proc(f"/proc/{pid}/{name}", b"%d %d %d\n" % (inside, outside, count))


def _write_proc(path: str, data: bytes) -> None:
    """One write(2), no file object: the fork server's every step after a fork
    costs the new sandbox the pages it touches (see the module docstring)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _open_bind_sources(steps: Any) -> dict[str, int]:
    """An O_PATH descriptor per bind source; the mounts bind from these."""
    return {s["source"]: os.open(s["source"], os.O_PATH | os.O_CLOEXEC)
            for s in steps if s["kind"] == "bind"}


def _build_view(plan: Mapping[str, Any], err_fd: int) -> None:
    """C3: open the bind sources (still the caller's uid), become uid/gid 0 inside,
    build the file system view, hostname and loopback; write why not on ``err_fd``.
    Never returns."""
    code = 0
    try:
        # opened while the host's permissions on the way there are still ours (a
        # checkout under a 0700 home); uid 0 inside could not walk to them
        source_fds = _open_bind_sources(plan["mounts"])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        contain.build_view(plan, source_fds=source_fds)
    except BaseException as e:
        code = 1
        try:
            os.write(err_fd, str(e).encode(errors="replace")[:500])
        except BaseException:
            pass
    os._exit(code)


def _child(req: Mapping[str, Any], agent_fd: int, w: int, r: int, prog: su.Seccomp) -> None:
    """C1: never returns.

    C1 forks C2, the sandbox's pid 1, as soon as the namespaces and id maps
    exist, so C2 starts from pages it still shares with the zygote: everything
    C1 does after that fork costs C2 nothing, whereas a page C1 dirtied before
    it would become C2's own copy the moment C1 exits. After replying to the
    zygote, C1 forks C3 (pid 2 of the new pid namespace) to build the file
    system view (``contain.build_view``) while C1 itself moves C2 into the
    sandbox's cgroup: that move waits for an RCU grace period (cgroup v1, or v2
    without favordynmods; 9-19 ms measured), which so overlaps the mounts. C1
    then says ``C`` to C2 (or ``X`` and why not), which waits for it before it
    unshares the cgroup namespace (whose root is then the sandbox's cgroup) and
    runs its own checklist (``contain.contain``).
    """
    stage = "setup"
    try:
        su.set_signal(signal.SIGCHLD, signal.SIG_DFL)
        su.set_sigmask(signal.SIG_SETMASK, ())
        os.setsid()
        stage = "cgroup"
        # opened as the caller, before any namespace: the kernel checks the move
        # against these open-time credentials
        procs = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in req["cgroup_procs"]]
        plan = req["plan"]
        if os.geteuid() == 0:
            os.setgroups([])
        stage = "unshare"
        su.unshare(plan["namespaces"] & ~su.CLONE_NEWCGROUP)
        os.write(w, b"U")
        if os.read(r, 1) != b"M":
            raise OSError(1, "the zygote could not write the id maps")
        stage = "fork"
        placed_r, placed_w = os.pipe2(os.O_CLOEXEC)
        c2 = su.fork_bare()
        if c2 == 0:
            for fd in (w, r, placed_w, *procs):
                os.close(fd)
            agent.main(agent_fd, plan, prog, placed_fd=placed_r)
            os._exit(70)
        os.close(placed_r)
        os.close(agent_fd)
        os.write(w, f"P{c2}\n".encode())
    except BaseException as e:
        try:
            os.write(w, f"E{stage}: {e}\n".encode())
        finally:
            os._exit(1)
    try:  # the zygote has replied: a failure from here on reaches C2, which reports it
        stage = "file system"
        view_r, view_w = os.pipe2(os.O_CLOEXEC)
        c3 = su.fork_bare()
        if c3 == 0:
            for fd in (view_r, w, r, placed_w, *procs):
                os.close(fd)
            _build_view(plan, view_w)
        os.close(view_w)
        stage = "cgroup"
        me = str(c2).encode()
        for fd in procs:
            os.write(fd, me)
        stage = "file system"
        why = _read_all(view_r)
        _, status = os.waitpid(c3, 0)
        if status != 0:
            raise OSError(1, why.decode(errors="replace") or "the builder died")
        os.write(placed_w, b"C")
        os._exit(0)
    except BaseException as e:
        try:
            os.write(placed_w, f"X{stage}: {e}".encode(errors="replace")[:500])
        finally:
            os._exit(1)


def _read_all(fd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(fd, 512):
        out += chunk
    return bytes(out)


def _create(req: Mapping[str, Any], agent_fd: int, prog: su.Seccomp
            ) -> tuple[dict[str, Any], int, int]:
    """Launch one sandbox: (reply, pidfd of its pid 1 or -1, pid of C1 to reap after replying)."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = su.fork_bare()
    if pid == 0:
        os.close(r1)
        os.close(w2)
        _child(req, agent_fd, w1, r2, prog)
    os.close(w1)
    os.close(r2)
    try:
        first = os.read(r1, 1)
        if first == b"U":
            try:
                _write_maps(pid, req["plan"])
                os.write(w2, b"M")
            except OSError as e:
                os.write(w2, b"X")
                return {"ok": False, "error": f"id maps: {e}"}, -1, pid
            first = b""
        line = (first + _read_line(r1)).decode(errors="replace").strip()
        if line.startswith("P"):
            c2 = int(line[1:])
            return {"ok": True, "pid": c2}, os.pidfd_open(c2), pid
        return {"ok": False, "error": line[1:] or "sandbox launcher died"}, -1, pid
    finally:
        os.close(r1)
        os.close(w2)


def _preload(modules: object, unseal: Callable[[], None]) -> tuple[list[str], Callable[[], None]]:
    """Import ``modules`` (names) here (``unseal`` lifts the import seal meanwhile), seal
    again and freeze the GC; returns the names that failed and the new undo."""
    unseal()
    missing: list[str] = []
    for name in modules if isinstance(modules, list) else ():
        try:
            importlib.import_module(str(name))
        except Exception:  # any failure: the module is not preloaded
            missing.append(str(name))
    unseal = agent.seal_imports()
    gc.collect()
    gc.freeze()
    return missing, unseal


def serve(fd: int) -> None:
    """Serve create requests on the socket ``fd`` until it closes."""
    su.set_child_subreaper()
    su.preresolve()  # shared by every sandbox, not built in each
    unseal = agent.seal_imports()  # every sandbox starts sealed
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()
    buf = bytearray()
    fds: list[int] = []
    prog: su.Seccomp | None = None
    while True:
        anc_fds = array.array("i")
        data, anc, _f, _a = sock.recvmsg(1 << 20, socket.CMSG_SPACE(4 * anc_fds.itemsize))
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                anc_fds.frombytes(cdata[: len(cdata) - (len(cdata) % anc_fds.itemsize)])
        fds.extend(anc_fds)
        if not data:
            os._exit(0)
        buf += data
        while (nl := buf.find(b"\n")) >= 0:
            req = _jsonline.loads(bytes(buf[:nl]))
            del buf[: nl + 1]
            if "seccomp" in req:
                prog = su.prepare_seccomp(base64.b64decode(req["seccomp"]))
            if req.get("op") == "preload":
                missing, unseal = _preload(req.get("modules", ()), unseal)
                sock.sendall(_jsonline.dumps({"id": req.get("id"), "ok": True,
                                              "missing": missing}) + b"\n")
                continue
            if req.get("op") != "create":
                continue
            agent_fd = fds.pop(0) if fds else -1
            su.set_sigmask(signal.SIG_BLOCK, _SIGCHLD_ONLY)
            pidfd = -1
            try:
                if agent_fd < 0 or prog is None:
                    reply: dict[str, Any] = {"ok": False, "error": "bad create request"}
                else:
                    try:
                        reply, pidfd, _c1 = _create(req, agent_fd, prog)
                    except OSError as e:
                        reply = {"ok": False, "error": f"fork server: {e}"}
                reply["id"] = req.get("id")
                payload = _jsonline.dumps(reply) + b"\n"
                if pidfd >= 0:
                    reply["nfds"] = 1
                    payload = _jsonline.dumps(reply) + b"\n"
                    sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                              array.array("i", [pidfd]).tobytes())])
                else:
                    sock.sendall(payload)
            finally:
                for f in (agent_fd, pidfd):
                    if f >= 0:
                        os.close(f)
                su.set_sigmask(signal.SIG_UNBLOCK, _SIGCHLD_ONLY)
            _reap()  # C1 (still moving C2 into the cgroup) is reaped on its SIGCHLD
