"""LinuxProvider and LinuxSandbox: the host side of the strict Linux provider."""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Awaitable
from typing import Any, Final, TypeVar, final

from ..._cancel import CancelToken
from ...errors import (
    ConfigInvalidError,
    CreateCancelledError,
    LevelNotSupportedError,
    ProviderError,
)
from ...provider import SandboxProvider
from ...spec import (
    Level,
    SandboxLimits,
    SandboxSpec,
)
from . import _sys_unsafe as su, mounts
from .client import Channel, Zygote, kill_pidfd
from .plan import DEFAULT_LIMITS, LinuxOptions, SandboxPlan, build_plan
from .sandbox import LinuxSandbox
from .snapshots import SnapshotStore

__all__ = ["DEFAULT_STDERR_CAP", "DEFAULT_STDOUT_CAP", "LinuxProvider", "LinuxSandbox"]

DEFAULT_STDOUT_CAP: Final = 8 * 1024 * 1024
DEFAULT_STDERR_CAP: Final = 1024 * 1024
_T = TypeVar("_T")


@final
class LinuxProvider(SandboxProvider):
    """Level ``strict`` on Linux: namespaces, seccomp, cgroups and rlimits.

    One zygote (fork server) per provider builds sandboxes; each sandbox is a
    pid namespace whose pid 1 is an agent that spawns commands on request.

    Args:
        default_limits: applied where a spec leaves a limit unset; by default
            mem_mb=512, max_processes=256, disk_mb=256 (cpu_ms unset: not capped).
        outside_uid / outside_gid: host ids that uid/gid 0 inside map to; default
            65534 when running as root, the caller's own ids otherwise.
        cgroup_root: a delegated cgroup dir (or v1 mapping) to nest sandboxes in.
        stdout_cap / stderr_cap: per-exec output caps (bytes).

    Limits the host cannot enforce are refused at ``create`` with
    LevelNotSupportedError naming the missing primitive; so are a missing
    seccomp filter and missing namespaces. ``reaped_orphans`` lists the cgroups
    of dead earlier providers this one removed at start.
    """

    name = "linux"
    levels: frozenset[Level] = frozenset({Level.STRICT})

    def __init__(self, *, default_limits: SandboxLimits = DEFAULT_LIMITS,
                 outside_uid: int | None = None, outside_gid: int | None = None,
                 cgroup_root: str | None = None, hostname: str = "sandbox",
                 stdout_cap: int = DEFAULT_STDOUT_CAP,
                 stderr_cap: int = DEFAULT_STDERR_CAP) -> None:
        from .cgroups import CgroupManager
        self.options = LinuxOptions(outside_uid=outside_uid, outside_gid=outside_gid,
                                    default_limits=default_limits, hostname=hostname)
        self.stdout_cap, self.stderr_cap = stdout_cap, stderr_cap
        self._host = mounts.detect_host_layout()
        self._cgroups = CgroupManager(root=cgroup_root)
        self.reaped_orphans: tuple[str, ...] = tuple(self._cgroups.reap_orphans())
        self.snapshots = SnapshotStore()
        caps = {"strict", "streaming", "snapshot", "restore"}
        if self._cgroups.support.has("freezer"):
            caps.add("pause")
        self.capabilities = frozenset(caps)
        self._zygote: Zygote | None = None
        self._zlock: asyncio.Lock | None = None
        self._prog: bytes | None = None
        self._live: set[LinuxSandbox] = set()
        self._closed = False

    # -- helpers -----------------------------------------------------------------
    def _seccomp(self) -> bytes:
        if self._prog is None:
            from . import seccomp
            arch = su.machine_arch()
            try:
                self._prog = seccomp.build_filter(arch)
            except LevelNotSupportedError:
                raise
            except Exception as e:
                raise LevelNotSupportedError("strict", (), str(e),
                                             missing=f"seccomp filter for {arch}") from e
        return self._prog

    async def _zygote_for(self, prog: bytes) -> Zygote:
        if self._zlock is None:
            self._zlock = asyncio.Lock()
        async with self._zlock:
            if self._zygote is None or not self._zygote.alive:
                if self._zygote is not None:
                    self._zygote.stop()
                self._zygote = Zygote(self._host.package_root, prog)
                await self._zygote.start()
            return self._zygote

    def plan(self, spec: SandboxSpec) -> SandboxPlan:
        """The plan ``create(spec)`` would apply (refusals included)."""
        plan = build_plan(spec, options=self.options, host=self._host)
        self._cgroups.require(plan.limits)
        return plan

    # -- the contract ---------------------------------------------------------------
    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None
                     ) -> LinuxSandbox:
        if self._closed:
            raise ProviderError("the provider is closed")
        if not isinstance(spec, SandboxSpec):
            raise ConfigInvalidError("spec", "must be a SandboxSpec")
        plan = self.plan(spec)
        prog = self._seccomp()
        sid = secrets.token_hex(6)
        cg: Any = None
        chan: Channel | None = None
        host_end: socket.socket | None = None
        pidfd = -1

        def check_cancel() -> None:
            if cancel is not None and cancel.cancelled:
                raise CreateCancelledError(f"create cancelled: {cancel.reason}")

        try:
            check_cancel()
            if self._cgroups.support.version != "none":
                cg = self._cgroups.create(sid, plan.limits)
            zygote = await self._zygote_for(prog)
            check_cancel()
            host_end, sb_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            launch = asyncio.ensure_future(zygote.create(
                plan.to_wire(), list(cg.procs_files) if cg else [], sb_end.fileno()))
            try:
                try:
                    _pid, pidfd = await asyncio.shield(launch)
                except asyncio.CancelledError:
                    # let the in-flight launch settle, so the rollback kills what it made
                    await asyncio.wait([launch], timeout=10)
                    if launch.done() and not launch.cancelled() and not launch.exception():
                        _pid, pidfd = launch.result()
                    raise
            except ProviderError as e:
                if "unshare" in e.message or "id maps" in e.message:
                    raise LevelNotSupportedError(
                        "strict", (), e.message,
                        missing="namespaces (user, mount, pid, net, ipc, uts, cgroup)") from None
                raise
            finally:
                sb_end.close()
            chan = Channel(host_end, what=f"sandbox {sid}")
            hello = await self._race(chan.hello, cancel)
            if not hello.get("ready"):
                err = str(hello.get("error", "sandbox setup failed"))
                if "seccomp" in err:
                    raise LevelNotSupportedError("strict", (), err, missing="seccomp")
                raise ProviderError(err)
            check_cancel()
            sb = LinuxSandbox(provider=self, sid=sid, spec=spec, plan=plan, channel=chan,
                              pidfd=pidfd, cgroup=cg)
        except BaseException:
            if chan is not None:
                chan.close()
            elif host_end is not None:
                host_end.close()
            if pidfd >= 0:
                kill_pidfd([pidfd])
            if cg is not None:
                _remove_cgroup(cg)
            raise
        self._live.add(sb)
        return sb

    @staticmethod
    async def _race(aw: Awaitable[_T], cancel: CancelToken | None) -> _T:
        if cancel is None:
            return await aw
        fut = asyncio.ensure_future(aw)
        waiter = asyncio.ensure_future(cancel.wait_cancelled_async())
        try:
            await asyncio.wait({fut, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not fut.done():
            fut.cancel()
            raise CreateCancelledError(f"create cancelled: {cancel.reason}")
        return fut.result()

    def _forget(self, sb: LinuxSandbox) -> None:
        self._live.discard(sb)

    async def aclose(self) -> None:
        """Destroy every live sandbox, stop the zygote, drop the snapshots. Idempotent."""
        self._closed = True
        for sb in list(self._live):
            await sb.destroy()
        if self._zygote is not None:
            self._zygote.stop()
            self._zygote = None
        self.snapshots.clear()

    @property
    def zygote_pid(self) -> int | None:
        """The fork server's pid (None before the first create); for leak checks."""
        return self._zygote.proc.pid if self._zygote is not None else None


def _remove_cgroup(cg: Any) -> None:
    """Best effort during a rollback: the original error is the one to raise."""
    try:
        cg.kill_all()
        cg.remove()
    except Exception:
        pass

