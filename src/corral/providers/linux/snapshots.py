"""Snapshots of a sandbox's /work: tar in the sandbox, signed handles in the host.

Sandbox side (the agent): :func:`tar_dir` packs the regular files and
directories of the work dir (symlinks, devices and other mounts are left
out); :func:`replace_dir` checks a whole archive first, then empties the work
dir and extracts it: regular files and directories only, no links, no
absolute or ``..`` names (Python 3.11.2 has no ``tarfile`` filters).

Host side: :class:`SnapshotStore` keeps the archives in memory and hands
out :class:`~corral.core.spec.SnapshotHandle` envelopes whose doc carries an id,
the archive's sha256 and an HMAC-SHA256 over both under a per-provider random
key. A tampered, foreign (other provider or key) or stale (dropped) handle
raises :class:`~corral.core.errors.InvalidSnapshotHandleError`.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import secrets
import stat
import tarfile
from typing import Final, final

from corral.core.errors import InvalidSnapshotHandleError
from corral.core.spec import SnapshotHandle
from corral.providers.confined import split_relative, write_file_under

__all__ = ["ADAPTER_ID", "SnapshotStore", "replace_dir", "tar_dir"]

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
@final
class SnapshotStore:
    """Archives by id, in memory, with HMAC-signed handles."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        self._data: dict[str, bytes] = {}

    def _mac(self, sid: str, digest: str, size: int) -> str:
        msg = f"{ADAPTER_ID}\0{sid}\0{digest}\0{size}".encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def put(self, data: bytes) -> SnapshotHandle:
        sid = secrets.token_hex(16)
        digest = hashlib.sha256(data).hexdigest()
        self._data[sid] = data
        return SnapshotHandle(adapter_id=ADAPTER_ID, doc={
            "id": sid, "sha256": digest, "size": len(data),
            "mac": self._mac(sid, digest, len(data))})

    def get(self, handle: object) -> bytes:
        """The archive for ``handle``, or InvalidSnapshotHandleError."""
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
        data = self._data.get(sid)
        if data is None:
            raise InvalidSnapshotHandleError("snapshot is stale: it was dropped")
        if hashlib.sha256(data).hexdigest() != digest:
            raise InvalidSnapshotHandleError("snapshot content does not match its handle")
        return data

    def drop(self, handle: SnapshotHandle) -> None:
        self._data.pop(str(handle.doc.get("id")), None)

    def clear(self) -> None:
        self._data.clear()
