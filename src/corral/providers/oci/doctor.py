"""``corral doctor``'s rows for the oci provider: one report per runtime (``oci/crun``,
``oci/runsc``), saying whether it was found and what it enforces on this host.

The rows are the same JSON-safe shape as the linux provider's
(``name``, ``level``, ``usable``, ``summary``, ``rows[]`` of ``what``/``enforced``/``how``).
Nothing here starts a container: the facts are the runtime's binary and version, the
init, root, and the cgroup hierarchies (:func:`corral.providers.oci._host.probe`).
"""

from __future__ import annotations

from typing import Any

from corral.providers.oci._host import RUNTIMES, HostFacts, RuntimeInfo, probe, probe_runtime
from corral.providers.oci._provider import unusable_reason

__all__ = ["providers_report"]


def _limit_row(facts: HostFacts, what: str, field: str, how: str) -> dict[str, Any]:
    missing = facts.missing_limit(field)
    return {"what": what, "enforced": not missing,
            "how": how if not missing else f"refused (limits.{field}): missing {missing}"}


def _report(rt: RuntimeInfo, facts: HostFacts) -> dict[str, Any]:
    missing = unusable_reason(rt, facts)
    name = f"oci/{rt.name}"
    if missing:
        return {"name": name, "level": "strict", "usable": False,
                "summary": f"missing {missing}", "rows": []}
    gvisor = rt.name == "runsc"
    kernel = ("gVisor's user-space kernel (the Sentry) answers the sandbox's syscalls"
              if gvisor else "the host kernel, filtered by a seccomp deny list")
    rows = [
        {"what": "runtime", "enforced": True, "how": f"{rt.path} ({rt.version or '?'})"},
        {"what": "namespaces", "enforced": True,
         "how": "pid, mount, network, ipc, uts, cgroup (no user namespace: rootful; each "
                "sandbox runs as a uid of its own, no capabilities, no_new_privs)"},
        {"what": "syscalls", "enforced": True, "how": kernel},
        {"what": "filesystem", "enforced": True,
         "how": "read-only root (the host's /usr, /lib* or an image), private tmpfs "
                "/work and /tmp"},
        {"what": "network none", "enforced": True,
         "how": "own network namespace with only lo"},
        {"what": "network allowlist / unrestricted", "enforced": False,
         "how": "refused (network): no egress proxy in this provider"},
        _limit_row(facts, "memory (mem_mb)", "mem_mb",
                   "cgroup v1 memory.limit_in_bytes + memory.memsw.limit_in_bytes"),
        _limit_row(facts, "processes (max_processes)", "max_processes", "cgroup pids.max"),
        _limit_row(facts, "cpu time (cpu_ms)", "cpu_ms",
                   "cpuacct.usage polled by the host, the command killed at the cap"),
        {"what": "disk (disk_mb)", "enforced": True, "how": "size of the /work and /tmp tmpfs"},
        {"what": "wall clock, output caps", "enforced": True,
         "how": "each exec a bounded run (timeout, caps, group kill)"},
    ]
    if facts.hybrid and rt.name == "crun":
        rows.append({"what": "hybrid cgroups", "enforced": True,
                     "how": f"containers start in a private mount namespace without "
                            f"{facts.unified} (crun refuses hybrid hosts)"})
    return {"name": name, "level": "strict", "usable": True,
            "summary": "containers on " + ("gVisor (runsc)" if gvisor else "crun"),
            "rows": rows}


def providers_report() -> list[dict[str, Any]]:
    """One report per runtime the oci provider knows."""
    facts = probe()
    return [_report(probe_runtime(name), facts) for name in RUNTIMES]
