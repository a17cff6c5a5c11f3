"""Per-sandbox host uids for a fork server running as root.

Why: the kernel charges a user namespace's per-user quotas (inotify
instances and watches, POSIX message queue bytes, queued signals, namespace
counts) up the chain to the uid that *created* it, and pipe buffers, epoll
watches and in-flight unix descriptors to the real uid outside. If root
created every sandbox's user namespace, or all sandboxes shared one outside
uid (65534), one sandbox could use up root's quota or its neighbours'. So a
root fork server gives every sandbox a uid of its own: the template creates
the user namespace with that uid as its effective uid (the namespace's
owner) and uid/gid 0 inside map to it.

Which uids: ``0x70000000`` to ``0x7FFDFFFF`` (1879048192 to 2147352575),
in 65536-aligned blocks. That is above every range a distribution gives to
users (up to 60000) and to systemd's dynamic (61184-65519) and container
(524288-1879048191, nspawn's ``--private-users=pick``, nsresourced)
ranges, below systemd's 64K "foreign" range at ``0x7FFE0000`` and below
2^31 (uids above it trip programs that keep a uid in a signed int). The
usual /etc/subuid allocations (100000 up, 65536 per user) sit far below.

The first block is not handed out: its first id, ``BIND_UID`` (0x70000000), is the
identity every write through a read-write bind lands as on the host (an idmapped
mount, ``init.mounts.idmap_trees``), so that id owns files outside sandboxes and no
sandbox ever runs as it (issue 24: a uid a sandbox runs as must never own a file a
local user can reach).

How, across processes: each pool takes one block, chosen at random, and
holds an exclusive ``flock`` on ``/run/corral/uid-blocks/<block>`` for its
life, so two fork servers (of one process or several) never share a block;
the lock goes when its process does. A pool that closes removes its file
while it still holds the lock; so a pool that got the lock checks that the
name still leads to the file it locked, and tries another block if not.
Inside its block a pool hands uids out round robin and keeps each until the
sandbox's pid 1 has exited (a dup of its pidfd: a pid namespace's init exits
last, after the kernel killed every other process in it), so no two live
sandboxes share a uid either.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without loading typing (the CLI's one-shot path)
if TYPE_CHECKING:
    from typing import Final

__all__ = ["BIND_UID", "BLOCK", "FIRST_UID", "LAST_UID", "LOCK_DIR", "SandboxUids", "UidPool"]

FIRST_UID: Final = 0x70000000
LAST_UID: Final = 0x7FFDFFFF
BLOCK: Final = 1 << 16
LOCK_DIR: Final = "/run/corral/uid-blocks"
#: what a sandbox's writes through a read-write bind are on the host (uid and gid): the
#: first id of the first block, which no pool hands out. ``policy.plan.BIND_UID`` (a
#: test holds them equal)
BIND_UID: Final = FIRST_UID
_FIRST_BLOCK: Final = FIRST_UID // BLOCK + 1  # the first block is BIND_UID's
_BLOCKS: Final = (LAST_UID + 1) // BLOCK - _FIRST_BLOCK
#: ``policy.plan.PER_SANDBOX_ID`` (a test holds them equal; the plan module is not loaded
#: here, for the CLI's one-shot path)
PER_SANDBOX_ID: Final = -1


class UidPool:
    """Host uids for sandboxes, one at a time, from a block no other pool holds."""

    def __init__(self, lock_dir: str = LOCK_DIR) -> None:
        self._lock_path, self._lock_fd, self.base = _claim_block(lock_dir)
        self._next = 0
        #: uid -> a pidfd of the sandbox's pid 1 (the uid is free once it exited)
        self._live: dict[int, int] = {}

    def allocate(self) -> int:
        """A uid of this pool's block that no live sandbox of this pool holds."""
        self._sweep()
        for _ in range(BLOCK):
            uid = self.base + self._next
            self._next = (self._next + 1) % BLOCK
            if uid not in self._live:
                return uid
        raise OSError(errno.EAGAIN, f"all {BLOCK} sandbox uids of this fork server are in use")

    def hold(self, uid: int, pidfd: int) -> None:
        """``uid`` is taken until the process behind ``pidfd`` exits (``pidfd`` is dup'ed)."""
        self._live[uid] = os.dup(pidfd)

    def live(self) -> int:
        """How many uids are held (after dropping those whose sandbox exited)."""
        self._sweep()
        return len(self._live)

    def wait_idle(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds until no sandbox of this pool is alive."""
        poller = select.poll()
        for fd in self._live.values():
            poller.register(fd, select.POLLIN)
        left = len(self._live)
        deadline = time.monotonic() + timeout
        while left and (ms := int((deadline - time.monotonic()) * 1000)) > 0:
            for fd, _ev in poller.poll(ms):
                poller.unregister(fd)
                left -= 1

    def close(self) -> None:
        """Give the block back (its lock file goes, under the lock)."""
        for fd in self._live.values():
            os.close(fd)
        self._live.clear()
        if self._lock_fd >= 0:
            try:
                os.unlink(self._lock_path)
            except FileNotFoundError:
                pass
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _sweep(self) -> None:
        if not self._live:
            return
        poller = select.poll()
        by_fd = {fd: uid for uid, fd in self._live.items()}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ev in poller.poll(0):
            del self._live[by_fd[fd]]
            os.close(fd)


class SandboxUids:
    """The fork server's side: each sandbox's outside uid/gid from its plan, a pool's
    uid where the plan says PER_SANDBOX_ID (the pool is made on first use)."""

    def __init__(self) -> None:
        self.root = os.geteuid() == 0
        self.pool: UidPool | None = None

    def pick(self, uid: int, gid: int) -> tuple[int, int, bool]:
        """(uid, gid, whether they came from the pool: :meth:`hold` them then)."""
        if uid != PER_SANDBOX_ID and gid != PER_SANDBOX_ID:
            return uid, gid, False
        if not self.root:
            raise OSError(errno.EPERM, "a uid per sandbox needs root")
        if self.pool is None:
            self.pool = UidPool()
        x = self.pool.allocate()
        return (x if uid == PER_SANDBOX_ID else uid), (x if gid == PER_SANDBOX_ID else gid), True

    def hold(self, uid: int, pidfd: int) -> None:
        if self.pool is not None:
            self.pool.hold(uid, pidfd)

    def wait_idle(self, timeout: float) -> None:
        if self.pool is not None:
            self.pool.wait_idle(timeout)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def _claim_block(lock_dir: str) -> tuple[str, int, int]:
    """(lock file, its descriptor, first uid) of a block no other pool holds."""
    os.makedirs(lock_dir, mode=0o755, exist_ok=True)
    start = int.from_bytes(os.urandom(4), "little") % _BLOCKS
    for i in range(_BLOCKS):
        block = _FIRST_BLOCK + (start + i) % _BLOCKS
        path = os.path.join(lock_dir, f"{block:04x}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            mine = os.fstat(fd)
            now = os.stat(path, follow_symlinks=False)
        except (BlockingIOError, FileNotFoundError):  # held, or removed by its last holder
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        if (mine.st_dev, mine.st_ino) != (now.st_dev, now.st_ino):  # replaced meanwhile
            os.close(fd)
            continue
        return path, fd, block * BLOCK
    raise OSError(errno.EAGAIN, f"every sandbox uid block under {lock_dir} is taken")
