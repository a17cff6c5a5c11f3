"""The one cgroup layer of a strict sandbox, shared by the provider (``cgroups``,
``cgroupfs``) and the CLI's one-shot path (``oneshot``): reading and writing cgroupfs
files, a process's start time (cgroup names carry it), which files a sandbox's limits are
written to, what a sandbox's cgroup reads back (:class:`CgroupReader`), and one sandbox
cgroup's life (:class:`CgroupDirs`: made, limited, joined, emptied and removed) and the
finding of those whose owner died (:func:`listing`).

Standard library only (``os``, ``errno``, ``time``), no dataclasses, no ``re``, no corral
imports at the top: the one-shot path loads it on every run.
"""

from __future__ import annotations

import errno
import os
import time

__all__ = ["V1_PEAK_FALLBACK", "CgroupDirs", "CgroupReader", "limit_writes", "listing",
           "read_int", "read_keyed", "read_text", "sandbox_name", "start_ticks",
           "write_text"]

_SIGKILL = 9

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing (the one-shot path)
if TYPE_CHECKING:
    from typing import Self

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
    """What one sandbox's cgroup reads back (it holds ``version``, ``dirs``: controller
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


def sandbox_name(prefix: str, owner_pid: int, name: str) -> str:
    """``<prefix>-<owner pid>-<owner start ticks>-<name>``: whose death makes it an orphan
    (the start time tells a reused pid from the owner)."""
    return f"{prefix}-{owner_pid}-{start_ticks(owner_pid) or 0}-{name}"


def _owner(prefix: str, entry: str) -> tuple[int, int] | None:
    """(owner pid, start ticks) of a sandbox cgroup's name, None for any other name (the
    shape ``<prefix>-<digits>-<digits>-<[A-Za-z0-9_.]+>``, read without ``re``)."""
    head = prefix + "-"
    if not entry.startswith(head):
        return None
    parts = entry[len(head):].split("-", 2)
    if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit() and parts[2]):
        return None
    if not all((c.isalnum() and c.isascii()) or c in "_." for c in parts[2]):
        return None
    return int(parts[0]), int(parts[1])


def listing(parents: dict[str, str] | tuple[tuple[str, str], ...], prefix: str = "corral",
            *, orphaned: bool = False, by_first: bool = False) -> dict[str, dict[str, str]]:
    """The sandbox cgroups under ``parents`` (hierarchy key -> corral's parent dir):
    name -> {key: dir}; with ``orphaned``, only those whose owner is dead (gone, or its
    pid reused by a later process). ``by_first``: find the names in the first parent
    alone (one directory read instead of one per v1 hierarchy: the one-shot path's
    check after every run) and take each one's directory in the others where it
    exists; a leftover missing from the first hierarchy is then not seen (a full
    listing, as ``CgroupManager.reap_orphans`` makes, sees it)."""
    pairs = list(dict(parents).items())
    out: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for key, parent in pairs[:1] if by_first else pairs:
        if parent in seen:
            continue
        seen.add(parent)
        try:
            entries = os.listdir(parent)
        except FileNotFoundError:
            continue
        for e in entries:
            owner = _owner(prefix, e)
            if owner is None or not os.path.isdir(os.path.join(parent, e)):
                continue
            if orphaned:
                now = start_ticks(owner[0])
                if now is not None and (owner[1] == 0 or now == owner[1]):
                    continue  # owner alive (same process, or its start time was unknown)
            out.setdefault(e, {})[key] = os.path.join(parent, e)
    if by_first:
        for name, dirs in out.items():
            for key, parent in pairs[1:]:
                path = os.path.join(parent, name)
                if parent not in dirs.values() and os.path.isdir(path):
                    dirs[key] = path
    return out


class CgroupDirs(CgroupReader):
    """One sandbox cgroup: a directory per v1 hierarchy, or one v2 directory. Made by
    :meth:`make` (the provider's ``CgroupManager.create`` and the one-shot path alike),
    joined by pid 1 through :attr:`join_files`, removed by :meth:`remove`. Failures are
    OSError; the provider's ``SandboxCgroup`` adds its typed errors, the freezer and
    usage on top."""

    __slots__ = ("dirs", "name", "oom_source", "version")

    def __init__(self, name: str, version: str, dirs: dict[str, str],
                 oom_source: str = "") -> None:
        self.name = name
        self.version = version
        self.dirs = dirs
        self.oom_source = oom_source

    @classmethod
    def make(cls, full: str, version: str, parents: dict[str, str] | tuple[tuple[str, str], ...],
             oom_source: str, mem_mb: int | None, max_processes: int | None) -> Self:
        """Make ``full`` under each parent (the parent made, and on v2 its controllers
        enabled, first) and write the limits; on any failure nothing is left and the
        error goes up."""
        cg = cls(full, version, {}, oom_source)
        try:
            for key, parent in parents.items() if isinstance(parents, dict) else parents:
                if parent in cg.dirs.values():
                    continue
                path = os.path.join(parent, full)
                for attempt in (1, 2):  # retry once if a racing remove of the parent won
                    try:
                        os.mkdir(parent)
                    except FileExistsError:
                        pass
                    if key == "unified":  # heavier module, v2 only
                        from corral.providers.linux.host.cgroupfs import v2_enable
                        v2_enable(os.path.dirname(parent), parent)
                    try:
                        os.mkdir(path)
                        break
                    except FileNotFoundError:
                        if attempt == 2:
                            raise
                cg.dirs[key] = path
            cg.apply_limits(mem_mb, max_processes)
        except BaseException:
            cg.remove()
            raise
        return cg

    def apply_limits(self, mem_mb: int | None, max_processes: int | None) -> None:
        """Write memory+swap and pids (cpu is accounted, not capped)."""
        for key, name, value in limit_writes(self.version, mem_mb, max_processes):
            self._write(key, name, value)

    def _write(self, key: str, name: str, value: str) -> None:
        path = self._file(key, name)
        if path is None or not os.path.exists(path):
            raise OSError(errno.ENOENT, f"cgroup file {name} ({key}) missing")
        write_text(path, value)

    @property
    def path(self) -> str:
        """The main directory (v2: the one dir; v1: memory's, else the first); "" if none."""
        return self.dirs.get("unified") or self.dirs.get("memory") or next(
            iter(self.dirs.values()), "")

    @property
    def procs_files(self) -> list[str]:
        """The cgroup.procs files a process is moved through (a whole process)."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    @property
    def join_files(self) -> list[str]:
        """What a sandbox's pid 1 writes "0" into to join: on v1 each hierarchy's
        ``tasks`` (pid 1 is single-threaded then, so the thread is the whole process; a
        ``tasks`` write of the writer itself skips the global threadgroup lock whose RCU
        grace period a ``cgroup.procs`` write waits for: 8-16 ms here), on v2
        ``cgroup.procs``."""
        name = "tasks" if self.version == "v1" else "cgroup.procs"
        return [os.path.join(d, name) for d in self.dirs.values()]

    def pids(self) -> list[int]:
        """Processes (and, on v1, tasks) in this cgroup, sorted, without duplicates."""
        out: set[int] = set()
        for d in self.dirs.values():
            for f in ("cgroup.procs", "tasks") if self.version == "v1" else ("cgroup.procs",):
                try:
                    out.update(int(x) for x in read_text(os.path.join(d, f)).split())
                except OSError as err:
                    if err.errno not in (errno.ENOENT, errno.ENODEV):
                        raise
        return sorted(out)

    def remove(self, timeout: float = 5.0) -> None:
        """Remove every directory; idempotent. Once a sandbox's pid 1 is gone the cgroup
        is empty (its pid namespace died with it), so each rmdir is tried first; while
        one is busy (EBUSY) whatever is left in the cgroup is SIGKILLed and the rmdir
        retried, for up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        for d in self.dirs.values():
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise OSError(err.errno, f"cannot remove cgroup {d}: {err}") from err
                for pid in self.pids():
                    try:
                        os.kill(pid, _SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.001)
