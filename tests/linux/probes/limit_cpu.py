"""Spin the CPU for at most a bound of process CPU time, then stop."""

import json
import sys
import time


def main() -> None:
    params = json.loads(sys.argv[1])
    bound_s = params["cpu_ms"] / 1000
    start = time.process_time()
    deadline = time.monotonic() + 4 * bound_s + 2  # a wall bound as well
    x = 0
    while time.process_time() - start < bound_s and time.monotonic() < deadline:
        x += 1
    used = int((time.process_time() - start) * 1000)
    print(json.dumps({"probe": "cpu", "ok": used >= params["cpu_ms"],
                      "detail": f"spun {used} ms of CPU"}), flush=True)


main()
