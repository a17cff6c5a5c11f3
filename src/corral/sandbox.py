"""A synchronous sandbox, for code that is not async: ``corral.sandbox.Sandbox``.

The shape E2B's sync SDK made familiar, on top of the async provider contract::

    from corral.sandbox import Sandbox

    with Sandbox.create() as sb:                      # strict, where the host gives it
        sb.files.write("data.txt", "a\\nb\\n")
        r = sb.commands.run("wc -l < data.txt")      # a string runs through /bin/sh -c
        print(r.stdout_text, r.outcome, r.level)
        r = sb.commands.run(["ls", "-la"])           # a list is argv (a name is looked
                                                     # up on the sandbox's PATH)
        p = sb.commands.run("sleep 5; echo done", background=True)
        p.wait()

    # a sandbox of a ``corral serve`` server, found again by its id
    ids = [s.id for s in Sandbox.list(url=URL, token=TOKEN)]
    with Sandbox.connect(ids[0], url=URL, token=TOKEN) as sb:
        sb.commands.run("ls")

How a command ended is its :class:`~corral.core.result.RunResult`, whatever the outcome
(``exit``, ``timeout``, a limit): the rule of every front door (docs/errors.md). Call
``result.check()`` to raise the outcome's error instead. A call that could not run at
all (a bad argument, a destroyed sandbox) raises.

Every call runs on corral's process-wide event loop (:mod:`corral.core.sync`), in its
``corral-sync`` thread. Nothing is left behind: leaving the ``with`` block (or
:meth:`Sandbox.kill`) destroys the sandbox; so does Ctrl-C in a call (the run is
cancelled and cleaned up first), the object being garbage-collected, and the
interpreter's exit. A provider this module made for :meth:`Sandbox.create` is shared by
the sandboxes made the same way and closed at exit; one passed in is the caller's.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from corral.core.contract import (
    ProcessHandle,
    Sandbox as AsyncSandbox,
    SandboxProvider,
    SupportsPause,
)
from corral.core.errors import ConfigInvalidError, CorralError, PauseNotSupportedError
from corral.core.filewalk import MAX_LIST_ENTRIES, list_tree
from corral.core.result import Outcome, RunResult
from corral.core.spec import (
    ExecOpts,
    Level,
    NetworkPolicy,
    ProcessOpts,
    SandboxLimits,
    SandboxSpec,
)
from corral.core.sync import background_loop, run_sync

__all__ = ["CommandHandle", "Commands", "Files", "Sandbox", "SandboxInfo", "shell_argv"]

#: the shell a command given as one string runs through (``/bin/sh -c CMD``)
SHELL: Final = "/bin/sh"
#: a background command's output kept for :attr:`CommandHandle.stdout` (the rest is
#: dropped, and said: ``stdout_truncated``)
BACKGROUND_OUTPUT_CAP: Final = 1 << 20

OutputCallback = Callable[[str], object]


def shell_argv(cmd: str | Sequence[str]) -> list[str]:
    """The argv a command names: a string is one shell command line (``/bin/sh -c
    cmd``: pipes, redirections, ``&&``), a sequence is argv itself."""
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ConfigInvalidError("cmd", "an empty command")
        return [SHELL, "-c", cmd]
    argv = list(cmd)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigInvalidError("argv", "a non-empty list of strings")
    return argv


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """A live sandbox of a ``corral serve`` server, as :meth:`Sandbox.list` gives it."""

    id: str
    level: str
    info: Mapping[str, Any]


# -- the providers this module made ---------------------------------------------------
_lock = threading.Lock()
_shared: dict[str, SandboxProvider] = {}
#: every sync sandbox alive (destroyed at exit); weak, so garbage collection still works
_alive: weakref.WeakSet[Sandbox] = weakref.WeakSet()


def _shared_provider(name: str | None, level: Level, options: Mapping[str, Any]
                     ) -> SandboxProvider:
    from corral.providers import provider
    key = repr((name, level.value, sorted(options.items(), key=lambda kv: kv[0])))
    with _lock:
        made = _shared.get(key)
        if made is None:
            opts = dict(options)
            if name in (None, "linux"):
                opts.setdefault("limits_by", "auto")  # cgroups where this user has them
            if name == "remote":  # asks the server at once (blocking): not on the loop
                made = provider(name, level=level, **opts)
            else:  # made on the loop it will be used on (some bind state to it)
                made = run_sync(_make(lambda: provider(name, level=level, **opts)))
            _shared[key] = made
        return made


async def _make(fn: Callable[[], SandboxProvider]) -> SandboxProvider:
    """Make a provider on the loop it will be used on (some bind state to it)."""
    return fn()


def _shutdown() -> None:
    """At exit: destroy every sync sandbox still alive, then close the shared providers."""
    for sb in list(_alive):
        with contextlib.suppress(BaseException):
            sb._finish()
    with _lock:
        providers = list(_shared.values())
        _shared.clear()
    for p in providers:
        with contextlib.suppress(BaseException):
            run_sync(p.aclose())


def _register_shutdown() -> None:
    """Run :func:`_shutdown` at exit while threads can still be started: destroying a
    sandbox hands work to the loop's thread pool, which refuses new work once the
    interpreter's thread shutdown has begun (before ``atexit`` callbacks run). The
    threading module's own exit hooks run first, newest first: registered after the
    thread pool's, ours runs before it closes."""
    import concurrent.futures.thread  # noqa: F401 - registers the pool's hook first
    hook = getattr(threading, "_register_atexit", None)
    if hook is None:  # pragma: no cover - CPython has it since 3.9
        atexit.register(_shutdown)
    else:
        hook(_shutdown)


