"""Read a host file outside the sandbox (its path given by the test)."""

import json
import sys


def emit(probe: str, ok: bool, detail: str) -> None:
    print(json.dumps({"probe": probe, "ok": ok, "detail": detail}), flush=True)


def try_read(probe: str, path: str) -> None:
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except OSError as e:
        emit(probe, False, f"{type(e).__name__}: {e.strerror} ({path})")
    else:
        emit(probe, True, data.decode("utf-8", "replace")[:200])


def main() -> None:
    params = json.loads(sys.argv[1])
    path = params["canary"]
    try_read("canary_read", path)
    try_read("canary_via_proc_self_root", "/proc/self/root" + path)
    try_read("canary_via_proc1_root", "/proc/1/root" + path)
    try_read("host_passwd_shadow", "/etc/shadow")


main()
