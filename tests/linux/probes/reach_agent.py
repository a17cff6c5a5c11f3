"""Reach another process of the same uid by its pid: lower its rlimits, renice
it, move it to SCHED_IDLE or one CPU, give it idle I/O priority, make it the
OOM killer's first choice.

In the sandbox the target is pid 1, corral's agent: if any of this works, a
command can break every later exec of its sandbox. In control mode the target
is a same-uid sleeper the test started (the calls work there). ``ok`` means
the call changed the target. The whole-uid forms (``PRIO_USER``,
``IOPRIO_WHO_USER``) would renice every process of the uid on the host, so they
run in sandbox mode only.
"""

import ctypes
import errno
import json
import os
import platform
import resource
import sys

NR = {
    "x86_64": {"ioprio_set": 251, "sched_setattr": 314},
    "aarch64": {"ioprio_set": 30, "sched_setattr": 274},
}[platform.machine()]
PRIO_PROCESS, PRIO_PGRP, PRIO_USER = 0, 1, 2
IOPRIO_WHO_PROCESS, IOPRIO_WHO_PGRP, IOPRIO_WHO_USER = 1, 2, 3
IOPRIO_IDLE = 3 << 13
SCHED_IDLE = 5

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def emit(probe: str, ok: bool, detail: str) -> None:
    print(json.dumps({"probe": probe, "ok": ok, "detail": detail}), flush=True)


def attempt(probe: str, fn: object) -> None:
    try:
        detail = fn()  # type: ignore[operator]
    except OSError as e:
        emit(probe, False, f"{errno.errorcode.get(e.errno or 0, e.errno)}: {e.strerror}")
    else:
        emit(probe, True, str(detail))


def raw(name: str, *args: object) -> int:
    ctypes.set_errno(0)
    ret = int(libc.syscall(ctypes.c_long(NR[name]), *args))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def sched_setattr_idle(pid: int) -> str:
    attr = (ctypes.c_uint32 * 14)()  # struct sched_attr, VER1 (56 bytes)
    attr[0], attr[1] = ctypes.sizeof(attr), SCHED_IDLE
    raw("sched_setattr", pid, ctypes.byref(attr), 0)
    return f"pid {pid} is SCHED_IDLE"


def write_proc(pid: int, name: str, value: str) -> str:
    with open(f"/proc/{pid}/{name}", "w") as f:
        f.write(value)
    return f"wrote {value} to /proc/{pid}/{name}"


def main() -> None:
    params = json.loads(sys.argv[1])
    pid = int(params["target"])
    emit("target_threads", len(os.listdir(f"/proc/{pid}/task")) > 1,
         f"{os.listdir(f'/proc/{pid}/task')}")
    attempt("prlimit_nofile", lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, 3)))
    attempt("prlimit_nproc", lambda: resource.prlimit(pid, resource.RLIMIT_NPROC, (1, 1)))
    attempt("setpriority_process", lambda: os.setpriority(PRIO_PROCESS, pid, 19))
    attempt("setpriority_pgrp", lambda: os.setpriority(PRIO_PGRP, pid, 19))
    attempt("sched_setaffinity", lambda: os.sched_setaffinity(pid, {0}))
    attempt("sched_setscheduler",
            lambda: os.sched_setscheduler(pid, SCHED_IDLE, os.sched_param(0)))
    attempt("sched_setparam", lambda: os.sched_setparam(pid, os.sched_param(0)))
    attempt("sched_setattr", lambda: sched_setattr_idle(pid))
    attempt("ioprio_process", lambda: raw("ioprio_set", IOPRIO_WHO_PROCESS, pid, IOPRIO_IDLE))
    attempt("ioprio_pgrp", lambda: raw("ioprio_set", IOPRIO_WHO_PGRP, pid, IOPRIO_IDLE))
    attempt("oom_score_adj", lambda: write_proc(pid, "oom_score_adj", "1000"))
    attempt("timerslack_ns", lambda: write_proc(pid, "timerslack_ns", "100000000"))
    if params["mode"] == "sandbox":
        attempt("setpriority_user", lambda: os.setpriority(PRIO_USER, 0, 19))
        attempt("ioprio_user", lambda: raw("ioprio_set", IOPRIO_WHO_USER, 0, IOPRIO_IDLE))
    # what the target looks like now
    with open(f"/proc/{pid}/limits") as f:
        nofile = [line for line in f if line.startswith("Max open files")]
    emit("target_state", False, f"nice {os.getpriority(PRIO_PROCESS, pid)}; "
         f"{' '.join(nofile[0].split()) if nofile else '?'}")


main()