_register_shutdown()


async def _end(inner: AsyncSandbox, destroy: bool, owned: SandboxProvider | None) -> None:
    """Destroy the sandbox (unless detached), then close the provider it owned."""
    try:
        if destroy:
            await inner.destroy()
    finally:
        if owned is not None:
            await owned.aclose()


def _release(inner: AsyncSandbox, destroy: bool, owned: SandboxProvider | None) -> None:
    """The finalizer of a collected :class:`Sandbox`: :func:`_end` on the loop, without
    waiting (it may run in any thread)."""
    with contextlib.suppress(BaseException):
        asyncio.run_coroutine_threadsafe(_end(inner, destroy, owned), background_loop())


# -- commands -------------------------------------------------------------------------
class CommandHandle:
    """A command started with ``commands.run(..., background=True)``: its output is read
    as it comes (``on_stdout`` / ``on_stderr`` get each piece as text, and the first
    MiB of each stream is kept); :meth:`wait` gives how it ended."""

    def __init__(self, handle: ProcessHandle, on_stdout: OutputCallback | None,
                 on_stderr: OutputCallback | None, level: Level) -> None:
        import codecs
        self._h = handle
        self._level = level
        self._out, self._err = bytearray(), bytearray()
        self._cut = [False, False]
        self._dec = [codecs.getincrementaldecoder("utf-8")("replace") for _ in range(2)]
        self._cb = (on_stdout, on_stderr)
        loop = background_loop()
        self._readers = asyncio.run_coroutine_threadsafe(self._read_all(), loop)

    async def _read_all(self) -> None:
        await asyncio.gather(self._read(0, self._h.stdout, self._out),
                             self._read(1, self._h.stderr, self._err))

    async def _read(self, i: int, it: Any, buf: bytearray) -> None:
        async for chunk in it:
            room = BACKGROUND_OUTPUT_CAP - len(buf)
            if len(chunk) > room:
                self._cut[i] = True
            buf += chunk[:max(room, 0)]
            cb = self._cb[i]
            if cb is not None:
                text = self._dec[i].decode(chunk)
                if text:
                    with contextlib.suppress(Exception):
                        cb(text)

    @property
    def stdout(self) -> str:
        """What the command wrote to stdout so far (its first MiB), as text."""
        return bytes(self._out).decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return bytes(self._err).decode("utf-8", "replace")

    def wait(self, timeout_s: float | None = None) -> RunResult:
        """Wait for the command to end: how it ended, with the output read (the first
        MiB of each stream). ``timeout_s`` bounds the wait only (``TimeoutError``)."""
        async def go() -> RunResult:
            async with asyncio.timeout(timeout_s):
                result = await self._h.wait()
                await asyncio.wrap_future(self._readers)
            return result
        r = run_sync(go()).at_level(self._level)
        if r.stdout or r.stderr:
            return r
        import dataclasses
        return dataclasses.replace(
            r, stdout=bytes(self._out), stderr=bytes(self._err),
            stdout_truncated=r.stdout_truncated or self._cut[0],
            stderr_truncated=r.stderr_truncated or self._cut[1])

    def send_stdin(self, data: str | bytes) -> None:
        run_sync(self._h.stdin.write(data.encode() if isinstance(data, str) else data))

    def close_stdin(self) -> None:
        run_sync(self._h.stdin.close())

    def kill(self) -> None:
        """Kill the command and what it started."""
        run_sync(self._h.kill())


