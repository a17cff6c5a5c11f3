"""Write a bounded flood to stdout; the result line goes to stderr."""

import json
import os
import sys


def main() -> None:
    params = json.loads(sys.argv[1])
    total, chunk = params["bytes"], b"x" * 65536
    written, error = 0, ""
    try:
        while written < total:
            written += os.write(1, chunk[: min(len(chunk), total - written)])
    except OSError as e:
        error = f"{type(e).__name__}: {e.strerror}"
    sys.stderr.write(json.dumps({"probe": "output", "ok": written >= total,
                                 "detail": f"wrote {written} of {total} bytes; {error}"}) + "\n")


main()
