"""The cgroups of this process's linux sandboxes, as the kernel shows them.

Tests read a sandbox's cgroup (its processes, its limits, its CPU usage) and look for
leftovers through the public ``CgroupManager`` and the sandbox's id, never through a
provider's or sandbox's private attributes. Valid for providers made with the default
cgroup root (``LinuxProvider(cgroup_root=None)``): every cgroup of a sandbox is named
``corral-<owner pid>-<start ticks>-<sandbox id>``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from corral.providers.linux.host.cgroups import CgroupManager, SandboxCgroup

__all__ = ["manager", "mine", "sandbox_cgroup", "sandbox_ids"]


@functools.cache
def manager() -> CgroupManager:
    """A manager of the default prefix and root, as a default LinuxProvider has (it only
    detects; it creates nothing until asked to)."""
    return CgroupManager()


def mine() -> dict[str, dict[str, str]]:
    """This process's sandbox cgroups: name -> {hierarchy: dir}."""
    if manager().support.version == "none":
        return {}
    return {n: d for n, d in manager().list_cgroups().items() if f"-{os.getpid()}-" in n}


def sandbox_ids() -> set[str]:
    """The ids of this process's sandboxes (live ones and idle spares) that have a cgroup."""
    return {n.rsplit("-", 1)[1] for n in mine()}


def sandbox_cgroup(sb: Any) -> SandboxCgroup | None:
    """The cgroup of the sandbox ``sb`` (by its id), None if it has none."""
    s = manager().support
    for name, dirs in mine().items():
        if name.endswith("-" + sb.id):
            return SandboxCgroup(name, s.version, dict(dirs), s.oom_source)
    return None
