"""The cgroup file primitives the provider (``cgroups``, ``cgroupfs``) and the CLI's
one-shot path (``oneshot``) share: reading and writing cgroupfs files, a process's start
time (cgroup names carry it), which files a sandbox's limits are written to, and what a
sandbox's cgroup reads back (:class:`CgroupReader`).

Standard library only (``os``), no dataclasses or corral imports: the one-shot path loads
it on every run.
"""

from __future__ import annotations

import os

__all__ = ["V1_PEAK_FALLBACK", "CgroupReader", "limit_writes", "read_int", "read_keyed",
           "read_text", "start_ticks", "write_text"]

_MIB = 1024 * 1024
#: v1 oom evidence on kernels < 4.13 (no oom_kill line). Not failcnt: on 6.18 an
#: oom-killed v1 cgroup showed memory.failcnt and memory.memsw.failcnt both 0.
V1_PEAK_FALLBACK = ("memory.memsw.max_usage_in_bytes reaching the limit (no oom_kill "
                    "counter: a hit, not proof of a kill)")


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


def read_keyed(path: str | None) -> dict[str, int]:
    """A ``key value`` file (cpu.stat, memory.events, oom_control, ...); {} when absent."""
    if path is None:
        return {}
    try:
        text = read_text(path)
    except FileNotFoundError:
        return {}
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


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


class CgroupReader:
    """What one sandbox's cgroup reads back: the provider's ``SandboxCgroup`` and the
    one-shot path's ``_Cgroup`` both are one (they hold ``version``, ``dirs``: controller
    key -> dir, and ``oom_source``: how this host shows an oom kill)."""

    __slots__ = ()
    version: str
    dirs: dict[str, str]
    oom_source: str

    def _file(self, key: str, name: str) -> str | None:
        d = self.dirs.get("unified" if self.version == "v2" else key)
        return None if d is None else os.path.join(d, name)

    def cpu_ms(self) -> int:
        """CPU time used by every process here since the cgroup was made (ms)."""
        if self.version == "v2":
            return read_keyed(self._file("", "cpu.stat")).get("usage_usec", 0) // 1000
        if self.version == "v1":
            return read_int(self._file("cpuacct", "cpuacct.usage")) // 1_000_000
        return 0

    def oom_kills(self) -> int:
        """The out-of-memory kill count (see ``oom_source``)."""
        if self.version == "v2":
            return read_keyed(self._file("", "memory.events")).get("oom_kill", 0)
        if self.version != "v1":
            return 0
        if self.oom_source == V1_PEAK_FALLBACK:
            lim = read_int(self._file("memory", "memory.memsw.limit_in_bytes"))
            top = read_int(self._file("memory", "memory.memsw.max_usage_in_bytes"))
            return int(0 < lim < 1 << 62 and top >= lim)
        return read_keyed(self._file("memory", "memory.oom_control")).get("oom_kill", 0)

    def peak_mb(self) -> int:
        """The peak memory of the cgroup (MiB, rounded up; 0 where not measured)."""
        if self.version not in ("v1", "v2"):
            return 0
        peak = read_int(self._file("memory", "memory.peak" if self.version == "v2"
                                   else "memory.max_usage_in_bytes"))
        return -(-peak // _MIB)

    def pids_current(self) -> int:
        """The tasks (threads, zombies not yet reaped) in the cgroup and its children now
        (``pids.current``); 0 when there is no pids controller."""
        return read_int(self._file("pids", "pids.current"))

    def pids_max_events(self) -> int:
        """How many forks or clones failed here because of ``pids.max``."""
        return read_keyed(self._file("pids", "pids.events")).get("max", 0)

    def pids_max_hit(self) -> bool:
        """Whether a fork or clone failed here because of ``pids.max``."""
        return self.pids_max_events() > 0
