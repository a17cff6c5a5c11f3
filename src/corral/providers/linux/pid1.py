"""A sandbox's first two processes: pid 1 (the agent to be) and its view builder.

Both run inside the new namespaces, cloned from the zygote's template (see
``zygote.py`` for the whole launch). pid 1 takes its plan, agent socket and
cgroup files from the zygote, forks the builder (pid 2), moves itself into
the sandbox's cgroups while the builder opens the bind sources as the caller
and builds the file system view, hostname and loopback, then becomes the
agent (:func:`agent.main`). The builder's pages die with it, so pid 1 never
holds a copy of the pages the mount code touched.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Mapping
from typing import Any

from . import _fdpass, _jsonline, _sys_unsafe as su, agent, contain

__all__ = ["main"]


def main(ctl_fd: int, prog: su.Seccomp) -> None:
    """C2, the sandbox's pid 1: take its plan, agent socket and cgroup files from the
    zygote, have C3 build the file system view while it joins its cgroup, then
    become the agent. Never returns."""
    su.set_signal(signal.SIGCHLD, signal.SIG_DFL)  # T's SIG_IGN would reap C3 for us
    su.set_sigmask(signal.SIG_SETMASK, ())
    try:
        os.setsid()
        ctl = socket.socket(fileno=ctl_fd)
        data, fds = _fdpass.recv(ctl)
        ctl.close()
        if not data or not fds:
            os._exit(72)  # the launch failed and the host was told
        agent_fd, procs = fds[0], fds[1:]
        plan = _jsonline.loads(data)
    except BaseException:
        os._exit(72)
    try:
        view_r, view_w = os.pipe2(os.O_CLOEXEC)
        c3 = su.fork_bare()
        if c3 == 0:
            try:
                for fd in (view_r, agent_fd, *procs):
                    os.close(fd)
                _build_view(plan, view_w)
            finally:
                os._exit(1)
        os.close(view_w)
        # the move waits for an RCU grace period (cgroup v1, or v2 without
        # favordynmods; 9-19 ms measured): C3 builds the view meanwhile
        contain.join_cgroup(procs)
        why = _read_all(view_r)
        os.close(view_r)
        _, status = os.waitpid(c3, 0)
        if status != 0:
            raise OSError(1, why.decode(errors="replace") or "the file system builder died")
    except BaseException as e:
        try:
            os.write(agent_fd, _jsonline.dumps({"error": f"sandbox setup failed: {e}"}) + b"\n")
        finally:
            os._exit(71)
    agent.main(agent_fd, plan, prog)


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


def _open_bind_sources(steps: Any) -> dict[str, int]:
    """An O_PATH descriptor per bind source; the mounts bind from these."""
    return {s["source"]: os.open(s["source"], os.O_PATH | os.O_CLOEXEC)
            for s in steps if s["kind"] == "bind"}


def _read_all(fd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(fd, 512):
        out += chunk
    return bytes(out)
