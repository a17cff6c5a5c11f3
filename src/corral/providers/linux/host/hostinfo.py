"""What this host can enforce: each kernel primitive, tested, with the reason for every "no".

:func:`probe` answers for the strict provider's refusal messages and for
``corral doctor``; it is cached per process. Namespaces are tested for real:
a forked child calls ``unshare`` for each kind (inside a new user namespace
when not root) and exits. :func:`providers_report` turns that into, for each
provider, rows of (what, enforced, how or why not).
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, final

from corral.providers.linux import _sys_unsafe as su
from corral.providers.linux.host.cgroupfs import V2_DELEGATE_HOW
from corral.providers.linux.host.cgroups import CgroupSupport, detect

__all__ = ["Check", "HostInfo", "ProviderReport", "Row", "limits_how", "probe",
           "providers_report", "strongest_limits_by", "userns_blocker"]

#: namespace kind -> its CLONE_NEW* flag name in _sys_unsafe
NAMESPACES: Mapping[str, str] = {
    "user": "CLONE_NEWUSER", "mount": "CLONE_NEWNS", "pid": "CLONE_NEWPID",
    "net": "CLONE_NEWNET", "ipc": "CLONE_NEWIPC", "uts": "CLONE_NEWUTS",
    "cgroup": "CLONE_NEWCGROUP",
}
_NOBODY = 65534


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One primitive: ``ok`` and, either way, ``detail`` (how it was found, or why not)."""

    name: str
    ok: bool
    detail: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HostInfo:
    """The kernel primitives the strict provider needs, as found on this host."""

    kernel: str
    arch: str
    uid: int
    is_root: bool
    namespaces: Mapping[str, Check] = field(hash=False)
    userns_unprivileged: Check
    seccomp: Check
    landlock: Check
    landlock_abi: int
    cgroups: CgroupSupport
    tools: tuple[Check, ...] = ()

    def checks(self) -> list[Check]:
        """Every host primitive, in display order."""
        cg = self.cgroups
        rows = [*self.namespaces.values(), self.userns_unprivileged, self.seccomp, self.landlock]
        fix = ""
        if not {"memory", "pids"} <= cg.available:
            fix = (f"; to get memory and pids limits: {V2_DELEGATE_HOW}" if cg.version != "v1"
                   else "; to get memory and pids limits: run as root, or have an "
                        "administrator chown per-controller v1 directories to this user and "
                        "pass them as cgroup_root (a systemd-delegated cgroup v2 scope "
                        "cannot help: the controllers are bound to cgroup v1 here)")
        rows.append(Check(name="cgroups", ok=cg.version != "none" and bool(cg.available),
                          detail="; ".join([f"version {cg.version}", *cg.notes]) + fix))
        for c in ("memory", "memsw", "pids", "cpu", "freezer", "kill"):
            rows.append(Check(name=f"cgroup {c}", ok=c in cg.available,
                              detail=cg.missing.get(c, "available") if c not in cg.available
                              else _cgroup_how(cg, c)))
        return rows + list(self.tools)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {"kernel": self.kernel, "arch": self.arch, "uid": self.uid,
                "is_root": self.is_root, "landlock_abi": self.landlock_abi,
                "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail}
                           for c in self.checks()],
                "cgroups": self.cgroups.to_dict()}


def _cgroup_how(cg: CgroupSupport, c: str, *, where: bool = True) -> str:
    files = {"v1": {"memory": "memory.limit_in_bytes", "memsw": "memory.memsw.limit_in_bytes",
                    "pids": "pids.max", "cpu": "cpuacct.usage", "freezer": "freezer.state"},
             "v2": {"memory": "memory.max", "memsw": "memory.swap.max", "pids": "pids.max",
                    "cpu": "cpu.stat usage_usec", "freezer": "cgroup.freeze",
                    "kill": "cgroup.kill"}}
    key = {"memsw": "memory", "cpu": "cpuacct"}.get(c, c) if cg.version == "v1" else "unified"
    name = files.get(cg.version, {}).get(c, c)
    return f"{name} under {cg.parents.get(key, '')}" if where else name