class Commands:
    """``sandbox.commands``: run commands in the sandbox."""

    def __init__(self, owner: Sandbox) -> None:
        self._sb = owner

    def run(self, cmd: str | Sequence[str], *, background: bool = False,
            timeout_ms: int | None = 60_000, cwd: str | None = None,
            envs: Mapping[str, str] | None = None, stdin: str | bytes | None = None,
            on_stdout: OutputCallback | None = None,
            on_stderr: OutputCallback | None = None,
            max_output_bytes: int | None = None) -> Any:
        """Run ``cmd`` in the sandbox: a string through ``/bin/sh -c`` (pipes and
        redirections work), a list as argv.

        Returns how it ended, a :class:`RunResult` whatever the outcome (``timeout``
        and limits included: ``result.check()`` raises them), with ``level`` set; or,
        with ``background=True``, a :class:`CommandHandle` at once.

        Args:
            timeout_ms: wall clock (default 60 s; ``None``: the provider's own).
            cwd: working directory, relative to the sandbox's work dir.
            envs: the command's environment (an allowlist over a minimal base).
            stdin: bytes or text given on stdin (a background command keeps stdin open
                for :meth:`CommandHandle.send_stdin` instead).
            on_stdout / on_stderr: each piece of output as text, as it arrives (a
                background command's always; otherwise where the provider streams).
            max_output_bytes: cap of stdout and of stderr (default: the provider's).

        Raises:
            ConfigInvalidError: a bad argument; ProviderError: the sandbox is gone.
        """
        argv = shell_argv(cmd)
        sb = self._sb._live()
        if background:
            popts = ProcessOpts(stdin=True, env=envs, cwd=cwd, timeout_ms=timeout_ms)
            handle = run_sync(sb.start_process(argv, popts))
            return CommandHandle(handle, on_stdout, on_stderr, sb.spec.level)
        running = self._sb._running
        if timeout_ms is not None and not running.wait(timeout_ms / 1000):
            # paused for the command's whole timeout: it never started (as corral serve)
            return RunResult(outcome=Outcome.TIMEOUT, limit_value=timeout_ms,
                             detail=f"the sandbox stayed paused for the command's whole "
                             f"timeout ({timeout_ms} ms): it never started",
                             level=sb.spec.level.value)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        opts = ExecOpts(timeout_ms=timeout_ms, cwd=cwd, env=envs, stdin=data,
                        max_stdout_bytes=max_output_bytes, max_stderr_bytes=max_output_bytes)
        return self._sb._stamp(run_sync(_exec(sb, argv, opts, on_stdout, on_stderr)))


async def _exec(sb: AsyncSandbox, argv: list[str], opts: ExecOpts,
                on_stdout: OutputCallback | None, on_stderr: OutputCallback | None
                ) -> RunResult:
    """exec, streamed where the sandbox can and a callback asks; an outcome other than
    ``exit`` is returned as its result (the contract's exec raises it)."""
    from corral.core.contract import SupportsStreamingExec
    try:
        if (on_stdout or on_stderr) and isinstance(sb, SupportsStreamingExec):
            import codecs
            decs = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in (1, 2)}

            def sink(fd: int, chunk: bytes) -> None:
                cb = on_stdout if fd == 1 else on_stderr
                text = decs[fd].decode(chunk) if fd in decs else ""
                if cb is not None and text:
                    with contextlib.suppress(Exception):
                        cb(text)
            return await sb.exec_streaming(argv, opts, on_output=sink)
        result = await sb.exec(argv, opts)
    except CorralError as err:
        if err.result is None:
            raise
        return err.result
    for cb, data in ((on_stdout, result.stdout), (on_stderr, result.stderr)):
        if cb is not None and data:
            with contextlib.suppress(Exception):
                cb(data.decode("utf-8", "replace"))
    return result


