"""Plant symlinks in the work dir that point out of the sandbox, then follow them."""

import json
import os
import sys


def emit(probe: str, ok: bool, detail: str) -> None:
    print(json.dumps({"probe": probe, "ok": ok, "detail": detail}), flush=True)


def main() -> None:
    params = json.loads(sys.argv[1])
    canary = params["canary"]
    workdir = params["workdir"]
    targets = {"symlink_to_canary": canary,
               "symlink_via_proc_self_root": "/proc/self/root" + canary,
               "symlink_via_proc1_root": "/proc/1/root" + canary}
    for probe, target in targets.items():
        link = os.path.join(workdir, f"{probe}-{params['token']}")
        try:
            os.symlink(target, link)
        except OSError as e:
            emit(probe, False, f"symlink: {e.strerror}")
            continue
        try:
            with open(link, "rb") as f:
                data = f.read(4096)
            emit(probe, True, data.decode("utf-8", "replace")[:200])
        except OSError as e:
            emit(probe, False, f"{type(e).__name__}: {e.strerror}")
        finally:
            if params["mode"] == "control":
                os.unlink(link)
    # leave one link for the host-side read_file check
    if params["mode"] == "sandbox":
        try:
            os.symlink(canary, os.path.join(workdir, "escape-link"))
        except OSError:
            pass


main()
