"""The zygote: a single-threaded fork server that builds sandboxes on request.

Started once per provider as ``python -I -S -c BOOT`` (no site: fast), it
imports everything a sandbox agent needs, freezes the GC and then serves
``create`` requests from the host over a unix socket (one JSON line plus the
agent's socket end as SCM_RIGHTS). For each request:

1. fork C1: new session, open the sandbox's cgroup procs files, drop
   supplementary groups (root), unshare every namespace of the plan but the
   cgroup one, wait while the zygote writes the uid/gid maps, become uid/gid 0
   inside;
2. C1 forks C2, the pid 1 of the new pid namespace, reports C2's host pid,
   moves C2 into the sandbox's cgroups and exits; C2 runs :func:`agent.main`
   (containment checklist, which waits for that move before it unshares the
   cgroup namespace, then serve);
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
import json
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import Any, Final

from . import _sys_unsafe as su, agent, contain, mounts, snapshots  # noqa: F401  (pre-imported for the agent)

__all__ = ["BOOT", "boot_argv", "serve"]

#: run by ``python -I -S -c``; ``{root}`` is corral's import root, ``{fd}`` the socket
BOOT: Final = ("import sys; sys.path.insert(0, {root!r}); "
               "from corral.providers.linux.zygote import serve; serve({fd})")


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
    with open(f"/proc/{pid}/setgroups", "w") as f:
        f.write("deny")
    for name in ("uid_map", "gid_map"):
        inside, outside, count = plan[name]
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"{inside} {outside} {count}\n")


def _open_bind_sources(steps: Any) -> dict[str, int]:
    """An O_PATH descriptor per bind source; the mounts bind from these."""
    return {s["source"]: os.open(s["source"], os.O_PATH | os.O_CLOEXEC)
            for s in steps if s["kind"] == "bind"}


def _child(req: Mapping[str, Any], agent_fd: int, w: int, r: int, prog: bytes) -> None:
    """C1: never returns.

    C1 moves C2 into the sandbox's cgroup *after* forking it and after telling
    the zygote C2's pid: the move waits for an RCU grace period (cgroup v1, or
    v2 without favordynmods; 9-19 ms measured), which so overlaps C2's own
    setup. C2 waits for the move before it unshares the cgroup namespace (whose
    root is then the sandbox's cgroup) and before it says ready.
    """
    stage = "setup"
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
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
        stage = "binds"
        # still the caller's own uid here: open what will be bound in now, while the
        # host's permissions on the way there are ours (a checkout under a 0700 home);
        # after setresuid the sandbox's uid could not walk to them
        plan = {**plan, "source_fds": _open_bind_sources(plan["mounts"])}
        stage = "setid"
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        stage = "fork"
        placed_r, placed_w = os.pipe2(os.O_CLOEXEC)
        c2 = su.fork_bare()
        if c2 == 0:
            for fd in (w, r, placed_w, *procs):
                os.close(fd)
            agent.main(agent_fd, plan, prog, placed_fd=placed_r)
            os._exit(70)
        os.close(placed_r)
        os.write(w, f"P{c2}\n".encode())
    except BaseException as e:
        try:
            os.write(w, f"E{stage}: {e}\n".encode())
        finally:
            os._exit(1)
    try:  # the zygote has replied: a failure from here on reaches C2, which reports it
        me = str(c2).encode()
        for fd in procs:
            os.write(fd, me)
        os.write(placed_w, b"C")
        os._exit(0)
    except BaseException as e:
        try:
            os.write(placed_w, f"Xcannot join the sandbox's cgroup: {e}".encode()[:500])
        finally:
            os._exit(1)


def _create(req: Mapping[str, Any], agent_fd: int, prog: bytes
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


def _preload(modules: object) -> list[str]:
    """Import ``modules`` (names) here, then freeze the GC; returns the names that failed."""
    missing: list[str] = []
    for name in modules if isinstance(modules, list) else ():
        try:
            importlib.import_module(str(name))
        except Exception:  # any failure: the module is not preloaded
            missing.append(str(name))
    gc.collect()
    gc.freeze()
    return missing


def serve(fd: int) -> None:
    """Serve create requests on the socket ``fd`` until it closes."""
    su.set_child_subreaper()
    su.preresolve()  # shared by every sandbox, not built in each
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()
    buf = bytearray()
    fds: list[int] = []
    prog = b""
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
            req = json.loads(bytes(buf[:nl]))
            del buf[: nl + 1]
            if "seccomp" in req:
                prog = base64.b64decode(req["seccomp"])
            if req.get("op") == "preload":
                sock.sendall(json.dumps({"id": req.get("id"), "ok": True,
                                         "missing": _preload(req.get("modules", ()))}
                                        ).encode() + b"\n")
                continue
            if req.get("op") != "create":
                continue
            agent_fd = fds.pop(0) if fds else -1
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            pidfd = -1
            try:
                if agent_fd < 0 or not prog:
                    reply: dict[str, Any] = {"ok": False, "error": "bad create request"}
                else:
                    try:
                        reply, pidfd, _c1 = _create(req, agent_fd, prog)
                    except OSError as e:
                        reply = {"ok": False, "error": f"fork server: {e}"}
                reply["id"] = req.get("id")
                payload = json.dumps(reply).encode() + b"\n"
                if pidfd >= 0:
                    reply["nfds"] = 1
                    payload = json.dumps(reply).encode() + b"\n"
                    sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                              array.array("i", [pidfd]).tobytes())])
                else:
                    sock.sendall(payload)
            finally:
                for f in (agent_fd, pidfd):
                    if f >= 0:
                        os.close(f)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            _reap()  # C1 (still moving C2 into the cgroup) is reaped on its SIGCHLD
