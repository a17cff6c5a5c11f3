"""Create a file outside the work dir: /, /usr, /etc, /tmp-of-the-host, ..."""

import json
import os
import sys


def emit(probe: str, ok: bool, detail: str) -> None:
    print(json.dumps({"probe": probe, "ok": ok, "detail": detail}), flush=True)


def main() -> None:
    params = json.loads(sys.argv[1])
    token = params["token"]
    for d in params["dirs"]:
        probe = f"write:{d}"
        if params["mode"] == "control" and d != params.get("safe_dir"):
            # harmless on the host: ask the kernel, do not write to system dirs
            ok = os.access(d, os.W_OK)
            emit(probe, ok, "access(W_OK)")
            continue
        path = os.path.join(d, f"corral-probe-{token}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            emit(probe, False, f"{type(e).__name__}: {e.strerror}")
            continue
        os.write(fd, token.encode())
        os.close(fd)
        emit(probe, True, path)
        if params["mode"] == "control":
            os.unlink(path)


main()
