"""``AsyncSession``: a strict sandbox holding a live Python interpreter whose globals
persist between cells (docs/sessions.md).

The interpreter is :mod:`corral.sessions.driver`, started in the sandbox with
``start_process``; it speaks JSON lines. Every byte from it is hostile to the host:
a line past :data:`MAX_FRAME_BYTES` ends the session, a frame of the wrong shape is
dropped, each cell's text output is capped (a note says what was cut), display items
are capped in number and size, and every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import itertools
import json
import sys
import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any, Final

from corral.core.contract import (
    ProcessHandle,
    Sandbox,
    SandboxProvider,
    restore as restore_sandbox,
    snapshot as snapshot_sandbox,
)
from corral.core.errors import (
    ConfigInvalidError,
    LimitsExceededError,
    SandboxTimeoutError,
    SessionEndedError,
)
from corral.core.files import FileInfo
from corral.core.result import Outcome
from corral.core.spec import (
    Level,
    NetworkPolicy,
    ProcessOpts,
    SandboxLimits,
    SandboxSpec,
    SnapshotHandle,
)
from corral.core.tasks import TaskSet, settle
from corral.sessions.result import CellError, CellResult, DisplayItem
from corral.snippets.host.sanitize import sanitize_stack

__all__ = ["DEFAULT_LIMITS", "MAX_FRAME_BYTES", "AsyncSession"]

#: the longest line the driver may send (a display bundle with a 4 MiB PNG fits)
MAX_FRAME_BYTES: Final = 8 * 1024 * 1024
#: the limits of a session that names none: the interpreter plus pandas and a plot fit
DEFAULT_LIMITS: Final = SandboxLimits(mem_mb=512, max_processes=64, disk_mb=256)
DRIVER_FILE: Final = ".corral-session-driver.py"
_MAX_DISPLAYS = 64
_MAX_DISPLAY_BYTES = 32 * 1024 * 1024
_MAX_MIME_KEY = 128
_START_TIMEOUT_S = 30.0

TextSink = Callable[[str], object]
DisplaySink = Callable[[DisplayItem], object]


def _driver_source() -> str:
    return resources.files("corral.sessions").joinpath("driver.py").read_text("utf-8")


class _Cell:
    """What one running cell has gathered so far."""

    def __init__(self, cid: int, max_output: int, on_stdout: TextSink | None,
                 on_stderr: TextSink | None, on_display: DisplaySink | None) -> None:
        self.cid = cid
        self.done = asyncio.Event()
        self.text: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.sinks: dict[str, TextSink | None] = {"stdout": on_stdout, "stderr": on_stderr}
        self.on_display = on_display
        self.left = max_output
        self.max_output = max_output
        self.truncated = False
        self.displays: list[DisplayItem] = []
        self.display_bytes = 0
        self.result: DisplayItem | None = None
        self.error: CellError | None = None
        self.notes: list[str] = []

    def stream(self, name: str, text: str) -> None:
        if self.truncated:
            return
        if len(text) > self.left:
            text = text[:self.left]
            self.truncated = True
        self.left -= len(text)
        if text:
            self.text[name].append(text)
            sink = self.sinks[name]
            if sink is not None:
                sink(text)
        if self.truncated:
            note = f"\n[corral: output past {self.max_output} characters was dropped]\n"
            self.text[name].append(note)
            self.notes.append(note.strip())

    def display(self, item: DisplayItem, size: int) -> None:
        if len(self.displays) >= _MAX_DISPLAYS or self.display_bytes + size > _MAX_DISPLAY_BYTES:
            if not any(n.startswith("display") for n in self.notes):
                self.notes.append(f"display outputs past {_MAX_DISPLAYS} items or "
                                  f"{_MAX_DISPLAY_BYTES} bytes were dropped")
            return
        self.display_bytes += size
        if item.kind == "result":
            self.result = item
        else:
            self.displays.append(item)
        if self.on_display is not None:
            self.on_display(item)


def _bundle(data: object) -> tuple[dict[str, Any], int] | None:
    """A display frame's data, checked: {mime: str | JSON}, and its size in bytes."""
    if not isinstance(data, dict):
        return None
    out: dict[str, Any] = {}
    size = 0
    for k, v in data.items():
        if not isinstance(k, str) or not k or len(k) > _MAX_MIME_KEY or "/" not in k:
            continue
        if not isinstance(v, str | dict | list):
            continue
        out[k] = v
        size += len(v) if isinstance(v, str) else len(json.dumps(v))
    return out, size


