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
from corral.providers.linux.host.cgroupfiles import CgroupDirs, listing, sandbox_name
from corral.providers.linux.host.cgroupfs import (
    CgroupSupport,
    CgroupUsage,
    CgroupVersion,
    detect,
    read_int,
    read_keyed,
    read_text,
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
        full = sandbox_name(self.prefix, os.getpid() if owner_pid is None else owner_pid, name)
        s = self.support
        try:
            return SandboxCgroup.make(full, s.version, dict(s.parents), s.oom_source,
                                      limits.mem_mb, limits.max_processes)
        except OSError as err:
            raise ProviderError(f"cannot create cgroup {full}: {err}", err) from err

    def list_cgroups(self) -> dict[str, dict[str, str]]:
        """Corral's sandbox cgroups under this manager's parents: name -> {hierarchy: dir}."""
        return listing(dict(self.support.parents), self.prefix)

    def reap_orphans(self) -> list[str]:
        """Kill and remove corral cgroups whose owner died; return their names."""
        reaped = []
        found = listing(dict(self.support.parents), self.prefix, orphaned=True)
        for name, dirs in sorted(found.items()):
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
class SandboxCgroup(CgroupDirs):
    """One sandbox's cgroup (:class:`~corral.providers.linux.host.cgroupfiles.CgroupDirs`:
    made, limited, joined, read and removed as the one-shot path does), with the
    provider's typed errors, the freezer, a whole-cgroup kill and usage."""

    def __repr__(self) -> str:
        return f"SandboxCgroup({self.name!r}, {self.version}, {sorted(self.dirs.values())})"

    def apply(self, limits: SandboxLimits) -> None:
        """Write ``limits`` (memory+swap and pids; cpu is accounted, not capped)."""
        self.apply_limits(limits.mem_mb, limits.max_processes)

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

    def remove(self, timeout: float = 2.0) -> None:
        """Kill everything inside (freezing first: a fork bomb cannot outrun it), then
        remove every directory; idempotent."""
        self.kill_all()
        try:
            super().remove(timeout)
        except OSError as err:
            raise ProviderError(str(err), err) from err

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
