"""Cgroups for strict sandboxes: v2 or v1, by plain file I/O on cgroupfs.

:func:`detect` finds which cgroup version this process can use and which
controllers work there; :class:`CgroupManager` creates one cgroup per sandbox
*under the caller's own cgroup* of each hierarchy (read from
``/proc/self/cgroup``), inside one ``<own>/<prefix>`` directory. It never
writes at a hierarchy root and never touches a cgroup it did not create.

Sandbox cgroup names are ``<prefix>-<owner pid>-<owner start ticks>-<name>``,
so :meth:`CgroupManager.reap_orphans` can tell a dead owner (or a reused pid)
from a live one.

Controllers, by the name :class:`CgroupSupport` uses:

========  ===================================  ===================================
name      v2 file                              v1 file
========  ===================================  ===================================
memory    memory.max, memory.events oom_kill,  memory.limit_in_bytes, oom_control
          memory.peak                          oom_kill, memory.max_usage_in_bytes
memsw     memory.swap.max = 0                  memory.memsw.limit_in_bytes
pids      pids.max, pids.events max            same
cpu       cpu.stat usage_usec                  cpuacct.usage (ns)
freezer   cgroup.freeze + cgroup.events        freezer.state FROZEN/THAWED
kill      cgroup.kill                          (none: freeze, SIGKILL each, thaw)
========  ===================================  ===================================

A limit is memory *plus* swap: without ``memsw`` a memory limit is refused.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from collections.abc import Callable, Mapping
from typing import Final, final

from corral.core.errors import ConfigInvalidError, LevelNotSupportedError, ProviderError
from corral.core.spec import SandboxLimits
from corral.providers.linux.host.cgroupfiles import CgroupReader, limit_writes, start_ticks
from corral.providers.linux.host.cgroupfs import (
    CgroupSupport,
    CgroupUsage,
    CgroupVersion,
    detect,
    read_int,
    read_keyed,
    read_text,
    v2_enable,
    write_text,
)

__all__ = [
    "CgroupManager",
    "CgroupSupport",
    "CgroupUsage",
    "CgroupVersion",
    "SandboxCgroup",
    "detect",
]

_MIB = 1024 * 1024
_KILL_DEADLINE_S = 5.0


_NAME_OK = re.compile(r"[A-Za-z0-9_.]{1,64}")


@final
class CgroupManager:
    """Creates, finds and reaps corral's sandbox cgroups (one per sandbox)."""

    def __init__(self, *, prefix: str = "corral",
                 root: str | Mapping[str, str] | None = None) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,30}", prefix):
            raise ConfigInvalidError("cgroups.prefix", f"must match [a-z][a-z0-9_]*: {prefix!r}")
        self.prefix = prefix
        self.support = detect(root, prefix=prefix)
        self._name_re = re.compile(rf"{prefix}-(\d+)-(\d+)-[A-Za-z0-9_.]+")

    def require(self, limits: SandboxLimits, *, pause: bool = False) -> None:
        """Refuse, naming every missing primitive, when ``limits`` cannot be enforced."""
        s = self.support
        need: list[tuple[str, str, str]] = []  # (controller, what, the refused spec field)
        if limits.mem_mb is not None:
            need += [("memory", "cgroup memory controller", "limits.mem_mb"),
                     ("memsw", "cgroup memory+swap limit (memory.memsw.limit_in_bytes"
                      if s.version == "v1" else "cgroup memory+swap limit (memory.swap.max",
                      "limits.mem_mb")]
        if limits.max_processes is not None:
            need.append(("pids", "cgroup pids controller", "limits.max_processes"))
        if limits.cpu_ms is not None:
            need.append(("cpu", "cgroup cpu accounting", "limits.cpu_ms"))
        if pause:
            need.append(("freezer", "cgroup freezer", "pause"))
        ctrls: list[str] = []
        whys: list[str] = []
        fields: list[str] = []
        for ctrl, _what, field in need:
            if ctrl not in s.available:
                why = s.missing.get(ctrl, "not available")
                ctrls += [] if ctrl in ctrls else [ctrl]
                whys += [] if why in whys or why.startswith("needs the") else [why]
                fields += [] if field in fields else [field]
        if ctrls:
            fix = CGROUP_FIX_V1 if s.version == "v1" and os.geteuid() != 0 else CGROUP_FIX
            raise LevelNotSupportedError(
                "strict", ("strict",), fix if "pause" not in fields else
                "run as root, or delegate a cgroup with the freezer and pass cgroup_root",
                missing=f"cgroup {', '.join(ctrls)} ({'; '.join(whys) or 'not available'})",
                field=", ".join(fields))

    def create(self, name: str, limits: SandboxLimits, *,
               owner_pid: int | None = None) -> SandboxCgroup:
        """Make the sandbox cgroup ``<prefix>-<owner pid>-<start ticks>-<name>`` with ``limits``.

        ``name`` is a short unique id ([A-Za-z0-9_.], up to 64). ``owner_pid``
        (default: this process) is whose death makes the cgroup an orphan.
        """
        if not _NAME_OK.fullmatch(name):
            raise ConfigInvalidError("cgroups.name", f"must match [A-Za-z0-9_.]{{1,64}}: {name!r}")
        self.require(limits)
        pid = os.getpid() if owner_pid is None else owner_pid
        full = f"{self.prefix}-{pid}-{start_ticks(pid) or 0}-{name}"
        s = self.support
        dirs: dict[str, str] = {}
        cg = SandboxCgroup(full, s.version, dirs, s.oom_source)
        try:
            for key, parent in s.parents.items():
                if parent in dirs.values():
                    continue
                path = os.path.join(parent, full)
                for attempt in (1, 2):  # retry once if a racing remove_parents() won
                    self._ensure_parent(key, parent)
                    try:
                        os.mkdir(path)
                        break
                    except FileNotFoundError:
                        if attempt == 2:
                            raise
                dirs[key] = path
            cg.apply(limits)
        except BaseException as err:
            cg.remove()
            if isinstance(err, OSError):
                raise ProviderError(f"cannot create cgroup {full}: {err}", err) from err
            raise
        return cg

    def _ensure_parent(self, key: str, parent: str) -> None:
        try:
            os.mkdir(parent)
        except FileExistsError:
            pass
        if key == "unified":
            v2_enable(os.path.dirname(parent), parent)

    def list_cgroups(self) -> dict[str, dict[str, str]]:
        """Corral's sandbox cgroups under this manager's parents: name -> {hierarchy: dir}."""
        out: dict[str, dict[str, str]] = {}
        seen: set[str] = set()
        for key, parent in self.support.parents.items():
            if parent in seen:
                continue
            seen.add(parent)
            try:
                entries = os.listdir(parent)
            except FileNotFoundError:
                continue
            for e in entries:
                if self._name_re.fullmatch(e) and os.path.isdir(os.path.join(parent, e)):
                    out.setdefault(e, {})[key] = os.path.join(parent, e)
        return out

    def reap_orphans(self) -> list[str]:
        """Kill and remove corral cgroups whose owner died; return their names."""
        reaped = []
        for name, dirs in sorted(self.list_cgroups().items()):
            m = self._name_re.fullmatch(name)
            assert m is not None
            pid, ticks = int(m.group(1)), int(m.group(2))
            now = start_ticks(pid)
            if now is not None and (ticks == 0 or now == ticks):
                continue  # owner alive (same process, or its start time was unknown)
            SandboxCgroup(name, self.support.version, dirs, self.support.oom_source).remove()
            reaped.append(name)
        return reaped

    def remove_parents(self) -> None:
        """Remove corral's parent directories if empty (best effort)."""
        for parent in dict.fromkeys(self.support.parents.values()):
            try:
                os.rmdir(parent)
            except OSError:
                pass