def _in_child(fn: Callable[[], None]) -> int:
    """Run ``fn`` in a forked child; 0 if it returned, else the errno it failed with (or 255)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 255
        try:
            fn()
            code = 0
        except OSError as err:
            code = (err.errno or 255) & 0xFF
        except BaseException:
            code = 255
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 255


def _why(code: int) -> str:
    return os.strerror(code) if code != 255 else "unexpected failure"


def _sysctl(name: str, root: str = "/proc/sys") -> str | None:
    try:
        with open(os.path.join(root, name.replace(".", "/"))) as f:
            return f.read().strip()
    except OSError:
        return None


def _read_first(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read().strip("\x00\n ")
    except OSError:
        return None


#: the fix for each sysctl that blocks unprivileged user namespaces
_SYSCTL_FIX: Mapping[str, tuple[str, str]] = {
    "kernel.apparmor_restrict_unprivileged_userns": (
        "1", "AppArmor restricts unprivileged user namespaces (Ubuntu 23.10+, 24.04); fix: an "
             "AppArmor profile that allows `userns,` for this interpreter (/etc/apparmor.d/, "
             "see docs/providers/linux.md), or `sudo sysctl -w "
             "kernel.apparmor_restrict_unprivileged_userns=0` (host-wide), or run as root"),
    "kernel.unprivileged_userns_clone": (
        "0", "unprivileged user namespaces are off; fix: `sudo sysctl -w "
             "kernel.unprivileged_userns_clone=1`, or run as root"),
    "user.max_user_namespaces": (
        "0", "user namespaces are capped at 0; fix: `sudo sysctl -w "
             "user.max_user_namespaces=15000`, or run as root"),
}


def userns_blocker(code: int = 0, *, sysctl_root: str = "/proc/sys",
                   status: str = "/proc/self/status",
                   apparmor_label: str = "/proc/self/attr/current") -> str:
    """Why namespaces are (or will be) refused to this process, with the fix; "" if no
    known cause. ``code`` is the errno a failed ``unshare`` gave (0: it did not fail).

    Looks at the sysctls that gate unprivileged user namespaces (AppArmor's restriction
    applies to an unconfined process even where the ``unshare`` itself succeeds: the
    namespace then lacks the capabilities to mount), and at a seccomp filter already on
    this process (``Seccomp: 2`` in /proc/self/status: docker's default profile refuses
    unshare with EPERM). The paths are parameters so tests point them at temp files.
    """
    causes = []
    for name, (bad, fix) in _SYSCTL_FIX.items():
        if _sysctl(name, sysctl_root) != bad:
            continue
        if name.startswith("kernel.apparmor"):
            label = _read_first(apparmor_label)
            if label not in (None, "", "unconfined"):
                continue  # confined by a profile: whether it allows userns is the profile's say
        causes.append(f"{name}={bad}: {fix}")
    sec = next((line.split(":", 1)[1].strip() for line in (_read_first(status) or "").splitlines()
                if line.startswith("Seccomp:")), "")
    if code == errno.EPERM and sec == "2":
        causes.append("a seccomp filter on this process refuses unshare (Seccomp: 2; docker's "
                      "default profile does); fix: `docker run --security-opt "
                      "seccomp=unconfined` (or a profile allowing unshare, mount, pivot_root "
                      "and setns), and `--security-opt apparmor=unconfined` for mounts")
    elif code == errno.ENOSPC:
        causes.append("the user namespace count limit is reached (user.max_user_namespaces)")
    elif code == errno.EINVAL:
        causes.append("the kernel was built without this namespace kind")
    return "; ".join(causes)


def _probe_namespaces(is_root: bool) -> dict[str, Check]:
    out = {}
    user = su.CLONE_NEWUSER
    for kind, flag_name in NAMESPACES.items():
        flag = getattr(su, flag_name)
        flags = flag if is_root or kind == "user" else flag | user
        code = _in_child(functools.partial(su.unshare, flags))
        via = "" if flags == flag else " inside a new user namespace"
        cause = userns_blocker(code) if code else ""
        out[kind] = Check(name=f"{kind} namespace", ok=code == 0,
                          detail=f"unshare({flag_name}){via} works" if code == 0
                          else f"unshare({flag_name}){via} failed: {_why(code)}"
                          + (f" ({cause})" if cause else ""))
    return out


def _probe_userns_unprivileged(is_root: bool, user_ok: bool, *,
                               sysctl_root: str = "/proc/sys",
                               status: str = "/proc/self/status",
                               apparmor_label: str = "/proc/self/attr/current") -> Check:
    facts = []
    for name in _SYSCTL_FIX:
        v = _sysctl(name, sysctl_root)
        if v is not None:
            facts.append(f"{name}={v}")
    sysctls = ", ".join(facts) or "no userns sysctls"
    where = {"sysctl_root": sysctl_root, "status": status, "apparmor_label": apparmor_label}
    if is_root:
        def drop_and_unshare() -> None:
            os.setgroups([])
            os.setgid(_NOBODY)
            os.setuid(_NOBODY)
            su.unshare(su.CLONE_NEWUSER)
        code = _in_child(drop_and_unshare)
        ok, how = code == 0, f"tested as uid {_NOBODY}"
        why = _why(code)
    else:
        code = 0 if user_ok else errno.EPERM
        ok, how, why = user_ok, "tested as this uid", "unshare(CLONE_NEWUSER) failed"
    blocker = userns_blocker(code, **where)
    if ok and not blocker:
        return Check(name="user namespace (unprivileged)", ok=True, detail=f"{how}; {sysctls}")
    if ok:  # AppArmor: the unshare works, the namespace cannot mount
        why = "unshare(CLONE_NEWUSER) works but the namespace gets no capabilities"
    return Check(name="user namespace (unprivileged)", ok=False,
                 detail=f"{how}: {why}; {blocker or 'cause unknown'}; {sysctls}")


def _probe_seccomp(arch: str) -> Check:
    try:
        with open("/proc/self/status") as f:
            kernel = any(line.startswith("Seccomp:") for line in f)
    except OSError:
        kernel = False
    if not kernel:
        return Check(name="seccomp", ok=False,
                     detail="no Seccomp: line in /proc/self/status (kernel without "
                            "CONFIG_SECCOMP_FILTER)")
    try:
        from corral.providers.linux.policy import seccomp
    except ImportError:
        return Check(name="seccomp", ok=False, detail="seccomp policy module missing")
    if arch not in seccomp.SUPPORTED_ARCHES:
        return Check(name="seccomp", ok=False,
                     detail=f"no seccomp filter for arch {arch} (corral has: "
                            f"{', '.join(sorted(seccomp.SUPPORTED_ARCHES))}); refused, "
                            "not run unfiltered")
    try:
        prog = seccomp.build_filter(arch)
    except Exception as err:  # reported, not raised
        return Check(name="seccomp", ok=False, detail=f"building the filter failed: {err}")

    def install() -> None:
        su.set_no_new_privs()
        su.seccomp_install(prog)
    code = _in_child(install)
    if code:
        return Check(name="seccomp", ok=False,
                     detail=f"installing corral's {arch} filter failed: {_why(code)}")
    return Check(name="seccomp", ok=True,
                 detail=f"corral's {arch} filter ({len(prog) // 8} instructions) installs")


def _probe_landlock() -> tuple[Check, int]:
    abi = su.landlock_abi_version()
    if abi:
        return Check(name="landlock", ok=True,
                     detail=f"ABI {abi} (reported only: corral's filesystem boundary is the "
                            "mount namespace)"), abi
    return Check(name="landlock", ok=False,
                 detail="landlock_create_ruleset unavailable (kernel < 5.13, or landlock not "
                        "in the lsm= list); not needed by corral"), 0


def _probe_tools() -> tuple[Check, ...]:
    out = []
    for tool in ("bwrap", "nsjail"):
        path = shutil.which(tool)
        out.append(Check(name=f"{tool} (optional)", ok=path is not None,
                         detail=f"found at {path}; not needed: corral has its own launcher"
                         if path else "not installed; not needed: corral has its own launcher"))
    return tuple(out)


@functools.cache
def _probe_cached() -> HostInfo:
    uid = os.geteuid()
    is_root = uid == 0
    arch = su.machine_arch()
    ns = _probe_namespaces(is_root)
    landlock, abi = _probe_landlock()
    return HostInfo(kernel=os.uname().release, arch=arch, uid=uid, is_root=is_root,
                    namespaces=ns,
                    userns_unprivileged=_probe_userns_unprivileged(is_root, ns["user"].ok),
                    seccomp=_probe_seccomp(arch), landlock=landlock, landlock_abi=abi,
                    cgroups=detect(), tools=_probe_tools())


def probe(*, refresh: bool = False) -> HostInfo:
    """This host's primitives (cached per process; ``refresh`` probes again)."""
    if refresh:
        _probe_cached.cache_clear()
    return _probe_cached()


