"""A sandbox's first two processes: pid 1 and its view builder, and the one bring-up
sequence both launch paths run (:func:`bring_up`).

Both run inside the new namespaces, cloned by the launcher (``clone.clone_pid1``: the
zygote's template on the library path, the ``corral run`` process itself on the
one-shot path). pid 1 takes its plan and cgroup files from the launcher (as root, also
one detached mount tree per bind source: ``clone.prepare``), forks the builder (pid 2;
the one-shot path's pid 1 builds the view itself, see :func:`bring_up`),
moves itself into the sandbox's cgroups while the builder builds the file system view
(attaching those trees, or else binding the sources it opens as the caller), writes the
user namespace's quotas, hostname and loopback, contains itself, then becomes the agent
(:func:`agent.main`, via :func:`main`) or the one-shot path's pid 1 (``oneshot``). The
builder's pages die with it, so pid 1 never holds a copy of the pages the mount code
touched.
"""

from __future__ import annotations

import os

from corral.providers.linux import _sys_unsafe as su
from corral.providers.linux.init import contain

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing (the CLI's one-shot path)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

__all__ = ["bring_up", "main", "seal_file_imports"]

#: SCM_RIGHTS' own limit (SCM_MAX_FD): the zygote never sends more
_MAX_FDS = 253


def main(ctl_fd: int, prog: su.Seccomp) -> None:
    """C2, the library path's pid 1: take its plan, agent socket and cgroup files from
    the zygote, :func:`bring_up`, then become the agent. Never returns."""
    # here, not at the top: the fork server has them loaded already, and the CLI's
    # one-shot path (``oneshot.py``) runs only :func:`bring_up`
    import signal
    import socket

    from corral.providers.linux import fdpass as _fdpass
    su.set_signal(signal.SIGCHLD, signal.SIG_DFL)  # T's SIG_IGN would reap C3 for us
    su.set_sigmask(signal.SIG_SETMASK, ())
    from corral.wire import jsonline as _jsonline  # loaded by the fork server already
    try:
        os.setsid()
        ctl = socket.socket(fileno=ctl_fd)
        data, fds = _fdpass.recv(ctl, max_fds=_MAX_FDS)
        ctl.close()
        if not data or not fds:
            os._exit(72)  # the launch failed and the host was told
        head = _jsonline.loads(data)
        plan, nprocs = head["plan"], head["procs"]
        agent_fd, procs, trees = fds[0], fds[1:1 + nprocs], fds[1 + nprocs:]
    except BaseException:
        os._exit(72)

    def report(why: str) -> None:
        os.write(agent_fd, _jsonline.dumps({"error": why}) + b"\n")

    bring_up(plan, keep_fd=agent_fd, procs=procs, trees=trees, prog=prog, report=report)
    from corral.providers.linux.init import agent
    if plan.get("image_root"):
        seal_file_imports()
    agent.main(agent_fd, plan)


def seal_file_imports() -> None:
    """An image root: no module is loaded from a file from now on (only built-in and
    frozen ones). The agent is a fork of the zygote with everything it runs loaded
    and mapped already, so it needs none of the host interpreter's files, and none is
    in the view; but the image may hold files at the host's paths (a Debian image's
    ``/usr/lib/python3.11``, say) and a lazy import must never run them in pid 1.
    Dropping the path finder from ``sys.meta_path`` covers ``sys.path`` and every
    package's ``__path__`` at once (one list changed: one page copied)."""
    import sys
    sys.meta_path[:] = [f for f in sys.meta_path
                        if getattr(f, "__name__", "") in ("BuiltinImporter", "FrozenImporter")]
    sys.path_importer_cache.clear()


def bring_up(plan: Mapping[str, Any], *, keep_fd: int, procs: list[int], trees: list[int],
             prog: bytes | su.Seccomp, report: Callable[[str], object],
             proctitle: bytes | None = None, builder: bool = True) -> None:
    """The one bring-up of a sandbox's pid 1 (C2), the agent's and the one-shot relay's
    alike: the file system view (:func:`_build_view`), the sandbox's cgroup
    (``contain.join_cgroup``), then contain this process (``contain.contain``: the
    cgroup namespace, rlimits, descriptors: only ``keep_fd`` stays, the privilege drop
    and seccomp last). ``proctitle``: what ``/proc/1/cmdline`` shows instead of the
    launcher's command line (the zygote set its own already). Returns contained; on any
    failure ``report(why)`` and exit 71: nothing half-built ever runs a command.

    ``builder`` (the agent's): the view is built by C3, forked for it, while pid 1 joins
    the cgroup, so the pages the mount code dirties die with C3 instead of staying
    copied in an agent that lives as long as its sandbox. Without (the one-shot path,
    whose pid 1 lives for one command): pid 1 joins, then builds the view itself; the
    same steps in the same namespaces, without a fork, a second process's page copies
    and a wait on the critical path of ``corral run``."""
    try:
        if proctitle is not None:
            su.set_proctitle(proctitle)
        if not builder:
            contain.join_cgroup(procs)
            _view(plan, trees)
            for fd in trees:
                os.close(fd)
            contain.contain(plan, keep_fd=keep_fd, seccomp_prog=prog)
            return
        view_r, view_w = os.pipe2(os.O_CLOEXEC)
        c3 = su.fork_bare()
        if c3 == 0:
            try:
                for fd in (view_r, keep_fd, *procs):
                    os.close(fd)
                _build_view(plan, view_w, trees)
            finally:
                os._exit(1)
        os.close(view_w)
        for fd in trees:  # the builder's now
            os.close(fd)
        contain.join_cgroup(procs)  # meanwhile C3 builds the view
        why = _read_all(view_r)
        os.close(view_r)
        _, status = os.waitpid(c3, 0)
        if status != 0:
            raise OSError(1, why.decode(errors="replace") or "the file system builder died")
        contain.contain(plan, keep_fd=keep_fd, seccomp_prog=prog)
    except BaseException as e:
        try:
            report(f"sandbox setup failed: {e}")
        finally:
            os._exit(71)


def _build_view(plan: Mapping[str, Any], err_fd: int, trees: list[int]) -> None:
    """C3: become uid/gid 0 inside and build the file system view (attaching
    ``trees``, or binding sources it opens while it still has the caller's uid),
    the user namespace's quotas, hostname and loopback; write why not on
    ``err_fd``. Never returns."""
    code = 0
    try:
        _view(plan, trees)
    except BaseException as e:
        code = 1
        try:
            os.write(err_fd, str(e).encode(errors="replace")[:500])
        except BaseException:
            pass
    os._exit(code)


def _view(plan: Mapping[str, Any], trees: list[int]) -> None:
    """Become uid/gid 0 inside (or an image's User) and build the view."""
    # without trees (not root, or an old kernel): opened while the host's
    # permissions on the way there are still ours (a checkout under a 0700
    # home); uid 0 inside could not walk to them
    source_fds = {} if trees else _open_bind_sources(plan["mounts"])
    uid, gid = plan["uid_map"][0], plan["gid_map"][0]  # 0, or an image's User
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    contain.build_view(plan, source_fds=source_fds, trees=trees)
    for fd in source_fds.values():
        os.close(fd)


def _open_bind_sources(steps: Any) -> dict[str, int]:
    """An O_PATH descriptor per bind source; the mounts bind from these."""
    return {s["source"]: os.open(s["source"], os.O_PATH | os.O_CLOEXEC)
            for s in steps if s["kind"] == "bind"}


def _read_all(fd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(fd, 512):
        out += chunk
    return bytes(out)
