"""The oci provider's guardian (run as a script, not imported): removes the provider's
containers when the provider's process ends, however it ends.

Containers are detached: nothing in the kernel ends them when the process that made
them dies. The provider starts this guardian (own session, stdin a pipe whose other
end only the provider holds) with its first sandbox. When that pipe reaches EOF (the
provider's ``aclose``, or its process killed), the guardian deletes every container in
the provider's runtime state (``RUNTIME --root ROOT delete --force ID``), kills what is
left in each container's cgroup (``<mount>/corral-oci/ID``, ids with the provider's tag),
removes those cgroup dirs and the state dir, and exits.

argv: ``_guardian.py STATE_DIR TAG OWN_STATE(0|1) CGROUP_MOUNTS(colon-separated)
RUNTIME_ARGV...`` (the runtime's argv up to and including ``--root ROOT``). Stdlib only.
"""

import os
import shutil
import signal
import subprocess
import sys
import time


def _procs(d: str) -> list[int]:
    try:
        with open(os.path.join(d, "cgroup.procs"), encoding="ascii") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def sweep(state: str, tag: str, own: bool, mounts: list[str], runtime: list[str]) -> None:
    mine = f"oci-{tag}-"
    root = os.path.join(state, "runtime")
    try:
        ids = [n for n in os.listdir(root) if n.startswith(mine)]
    except OSError:
        ids = []
    for cid in ids:
        try:
            subprocess.run([*runtime, "delete", "--force", cid], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30,
                           check=False)
        except (OSError, subprocess.SubprocessError):
            pass
    for _ in range(200):
        left = []
        for m in mounts:
            parent = os.path.join(m, "corral-oci")
            try:
                names = [n for n in os.listdir(parent) if n.startswith(mine)]
            except OSError:
                continue
            left += [os.path.join(parent, n) for n in names]
        if not left:
            break
        for d in left:
            for pid in _procs(d):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(d)
            except OSError:
                pass
        time.sleep(0.02)
    if own:
        shutil.rmtree(state, ignore_errors=True)


def _left(state: str, tag: str, own: bool) -> bool:
    if own:
        return os.path.exists(state)
    try:
        return any(n.startswith(f"oci-{tag}-") for n in os.listdir(os.path.join(state, "runtime")))
    except OSError:
        return False


def main(argv: list[str]) -> None:
    state, tag, own, mounts = argv[0], argv[1], argv[2] == "1", argv[3]
    runtime = argv[4:]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the provider's group may be signalled
    clean = False
    while True:
        try:
            data = os.read(0, 4096)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        clean = clean or b"q" in data  # the provider's aclose, after its own destroys
    cg = [m for m in mounts.split(":") if m]
    sweep(state, tag, own, cg, runtime)
    if clean:
        return
    # the provider died: a runtime command it had started (an exec starting) may write
    # into the state dir after the sweep, so look again for a few seconds
    for _ in range(10):
        time.sleep(0.3)
        if _left(state, tag, own):
            sweep(state, tag, own, cg, runtime)


if __name__ == "__main__":
    main(sys.argv[1:])
