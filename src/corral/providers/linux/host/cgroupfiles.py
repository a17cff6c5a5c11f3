"""The cgroup file primitives the provider (``cgroups``, ``cgroupfs``) and the CLI's
one-shot path (``oneshot``) share: reading and writing cgroupfs files, a process's start
time (cgroup names carry it), and which files a sandbox's limits are written to.

Standard library only (``os``), no dataclasses or corral imports: the one-shot path loads
it on every run.
"""

from __future__ import annotations

import os

__all__ = ["limit_writes", "read_int", "read_text", "start_ticks", "write_text"]

_MIB = 1024 * 1024


def read_text(path: str) -> str:
    """The whole file as text."""
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def write_text(path: str, value: str) -> None:
    """Write ``value`` in a single write(2), as cgroupfs wants."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode("ascii"))
    finally:
        os.close(fd)


def read_int(path: str | None) -> int:
    """An integer file; 0 when absent or ``max``."""
    if path is None:
        return 0
    try:
        s = read_text(path).strip()
    except FileNotFoundError:
        return 0
    return int(s) if s.isdigit() else 0


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot; None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def limit_writes(version: str, mem_mb: int | None, max_processes: int | None
                 ) -> list[tuple[str, str, str]]:
    """(controller key, file, value) to write, in order, for a sandbox's memory+swap and
    process limits (cpu is accounted, not capped)."""
    out: list[tuple[str, str, str]] = []
    if mem_mb is not None:
        b = str(mem_mb * _MIB)
        if version == "v2":
            out += [("memory", "memory.max", b), ("memory", "memory.swap.max", "0")]
        else:  # memsw must stay >= memory: raise memory first
            out += [("memory", "memory.limit_in_bytes", b),
                    ("memory", "memory.memsw.limit_in_bytes", b)]
    if max_processes is not None:
        out.append(("pids", "pids.max", str(max_processes)))
    return out
