"""This test process's live descendants, from /proc (ppid links): for tests that close a
door with work in flight and check that nothing it started is left running."""

from __future__ import annotations

import os


def descendants() -> set[int]:
    """Live (not zombie) processes below this one."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            parent[int(d)] = int(fields[1])
    mine, grew = {os.getpid()}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in mine} - mine
        grew = bool(more)
        mine |= more
    return mine - {os.getpid()}


def cmdline(pid: int) -> str:
    """``pid``'s command line, for a failure's message ("?" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
