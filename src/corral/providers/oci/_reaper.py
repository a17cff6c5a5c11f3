"""The host-side wrapper of one command run in a container (run as a script, not imported).

``crun exec`` reports a command killed by signal N as exit ``128 + N``, the same as a
command that exits with that code. To give the contract's answer (a negative exit code
for a signal), the command must be waited on by its real parent. This wrapper makes
itself a child subreaper, runs ``RUNTIME ... exec --detach --pid-file PIDFILE ...``
(stdio passed straight through: the command's pipes are the wrapper's), and when the
runtime has detached, the command is re-parented to the wrapper, which waits on it and
ends the same way: the same exit code, or killed by the same signal.

The detached runtime starts the command in a session of its own, so the command and
what it starts are in a process group of their own: the wrapper writes that group's
number (``getpgid`` of the adopted command) to ``GROUPFILE`` (the provider kills what is
left of the group in the container when the run ends, however it ends) and forwards
SIGTERM, SIGINT, SIGHUP and SIGQUIT to the group (a timeout's shutdown signal reaches
the command).

argv: ``_reaper.py SYS_UNSAFE_PATH PIDFILE GROUPFILE RUNTIME_ARGV...``. Exit 125 (with a
line on stderr) when the runtime could not start the command. Stdlib only; the one
``ctypes`` user (``_sys_unsafe``) is loaded by its path, without corral's packages.
"""

import importlib.util
import os
import signal
import sys

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _load(path: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("_corral_sys_unsafe", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _killpg(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except OSError:
        pass


def main(argv: list[str]) -> None:
    sys_unsafe, pidfile, groupfile, runtime = argv[0], argv[1], argv[2], argv[3:]
    _load(sys_unsafe).set_child_subreaper()
    pending: list[int] = []
    group = 0
    for fwd in _FORWARDED:  # until the command's group is known, remember what came
        signal.signal(fwd, lambda s, _f: _killpg(group, s) if group else pending.append(s))
    pid = os.posix_spawn(runtime[0], runtime, {})
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        with open(pidfile, "rb") as f:
            target = int(f.read(32).strip() or b"0")
    except (OSError, ValueError):
        target = 0
    if code != 0 or target <= 0:
        os.write(2, b"corral-oci: the runtime could not start the command (exit %d)\n" % code)
        os._exit(125)
    try:  # the command is our child now (adopted), alive or not yet reaped
        found = os.getpgid(target)
    except OSError:
        found = 0
    if found > 0 and found != os.getpgrp():
        fd = os.open(groupfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.write(fd, b"%d\n" % found)
        os.close(fd)
        group = found
        for early in pending:
            _killpg(group, early)
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:  # never adopted: it ended before the runtime detached
            os._exit(125)
        if got == target:
            break
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 125)


if __name__ == "__main__":
    main(sys.argv[1:])