def _check_options(cell_timeout_s: object, interrupt_grace_s: object, idle_timeout_s: object,
                   max_lifetime_s: object, max_output_chars: object) -> None:
    for name, v in (("cell_timeout_s", cell_timeout_s),
                    ("interrupt_grace_s", interrupt_grace_s),
                    ("idle_timeout_s", idle_timeout_s), ("max_lifetime_s", max_lifetime_s)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ConfigInvalidError(name, f"must be a positive number, got {v!r}")
    if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) \
            or max_output_chars < 1:
        raise ConfigInvalidError("max_output_chars", "must be a positive integer")


class AsyncSession:
    """A live interpreter in a strict sandbox; ``await session.run(code)`` runs a cell.

    Make one with :meth:`create` (or ``async with AsyncSession.create(...)``... see
    :meth:`__aenter__`). Cells run one at a time (a second ``run`` waits its turn).

    Args (of :meth:`create`):
        provider: a provider you made (yours to close), a registry name, or ``None``
            (the host's strict provider, made here and closed with the session).
        environment: a built environment (its name or digest, docs/environments.md)
            to run in, as ``SandboxSpec.environment``: its packages import from the
            read-only ``/opt/corral/env`` (linux provider; the store is the provider's
            ``env_store_dir``, else ``$CORRAL_ENV_DIR``, else the default).
        limits: the sandbox's limits (default :data:`DEFAULT_LIMITS`); ``mem_mb`` is
            what a cell allocating past it ends the session with
            (``LimitsExceededError("memory")``).
        network: default ``none``.
        cell_timeout_s: a cell running longer gets SIGINT (``KeyboardInterrupt`` in the
            cell); the session lives on with its variables.
        interrupt_grace_s: how long an interrupted cell may take to stop; past it the
            session is ended (``SandboxTimeoutError``; then ``SessionEndedError``).
        idle_timeout_s / max_lifetime_s: the session ends after this long without a
            cell running, or this long after it started.
        max_output_chars: the stdout plus stderr a cell keeps (then a note).
        env: more environment variables for the interpreter.
        python: the interpreter inside the sandbox (default: this one's path, which the
            strict provider binds in).
    """

    def __init__(self, sandbox: Sandbox, process: ProcessHandle, *, owned: SandboxProvider | None,
                 cell_timeout_s: float, interrupt_grace_s: float, idle_timeout_s: float,
                 max_lifetime_s: float, max_output_chars: int) -> None:
        self.sandbox = sandbox
        self._proc = process
        self._owned = owned
        self.cell_timeout_s = cell_timeout_s
        self.interrupt_grace_s = interrupt_grace_s
        self.idle_timeout_s = idle_timeout_s
        self.max_lifetime_s = max_lifetime_s
        self.max_output_chars = max_output_chars
        self.started = time.monotonic()
        self.last_active = self.started
        self.pid = 0
        self.python = ""
        self.cells = 0
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._cell: _Cell | None = None
        self._ready = asyncio.Event()
        self._ended: BaseException | None = None
        self._killing = False
        self._buf = bytearray()
        # owned by the session: close() ends and awaits them (settle), and the interrupts
        # of cancelled cells (shielded from the cancellation)
        self._chores = TaskSet()
        self._tasks = [asyncio.ensure_future(self._read_stdout()),
                       asyncio.ensure_future(self._read_stderr()),
                       asyncio.ensure_future(self._watch())]

    # -- making one ------------------------------------------------------------------
    @classmethod
    async def create(cls, *, provider: SandboxProvider | str | None = None,
                     environment: str | None = None, limits: SandboxLimits | None = None,
                     network: NetworkPolicy | None = None,
                     tenant_id: str = "corral-session", cell_timeout_s: float = 30.0,
                     interrupt_grace_s: float = 3.0, idle_timeout_s: float = 900.0,
                     max_lifetime_s: float = 4 * 3600.0, max_output_chars: int = 1 << 20,
                     env: Mapping[str, str] | None = None, python: str | None = None
                     ) -> AsyncSession:
        _check_options(cell_timeout_s, interrupt_grace_s, idle_timeout_s, max_lifetime_s,
                       max_output_chars)
        owned: SandboxProvider | None = None
        if isinstance(provider, SandboxProvider):
            made = provider
        else:
            from corral.providers import provider as make_provider
            opts: dict[str, Any] = {"limits_by": "auto"} if provider in (None, "linux") else {}
            made = owned = make_provider(provider, level=Level.STRICT, **opts)
        try:
            spec = SandboxSpec(tenant_id=tenant_id, level=Level.STRICT,
                               limits=limits if limits is not None else DEFAULT_LIMITS,
                               network=network or NetworkPolicy.none(),
                               environment=environment)
            sandbox = await made.create(spec)
        except BaseException:
            if owned is not None:
                await owned.aclose()
            raise
        try:
            return await cls.attach(sandbox, owned=owned, cell_timeout_s=cell_timeout_s,
                                    interrupt_grace_s=interrupt_grace_s,
                                    idle_timeout_s=idle_timeout_s, max_lifetime_s=max_lifetime_s,
                                    max_output_chars=max_output_chars, env=env, python=python)
        except BaseException:
            if owned is not None:
                await owned.aclose()
            raise

    @classmethod
    async def attach(cls, sandbox: Sandbox, *, owned: SandboxProvider | None = None,
                     cell_timeout_s: float = 30.0, interrupt_grace_s: float = 3.0,
                     idle_timeout_s: float = 900.0, max_lifetime_s: float = 4 * 3600.0,
                     max_output_chars: int = 1 << 20, env: Mapping[str, str] | None = None,
                     python: str | None = None) -> AsyncSession:
        """A session in ``sandbox`` (made by the caller, e.g. a server that counts it
        against a tenant's caps): the interpreter is started there. The session owns the
        sandbox from now on: closing the session destroys it, and so does a failure here."""
        try:
            await sandbox.write_file(DRIVER_FILE, _driver_source())
            penv = {"LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
                    "MPLCONFIGDIR": "/tmp/.corral-matplotlib", "HOME": "/work",
                    "PATH": "/usr/local/bin:/usr/bin:/bin"}
            penv.update(env or {})
            argv = [python or sys.executable, "-S", "-B", DRIVER_FILE]
            proc = await sandbox.start_process(argv, ProcessOpts(stdin=True, env=penv))
        except BaseException:
            await sandbox.destroy()
            raise
        self = cls(sandbox, proc, owned=owned, cell_timeout_s=float(cell_timeout_s),
                   interrupt_grace_s=float(interrupt_grace_s),
                   idle_timeout_s=float(idle_timeout_s),
                   max_lifetime_s=float(max_lifetime_s), max_output_chars=max_output_chars)
        try:
            await asyncio.wait_for(self._ready.wait(), _START_TIMEOUT_S)
            if self._ended is not None:
                raise self._ended
        except BaseException as exc:
            self._owned = None  # the caller closes it (create's rollback)
            await self.close()
            if isinstance(exc, TimeoutError):
                raise SessionEndedError("the session's interpreter did not start within "
                                        f"{_START_TIMEOUT_S:g} s", reason="exited") from None
            raise
        return self

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- state -----------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.sandbox.id

    @property
    def alive(self) -> bool:
        return self._ended is None

    @property
    def ended(self) -> BaseException | None:
        """Why the session ended (the error a ``run`` raises now), or ``None``."""
        return self._ended

    def _check(self) -> None:
        if self._ended is not None:
            raise self._ended

    # -- cells -----------------------------------------------------------------------
    async def run(self, code: str, *, timeout_s: float | None = None,
                  on_stdout: TextSink | None = None, on_stderr: TextSink | None = None,
                  on_display: DisplaySink | None = None) -> CellResult:
        """Run ``code`` as the next cell and return its outputs.

        The cell's exception (``KeyboardInterrupt`` when it passed its timeout and was
        interrupted) is in ``result.error``; the session lives on. Output and display
        items reach the callbacks as they arrive.

        Raises:
            LimitsExceededError: (``limit="memory"``) the cell took the session past its
                memory limit; the session has ended.
            SandboxTimeoutError: the cell ignored its interrupt for the grace period;
                the session has ended.
            SessionEndedError: the session had ended (closed, idle, past its lifetime,
                its interpreter exited).
        """
        if not isinstance(code, str):
            raise ConfigInvalidError("code", "must be a string")
        timeout = self.cell_timeout_s if timeout_s is None else timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigInvalidError("timeout_s", "must be a positive number")
        self._check()
        async with self._lock:
            self._check()
            cid = next(self._ids)
            cell = _Cell(cid, self.max_output_chars, on_stdout, on_stderr, on_display)
            self._cell = cell
            t0 = time.monotonic()
            self.last_active = t0
            timed_out = False
            try:
                frame = json.dumps({"op": "run", "id": cid, "code": code}).encode() + b"\n"
                await self._write(frame)
                try:
                    await asyncio.wait_for(cell.done.wait(), timeout)
                except TimeoutError:
                    timed_out = True
                    await self._interrupt(cell)
            except asyncio.CancelledError:
                with contextlib.suppress(BaseException):  # finished even if cancelled again
                    await asyncio.shield(self._chores.spawn(self._interrupt(cell)))
                raise
            finally:
                self._cell = None
                self.last_active = time.monotonic()
            self.cells += 1
            if self._ended is not None:
                raise self._ended
            return CellResult(
                cell=cid, stdout="".join(cell.text["stdout"]),
                stderr="".join(cell.text["stderr"]), result=cell.result,
                displays=tuple(cell.displays), error=cell.error, timed_out=timed_out,
                truncated=cell.truncated, duration_ms=(time.monotonic() - t0) * 1000,
                notes=tuple(cell.notes))

    async def _write(self, frame: bytes) -> None:
        try:
            await self._proc.stdin.write(frame)
        except Exception:  # the interpreter is gone: its reader says why
            await asyncio.sleep(0)
            self._check()
            raise

    async def _interrupt(self, cell: _Cell) -> None:
        """SIGINT for the cell (the driver sends it to its main thread); past the grace
        period, the session ends."""
        if cell.done.is_set():
            return
        with contextlib.suppress(Exception):
            await self._proc.stdin.write(
                json.dumps({"op": "interrupt", "id": cell.cid}).encode() + b"\n")
        try:
            await asyncio.wait_for(cell.done.wait(), self.interrupt_grace_s)
        except TimeoutError:
            await self._end(SandboxTimeoutError(
                f"cell {cell.cid} passed its timeout and ignored the interrupt for "
                f"{self.interrupt_grace_s:g} s; the session was ended",
                timeout_ms=int(self.cell_timeout_s * 1000)))

    # -- reading the driver ----------------------------------------------------------
    async def _read_stdout(self) -> None:
        try:
            async for chunk in self._proc.stdout:
                self._buf += chunk
                start = 0
                while (nl := self._buf.find(b"\n", start)) >= 0:
                    self._frame(bytes(self._buf[start:nl]))
                    start = nl + 1
                del self._buf[:start]
                if len(self._buf) > MAX_FRAME_BYTES:
                    await self._end(SessionEndedError(
                        f"the session's interpreter sent a line past {MAX_FRAME_BYTES} bytes; "
                        "the session was ended", reason="protocol"))
                    return
        except Exception:  # the end below says what happened
            pass
        await self._exited()

    async def _read_stderr(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        with contextlib.suppress(Exception):
            async for chunk in self._proc.stderr:
                text = decoder.decode(chunk[:1 << 20])
                cell = self._cell
                if cell is not None and text:
                    cell.stream("stderr", text)

    def _frame(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return
        if not isinstance(msg, dict):
            return
        kind = msg.get("t")
        if kind == "ready":
            pid, py = msg.get("pid"), msg.get("python")
            self.pid = pid if isinstance(pid, int) else 0
            self.python = py[:32] if isinstance(py, str) else ""
            self._ready.set()
            return
        cell = self._cell
        if cell is None or msg.get("id") != cell.cid:
            return
        if kind == "stream":
            name, text = msg.get("name"), msg.get("text")
            if name in ("stdout", "stderr") and isinstance(text, str):
                cell.stream(name, text)
        elif kind in ("display", "result"):
            got = _bundle(msg.get("data"))
            if got is not None and got[0]:
                cell.display(DisplayItem("result" if kind == "result" else "display",
                                         got[0]), got[1])
        elif kind == "error":
            ename, evalue, tb = msg.get("ename"), msg.get("evalue"), msg.get("traceback")
            cell.error = CellError(
                name=ename[:200] if isinstance(ename, str) else "Error",
                value=sanitize_stack(evalue[:65536]) if isinstance(evalue, str) else "",
                traceback=sanitize_stack(tb[:262144]) if isinstance(tb, str) else "")
        elif kind == "done":
            cell.done.set()

    async def _exited(self) -> None:
        """The driver's stdout ended: say why the session ended, wake a waiting cell."""
        if self._ended is None:
            err: BaseException
            code: int | None = None
            oom = False
            with contextlib.suppress(Exception):
                res = await asyncio.wait_for(self._proc.wait(), 10)
                code, oom = res.exit_code, res.outcome is Outcome.MEMORY_LIMIT
            if not self._killing and self._ended is None:
                mem = self.sandbox.spec.limits.mem_mb
                # the provider's word (the cgroup's OOM-kill count), never a guess from
                # the status: a cell that SIGKILLs its own interpreter is an exit
                if oom and mem is not None:
                    err = LimitsExceededError(
                        "memory", mem, detail="the session's interpreter was killed at the "
                        "sandbox's memory limit (SIGKILL by the kernel's OOM killer); the "
                        "session has ended")
                else:
                    err = SessionEndedError(f"the session's interpreter exited (status "
                                            f"{code}); the session has ended", reason="exited")
                self._ended = err
        self._ready.set()
        if self._cell is not None:
            self._cell.done.set()
        self._stop_watch()

    def _stop_watch(self) -> None:
        watch = self._tasks[2]
        if watch is not asyncio.current_task():
            watch.cancel()

    async def _watch(self) -> None:
        """End the session at its idle timeout or maximum lifetime."""
        while self._ended is None:
            now = time.monotonic()
            idle_at = self.last_active + self.idle_timeout_s
            life_at = self.started + self.max_lifetime_s
            if now >= life_at:
                await self._end(SessionEndedError(
                    f"the session reached its maximum lifetime ({self.max_lifetime_s:g} s)",
                    reason="max-lifetime"))
                return
            if now >= idle_at and self._cell is None:
                await self._end(SessionEndedError(
                    f"the session was idle for {self.idle_timeout_s:g} s", reason="idle-timeout"))
                return
            await asyncio.sleep(max(0.05, min(idle_at, life_at) - now))

    # -- files -----------------------------------------------------------------------
    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a file of the session's work dir (its cells' cwd)."""
        self._check()
        await self.sandbox.write_file(path, data)

    async def read_file(self, path: str) -> bytes:
        self._check()
        return await self.sandbox.read_file(path)

    async def list_files(self, path: str = "") -> list[FileInfo]:
        self._check()
        return await self.sandbox.list_files(path)

    # -- snapshots -------------------------------------------------------------------
    async def snapshot(self) -> SnapshotHandle:
        """The session's files (its work dir), where the provider takes snapshots
        (``SnapshotNotSupportedError`` otherwise). The interpreter's variables are not
        in it: they live in a process's memory, which no provider here captures."""
        self._check()
        return await snapshot_sandbox(self.sandbox)

    async def restore(self, handle: SnapshotHandle) -> None:
        """Put a snapshot's files back into the work dir; the variables stay as they are."""
        self._check()
        await restore_sandbox(self.sandbox, handle)

    # -- ending ----------------------------------------------------------------------
    async def _end(self, err: BaseException) -> None:
        if self._ended is None:
            self._ended = err
        self._killing = True
        with contextlib.suppress(Exception):
            await self._proc.kill()
        with contextlib.suppress(Exception):
            await self.sandbox.destroy()
        if self._cell is not None:
            self._cell.done.set()
        self._stop_watch()

    async def close(self) -> None:
        """End the session: kill the interpreter, destroy the sandbox (and close a
        provider it made). Idempotent."""
        await self._end(SessionEndedError("the session was closed", reason="closed"))
        me = asyncio.current_task()
        try:
            # ended and awaited; a cancellation of this close still propagates
            await settle(t for t in self._tasks if t is not me)
            await self._chores.aclose()
        finally:
            if self._owned is not None:
                owned, self._owned = self._owned, None
                await owned.aclose()

    def __repr__(self) -> str:
        state = "alive" if self._ended is None else f"ended ({type(self._ended).__name__})"
        return f"<AsyncSession {self.id} cells={self.cells} {state}>"

