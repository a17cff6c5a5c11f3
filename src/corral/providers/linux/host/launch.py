"""One launch of a strict sandbox: its cgroup, the zygote's fork into fresh
namespaces, and the agent's hello, rolled back on failure or cancel. Used by
:class:`~corral.providers.linux.host.provider.LinuxProvider` for cold creates and for
building spares.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from corral.core.cancel import CancelScope, CancelToken
from corral.core.errors import CreateCancelledError, LevelNotSupportedError, ProviderError
from corral.core.spec import SandboxLimits
from corral.core.tasks import settle
from corral.providers.linux.host.channel import REQUEST_TIMEOUT_S, Channel, Zygote, kill_pidfd
from corral.providers.linux.host.spares import Launched
from corral.providers.linux.init.clone import IDMAP_ERROR  # the launcher's word for it
from corral.providers.linux.policy.plan import SandboxPlan

if TYPE_CHECKING:
    from corral.providers.linux.host.cgroups import CgroupManager

__all__ = ["FORK_SETTLE_S", "launch", "race"]

_T = TypeVar("_T")
#: how long a cancelled launch waits for the fork server's reply before it cancels the
#: request (the fork server's answer is what the rollback needs to kill the sandbox)
FORK_SETTLE_S = 10.0
IDMAP_FIX = ("; a read-write bind as root needs one (what the sandbox writes then lands "
             "on the host as uid 0x70000000, never as a sandbox's uid): bind a directory "
             "on a file system with idmapped mounts (ext4, xfs, btrfs, tmpfs since 6.3; "
             "not overlayfs, nfs), read-only, or run corral as a non-root user")


async def launch(plan: SandboxPlan, prog: bytes, cancel: CancelToken | None, *,
                 limits: SandboxLimits, cgroups: CgroupManager,
                 zygote_for: Callable[[bytes], Awaitable[Zygote]]) -> Launched:
    """Build one sandbox: its cgroup (with ``limits``, in ``cgroups``), namespaces and
    ready agent, forked by the zygote ``zygote_for(prog)`` gives. Rolls back what it
    made on any failure or on ``cancel`` (``CreateCancelledError``)."""
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
        if cgroups.support.version != "none":
            cg = cgroups.create(sid, limits)
        zygote = await zygote_for(prog)
        check_cancel()
        host_end, sb_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        forking = asyncio.ensure_future(zygote.create(
            plan.wire, list(cg.join_files) if cg else [], sb_end.fileno()))
        try:
            try:
                _pid, pidfd = await asyncio.shield(forking)
            except asyncio.CancelledError:
                # let the in-flight launch finish (bounded), so the rollback kills what it
                # made; past the bound it is cancelled and awaited here: a reply that comes
                # later is dropped by the channel, its pidfd killed (``on_orphan_fds``)
                try:
                    await asyncio.wait([forking], timeout=FORK_SETTLE_S)
                finally:
                    if forking.done() and not forking.cancelled() and not forking.exception():
                        _pid, pidfd = forking.result()
                    await settle([forking])
                raise
        except ProviderError as e:
            if "unshare" in e.message or "id maps" in e.message:
                raise LevelNotSupportedError(
                    "strict", (), e.message,
                    missing="namespaces (user, mount, pid, net, ipc, uts, cgroup)") from None
            if f"failed: {IDMAP_ERROR}: " in e.message:  # a rw bind as root: never without
                raise LevelNotSupportedError(
                    "strict", (), e.message + IDMAP_FIX, missing="idmapped mount",
                    field="binds") from None
            raise
        finally:
            sb_end.close()
        chan = Channel(host_end, what=f"sandbox {sid}", accept_fds=True)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                hello = await race(chan.hello, cancel)
        except TimeoutError:
            raise ProviderError(f"sandbox setup did not finish within {REQUEST_TIMEOUT_S} s"
                                ) from None
        if not hello.get("ready"):
            err = str(hello.get("error", "sandbox setup failed"))[:1000]
            if "seccomp" in err:
                raise LevelNotSupportedError("strict", (), err, missing="seccomp")
            raise ProviderError(err)
        check_cancel()
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
    return Launched(sid=sid, chan=chan, pidfd=pidfd, cg=cg)

async def race(aw: Awaitable[_T], cancel: CancelToken | None) -> _T:
    """``aw``, or CreateCancelledError as soon as ``cancel`` fires (``aw`` cancelled)."""
    async with CancelScope(cancel):
        return await aw
    assert cancel is not None
    raise CreateCancelledError(f"create cancelled: {cancel.reason}")


def _remove_cgroup(cg: Any) -> None:
    """Best effort during a rollback: the original error is the one to raise."""
    try:
        cg.kill_all()
        cg.remove()
    except Exception:
        pass
