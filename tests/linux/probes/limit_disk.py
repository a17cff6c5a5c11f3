"""Write 1 MiB chunks up to a bound into a file, then stop (and delete it)."""

import json
import os
import sys


def main() -> None:
    params = json.loads(sys.argv[1])
    bound, path = params["mb"], params["path"]
    chunk = b"\xa5" * (1 << 20)
    written, error = 0, ""
    try:
        with open(path, "wb") as f:
            for _ in range(bound):
                f.write(chunk)
                f.flush()
                written += 1
            os.fsync(f.fileno())
    except OSError as e:
        error = f"{type(e).__name__}: {e.strerror}"
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    print(json.dumps({"probe": "disk", "ok": written == bound and not error,
                      "detail": f"wrote {written} of {bound} MiB; {error}"}), flush=True)


main()
