"""Cgroup detection and cgroupfs plumbing for :mod:`.cgroups` (which re-exports the public names).

:func:`detect` parses /proc, probes v1 and v2 and picks the path; the rest reads and
writes cgroupfs files.

Everything here is plain file I/O against directories, so the v2 logic can be
unit-tested against a fake tree in a temp dir (that checks file handling only,
not the kernel's semantics).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, final

from corral.core.errors import ConfigInvalidError, ProviderError
from corral.providers.linux.host.cgroupfiles import (
    V1_PEAK_FALLBACK,
    read_int,
    read_keyed,
    read_text,
    write_text,
)

__all__ = [
    "CgroupSupport",
    "CgroupUsage",
    "CgroupVersion",
    "Mount",
    "SELF_LEAF",
    "V1_HIERARCHY",
    "V1_PEAK_FALLBACK",
    "detect",
    "detect_v1",
    "detect_v2",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "read_int",
    "read_keyed",
    "read_text",
    "v2_enable",
    "v2_vacate",
    "write_text",
]

#: controller name used by CgroupSupport -> the v1 hierarchy that holds it
V1_HIERARCHY: Mapping[str, str] = {
    "memory": "memory", "memsw": "memory", "pids": "pids", "cpu": "cpuacct", "freezer": "freezer",
}
_V2_WANTED = ("memory", "pids", "cpu")
#: the child leaf of the caller's own v2 cgroup that its processes move into, so that
#: the own cgroup may enable controllers for its children (cgroup v2's
#: "no internal processes" rule; what systemd asks of a Delegate=yes unit, and what
#: docker-in-docker and kind do at a namespace root). Not a sandbox name.
SELF_LEAF = "corral-self"
#: how to get a delegated cgroup v2 subtree (``corral doctor`` shows it where one is missing)
V2_DELEGATE_HOW = ("systemd: run under `systemd-run --user --scope -p Delegate=yes ...` "
                   "(or a unit with Delegate=yes); docker: `docker run --cgroupns=private` with "
                   "a writable /sys/fs/cgroup (--privileged, or a cgroup rw mount); or pass a "
                   "delegated directory as cgroup_root")
CgroupVersion = Literal["v1", "v2", "none"]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupSupport:
    """What cgroups this process can use, and why not where it cannot.

    Attributes:
        version: the path taken: ``"v2"``, ``"v1"`` or ``"none"``.
        available: usable controllers (memory, memsw, pids, cpu, freezer, kill).
        parents: hierarchy key -> corral's parent directory (``<own>/<prefix>``);
            v2 has the one key ``"unified"``, v1 keys are memory, pids, cpuacct, freezer.
        missing: controller -> why it cannot be used here.
        notes: how the version was chosen and anything else a person should know.
        oom_source: the file oom kills are counted from (``""`` without memory).
    """

    version: CgroupVersion
    available: frozenset[str]
    parents: Mapping[str, str] = field(default_factory=dict, hash=False)
    missing: Mapping[str, str] = field(default_factory=dict, hash=False)
    notes: tuple[str, ...] = ()
    oom_source: str = ""

    def has(self, controller: str) -> bool:
        """Whether ``controller`` works here."""
        return controller in self.available

    def describe(self) -> str:
        """One paragraph for a person: the path taken and what is missing."""
        order = ("memory", "memsw", "pids", "cpu", "freezer", "kill")
        have = ", ".join(c for c in order if c in self.available) or "nothing"
        out = [f"cgroup {self.version}: {have}"]
        out += [f"at {p}" for p in dict.fromkeys(self.parents.values())]
        out += [f"no {c}: {why}" for c, why in self.missing.items()]
        if self.oom_source:
            out.append(f"oom kills counted from {self.oom_source}")
        out += list(self.notes)
        return "; ".join(out)

    def to_dict(self) -> dict[str, object]:
        """JSON-safe form."""
        return {"version": self.version, "available": sorted(self.available),
                "parents": dict(self.parents), "missing": dict(self.missing),
                "notes": list(self.notes), "oom_source": self.oom_source}


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupUsage:
    """Accounting of one sandbox cgroup; 0 means not measured."""

    cpu_ms: int = 0
    peak_mem_mb: int = 0
    oom_kills: int = 0
    pids_current: int = 0


def detect(root: str | Mapping[str, str] | None = None, *, prefix: str = "corral",
           mountinfo: str = "/proc/self/mountinfo",
           proc_cgroup: str = "/proc/self/cgroup") -> CgroupSupport:
    """Find the cgroup path this process can use; no side effects.

    ``root`` replaces the caller's own cgroup: a str is a (delegated) v2
    directory, a mapping gives pre-made v1 directories per controller
    hierarchy (memory, pids, cpuacct, freezer).
    """
    if isinstance(root, str):
        return detect_v2(root, prefix=prefix, own_is_root=False, notes=(f"root={root} given",))
    if root is not None:
        return detect_v1(dict(root), prefix=prefix, notes=("root= given (v1 dirs)",))
    mounts = parse_mountinfo(read_text(mountinfo))
    own = parse_proc_cgroup(read_text(proc_cgroup))
    v2 = _auto_v2(mounts, own, prefix)
    v1_dirs = _own_v1_dirs(mounts, own)
    v1 = detect_v1(v1_dirs, prefix=prefix)
    key = ("memory", "memsw", "pids")
    s1 = sum(c in v1.available for c in key)
    s2 = sum(c in v2.available for c in key)
    if not (s1 or s2) and "memory" in v1_dirs:
        # nothing usable either way (a user without delegation on a v1 or hybrid host):
        # the memory controller is bound to its v1 hierarchy, so v2 can never give it;
        # report v1, whose fix (root, or directories an administrator chowns) is the real one
        why = v2.missing.get("memory") or "not mounted"
        return CgroupSupport(version="v1", available=frozenset(), missing=v1.missing,
                             notes=(*v1.notes, f"cgroup v2 not used: {why}"))
    if v2.version != "none" and s2 >= s1 and (s2 or not v1.available):
        return v2
    if v1.available:
        why = v2.missing.get("memory") or "not mounted"
        return _with_notes(v1, f"cgroup v2 not used: {why}")
    return CgroupSupport(version="none", available=frozenset(),
                         missing={**v1.missing, **v2.missing}, notes=v2.notes + v1.notes)


def _with_notes(s: CgroupSupport, *extra: str) -> CgroupSupport:
    return CgroupSupport(version=s.version, available=s.available, parents=s.parents,
                         missing=s.missing, notes=s.notes + extra, oom_source=s.oom_source)


def _auto_v2(mounts: list[Mount], own: Mapping[str, str], prefix: str) -> CgroupSupport:
    m = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if m is None or "" not in own:
        return CgroupSupport(version="none", available=frozenset(),
                             missing={"memory": "no cgroup2 mount"})
    if m.root == "/.." or m.root.startswith("/../"):
        why = (f"this process's cgroup is outside the cgroup2 mount at {m.point} (mount root "
               f"{m.root}: a cgroup namespace whose cgroup2 was mounted outside it); mount "
               "cgroup2 again inside the namespace (docker run --cgroupns=private does)")
        return CgroupSupport(version="none", available=frozenset(), missing=dict.fromkeys(
            ("memory", "memsw", "pids", "cpu", "freezer", "kill"), why))
    path = _under_mount(m, own[""])
    notes: tuple[str, ...] = ()
    if os.path.basename(path) == SELF_LEAF:  # moved there by an earlier manager
        path = os.path.dirname(path)
    if own[""] == "/" and os.path.exists(os.path.join(path, "cgroup.type")):
        notes = (f"{path} is a cgroup namespace root, not the host's root cgroup",)
    if "ro" in m.opts:
        why = f"cgroup2 is mounted read-only at {m.point}"
        return CgroupSupport(version="v2", available=frozenset(), notes=notes,
                             missing=dict.fromkeys(("memory", "memsw", "pids", "cpu",
                                                    "freezer", "kill"), why))
    # the real root cgroup has no cgroup.type; a namespace root or a leaf has one
    return detect_v2(path, prefix=prefix, own_is_root=False, notes=notes)


def _under_mount(m: Mount, cg_path: str) -> str:
    rel = cg_path
    if m.root != "/" and (rel == m.root or rel.startswith(m.root + "/")):
        rel = rel[len(m.root):]
    return os.path.normpath(m.point + "/" + rel.lstrip("/"))


def _own_v1_dirs(mounts: list[Mount], own: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key in V1_HIERARCHY.values():
        m = next((m for m in mounts if m.fstype == "cgroup" and key in m.super_opts), None)
        if m is not None and key in own:
            out[key] = _under_mount(m, own[key])
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Mount:
    """One line of /proc/self/mountinfo (the fields we use)."""

    root: str
    point: str
    fstype: str
    super_opts: frozenset[str]
    opts: frozenset[str] = frozenset()  # per-mount options (ro, nosuid, ...)


def _unescape(s: str) -> str:
    return s.encode().decode("unicode_escape") if "\\" in s else s


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse /proc/self/mountinfo."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        f, r = left.split(), right.split()
        if len(f) < 5 or len(r) < 3:
            continue
        out.append(Mount(root=_unescape(f[3]), point=_unescape(f[4]), fstype=r[0],
                         super_opts=frozenset(r[2].split(",")),
                         opts=frozenset(f[5].split(",")) if len(f) > 5 else frozenset()))
    return out


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Parse /proc/self/cgroup: v1 controller (or ``name=x``) -> path; ``""`` is v2's path."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            out[""] = path
        else:
            for c in ctrls.split(","):
                out[c] = path
    return out


def _writable(own: str, base: str, *files: str) -> bool:
    d = base if os.path.isdir(base) else own
    return os.access(d, os.W_OK) and all(
        os.access(os.path.join(d, f), os.W_OK) for f in files if os.path.exists(os.path.join(d, f)))


def _not_writable(d: str, v2: bool = False) -> str:
    if v2:
        return f"{d} is not writable by uid {os.geteuid()} (no delegated cgroup)"
    return (f"{d} is not writable by uid {os.geteuid()} (no delegated cgroup: run as root, "
            "or delegate one and pass root=)")


def detect_v1(dirs: Mapping[str, str], *, prefix: str,
              notes: tuple[str, ...] = ()) -> CgroupSupport:
    """Probe v1: ``dirs`` maps hierarchy (memory, pids, cpuacct, freezer) -> the own cgroup dir."""
    bad = set(dirs) - set(V1_HIERARCHY.values())
    if bad:
        raise ConfigInvalidError("cgroups.root", f"unknown v1 hierarchies {sorted(bad)}; "
                                 f"use {sorted(set(V1_HIERARCHY.values()))}")
    available: set[str] = set()
    missing: dict[str, str] = {}
    parents: dict[str, str] = {}
    probe = {"memory": "memory.limit_in_bytes", "memsw": "memory.memsw.limit_in_bytes",
             "cpu": "cpuacct.usage", "pids": "pids.max", "freezer": "freezer.state"}
    for ctrl, key in V1_HIERARCHY.items():
        own = dirs.get(key)
        if own is None:
            missing[ctrl] = f"no v1 {key} hierarchy for this process"
            continue
        base = os.path.join(own, prefix)
        at_root = os.path.exists(os.path.join(own, "cgroup.sane_behavior"))
        if not os.path.isdir(own):
            missing[ctrl] = f"{own} does not exist"
        elif not _writable(own, base, "cgroup.procs"):
            missing[ctrl] = _not_writable(own)
        elif (not at_root or ctrl in ("memory", "memsw", "cpu")) and not os.path.exists(
                os.path.join(own, probe[ctrl])):
            missing[ctrl] = (f"{probe[ctrl]} absent in {own}" + (
                " (kernel without swap accounting: boot with swapaccount=1)"
                if ctrl == "memsw" else ""))
        else:
            available.add(ctrl)
            parents[key] = base
    missing["kill"] = "cgroup v1 has no cgroup.kill (kill_all freezes, SIGKILLs each pid, thaws)"
    oom = ""
    if "memory" in available:
        ctl = os.path.join(dirs["memory"], "memory.oom_control")
        oom = ("memory.oom_control oom_kill" if "oom_kill " in read_text(ctl) else
               V1_PEAK_FALLBACK)
    return CgroupSupport(version="v1" if available else "none", available=frozenset(available),
                         parents=parents, missing=missing, notes=notes, oom_source=oom)


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = os.uname().release.split(".")
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (ValueError, IndexError):
        return False


def _has_procs(d: str) -> bool:
    try:
        return bool(read_text(os.path.join(d, "cgroup.procs")).split())
    except OSError:
        return True


def detect_v2(own: str, *, prefix: str, own_is_root: bool,
              notes: tuple[str, ...] = ()) -> CgroupSupport:
    """Probe v2 with ``own`` as the parent of corral's dir (own cgroup or a delegated root=)."""
    base = os.path.join(own, prefix)
    if not os.path.exists(os.path.join(own, "cgroup.controllers")):
        why = f"{own} is not a cgroup2 directory"
        return CgroupSupport(version="none", available=frozenset(), notes=notes,
                             missing=dict.fromkeys(("memory", "memsw", "pids", "cpu", "freezer",
                                                    "kill"), why))
    own_is_root = own_is_root or not os.path.exists(os.path.join(own, "cgroup.type"))
    ctrls = set(read_text(os.path.join(own, "cgroup.controllers")).split())
    sub = set(read_text(os.path.join(own, "cgroup.subtree_control")).split())
    available: set[str] = set()
    missing: dict[str, str] = {}
    writable = _writable(own, base, "cgroup.procs", "cgroup.subtree_control")
    leaf = os.path.join(own, SELF_LEAF)
    busy = not own_is_root and not (set(_V2_WANTED) & sub) and _has_procs(own)
    for c in ("memory", "pids"):
        if c not in ctrls:  # first: delegating this dir would not bring it
            have = " ".join(sorted(ctrls)) or "nothing"
            missing[c] = (f"{c} not in {own}/cgroup.controllers (it lists: {have}): "
                          + ("it is bound to a cgroup v1 hierarchy" if own_is_root else
                             "the parent does not delegate it"))
        elif not writable:
            missing[c] = _not_writable(own, v2=True)
        else:
            available.add(c)
    if busy and available:  # writable: the processes can move to a child it makes
        notes = (*notes, f"{own} holds processes: they move into {leaf} before controllers "
                         "are enabled for sandboxes (cgroup v2's no-internal-processes rule)")
    if "memory" in available:
        probe = next((os.path.join(d, "memory.max") for d in (base, own)
                      if os.path.exists(os.path.join(d, "memory.max"))), None)
        if probe is None or os.path.exists(probe.replace("memory.max", "memory.swap.max")):
            available.add("memsw")
        else:
            missing["memsw"] = "memory.swap.max absent (kernel without swap accounting)"
    else:
        missing["memsw"] = "needs the memory controller"
    for c, f, ver in (("cpu", "cpu.stat", (4, 15)), ("freezer", "cgroup.freeze", (5, 2)),
                      ("kill", "cgroup.kill", (5, 14))):
        if not writable:
            missing[c] = _not_writable(own, v2=True)
        elif (os.path.exists(os.path.join(own, f)) if not own_is_root
              else _kernel_at_least(*ver)):
            available.add(c)
        else:
            missing[c] = f"{f} absent (kernel older than {ver[0]}.{ver[1]})"
    return CgroupSupport(version="v2", available=frozenset(available),
                         parents={"unified": base} if available else {},
                         missing=missing, notes=notes,
                         oom_source="memory.events oom_kill" if "memory" in available else "")


