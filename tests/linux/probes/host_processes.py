"""See or signal a host process (the test passes its pid and a token in its argv)."""

import json
import os
import sys


def emit(probe: str, ok: bool, detail: str) -> None:
    print(json.dumps({"probe": probe, "ok": ok, "detail": detail}), flush=True)


def main() -> None:
    params = json.loads(sys.argv[1])
    pid, token = params["pid"], params["token"]
    emit("proc_entry_visible", os.path.exists(f"/proc/{pid}"), f"/proc/{pid}")
    try:
        os.kill(pid, 0)
        emit("signal_host_pid", True, "kill(pid, 0) succeeded")
    except OSError as e:
        emit("signal_host_pid", False, f"{type(e).__name__}: {e.strerror}")
    pids, seen = [], False
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pids.append(int(name))
        if int(name) == os.getpid():  # our own argv carries the token too
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    seen = True
        except OSError:
            pass
    emit("ps_sees_host_process", seen, f"{len(pids)} pids visible: {sorted(pids)[:20]}")


main()
