"""Snapshots of a sandbox's /work: tar in the sandbox, signed handles in the host.

Sandbox side (the agent): :func:`tar_dir` packs the regular files and
directories of the work dir (symlinks, devices and other mounts are left
out); :func:`replace_dir` checks a whole archive first, then empties the work
dir and extracts it: regular files and directories only, no links, no
absolute or ``..`` names (Python 3.11.2 has no ``tarfile`` filters).

Host side: :class:`SnapshotStore` keeps the archives on disk, in nameless
files (``O_TMPFILE``, mode 0600, in the store's directory) held only by a
descriptor of the host process, so nothing is left on disk on any path (a
crash of the host included), bounded in bytes and count per store and per
tenant (:class:`SnapshotLimits`), dropped with the sandbox that made them
(unless ``keep_after_destroy``), after ``ttl_s`` and at the provider's close.
It hands out :class:`~corral.core.spec.SnapshotHandle` envelopes whose doc
carries an id, the archive's sha256 and an HMAC-SHA256 over both under a
per-provider random key. A tampered, foreign (other provider, key or tenant)
or stale (dropped, expired) handle raises
:class:`~corral.core.errors.InvalidSnapshotHandleError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import hmac
import io
import os
import secrets
import stat
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from corral.core.errors import (
    ConfigInvalidError,
    InvalidSnapshotHandleError,
    LimitsExceededError,
    ProviderError,
)
from corral.core.spec import SnapshotHandle
from corral.providers.confined import split_relative, write_file_under

__all__ = ["ADAPTER_ID", "SnapshotLimits", "SnapshotStore", "replace_dir", "tar_dir"]

ADAPTER_ID: Final = "linux"
_MAX_MEMBERS: Final = 100_000


# -- sandbox side ---------------------------------------------------------------
def tar_dir(root: str) -> bytes:
    """An uncompressed tar of ``root``'s regular files and dirs (same device only)."""
    buf = io.BytesIO()
    dev = os.stat(root).st_dev
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        stack = [""]
        while stack:
            rel = stack.pop()
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                entries = sorted(it, key=lambda e: e.name)
            for e in entries:
                name = f"{rel}/{e.name}" if rel else e.name
                st = e.stat(follow_symlinks=False)
                if st.st_dev != dev:
                    continue  # another mount (e.g. a read-only bind): not sandbox state
                if stat.S_ISDIR(st.st_mode):
                    ti = tarfile.TarInfo(name)
                    ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, st.st_mode & 0o777, st.st_mtime
                    tar.addfile(ti)
                    stack.append(name)
                elif stat.S_ISREG(st.st_mode):
                    ti = tarfile.TarInfo(name)
                    ti.size, ti.mode, ti.mtime = st.st_size, st.st_mode & 0o777, st.st_mtime
                    fd = os.open(e.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                    with os.fdopen(fd, "rb") as f:
                        tar.addfile(ti, f)
    return buf.getvalue()


def _checked_members(data: bytes) -> list[tuple[tarfile.TarInfo, list[str]]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for i, ti in enumerate(tar):
            if i >= _MAX_MEMBERS:
                raise InvalidSnapshotHandleError("snapshot has too many members")
            if not (ti.isfile() or ti.isdir()):
                raise InvalidSnapshotHandleError(f"snapshot member {ti.name!r} is not a file/dir")
            if ti.name.startswith("/"):
                raise InvalidSnapshotHandleError(f"absolute name in snapshot: {ti.name!r}")
            out.append((ti, split_relative(ti.name)))
    return out


def _protected(root: str) -> tuple[set[str], set[str]]:
    """(other mounts, their ancestors) as relative paths: never removed."""
    dev = os.stat(root).st_dev
    keep: set[str] = set()
    mounts: set[str] = set()
    for dirpath, dirnames, _files in os.walk(root):
        for d in list(dirnames):
            p = os.path.join(dirpath, d)
            if os.lstat(p).st_dev != dev:
                rel = os.path.relpath(p, root)
                mounts.add(rel)
                parts = rel.split("/")
                keep.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
                dirnames.remove(d)
    return mounts, keep


def _clear(root: str, rel: str, keep: set[str], mounts: set[str]) -> None:
    path = os.path.join(root, rel) if rel else root
    if rel:
        os.chmod(path, 0o700)
    for name in os.listdir(path):
        child = f"{rel}/{name}" if rel else name
        full = os.path.join(root, child)
        if child in mounts:
            continue
        if child in keep:
            _clear(root, child, keep, mounts)
            continue
        if stat.S_ISDIR(os.lstat(full).st_mode):
            _clear(root, child, keep, mounts)
            os.rmdir(full)
        else:
            os.unlink(full)


def replace_dir(root: str, data: bytes) -> None:
    """Replace ``root``'s content with the archive ``data`` (checked before anything changes)."""
    try:
        members = _checked_members(data)
    except (tarfile.TarError, ValueError) as e:
        raise InvalidSnapshotHandleError(f"snapshot archive is unreadable: {e}") from None
    mounts, keep = _protected(root)
    _clear(root, "", keep, mounts)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for ti, parts in members:
            rel = "/".join(parts)
            if any("/".join(parts[:i]) in keep for i in range(1, len(parts) + 1)):
                continue
            if ti.isdir():
                d = root
                for p in parts:
                    d = os.path.join(d, p)
                    if not os.path.isdir(d):
                        os.mkdir(d, 0o700)
                continue
            f = tar.extractfile(ti)
            write_file_under(root, rel, f.read() if f else b"", root_alias=root,
                             mode=ti.mode & 0o777)
        for ti, parts in reversed(members):  # dir modes last, deepest first
            if ti.isdir() and not any("/".join(parts[:i]) in keep
                                      for i in range(1, len(parts) + 1)):
                os.chmod(os.path.join(root, *parts), (ti.mode & 0o777) | 0o700)


# -- host side --------------------------------------------------------------------
_MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class SnapshotLimits:
    """Bounds of a provider's snapshot store (``LinuxProvider(snapshots=...)``, a
    mapping of these names in ``[provider_options.linux.snapshots]``).

    ``max_bytes`` / ``max_count``: all snapshots of the store together;
    ``tenant_max_bytes`` / ``tenant_max_count``: those of one tenant (the
    ``tenant_id`` of the sandbox that made them). A snapshot past a bound is refused
    with ``LimitsExceededError`` (``limit`` ``snapshot-bytes`` or ``snapshots``).
    ``ttl_s``: a snapshot is deleted that long after it was taken.
    ``keep_after_destroy``: False (the default) deletes a sandbox's snapshots when it
    is destroyed; True keeps them (restorable into another sandbox of the same
    tenant) until ``ttl_s``, ``drop_snapshot`` or the provider's close.
    ``dir``: where the (nameless) files live; default the system's temp dir.
    """

    max_bytes: int = 2048 * _MIB
    max_count: int = 64
    tenant_max_bytes: int = 512 * _MIB
    tenant_max_count: int = 16
    ttl_s: float = 3600.0
    keep_after_destroy: bool = False
    dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_count", "tenant_max_bytes", "tenant_max_count"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigInvalidError(f"snapshots.{name}",
                                         f"must be a positive integer, got {v!r}")
        t = self.ttl_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 30 * 86400:
            raise ConfigInvalidError("snapshots.ttl_s",
                                     f"must be seconds in (0, 30 days], got {t!r}")
        if not isinstance(self.keep_after_destroy, bool):
            raise ConfigInvalidError("snapshots.keep_after_destroy", "must be true or false")
        if self.dir is not None and not (isinstance(self.dir, str) and os.path.isabs(self.dir)
                                         and os.path.isdir(self.dir)):
            raise ConfigInvalidError("snapshots.dir",
                                     f"must be an existing absolute directory, got {self.dir!r}")

    @classmethod
    def of(cls, value: SnapshotLimits | Mapping[str, Any] | None) -> SnapshotLimits:
        """``value`` as SnapshotLimits (None: the defaults); unknown keys are refused."""
        if value is None:
            return cls()
        if isinstance(value, SnapshotLimits):
            return value
        if not isinstance(value, Mapping):
            raise ConfigInvalidError("snapshots", "must be a table of snapshot bounds")
        names = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(str(k) for k in value if k not in names)
        if extra:
            raise ConfigInvalidError("snapshots", f"unknown key(s) {extra}; known: "
                                     f"{sorted(names)}")
        return cls(**dict(value))


@dataclass
class _Entry:
    fd: int          # the nameless file holding the archive
    size: int
    digest: str
    tenant: str
    owner: str       # the id of the sandbox that made it
    expires: float   # loop time


def _nameless_file(directory: str) -> int:
    """A new file of ``directory`` that has no name (O_TMPFILE; else made and unlinked
    at once, mode 0600): it lives as long as its descriptor, not a crash longer."""
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    fd, path = tempfile.mkstemp(prefix=".corral-snap-", dir=directory)
    os.unlink(path)
    return fd


def _stored(directory: str, data: bytes) -> tuple[int, str]:
    """A nameless file of ``directory`` holding ``data``: (its descriptor, the data's
    sha256), on a thread."""
    digest = hashlib.sha256(data).hexdigest()
    fd = _nameless_file(directory)
    try:
        view = memoryview(data)
        off = 0
        while off < len(view):
            off += os.pwrite(fd, view[off:off + 8 * _MIB], off)
    except BaseException:
        os.close(fd)
        raise
    return fd, digest


def _close_when_done(fut: asyncio.Future[tuple[int, str]]) -> None:
    """A cancelled store's thread still finishes: close the descriptor it made then
    (never while the thread uses it, whose number could be reused meanwhile)."""
    def done(f: asyncio.Future[tuple[int, str]]) -> None:
        if not f.cancelled() and f.exception() is None:
            os.close(f.result()[0])
    fut.add_done_callback(done)


def _read_all(fd: int, size: int, digest: str) -> bytes:
    """Read ``size`` bytes of ``fd`` from its start and check their sha256, then close
    ``fd`` (on a thread)."""
    try:
        data = os.pread(fd, size, 0)  # one read for a regular file under 2 GiB
        while len(data) < size:
            more = os.pread(fd, size - len(data), len(data))
            if not more:
                raise InvalidSnapshotHandleError("snapshot file is shorter than its handle")
            data += more
        if hashlib.sha256(data).hexdigest() != digest:
            raise InvalidSnapshotHandleError("snapshot content does not match its handle")
        return data
    finally:
        os.close(fd)


@final
class SnapshotStore:
    """Archives by id, on disk in nameless files, bounded, with HMAC-signed handles."""

    def __init__(self, limits: SnapshotLimits | None = None) -> None:
        self.limits = limits or SnapshotLimits()
        self._key = secrets.token_bytes(32)
        self._data: dict[str, _Entry] = {}
        self._reserved = 0  # bytes of puts writing now (counted against the bounds)
        self._reserved_by: dict[str, tuple[int, int]] = {}  # tenant -> (bytes, count)
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    # what is held now (tests, the soak benchmark's leak count)
    @property
    def bytes_used(self) -> int:
        return sum(e.size for e in self._data.values()) + self._reserved

    @property
    def count(self) -> int:
        return len(self._data) + sum(c for _b, c in self._reserved_by.values())

    def tenant_usage(self, tenant: str) -> tuple[int, int]:
        """(bytes, count) held for ``tenant``, writes in progress included."""
        rb, rc = self._reserved_by.get(tenant, (0, 0))
        es = [e for e in self._data.values() if e.tenant == tenant]
        return sum(e.size for e in es) + rb, len(es) + rc

    def _mac(self, sid: str, digest: str, size: int) -> str:
        msg = f"{ADAPTER_ID}\0{sid}\0{digest}\0{size}".encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def _admit(self, size: int, tenant: str) -> None:
        lim = self.limits
        tb, tc = self.tenant_usage(tenant)
        for kind, cap, now, add, who in (
                ("snapshot-bytes", lim.max_bytes, self.bytes_used, size, "the store"),
                ("snapshots", lim.max_count, self.count, 1, "the store"),
                ("snapshot-bytes", lim.tenant_max_bytes, tb, size, f"tenant {tenant!r}"),
                ("snapshots", lim.tenant_max_count, tc, 1, f"tenant {tenant!r}")):
            if now + add > cap:
                raise LimitsExceededError(
                    kind, cap, now + add,  # type: ignore[arg-type]
                    detail=f"snapshots of {who} would take {now + add} "
                    f"{'bytes' if kind == 'snapshot-bytes' else 'snapshots'}; drop one "
                    "(drop_snapshot) or destroy its sandbox")

    async def put(self, data: bytes, *, tenant: str, owner: str) -> SnapshotHandle:
        """Store ``data`` for ``tenant`` (made by sandbox ``owner``): refused past a bound
        (LimitsExceededError); written on a thread, then held by a descriptor only."""
        if self._closed:
            raise ProviderError("the snapshot store is closed")
        self._sweep()
        size = len(data)
        self._admit(size, tenant)
        rb, rc = self._reserved_by.get(tenant, (0, 0))
        self._reserved += size
        self._reserved_by[tenant] = (rb + size, rc + 1)
        directory = self.limits.dir or tempfile.gettempdir()
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(None, _stored, directory, data)
            try:
                fd, digest = await asyncio.shield(fut)
            except asyncio.CancelledError:
                _close_when_done(fut)
                raise
        except OSError as e:
            raise ProviderError(f"cannot store the snapshot in {directory}: "
                                f"{e.strerror or e}") from None
        finally:
            self._reserved -= size
            rb, rc = self._reserved_by.pop(tenant)
            if rc > 1:
                self._reserved_by[tenant] = (rb - size, rc - 1)
        if self._closed:  # closed while writing: nothing kept
            os.close(fd)
            raise ProviderError("the snapshot store is closed")
        sid = secrets.token_hex(16)
        self._data[sid] = _Entry(fd, size, digest, tenant, owner,
                                 loop.time() + self.limits.ttl_s)
        self._arm(loop)
        return SnapshotHandle(adapter_id=ADAPTER_ID, doc={
            "id": sid, "sha256": digest, "size": size,
            "mac": self._mac(sid, digest, size)})

    def _entry(self, handle: object) -> tuple[str, _Entry]:
        if not isinstance(handle, SnapshotHandle) or handle.adapter_id != ADAPTER_ID:
            raise InvalidSnapshotHandleError("not a snapshot handle of the linux provider")
        doc = handle.doc
        sid, digest, size, mac = (doc.get("id"), doc.get("sha256"), doc.get("size"),
                                  doc.get("mac"))
        if not (isinstance(sid, str) and isinstance(digest, str) and isinstance(mac, str)
                and isinstance(size, int) and not isinstance(size, bool)):
            raise InvalidSnapshotHandleError("malformed snapshot handle")
        if not hmac.compare_digest(mac, self._mac(sid, digest, size)):
            raise InvalidSnapshotHandleError(
                "snapshot handle signature does not verify (tampered or from another provider)")
        self._sweep()
        entry = self._data.get(sid)
        if entry is None:
            raise InvalidSnapshotHandleError(
                "snapshot is stale: it was dropped (destroyed with its sandbox, expired "
                "or dropped)")
        if entry.digest != digest or entry.size != size:
            raise InvalidSnapshotHandleError("snapshot content does not match its handle")
        return sid, entry

    async def get(self, handle: object, *, tenant: str) -> bytes:
        """The archive for ``handle``, which only a sandbox of the tenant that took it
        may restore; InvalidSnapshotHandleError otherwise (or if changed, stale)."""
        _sid, entry = self._entry(handle)
        if not hmac.compare_digest(entry.tenant.encode(), tenant.encode()):
            raise InvalidSnapshotHandleError("snapshot belongs to another tenant")
        # a copy of the descriptor, closed by the reading thread itself: a drop while it
        # reads closes only the store's, and a cancel never closes one in use
        return await asyncio.to_thread(_read_all, os.dup(entry.fd), entry.size, entry.digest)

    def drop(self, handle: SnapshotHandle) -> None:
        """Delete the snapshot of ``handle`` (a verified one; stale: nothing to do)."""
        try:
            sid, _e = self._entry(handle)
        except InvalidSnapshotHandleError as e:
            if "stale" in str(e):
                return
            raise
        self._close(sid)

    def drop_owner(self, owner: str) -> None:
        """The sandbox ``owner`` was destroyed: delete its snapshots (unless the store
        keeps them after destroy)."""
        if self.limits.keep_after_destroy:
            return
        for sid in [k for k, e in self._data.items() if e.owner == owner]:
            self._close(sid)

    def _close(self, sid: str) -> None:
        e = self._data.pop(sid, None)
        if e is not None:
            os.close(e.fd)

    def _sweep(self) -> None:
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:
            return
        for sid in [k for k, e in self._data.items() if e.expires <= now]:
            self._close(sid)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """One timer, at the earliest expiry: an expired snapshot goes at its time."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._data and not self._closed:
            at = min(e.expires for e in self._data.values())
            self._timer = loop.call_at(at, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._sweep()
        self._arm(loop)

    def clear(self) -> None:
        """Delete every snapshot (the provider's close); later puts are refused."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for sid in list(self._data):
            self._close(sid)