def v2_vacate(own: str) -> str:
    """Move every process of ``own`` into its child :data:`SELF_LEAF` (made if absent),
    so ``own`` may enable controllers for its children; return the leaf.

    The caller is one of those processes (its own cgroup), and so are its siblings in a
    systemd service or a container's namespace root; they stay together in the leaf,
    under the same limits as before (the leaf inherits ``own``'s). A few rounds, since a
    process may fork while we move; one that exits meanwhile is skipped.
    """
    leaf = os.path.join(own, SELF_LEAF)
    try:
        os.mkdir(leaf)
    except FileExistsError:
        pass
    except OSError as err:
        raise ProviderError(f"cannot make {leaf} to leave {own} (cgroup v2 allows controllers "
                            f"for children only in a cgroup without processes): {err}",
                            err) from err
    procs = os.path.join(leaf, "cgroup.procs")
    for _ in range(5):
        pids = read_text(os.path.join(own, "cgroup.procs")).split()
        if not pids:
            break
        moved = 0
        for pid in pids:
            try:
                write_text(procs, pid)
                moved += 1
            except ProcessLookupError:
                continue
            except OSError as err:
                raise ProviderError(f"cannot move pid {pid} from {own} into {leaf}: {err}",
                                    err) from err
        if not moved:
            break
    return leaf


def _is_real_root(d: str) -> bool:
    return not os.path.exists(os.path.join(d, "cgroup.type"))


def v2_enable(own: str, base: str) -> None:
    """Enable memory, pids (and cpu if allowed) for ``base`` and for its children.

    When ``own`` holds processes (a systemd service, a login session, a container's
    namespace root), they first move into ``<own>/corral-self`` (:func:`v2_vacate`).
    """
    for d in (own, base):
        have = set(read_text(os.path.join(d, "cgroup.controllers")).split())
        on = set(read_text(os.path.join(d, "cgroup.subtree_control")).split())
        todo = [c for c in _V2_WANTED if c in have and c not in on]
        if not todo:
            continue
        if d == own and not on and not _is_real_root(d) and _has_procs(d):
            v2_vacate(d)
        path = os.path.join(d, "cgroup.subtree_control")
        try:
            write_text(path, " ".join(f"+{c}" for c in todo))
        except OSError:
            for c in todo:  # one at a time: cpu may refuse (realtime tasks) and is optional
                try:
                    write_text(path, f"+{c}")
                except OSError as err:
                    if c != "cpu":
                        raise ProviderError(f"cannot enable +{c} in {path}: {err}", err) from err