#: the controllers a sandbox-wide (cgroup) memory and process limit needs
_CGROUP_LIMITS: Final = ("memory", "memsw", "pids")
#: why limits are rlimits: said wherever a door says how it enforces them
NO_CGROUP: Final = "no delegated cgroup"


def strongest_limits_by(cgroups: CgroupSupport | None = None) -> str:
    """How the strict provider enforces memory, process and CPU limits at its strongest
    for this process: ``"cgroup"`` (for the whole sandbox) where this user's cgroups
    give memory+swap and pids, else ``"rlimit"`` (per process; RLIMIT_NPROC for the
    sandbox's user). The doors that choose for the caller (the snippet pool, so
    ``run_snippet`` and ``corral python``; ``corral.provider(limits_by="auto")``, so
    ``corral mcp``) take this; ``corral doctor`` says the same."""
    cg = cgroups if cgroups is not None else detect()
    return "cgroup" if all(c in cg.available for c in _CGROUP_LIMITS) else "rlimit"


def limits_how(limits_by: str, cgroups: CgroupSupport | None = None) -> dict[str, str]:
    """For a person: how each limit is enforced with ``limits_by`` on this host
    (``{"memory": ..., "processes": ..., "cpu": ...}``)."""
    cg = cgroups if cgroups is not None else detect()
    if limits_by == "rlimit":
        why = "" if strongest_limits_by(cg) == "cgroup" else f" ({NO_CGROUP})"
        return {"memory": f"rlimit per process{why}",
                "processes": f"rlimit RLIMIT_NPROC for the sandbox's user{why}",
                "cpu": f"rlimit per process{why}"}
    v = cg.version

    def how(ctrls: tuple[str, ...], what: str) -> str:
        lacking = [c for c in ctrls if c not in cg.available]
        if lacking:
            return f"refused when asked (cgroup {', '.join(lacking)} unavailable)"
        return f"cgroup {v} {what} for the whole sandbox"
    return {"memory": how(("memory", "memsw"), "memory+swap"),
            "processes": how(("pids",), "pids"),
            "cpu": how(("cpu",), "cpu time, polled")}


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One enforcement of one provider: ``how`` it is done, or why not."""

    what: str
    enforced: bool
    how: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderReport:
    """What one provider enforces on this host."""

    name: str
    level: str
    usable: bool
    summary: str
    rows: tuple[Row, ...]
    #: how the doors that choose the strongest (``strongest_limits_by``: corral python,
    #: run_snippet, corral mcp) enforce limits here: "cgroup" or "rlimit" ("" for none)
    limits_by: str = ""
    #: and what that means for each limit (``limits_how``)
    limits: Mapping[str, str] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {"name": self.name, "level": self.level, "usable": self.usable,
                "summary": self.summary,
                "rows": [{"what": r.what, "enforced": r.enforced, "how": r.how}
                         for r in self.rows],
                "limits_by": self.limits_by, "limits": dict(self.limits)}


def _rows(*rows: tuple[str, bool, str]) -> tuple[Row, ...]:
    return tuple(Row(what=w, enforced=e, how=h) for w, e, h in rows)


def providers_report(info: HostInfo | None = None) -> list[ProviderReport]:
    """For each provider (inprocess, subproc, linux): what it enforces here, and why not."""
    info = info or probe()
    inprocess = ProviderReport(
        name="inprocess", level="none", usable=True,
        summary="no boundary: trusted code only",
        rows=_rows(("process boundary", False, "commands run as the caller's own children"),
                   ("filesystem", False, "the caller's user sees the host filesystem"),
                   ("network", False, "the host network"),
                   ("syscalls", False, "no filter"),
                   ("limits (memory, cpu, processes, disk)", False,
                    "refused when asked (config-invalid)"),
                   ("wall clock", True, "the caller kills the command's process group")))
    subproc = ProviderReport(
        name="subproc", level="context-isolated", usable=True,
        summary="separate process: a crash or hang cannot take the caller down",
        rows=_rows(("process boundary", True, "a child process in its own session"),
                   ("environment", True, "allowlist: the caller's env is never inherited"),
                   ("wall clock", True, "killed from outside at the deadline"),
                   ("output caps", True, "capped while the pipes are read"),
                   ("rlimits (cpu, memory, files)", True, "per process, not for the whole tree"),
                   ("network", False, "not isolated: the host network"),
                   ("filesystem", False, "not isolated: the host filesystem as the caller"),
                   ("syscalls", False, "no filter")))
    rows, usable, summary = _linux_rows(info)
    by = strongest_limits_by(info.cgroups) if usable else ""
    linux = ProviderReport(name="linux", level="strict", usable=usable, summary=summary,
                           rows=rows, limits_by=by,
                           limits=limits_how(by, info.cgroups) if by else {})
    return [inprocess, subproc, linux]


def _linux_rows(info: HostInfo) -> tuple[tuple[Row, ...], bool, str]:
    ns, cg = info.namespaces, info.cgroups

    def n(kind: str, what: str, how: str) -> tuple[str, bool, str]:
        c = ns[kind]
        return (what, c.ok, how if c.ok else c.detail)

    def c(ctrls: tuple[str, ...], what: str, how: str) -> tuple[str, bool, str]:
        lacking = [x for x in ctrls if x not in cg.available]
        if not lacking:
            return (what, True, f"{how} (cgroup {cg.version}: "
                    + ", ".join(_cgroup_how(cg, x, where=False) for x in ctrls) + ")")
        return (what, False, "; ".join(f"cgroup {x}: {cg.missing.get(x, 'unavailable')}"
                                       for x in lacking))

    user_how = ("sandbox root is a host uid of each sandbox's own (0x70010000 up), "
                "owner of its user namespace" if info.is_root
                else f"sandbox root is your uid {info.uid} outside")
    user = n("user", "user namespace", user_how)
    if not info.is_root and not info.userns_unprivileged.ok:
        user = ("user namespace", False, info.userns_unprivileged.detail)
    rows = _rows(
        user,
        n("mount", "mount namespace: minimal read-only root", "tmpfs root, read-only binds"),
        n("mount", "private /work and /tmp, disk_mb", "tmpfs with size=disk_mb"),
        n("pid", "pid namespace: host processes invisible", "sandbox init is pid 1"),
        n("net", "network none (loopback only)", "empty network namespace, lo up"),
        n("net", "network allowlist / unrestricted",
          "egress proxy on the host (HTTP CONNECT, plain HTTP, SOCKS5; names resolved "
          "on the host), listening inside the sandbox on 127.0.0.1:3128, which "
          "HTTP_PROXY/HTTPS_PROXY/ALL_PROXY name; no route out otherwise"),
        n("net", "preview URLs (expose)",
          "host loopback port forwarded to a port on the sandbox's loopback, "
          "for connections presenting the URL's token"),
        n("ipc", "ipc namespace", "private SysV IPC and POSIX queues"),
        n("uts", "uts namespace", "hostname 'sandbox'"),
        n("cgroup", "cgroup namespace", "host cgroup paths hidden"),
        ("capabilities dropped, no_new_privs", True, "capset + prctl in the child"),
        ("seccomp filter", info.seccomp.ok, info.seccomp.detail),
        ("new session (no terminal injection)", True, "setsid; stdio are pipes"),
        ("environment allowlist", True, "only the allowlisted variables reach commands"),
        ("wall clock", True, "killed from the host at the deadline"),
        ("output caps", True, "capped by the host while reading the pipes"),
        c(("memory", "memsw"), "mem_mb (memory plus swap)", "oom kill -> limits-exceeded"),
        c(("cpu",), "cpu_ms", "host polls usage, kills at the cap"),
        c(("pids",), "max_processes", "fork fails past the cap"),
        c(("freezer",), "pause/resume", "freezer"),
        n("pid", "whole tree dies on destroy", "pid namespace init killed; cgroup kill"),
    )
    needed = [*(f"{k} namespace" for k, v in ns.items() if not v.ok)]
    if not info.is_root and not info.userns_unprivileged.ok:
        needed.append("unprivileged user namespaces")
    if not info.seccomp.ok:
        needed.append("seccomp")
    if needed:
        return rows, False, "strict not usable here: missing " + ", ".join(needed)
    lacking = [r.what for r in rows if not r.enforced]
    summary = (f"boundary complete; refused when asked: {', '.join(lacking)}" if lacking
               else "every boundary and limit enforced")
    # the default spec (no limits asked): the provider's defaults fit the host
    from corral.providers.linux.policy.plan import DEFAULT_LIMITS
    dropped = [what for ctrls, what in (
        (("memory", "memsw"), f"memory ({DEFAULT_LIMITS.mem_mb} MiB)"),
        (("pids",), f"processes ({DEFAULT_LIMITS.max_processes})"))
               if any(x not in cg.available for x in ctrls)]
    if dropped:
        summary += (f"; the default spec runs without its default {' and '.join(dropped)} "
                    "limit (no cgroup for it; --limits rlimit enforces them per process)")
    if strongest_limits_by(cg) == "rlimit":
        summary += (f"; corral python, run_snippet and corral mcp enforce memory, processes "
                    f"and cpu by rlimits per process ({NO_CGROUP}); a limit asked of the "
                    "cgroup (corral run --mem-mb without --limits rlimit) is refused")
    return rows, True, summary
