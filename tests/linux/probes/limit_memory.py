"""Allocate (and touch) memory in 1 MiB steps up to a bound, then stop."""

import json
import sys


def main() -> None:
    params = json.loads(sys.argv[1])
    bound = params["mb"]
    chunks = []
    for i in range(bound):
        try:
            chunks.append(bytearray(1 << 20))  # zero-filled: every page touched
        except MemoryError:
            print(json.dumps({"probe": "memory", "ok": False,
                              "detail": f"MemoryError after {i} MiB"}), flush=True)
            return
    print(json.dumps({"probe": "memory", "ok": True, "detail": f"allocated {bound} MiB"}),
          flush=True)


main()
