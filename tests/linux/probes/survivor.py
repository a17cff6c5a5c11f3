"""Leave a double-forked, bounded sleeper behind; its argv carries a token."""

import json
import os
import sys


def main() -> None:
    params = json.loads(sys.argv[1])
    token, sleep_s = params["token"], min(int(params["sleep_s"]), 30)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv(sys.executable, [sys.executable, "-I", "-S", "-c",
                                      f"import time; time.sleep({sleep_s})", token])
        os._exit(0)
    os.waitpid(pid, 0)
    print(json.dumps({"probe": "survivor", "ok": True, "detail": "spawned"}), flush=True)


main()