class Files:
    """``sandbox.files``: files of the sandbox, by paths relative to its work dir."""

    def __init__(self, owner: Sandbox) -> None:
        self._sb = owner

    def write(self, path: str, data: str | bytes) -> None:
        """Create or replace the file (parents are created)."""
        run_sync(self._sb._live().write_file(path, data))

    def read(self, path: str, format: str = "text") -> Any:  # noqa: A002 - E2B's name
        """The file's content: text (``format="text"``, UTF-8) or ``bytes``
        (``format="bytes"``). ``FileNotFoundError`` when there is none."""
        if format not in ("text", "bytes"):
            raise ConfigInvalidError("format", "'text' or 'bytes'")
        data = run_sync(self._sb._live().read_file(path))
        return data if format == "bytes" else data.decode("utf-8", "replace")

    def _op(self, name: str, *args: Any, **kw: Any) -> Any:
        """The provider contract's file operation ``name`` (the ``files`` capability,
        issue 27 item 4: ``list_files``, ``get_info``, ``exists``, ``make_dir``,
        ``remove``), run to its end; a sandbox without it raises ``ProviderError``."""
        sb = self._sb._live()
        fn = getattr(sb, name, None)
        if fn is None:
            from corral.core.errors import ProviderError
            raise ProviderError(f"{name}: {type(sb).__name__} has no file operations "
                                "(capability 'files')")
        return run_sync(fn(*args, **kw))

    def list(self, path: str = "", depth: int = 1, *,
             max_entries: int = MAX_LIST_ENTRIES) -> Any:
        """The entries under a directory (default the work dir) down to ``depth`` levels
        (1: its own entries), sorted by path: ``FileInfo`` values (E2B: ``files.list``).
        A symlink is an entry, never walked into. More than ``max_entries`` (at most
        10 000) raises ``ConfigInvalidError`` naming ``max_entries``: list a deeper path
        or ask a smaller depth."""
        entries, cut = run_sync(list_tree(self._sb._live(), path, depth, max_entries))
        if cut:
            raise ConfigInvalidError("max_entries", f"more than {max_entries} entries "
                                     f"under {path or '.'!r} at depth {depth}; list a "
                                     "deeper path or ask a smaller depth")
        return entries

    def get_info(self, path: str) -> Any:
        """What is at ``path`` (a ``FileInfo``); ``FileNotFoundError`` if nothing."""
        return self._op("get_info", path)

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path``."""
        return bool(self._op("exists", path))

    def make_dir(self, path: str, *, parents: bool = True) -> bool:
        """Make the directory (and its missing parents); False if one was there."""
        return bool(self._op("make_dir", path, parents=parents))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove the file, symlink or directory (a directory that is not empty needs
        ``recursive``)."""
        self._op("remove", path, recursive=recursive)


