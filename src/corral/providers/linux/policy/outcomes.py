"""Which limit ended a command in a strict sandbox: the one set of rules, for the
provider's exec and the CLI's one-shot path.

Pure: the caller hands in the command's exit status and the facts to read (cgroup
counters as callables, read only when a rule needs them); the answer is the outcome's
value (``corral.core.result.Outcome``, as a string so the one-shot path needs no
enum), the limit, what was observed (or None) and how it was seen.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["LimitHit", "limit_hit"]

# signal numbers (the same on x86-64 and arm64), so this module imports no ``signal``
_SIGABRT, _SIGBUS, _SIGKILL, _SIGSEGV, _SIGXCPU, _SIGXFSZ = 6, 7, 9, 11, 24, 25
#: how a process dies of a failed allocation under RLIMIT_AS
_MEMORY_SIGNALS = frozenset({_SIGSEGV, _SIGBUS, _SIGABRT})

#: (outcome value, limit, observed or None, how it was seen)
LimitHit = tuple[str, int, "int | None", str]

CPU_KILLED = ("the sandbox used up its CPU time (cpu_ms) and was killed with every process "
              "in it")


def limit_hit(code: int, *, mem_mb: int | None, cpu_ms: int | None,
              max_processes: int | None, disk_mb: int | None, by_rlimit: bool,
              cpu_killed_at: int, cpu_used: Callable[[], int],
              oom_rose: Callable[[], bool], peak_mb: Callable[[], int | None],
              pids_refused: Callable[[], bool], disk_free: int) -> LimitHit | None:
    """The limit that ended a command which exited with ``code`` (negative: the signal),
    or None when none did.

    ``cpu_killed_at``: the CPU time at which the host killed the whole sandbox at its
    ``cpu_ms`` (0: it did not). ``cpu_used``: the command's (and the sandbox's) CPU
    time. ``oom_rose`` / ``pids_refused``: the cgroup's OOM kills / refused forks rose
    during the command. ``disk_free``: free bytes of the writable area at the exit
    (-1: unknown).
    """
    if cpu_ms is not None and (code == -_SIGXCPU or cpu_killed_at):
        if not cpu_killed_at:  # RLIMIT_CPU struck first
            return ("cpu-limit", cpu_ms, cpu_used(),
                    "a command used up its CPU time (RLIMIT_CPU)")
        return ("cpu-limit", cpu_ms, cpu_killed_at, CPU_KILLED)
    if by_rlimit and mem_mb is not None and -code in _MEMORY_SIGNALS:
        return ("memory-limit", mem_mb, None,
                "a command died of a failed allocation under its address-space limit "
                "(RLIMIT_AS, per process)")
    if mem_mb is not None and code == -_SIGKILL and oom_rose():
        return ("memory-limit", mem_mb, peak_mb(),
                "the command was killed by the out-of-memory killer")
    if max_processes is not None and code != 0 and pids_refused():
        return ("processes-limit", max_processes, None,
                "a fork failed at the sandbox's process limit")
    disk = disk_mb or 0
    if code == -_SIGXFSZ or (code != 0 and 0 <= disk_free < min(
            1 << 20, disk * 1024 * 1024 // 50)):
        return ("disk-limit", disk, disk, "the sandbox's writable area (/work and /tmp) is full")
    return None
