"""What the host-dir providers (``inprocess``, ``subproc``) share.

Their sandbox is a private host directory (``mkdtemp``, mode 0700) holding
``work/`` (the commands' cwd and ``HOME``, where the file methods act) and
``tmp/`` (``TMPDIR``), plus the child processes each provider runs in it its
own way. This module makes and removes that directory and gives the sandbox
its id, liveness check, cwd resolution and confined file access; the
providers keep their own exec, processes, env and destroy.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from corral.core.cancel import CancelToken
from corral.core.contract import Sandbox
from corral.core.errors import ConfigInvalidError, CreateCancelledError, ProviderError
from corral.core.files import FileInfo
from corral.core.spec import SandboxSpec
from corral.images.hostdir import copy_image_dir
from corral.providers.confined import (
    EntryTuple,
    list_dir_under,
    make_dir_under,
    read_file_under,
    remove_under,
    split_relative,
    stat_under,
    write_file_under,
)
from corral.runner.tree import remove_tree

T = TypeVar("T")

__all__ = ["HostDirSandbox", "make_sandbox_dir", "remove_sandbox_dir"]


def _check_cancel(cancel: CancelToken | None) -> None:
    if cancel is not None and cancel.cancelled:
        raise CreateCancelledError(f"create cancelled: {cancel.reason}")


async def make_sandbox_dir(*, prefix: str, temp_dir: str | None, image: str | None,
                           max_image_bytes: int, cancel: CancelToken | None) -> str:
    """A fresh private dir with ``work/`` (holding a copy of ``image``, if any) and
    ``tmp/``; removed again if anything fails or ``cancel`` fires meanwhile."""
    _check_cancel(cancel)
    base = tempfile.mkdtemp(prefix=prefix, dir=temp_dir)  # mode 0700
    try:
        os.mkdir(os.path.join(base, "work"), 0o700)
        os.mkdir(os.path.join(base, "tmp"), 0o700)
        if image is not None:
            await asyncio.to_thread(copy_image_dir, image, os.path.join(base, "work"),
                                    max_bytes=max_image_bytes)
        _check_cancel(cancel)
    except BaseException:
        remove_tree(base)
        raise
    return base


async def remove_sandbox_dir(base: str) -> None:
    """Remove a sandbox dir, also where the code in it took write permission away."""
    await asyncio.to_thread(remove_tree, base)


class HostDirSandbox(Sandbox):
    """A sandbox whose files live in a private host dir (see the module docstring)."""

    def __init__(self, spec: SandboxSpec, base: str, *, provider_name: str) -> None:
        self.id = f"{provider_name}-{uuid.uuid4().hex}"
        self.spec = spec
        self.base = base
        self.work_dir = os.path.join(base, "work")
        self.tmp_dir = os.path.join(base, "tmp")
        self._destroyed = False

    def _alive(self, what: str) -> None:
        if self._destroyed:
            raise ProviderError(f"{what}: sandbox {self.id} was destroyed")

    def _cwd(self, cwd: str | None) -> str:
        """``cwd`` (relative to, or under, the work dir) as a real dir inside it."""
        if cwd is None:
            return self.work_dir
        try:
            parts = split_relative(cwd, root_alias=self.work_dir)
        except ConfigInvalidError as e:
            raise ConfigInvalidError("cwd", e.reason) from None
        real = os.path.realpath(os.path.join(self.work_dir, *parts))
        if not real.startswith(os.path.realpath(self.work_dir) + os.sep) or not os.path.isdir(real):
            raise ConfigInvalidError("cwd", f"not a directory inside the sandbox: {cwd!r}")
        return real

    async def write_file(self, path: str, data: bytes | str) -> None:
        self._alive("write_file")
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await asyncio.to_thread(write_file_under, self.work_dir, path, raw,
                                root_alias=self.work_dir)

    async def read_file(self, path: str) -> bytes:
        self._alive("read_file")
        return await asyncio.to_thread(read_file_under, self.work_dir, path,
                                       root_alias=self.work_dir)

    # -- the file operations (capability "files"), confined as read/write are ----------
    def _info(self, e: EntryTuple, parts: list[str]) -> FileInfo:
        name, kind, size, mode, mtime, target = e
        return FileInfo(name=name, path="/".join([self.work_dir, *parts]),
                        type=kind,  # type: ignore[arg-type]
                        size=size, mode=mode, modified=mtime, symlink_target=target)

    async def _fs(self, path: str, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """``fn(*args, **kw)`` in a thread; an OSError names the sandbox ``path``."""
        try:
            return await asyncio.to_thread(fn, *args, **kw)
        except OSError as e:
            raise OSError(e.errno, e.strerror, path) from None

    async def list_files(self, path: str = "") -> list[FileInfo]:
        self._alive("list_files")
        parts = split_relative(path, root_alias=self.work_dir, allow_root=True)
        entries = await self._fs(path, list_dir_under, self.work_dir, "/".join(parts))
        return [self._info(e, [*parts, e[0]]) for e in entries]

    async def get_info(self, path: str) -> FileInfo:
        self._alive("get_info")
        parts = split_relative(path, root_alias=self.work_dir, allow_root=True)
        return self._info(await self._fs(path, stat_under, self.work_dir, "/".join(parts)),
                          parts)

    async def make_dir(self, path: str, *, parents: bool = True) -> bool:
        self._alive("make_dir")
        return await self._fs(path, make_dir_under, self.work_dir, path, parents=parents,
                              root_alias=self.work_dir)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        self._alive("remove")
        await self._fs(path, remove_under, self.work_dir, path, recursive=recursive,
                       root_alias=self.work_dir)