@final
class SandboxCgroup(CgroupReader):
    """One sandbox's cgroup: a dir per v1 hierarchy, or one v2 dir. Its readings
    (``cpu_ms``, ``oom_kills``, ``peak_mb``, ``pids_max_events``) are
    :class:`~corral.providers.linux.host.cgroupfiles.CgroupReader`'s."""

    def __init__(self, name: str, version: CgroupVersion, dirs: dict[str, str],
                 oom_source: str = "") -> None:
        self.name = name
        self.version = version
        self.dirs = dirs
        self.oom_source = oom_source

    def __repr__(self) -> str:
        return f"SandboxCgroup({self.name!r}, {self.version}, {sorted(self.dirs.values())})"

    @property
    def path(self) -> str:
        """The main directory (v2: the one dir; v1: memory's, else the first); "" if none."""
        return self.dirs.get("unified") or self.dirs.get("memory") or next(
            iter(self.dirs.values()), "")

    @property
    def procs_files(self) -> list[str]:
        """The cgroup.procs files a child writes its own pid into (before unsharing)."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def apply(self, limits: SandboxLimits) -> None:
        """Write ``limits`` (memory+swap and pids; cpu is accounted, not capped)."""
        for key, name, value in limit_writes(self.version, limits.mem_mb,
                                             limits.max_processes):
            self._write(key, name, value)

    def _write(self, key: str, name: str, value: str) -> None:
        path = self._file(key, name)
        if path is None or not os.path.exists(path):
            field = {"memory": "limits.mem_mb", "pids": "limits.max_processes"}[key]
            raise LevelNotSupportedError("strict", ("strict",), f"sandbox cgroup {self.path}",
                                         missing=f"cgroup file {name} ({key})", field=field)
        write_text(path, value)

    def add_pid(self, pid: int) -> None:
        """Move ``pid`` (a whole process) into every hierarchy of this cgroup."""
        for f in self.procs_files:
            try:
                write_text(f, str(pid))
            except OSError as err:
                raise ProviderError(f"cannot move pid {pid} into {f}: {err}", err) from err

    def pids(self) -> list[int]:
        """Processes (and, on v1, tasks) in this cgroup, sorted, without duplicates."""
        out: set[int] = set()
        for d in self.dirs.values():
            for f in ("cgroup.procs", "tasks") if self.version == "v1" else ("cgroup.procs",):
                try:
                    out.update(int(x) for x in read_text(os.path.join(d, f)).split())
                except FileNotFoundError:
                    pass
        return sorted(out)

    def freeze(self) -> None:
        """Stop every process (freezer) and wait until the kernel says frozen."""
        self._set_frozen(True)

    def thaw(self) -> None:
        """Let every process run again."""
        self._set_frozen(False)

    def _set_frozen(self, frozen: bool, timeout: float = 2.0) -> None:
        if self.version == "v2":
            f, ev = self._file("", "cgroup.freeze"), self._file("", "cgroup.events")
            assert f is not None and ev is not None
            write_text(f, "1" if frozen else "0")
            want = int(frozen)
            done: Callable[[], bool] = lambda: read_keyed(ev).get("frozen") == want  # noqa: E731
        else:
            f = self._file("freezer", "freezer.state")
            if f is None:
                raise LevelNotSupportedError("strict", (), f"sandbox cgroup {self.path}",
                                             missing="cgroup freezer")
            state = "FROZEN" if frozen else "THAWED"
            write_text(f, state)
            done = lambda: read_text(f).strip() == state  # noqa: E731
        if not _wait(done, timeout):
            raise ProviderError(f"cgroup {self.name} did not become "
                                f"{'frozen' if frozen else 'thawed'} within {timeout}s")

    def _can_freeze(self) -> bool:
        f = self._file("freezer", "cgroup.freeze" if self.version == "v2" else "freezer.state")
        return f is not None and os.path.exists(f)

    def kill_all(self, timeout: float = _KILL_DEADLINE_S) -> None:
        """SIGKILL every process in the cgroup and wait until it is empty."""
        if not self.dirs:
            return
        kill = self._file("", "cgroup.kill") if self.version == "v2" else None
        deadline = time.monotonic() + timeout
        while (pids := self._live_pids()) and time.monotonic() < deadline:
            if kill is not None and os.path.exists(kill):
                write_text(kill, "1")
            else:
                frozen = False
                if self._can_freeze():
                    try:
                        self._set_frozen(True, timeout=0.5)
                    except ProviderError:
                        pass  # FREEZING: kill anyway, thaw below
                    frozen = True
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if frozen:
                    self._set_frozen(False)
            _wait(lambda: not self._live_pids(), min(0.2, max(0.0, deadline - time.monotonic())))
        if self._live_pids():
            raise ProviderError(f"cgroup {self.name}: processes survived SIGKILL for {timeout}s")

    def _live_pids(self) -> list[int]:
        try:
            return self.pids()
        except OSError as err:
            if err.errno == errno.ENODEV:
                return []
            raise

    def remove(self) -> None:
        """Kill everything inside, then remove every directory; idempotent."""
        self.kill_all()
        for d in self.dirs.values():
            deadline = time.monotonic() + 2.0
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise ProviderError(f"cannot remove cgroup {d}: {err}", err) from err
                    time.sleep(0.01)

    def usage(self) -> CgroupUsage:
        """CPU time, peak memory, oom kills and live pids (0 where not measured)."""
        current = read_int(self._file("pids", "pids.current"))
        return CgroupUsage(cpu_ms=self.cpu_ms(), peak_mem_mb=self.peak_mb(),
                           oom_kills=self.oom_kills(),
                           pids_current=current)

    def memory_hit(self) -> bool:
        """Whether the kernel killed a process here for memory (see ``oom_source``)."""
        return self.oom_kills() > 0


#: how to get cgroup limits, or do without them: the fix a refusal names
CGROUP_FIX: Final = (
    "fix: run as root; or run in a delegated cgroup (systemd-run --user --scope "
    "-p Delegate=yes ..., docker run --cgroupns=private with a writable /sys/fs/cgroup) "
    "and pass its path as "
    "cgroup_root; or enforce the limits per process by rlimits "
    "(LinuxProvider(limits_by='rlimit'), corral run --limits rlimit); `corral doctor` "
    "shows what this host has")

#: the same on cgroup v1 as a user (a delegated v2 scope cannot bring v1's controllers)
CGROUP_FIX_V1: Final = (
    "fix: run as root; or have an administrator make per-controller cgroup v1 directories "
    "(memory, pids, cpuacct, freezer), chown them to this user and pass them as "
    "cgroup_root; or enforce the limits per process by rlimits "
    "(LinuxProvider(limits_by='rlimit'), corral run --limits rlimit); `corral doctor` "
    "shows what this host has")


def _wait(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.001
    while not pred():
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    return True
