"""Fork up to N children that each sleep a bounded time; count refusals."""

import json
import os
import sys
import time


def main() -> None:
    params = json.loads(sys.argv[1])
    n, sleep_s = params["n"], min(float(params["sleep_s"]), 5.0)
    pids, error = [], ""
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError as e:
            error = f"{type(e).__name__}: {e.strerror}"
            break
        if pid == 0:
            time.sleep(sleep_s)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    print(json.dumps({"probe": "processes", "ok": len(pids) == n,
                      "detail": f"forked {len(pids)} of {n}; {error}"}), flush=True)


main()
