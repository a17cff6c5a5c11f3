"""``Session``: the synchronous twin of :class:`~corral.sessions.session.AsyncSession`.

Every call runs on corral's process-wide event loop (:mod:`corral.core.sync`); output
callbacks run on its ``corral-sync`` thread. Leaving the ``with`` block closes the
session.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import Any

from corral.core.files import FileInfo
from corral.core.spec import SnapshotHandle
from corral.core.sync import background_loop, run_sync
from corral.sessions.result import CellResult
from corral.sessions.session import AsyncSession, DisplaySink, TextSink

__all__ = ["Session"]


class Session:
    """A live interpreter in a strict sandbox, from sync code::

        with Session(limits=SandboxLimits(mem_mb=256)) as s:
            s.write_file("data.csv", "a,b\\n1,2\\n")
            s.run("import csv; rows = list(csv.reader(open('data.csv')))")
            print(s.run("rows").result.text())

    The keyword arguments are :meth:`AsyncSession.create`'s.
    """

    def __init__(self, **options: Any) -> None:
        self._inner = run_sync(AsyncSession.create(**options))
        # a session dropped without close() is closed on the loop (not waited for)
        self._fin = weakref.finalize(self, _release, self._inner)
        self._fin.atexit = False

    @property
    def inner(self) -> AsyncSession:
        return self._inner

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def alive(self) -> bool:
        return self._inner.alive

    def run(self, code: str, *, timeout_s: float | None = None,
            on_stdout: TextSink | None = None, on_stderr: TextSink | None = None,
            on_display: DisplaySink | None = None) -> CellResult:
        """:meth:`AsyncSession.run` (the callbacks run on the corral-sync thread)."""
        return run_sync(self._inner.run(code, timeout_s=timeout_s, on_stdout=on_stdout,
                                        on_stderr=on_stderr, on_display=on_display))

    def write_file(self, path: str, data: bytes | str) -> None:
        run_sync(self._inner.write_file(path, data))

    def read_file(self, path: str) -> bytes:
        return run_sync(self._inner.read_file(path))

    def list_files(self, path: str = "") -> list[FileInfo]:
        return run_sync(self._inner.list_files(path))

    def snapshot(self) -> SnapshotHandle:
        return run_sync(self._inner.snapshot())

    def restore(self, handle: SnapshotHandle) -> None:
        run_sync(self._inner.restore(handle))

    def close(self) -> None:
        self._fin.detach()
        run_sync(self._inner.close())

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._inner).replace("AsyncSession", "Session", 1)


def _release(inner: AsyncSession) -> None:
    """The finalizer of a collected :class:`Session`: close it on the loop, unawaited."""
    with contextlib.suppress(BaseException):
        asyncio.run_coroutine_threadsafe(inner.close(), background_loop())
