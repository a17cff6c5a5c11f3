"""What the oci provider finds on this host: the OCI runtimes, the init it runs as each
container's pid 1, and the cgroup hierarchies the runtime can enforce limits with.

Read once per provider (:func:`probe`); ``corral doctor`` prints the same facts
(:mod:`corral.providers.oci.doctor`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Final

__all__ = ["CGROUP_ROOT", "RUNTIMES", "HostFacts", "RuntimeInfo", "probe", "probe_runtime"]

#: the runtimes the provider drives, by the name ``corral.provider("oci", runtime=...)`` takes
RUNTIMES: Final = ("crun", "runsc")
CGROUP_ROOT: Final = "/sys/fs/cgroup"
_INSTALL: Final = {"crun": "apt-get install crun", "runsc": "apt-get install runsc (gVisor)",
                   "catatonit": "apt-get install catatonit"}


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """One runtime: where it is and its version, or why it cannot be used."""

    name: str
    path: str | None
    version: str = ""
    missing: str = ""

    @property
    def usable(self) -> bool:
        return self.path is not None and not self.missing


@dataclass(frozen=True, slots=True)
class HostFacts:
    """The cgroup layout the runtime meets, and the container init.

    ``v1``: controller name -> its v1 hierarchy dir (``memory``, ``pids``, ``cpuacct`` ...);
    ``unified``: the cgroup2 mount's path; ``hybrid`` when both hold controllers, the
    layout crun 1.8 refuses ("cgroups in hybrid mode not supported"), so the provider
    starts containers in a private mount namespace where the cgroup2 mount is hidden.
    """

    v1: dict[str, str] = field(default_factory=dict)
    unified: str | None = None
    unified_controllers: tuple[str, ...] = ()
    memsw: bool = False
    init: str | None = None
    unshare: str | None = None
    umount: str | None = None

    @property
    def pure_v2(self) -> bool:
        return self.unified == CGROUP_ROOT

    @property
    def hybrid(self) -> bool:
        return bool(self.v1) and self.unified is not None and self.unified != CGROUP_ROOT

    def controller(self, name: str) -> bool:
        """Whether the runtime can enforce with controller ``name`` (v1 hierarchy here)."""
        if self.pure_v2:
            return name in self.unified_controllers or (name == "cpuacct"
                                                        and "cpu" in self.unified_controllers)
        return name in self.v1

    def missing_limit(self, limit: str) -> str:
        """'' when ``limit`` (a ``SandboxLimits`` field) can be enforced here, else what is
        missing."""
        if self.pure_v2:
            return "cgroup v2 only hosts are not supported by this provider yet"
        need = {"mem_mb": "memory", "max_processes": "pids", "cpu_ms": "cpuacct"}.get(limit)
        if need is None:
            return ""
        if not self.controller(need):
            return f"the cgroup v1 {need} controller (not mounted under {CGROUP_ROOT})"
        if limit == "mem_mb" and not self.memsw:
            return ("memory+swap accounting (memory.memsw.limit_in_bytes; boot with "
                    "swapaccount=1): without it a memory limit can be escaped into swap")
        if self.hybrid and not (self.unshare and self.umount):
            return "unshare(1) and umount(1) to hide the cgroup2 mount from the runtime"
        return ""


def _version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, timeout=10,
                             check=False, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    first = out.decode(errors="replace").strip().splitlines()
    return first[0][:120] if first else ""


def probe_runtime(name: str, path: str | None = None) -> RuntimeInfo:
    """Find runtime ``name`` (on PATH, or at ``path``) and its version."""
    found = path or shutil.which(name)
    if found is None or not os.access(found, os.X_OK):
        return RuntimeInfo(name, None, missing=f"{name} is not installed ({_INSTALL[name]})")
    return RuntimeInfo(name, os.path.realpath(found), _version(found))


def _mounts() -> list[tuple[str, str, str]]:
    out = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                parts, rparts = left.split(), right.split()
                if len(parts) >= 5 and len(rparts) >= 3:
                    out.append((parts[4], rparts[0], rparts[2]))
    except OSError:
        pass
    return out


def probe() -> HostFacts:
    """The cgroup layout and the tools the provider needs, as this process sees them."""
    v1: dict[str, str] = {}
    unified: str | None = None
    for point, fstype, opts in _mounts():
        if fstype == "cgroup":
            for opt in opts.split(","):
                if opt in ("memory", "pids", "cpu", "cpuacct", "freezer", "devices", "cpuset",
                           "blkio"):
                    v1[opt] = point
        elif fstype == "cgroup2":
            unified = point
    controllers: tuple[str, ...] = ()
    if unified is not None:
        try:
            with open(os.path.join(unified, "cgroup.controllers"), encoding="ascii") as f:
                controllers = tuple(f.read().split())
        except OSError:
            pass
    memsw = "memory" in v1 and os.path.exists(
        os.path.join(v1["memory"], "memory.memsw.limit_in_bytes"))
    return HostFacts(v1=v1, unified=unified, unified_controllers=controllers, memsw=memsw,
                     init=shutil.which("catatonit"), unshare=shutil.which("unshare"),
                     umount=shutil.which("umount"))


def install_hint(what: str) -> str:
    return _INSTALL.get(what, what)