# -- the sandbox ----------------------------------------------------------------------
class Sandbox:
    """One sandbox, driven from sync code. Make it with :meth:`create` (or
    :meth:`connect` to a remote one); use it as a context manager."""

    def __init__(self, inner: AsyncSandbox, *, owned_provider: SandboxProvider | None = None,
                 destroy_on_gc: bool = True) -> None:
        self._inner: AsyncSandbox | None = inner
        self.id: str = inner.id
        self.spec: SandboxSpec = inner.spec
        self.commands = Commands(self)
        self.files = Files(self)
        self._owned = owned_provider
        #: set unless paused: a command waits for the resume within its timeout
        self._running = threading.Event()
        self._running.set()
        self._fin = weakref.finalize(self, _release, inner, destroy_on_gc, owned_provider)
        self._fin.atexit = False  # _shutdown destroys (and waits) at exit
        _alive.add(self)

    # -- making one -----------------------------------------------------------------
    @classmethod
    def create(cls, *, level: Level | str = Level.STRICT,
               provider: SandboxProvider | str | None = None,
               limits: SandboxLimits | None = None,
               network: NetworkPolicy | None = None,
               url: str | None = None, token: str | None = None,
               tenant_id: str = "corral-sync", **provider_options: Any) -> Sandbox:
        """A new sandbox at ``level`` (default strict). ``network``: default none at
        strict; below it the host's network, which those levels share by definition.

        ``provider``: a provider you made (yours to close), or a registry name; default
        the one that gives ``level`` here, or the remote provider when ``url`` and
        ``token`` name a ``corral serve`` server. ``provider_options`` go to a provider
        made here (shared with other sandboxes made with the same, closed at exit).

        Raises:
            LevelNotSupportedError: no provider gives ``level`` here (never weaker).
            ConfigInvalidError: a bad argument.
        """
        try:
            lv = Level(level)
        except ValueError:
            raise ConfigInvalidError("level", f"unknown level {level!r}") from None
        if url is not None or token is not None:
            if provider not in (None, "remote"):
                raise ConfigInvalidError("provider", "url and token name the remote provider")
            provider = "remote"
            provider_options = {**provider_options, "url": url, "token": token}
        if isinstance(provider, SandboxProvider):
            made = provider
        else:
            made = _shared_provider(provider, lv, provider_options)
        if network is None:  # below strict the host's network is shared by definition
            network = NetworkPolicy() if lv is Level.STRICT else NetworkPolicy.unrestricted()
        spec = SandboxSpec(tenant_id=tenant_id, level=lv, limits=limits or SandboxLimits(),
                           network=network)
        return cls(run_sync(made.create(spec)))

    @classmethod
    def connect(cls, sandbox_id: str, *, url: str, token: str,
                **provider_options: Any) -> Sandbox:
        """The live sandbox ``sandbox_id`` of the ``corral serve`` server at ``url``
        (one of this token's tenant). Leaving ``with`` destroys it, as for a created one;
        :meth:`detach` lets it go on living on the server instead.

        Raises:
            ProviderError: no such sandbox (destroyed, expired, or another tenant's).
        """
        from corral.providers.remote import RemoteProvider
        p = RemoteProvider(url, token, **provider_options)  # asks the server (blocking)
        try:
            inner = run_sync(p.connect(sandbox_id))
        except BaseException:
            run_sync(p.aclose())
            raise
        return cls(inner, owned_provider=p, destroy_on_gc=False)

    @staticmethod
    def list(*, url: str, token: str, **provider_options: Any) -> list[SandboxInfo]:
        """The live sandboxes this token's tenant has on the server at ``url``."""
        from corral.providers.remote import RemoteProvider
        p = RemoteProvider(url, token, **provider_options)

        async def go() -> list[dict[str, Any]]:
            try:
                return await p.list_sandboxes()
            finally:
                await p.aclose()
        return [SandboxInfo(id=str(d["id"]), level=str(d.get("level", "")), info=d)
                for d in run_sync(go())]

    # -- state ----------------------------------------------------------------------
    @property
    def level(self) -> Level:
        return self.spec.level

    @property
    def alive(self) -> bool:
        return self._inner is not None

    @property
    def sandbox(self) -> AsyncSandbox:
        """The async sandbox under this one (the provider contract's object)."""
        return self._live()

    def _live(self) -> AsyncSandbox:
        if self._inner is None:
            from corral.core.errors import ProviderError
            raise ProviderError(f"sandbox {self.id} is destroyed")
        return self._inner

    def _stamp(self, result: RunResult) -> RunResult:
        return result.at_level(self.spec.level)

    # -- lifecycle --------------------------------------------------------------------
    def pause(self) -> None:
        """Freeze every process of the sandbox (where its provider can: ``pause``). A
        command run meanwhile (from another thread) waits for :meth:`resume` within its
        timeout, and past it is a ``timeout`` result that never started."""
        sb = self._live()
        if not isinstance(sb, SupportsPause):
            raise PauseNotSupportedError(f"{type(sb).__name__} cannot be paused")
        run_sync(sb.pause())
        self._running.clear()

    def resume(self) -> None:
        sb = self._live()
        if not isinstance(sb, SupportsPause):
            raise PauseNotSupportedError(f"{type(sb).__name__} cannot be resumed")
        run_sync(sb.resume())
        self._running.set()

    def kill(self) -> None:
        """Destroy the sandbox: every process, file and limit of it is released.
        Idempotent."""
        self._finish()

    close = kill

    def detach(self) -> None:
        """Let go of a remote sandbox without destroying it (it lives on the server
        until its lifetime ends; :meth:`connect` finds it again)."""
        self._finish(destroy=False)

    def _finish(self, *, destroy: bool = True) -> None:
        inner, self._inner = self._inner, None
        self._fin.detach()
        _alive.discard(self)
        if inner is None:
            return
        owned, self._owned = self._owned, None
        run_sync(_end(inner, destroy, owned))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def __repr__(self) -> str:
        state = "alive" if self._inner is not None else "destroyed"
        return f"<corral.sandbox.Sandbox {self.id} {self.spec.level.value} {state}>"
