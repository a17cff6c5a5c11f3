"""Run a command as the child of a child subreaper, so whatever it leaves behind when it
exits (orphans reparent here, not to init) can be seen: ``python reaper.py OUT CMD...``.

Writes ``{"pid": <the command's pid>}`` to OUT.pid once started; when the command has
exited, waits a moment, writes the processes still parented here (pid, cmdline) to OUT,
kills them (so a failing test leaves nothing), and exits with the command's status.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def children() -> list[dict[str, object]]:
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] not in ("Z", "X"):
            out.append({"pid": int(d), "cmdline": cmd})
    return out


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    proc = subprocess.Popen(cmd)
    with open(out + ".pid", "w") as fh:
        json.dump({"pid": proc.pid}, fh)
    code = proc.wait()
    time.sleep(0.5)  # orphans of the exit are reparented by now
    left = children()
    with open(out, "w") as fh:
        json.dump(left, fh)
    for p in left:
        try:
            os.kill(int(p["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
        except ProcessLookupError:
            pass
    while True:  # reap what was killed
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    return code


if __name__ == "__main__":
    sys.exit(main())
