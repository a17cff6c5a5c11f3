"""The host-side wrapper of one command run in a container (run as a script, not imported).

``crun exec`` reports a command killed by signal N as exit ``128 + N``, the same as a
command that exits with that code. To give the contract's answer (a negative exit code
for a signal), the command must be waited on by its real parent. This wrapper makes
itself a child subreaper, runs ``RUNTIME ... exec --detach --pid-file PIDFILE ...``
(stdio passed straight through: the command's pipes are the wrapper's), and when the
runtime has detached, the command is re-parented to the wrapper, which waits on it and
ends the same way: the same exit code, or killed by the same signal.

argv: ``_reaper.py SYS_UNSAFE_PATH PIDFILE RUNTIME_ARGV...``. Exit 125 (with a line on
stderr) when the runtime could not start the command. Stdlib only; the one ``ctypes``
user (``_sys_unsafe``) is loaded by its path, without corral's packages.
"""

import importlib.util
import os
import signal
import sys


def _load(path: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("_corral_sys_unsafe", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str]) -> None:
    sys_unsafe, pidfile, runtime = argv[0], argv[1], argv[2:]
    _load(sys_unsafe).set_child_subreaper()
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
