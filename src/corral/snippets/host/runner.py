"""``run_snippet``: validate a Python snippet, run it in the warm pool, return its Transcript.

Without ``pool=`` or ``provider=`` runs go to one process-wide :class:`SnippetPool`
that lives on a background event loop (thread ``corral-snippets``), so async callers
on any loop and sync callers share one bound on concurrency
(:func:`set_max_concurrent_workers`). It is closed at interpreter exit or by
:func:`shutdown_snippet_pool`. With ``provider=`` the run goes through a short-lived
pool on that provider (the same pool code, whatever the provider), closed after the
run; the provider stays the caller's.
"""

from __future__ import annotations

import ast
import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import queue
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, cast

from corral.core.cancel import CancelScope, CancelToken
from corral.core.contract import SandboxProvider
from corral.core.errors import ConfigInvalidError, LevelNotSupportedError, SandboxCancelledError
from corral.core.spec import Level, NetworkPolicy
from corral.core.sync import background_loop, sync_twin

if TYPE_CHECKING:
    from corral.envs.store import Environment
from corral.snippets.host.pool import GRACE_MS, PoolStatistics, SnippetPool
from corral.snippets.host.transcript import (
    CAPS,
    LogCaps,
    LogLine,
    SnippetError,
    Transcript,
    transcript_from_wire,
    transcript_rejected,
)
from corral.snippets.validator import (
    DEFAULT_ALLOWED_IMPORTS,
    FORBIDDEN_NAMES,
    Violation,
    ViolationCode,
    validate_files,
)

__all__ = [
    "DEFAULT_TIMEOUT_MS", "MAX_FILES", "MAX_PAYLOAD_BYTES", "MAX_TIMEOUT_MS", "MIN_TIMEOUT_MS",
    "FilesArg", "run_snippet", "run_snippet_sync", "set_max_concurrent_workers",
    "shutdown_snippet_pool", "snippet_pool_statistics",
]

MIN_TIMEOUT_MS: Final = 100
MAX_TIMEOUT_MS: Final = 10_000
DEFAULT_TIMEOUT_MS: Final = 5_000
#: Files in one payload, and their UTF-8 size together (each file: the validator's cap).
MAX_FILES: Final = 64
MAX_PAYLOAD_BYTES: Final = 1024 * 1024
#: Paths inside a sandbox that tracebacks never show.
_SANDBOX_PATHS: Final = ("/work", "/tmp")
#: How long ``on_log`` listeners may hold the caller's loop before it is yielded.
_DELIVER_SLICE_S: Final = 0.005
#: how long an interrupted sync call waits for its cancelled run to clean up
_CLEANUP_WAIT_S: Final = 30.0
_log = logging.getLogger(__name__)

FilesArg = Sequence[Mapping[str, str]] | Sequence[tuple[str, str]] | Mapping[str, str]
T = TypeVar("T")
P = ParamSpec("P")


def _files(source: str | None, files: FilesArg | None) -> list[tuple[str, str]]:
    if (source is None) == (files is None):
        raise ConfigInvalidError("source", "pass exactly one of source= or files=")
    if source is not None:
        if not isinstance(source, str):
            raise ConfigInvalidError("source", "must be a string")
        return [("main.py", source)]
    assert files is not None
    items: list[Any] = list(files.items()) if isinstance(files, Mapping) else list(files)
    out: list[tuple[str, str]] = []
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            item = (item.get("path"), item.get("source"))
        if not (isinstance(item, tuple) and len(item) == 2
                and isinstance(item[0], str) and isinstance(item[1], str)):
            raise ConfigInvalidError(f"files[{i}]", "must be {path, source} with string values")
        out.append((item[0], item[1]))
    if "main.py" not in {p for p, _ in out}:
        raise ConfigInvalidError("files", "a payload needs a main.py (it runs as __main__)")
    return out


def _timeout(timeout_ms: int) -> int:
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int):
        raise ConfigInvalidError("timeout_ms", "must be an integer (milliseconds)")
    return min(max(timeout_ms, MIN_TIMEOUT_MS), MAX_TIMEOUT_MS)


def _level(level: Level | str) -> Level:
    """The level asked for; ConfigInvalidError for an unknown one or ``none``."""
    try:
        lv = Level(level)
    except ValueError:
        raise ConfigInvalidError("level", f"unknown level {level!r}") from None
    if lv == Level.NONE:
        raise ConfigInvalidError("level", "snippets run at 'strict' (default) or "
                                 "'context-isolated', never at 'none'")
    return lv


#: the levels a snippet may run at, strongest first
_SNIPPET_LEVELS: Final = (Level.STRICT, Level.CONTEXT_ISOLATED)


def _level_on(level: Level | str | None, provider: SandboxProvider | None) -> Level:
    """The level a run uses: the one asked for (default ``strict``), or with a provider
    the strongest snippet level it offers unless the caller asked for one. A level the
    provider does not offer raises LevelNotSupportedError (nothing has run)."""
    asked = None if level is None else _level(level)
    if provider is None:
        return asked or Level.STRICT
    offered = frozenset(provider.levels)
    supported = frozenset(lv.value for lv in offered)
    if asked is None:
        for lv in _SNIPPET_LEVELS:
            if lv in offered:
                return lv
        raise LevelNotSupportedError(
            Level.STRICT.value, supported,
            f"snippets run at 'strict' or 'context-isolated'; {provider.name!r} offers neither")
    if asked not in offered:
        raise LevelNotSupportedError(asked.value, supported,
                                     f"provider {provider.name!r} does not offer it")
    return asked


def _too_large(files: list[tuple[str, str]]) -> Transcript | None:
    size = sum(len(s.encode("utf-8", "surrogatepass")) for _, s in files)
    if len(files) <= MAX_FILES and size <= MAX_PAYLOAD_BYTES:
        return None
    msg = (f"a payload holds at most {MAX_FILES} files and {MAX_PAYLOAD_BYTES} bytes "
           f"(got {len(files)} files, {size} bytes)")
    return transcript_rejected(
        [Violation(code=ViolationCode.SOURCE_TOO_LARGE, line=0, column=0, message=msg)])


#: where main.py's last statement starts, for the worker: ``(offset, line)`` of an
#: expression statement at column 0 (its value is the run's result), ``(-1, 0)`` when the
#: last statement is not an expression, None when the worker is to find it itself
Split = tuple[int, int] | None

_NEWLINE: Final = re.compile(r"\r\n|\r|\n")  # the tokenizer's line ends


def expression_split(source: str, tree: ast.Module | None = None) -> Split:
    """Where ``source``'s last statement starts if it is an expression statement at the
    start of a line: ``(character offset, line)``; ``(-1, 0)`` if the last statement is not
    an expression (or there is none); None if the worker must parse it itself (an
    expression after a ``;`` on its line, a source that does not parse). ``tree``: the
    source's, when the caller has it (the validator's); else it is parsed here.

    The worker then compiles the text before the offset as the module and the text from
    it as one expression (padded with line ends, so line numbers stay the same), straight
    from source: building and compiling Python AST objects cost a forked run about 30
    copy-on-write page faults and 0.1-0.2 ms of CPU more (docs/snippets.md, "CPU per
    run")."""
    if tree is None:
        try:
            tree = ast.parse(source, "main.py")
        except (SyntaxError, ValueError):
            return None
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        return (-1, 0)
    if last.col_offset != 0:
        return None
    offset = 0
    for _ in range(last.lineno - 1):
        m = _NEWLINE.search(source, offset)
        if m is None:
            return None
        offset = m.end()
    return (offset, last.lineno)


class _ValidationCache:
    """The validator's verdict on recent payloads (a bounded LRU), so a payload sent again
    is not parsed and walked again: :func:`validate_files` is a pure function of the
    files and the allowed imports, and its verdict is an immutable tuple. An accepted
    payload's entry also holds main.py's :func:`expression_split` (from the validator's
    tree: the source is parsed once).

    Keyed by tenant too, so one tenant's timing never tells whether another sent the same
    source. Bounded in entries and in the characters of the paths and sources held (a
    character takes at most 4 bytes: 1 Mi characters is at most 4 MiB); a payload larger
    than ``max_entry_chars`` is validated every time and never held."""

    def __init__(self, *, max_entries: int = 256, max_chars: int = 1 << 20,
                 max_entry_chars: int = 32 * 1024) -> None:
        self.max_entries, self.max_chars, self.max_entry_chars = (
            max_entries, max_chars, max_entry_chars)
        self._lru: OrderedDict[tuple[str, frozenset[str], tuple[tuple[str, str], ...]],
                               tuple[tuple[Violation, ...], Split, int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()  # run_snippet runs on any thread's loop

    def violations(self, payload: list[tuple[str, str]], allowed: frozenset[str],
                   tenant_id: str) -> tuple[Violation, ...]:
        """The validator's verdict on ``payload``."""
        return self.check(payload, allowed, tenant_id)[0]

    def check(self, payload: list[tuple[str, str]], allowed: frozenset[str],
              tenant_id: str) -> tuple[tuple[Violation, ...], Split]:
        """The validator's verdict on ``payload`` and, when it is accepted, main.py's
        :func:`expression_split`."""
        size = sum(len(p) + len(s) for p, s in payload) + len(tenant_id)
        if size > self.max_entry_chars:
            return _validated(payload, allowed)
        key = (tenant_id, allowed, tuple(payload))
        with self._lock:
            hit = self._lru.get(key)
            if hit is not None:
                self._lru.move_to_end(key)
                return hit[0], hit[1]
        found, split = _validated(payload, allowed)
        with self._lock:
            if key not in self._lru:
                self._lru[key] = (found, split, size)
                self._chars += size
                while len(self._lru) > self.max_entries or self._chars > self.max_chars:
                    self._chars -= self._lru.popitem(last=False)[1][2]
        return found, split

    def clear(self) -> None:
        with self._lock:
            self._lru.clear()
            self._chars = 0


def _validated(payload: list[tuple[str, str]], allowed: frozenset[str]
               ) -> tuple[tuple[Violation, ...], Split]:
    """:func:`validate_files`' verdict and, for an accepted payload, main.py's split from
    the tree the validator parsed."""
    trees: dict[str, ast.Module] = {}
    found = validate_files(payload, allowed_imports=allowed, trees=trees)
    main, tree = dict(payload).get("main.py"), trees.get("main.py")
    return found, (expression_split(main, tree) if not found and main is not None
                   and tree is not None else None)


_VALIDATED: Final = _ValidationCache()


@functools.lru_cache(maxsize=32)
def _guard_lists(allowed: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The job's sorted allowed imports and forbidden names (the same every run)."""
    return tuple(sorted(allowed)), tuple(sorted(FORBIDDEN_NAMES - {"__build_class__"}))


def _job(files: list[tuple[str, str]], timeout_ms: int, allowed: frozenset[str],
         mem_mb: int, guard: bool, split: Split = None) -> dict[str, Any]:
    allowed_sorted, forbidden = _guard_lists(allowed)
    options = {
        "timeout_ms": timeout_ms, "grace_ms": GRACE_MS, "mem_mb": mem_mb, "caps": dict(CAPS),
        "stream": True,  # a template streams the log lines as they come (pool._Slot)
        "allowed": list(allowed_sorted) if guard else None,
        "forbidden": list(forbidden) if guard else [],
    }
    if split is not None:
        options["split"] = list(split)
    return {"op": "run", "files": [list(f) for f in files], "options": options}


class _LogRelay:
    """A run's log lines, live: capped as the transcript caps them (:class:`LogCaps`, so
    the lines handed out are the transcript's lines) and handed to ``on_log`` on the
    caller's event loop ``loop``, in order.

    :meth:`feed` runs on the pool's loop (the caller's, or the process-wide pool's
    thread): it only caps, queues and wakes the caller's loop, once per batch of lines
    that arrived together, so reading the run never waits on the listener. The
    caller's loop calls ``on_log`` for the queued lines; a listener slower than ~5 ms a
    batch yields the loop between lines, so a run read on that same loop keeps being
    read and its timeout keeps applying. A listener that raises is logged (the first
    time with its traceback) and the run goes on. :meth:`drain`, awaited on the
    caller's loop once the run is over, returns when every line was handed out."""

    def __init__(self, on_log: Callable[[LogLine], None] | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._on_log, self._loop = on_log, loop
        self.caps = LogCaps()
        #: every line kept, in order (read on the pool's loop: the transcript's logs)
        self.kept: list[LogLine] = []
        self._queue: deque[LogLine] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self._idle: asyncio.Future[None] | None = None
        self.failures = 0

    def feed(self, batch: list[dict[str, str]]) -> None:
        """Lines read from the run (the pool's ``on_logs``), on the pool's loop."""
        lines = [line for item in batch
                 if (line := self.caps.take(item["stream"], item["text"])) is not None]
        if not lines:
            return
        self.kept.extend(lines)
        if self._on_log is None:
            return
        with self._lock:
            self._queue.extend(lines)
            wake, self._scheduled = not self._scheduled, True
        if wake:
            if _running_loop() is self._loop:
                self._loop.call_soon(self._deliver)
            else:
                with contextlib.suppress(RuntimeError):  # the caller's loop is closed
                    self._loop.call_soon_threadsafe(self._deliver)

    def close(self) -> None:
        """The run failed or was cancelled: hand out nothing more."""
        with self._lock:
            self._on_log = None
            self._queue.clear()

    def _deliver(self) -> None:
        until = time.monotonic() + _DELIVER_SLICE_S
        while True:
            with self._lock:
                if not self._queue:
                    self._scheduled = False
                    break
                line = self._queue.popleft()
                on_log = self._on_log
            if on_log is None:
                continue
            try:
                on_log(line)
            except Exception:
                self.failures += 1
                if self.failures == 1:
                    _log.exception("a snippet's on_log listener raised; the run goes on")
            if time.monotonic() > until:  # a slow listener: let the loop breathe
                self._loop.call_soon(self._deliver)
                return
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def drain(self) -> None:
        """Wait (on the caller's loop) until every line fed so far was handed out."""
        with self._lock:
            if self._scheduled:
                self._idle = self._loop.create_future()
        if self._idle is not None:
            await self._idle
        if self.failures > 1:
            _log.warning("a snippet's on_log listener raised %d times", self.failures)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _run_in(pool: SnippetPool, files: list[tuple[str, str]], *, tenant_id: str,
                  level: Level, timeout_ms: int, allowed: frozenset[str],
                  guard: bool, split: Split = None,
                  relay: _LogRelay | None = None) -> Transcript:
    job = _job(files, timeout_ms, allowed, pool.mem_mb, guard, split)
    loop = asyncio.get_running_loop()
    relay = relay if relay is not None else _LogRelay(None, loop)
    started = loop.time()
    transcript: Transcript | None = await pool.run_job(
        job, tenant_id=tenant_id, level=level, timeout_ms=timeout_ms,
        parse=lambda output: _from_wire(output, level), on_logs=relay.feed)
    if transcript is None:  # the host backstop killed a slot that did not answer
        elapsed = round((loop.time() - started) * 1000, 3)
        transcript = Transcript(
            timed_out=True, duration_ms=elapsed, level=level, errors=(SnippetError(
                type="TimeoutError", message=f"the snippet ran past its {timeout_ms} ms "
                "timeout and its sandbox was killed"),), logs=tuple(relay.kept),
            truncated=frozenset({"logs"}) if relay.caps.cut else frozenset())
    return dataclasses.replace(transcript, limits=pool.limits_for(level))


def _from_wire(output: Any, level: Level) -> Transcript:
    """The checked transcript of a worker's output (UnhandledWorkerError if malformed)."""
    return transcript_from_wire(output, sandbox_paths=_SANDBOX_PATHS, level=level)


#: the environment modules an environment pool's template imports by default (the ones
#: worth it: slow to import, used by most snippets that name the environment)
_HEAVY: Final = frozenset({"numpy", "pandas", "scipy", "sklearn", "polars", "pyarrow",
                           "sympy", "networkx", "statsmodels"})


def env_preload(modules: frozenset[str]) -> frozenset[str]:
    """What an environment pool's template imports once: the default preloads and the
    environment's top-level modules (private ``_x`` ones left to their packages)."""
    from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS
    return (DEFAULT_ALLOWED_IMPORTS | {"traceback", "ast"}
            | {m for m in modules if m in _HEAVY})


async def _on_provider(provider: SandboxProvider | None, level: Level,
                       run: Callable[[SnippetPool], Awaitable[T]], *,
                       network: NetworkPolicy | None = None, environment: str | None = None,
                       preload: frozenset[str] | None = None) -> T:
    """``run`` in a short-lived pool on ``provider`` (one slot, no spare; None: a
    provider of the pool's own, closed with it), closed after it on every path; a
    given provider is not closed (the caller owns it)."""
    extra: dict[str, Any] = {} if network is None else {"network": network}
    if environment is not None:
        extra.update(environment=environment, preload=preload)
    pool = SnippetPool(providers={level: provider} if provider is not None else None,
                       max_workers=1, spares=0, **extra)
    try:
        return await run(pool)
    finally:
        await pool.aclose()


async def run_snippet(
    source: str | None = None, *, files: FilesArg | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS, level: Level | str | None = None,
    tenant_id: str = "default", cancel: CancelToken | None = None,
    allowed_imports: frozenset[str] | None = None, pool: SnippetPool | None = None,
    provider: SandboxProvider | None = None, _unsafe_skip_validation: bool = False,
    network: NetworkPolicy | None = None, on_log: Callable[[LogLine], None] | None = None,
    environment: str | Environment | None = None,
) -> Transcript:
    """Validate and run a Python snippet; return what it did.

    ``source`` is one file (``main.py``); ``files`` a payload (``[{"path", "source"}]``,
    ``[(path, source)]`` or ``{path: source}``) in which ``main.py`` runs as ``__main__``
    and the others import as modules. ``timeout_ms`` is clamped to [100, 10000].
    A snippet the validator refuses is not run: its transcript holds one
    ``ValidationError`` per violation. ``level`` ``strict`` (the default) runs on the
    linux provider, ``context-isolated`` on subproc. Slots are never shared between
    ``tenant_id`` values. Cancelling the awaiting task or ``cancel`` stops the run
    (``cancel`` raises :class:`SandboxCancelledError`).

    ``provider``: run on this provider instead (any provider offering ``strict`` or
    ``context-isolated``), through a short-lived pool closed after the run; the
    provider is not closed. The level is then ``level`` if given, else the strongest
    the provider offers; one it does not offer raises
    :class:`~corral.core.errors.LevelNotSupportedError` before anything runs.
    ``pool`` (a pool of the calling event loop) and ``provider`` exclude each other.
    ``Transcript.level`` says the level the snippet ran at.

    ``network``: the sandbox's network policy at ``strict`` (default ``none``). Another
    policy runs in a short-lived pool of its own (a slot never outlives the policy it
    was made with), on ``provider`` or a fresh one; ``pool`` does not go with it. The
    snippet still needs ``allowed_imports`` that let it use a client (``urllib``...);
    it reaches out only through the egress proxy (docs/network.md).

    ``on_log``: called with each log line (a :class:`LogLine`, as the transcript holds it:
    the same caps, the same cut text) as soon as the run writes it, in order, on the
    event loop that awaits ``run_snippet`` (never from another thread); every call comes
    before ``run_snippet`` returns, and ``Transcript.logs`` holds the same lines. Lines
    that arrive together are handed out together (one wake-up of the loop). A listener
    that raises is logged and the run goes on; a slow one delays only this call's
    return, never the run (its timeout applies as always). Nothing is handed out after
    the run fails or is cancelled. From :func:`run_snippet_sync` the listener runs in the
    calling thread.

    ``environment``: a built environment's name or digest (docs/environments.md), or
    an :class:`~corral.envs.Environment` looked up already (another store), strict
    only. Its top-level modules join the default allowed imports (when
    ``allowed_imports`` is not given); the run goes to a pool of that environment's
    own, whose slots imported its packages once inside the sandbox and fork per run.
    """
    payload = _files(source, files)
    env_modules: frozenset[str] = frozenset()
    if environment is not None:
        from corral.envs.store import Environment, EnvStore
        env = (environment if isinstance(environment, Environment)  # a service's store
               else EnvStore().get(environment))  # ConfigInvalidError (environment) if none
        environment, env_modules = env.digest, env.allowed_imports()
    if pool is not None and provider is not None:
        raise ConfigInvalidError("provider", "pass pool= or provider=, not both")
    lv, timeout = _level_on(level, provider), _timeout(timeout_ms)
    if not isinstance(tenant_id, str) or not tenant_id:
        raise ConfigInvalidError("tenant_id", "must be a non-empty string")
    if environment is not None and lv != Level.STRICT:
        raise LevelNotSupportedError(str(lv), ("strict",), "an environment is shown at "
                                     "strict only", field="environment")
    allowed = (DEFAULT_ALLOWED_IMPORTS | env_modules if allowed_imports is None
               else frozenset(allowed_imports))
    rejected = _too_large(payload)
    split: Split = None
    if rejected is None and not _unsafe_skip_validation:
        violations, split = _VALIDATED.check(payload, allowed, tenant_id)
        rejected = transcript_rejected(violations) if violations else None
    if rejected is not None:
        return rejected
    relay = _LogRelay(on_log, asyncio.get_running_loop())
    try:
        transcript = await _dispatch(_SnippetRun(
            payload=payload, tenant_id=tenant_id, level=lv, timeout_ms=timeout,
            allowed=allowed, guard=not _unsafe_skip_validation, split=split, relay=relay,
            environment=environment, env_modules=env_modules),
            pool=pool, provider=provider, network=network, cancel=cancel)
    except BaseException:
        relay.close()
        raise
    await relay.drain()
    return transcript


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _SnippetRun:
    """One snippet run, checked: what :func:`run_snippet`'s keywords say, as the one
    value the layers below read (``on(pool)`` runs it there)."""

    payload: list[tuple[str, str]]
    tenant_id: str
    level: Level
    timeout_ms: int
    allowed: frozenset[str]
    guard: bool
    split: Split
    relay: _LogRelay
    #: the environment's digest (None: the stdlib pool) and its top-level modules: the run
    #: goes to that environment's pool, whose template preloaded ``env_preload`` of them
    environment: str | None = None
    env_modules: frozenset[str] = frozenset()

    async def on(self, pool: SnippetPool) -> Transcript:
        return await _run_in(pool, self.payload, tenant_id=self.tenant_id, level=self.level,
                             timeout_ms=self.timeout_ms, allowed=self.allowed,
                             guard=self.guard, split=self.split, relay=self.relay)


async def _dispatch(run: _SnippetRun, *, pool: SnippetPool | None,
                    provider: SandboxProvider | None, network: NetworkPolicy | None,
                    cancel: CancelToken | None) -> Transcript:
    """The run on the pool it belongs to (see :func:`run_snippet`)."""
    lv, environment, modules = run.level, run.environment, run.env_modules
    if environment is not None:
        if pool is not None:
            if pool.environment not in (environment,):
                raise ConfigInvalidError("environment", "the pool passed in shows another "
                                         "environment (SnippetPool(environment=...))")
            return await _with_token(cancel, lambda: run.on(pool))
        if provider is not None or (network is not None and network.kind != "none"):
            return await _with_token(cancel, lambda: _on_provider(
                provider, lv, run.on, network=network,
                environment=environment, preload=env_preload(modules)))
        fut = _DEFAULT.submit(
            lambda p: _with_token(cancel, lambda: run.on(p)),
            environment=environment, preload=env_preload(modules))
        return await asyncio.wrap_future(fut)
    if network is not None and network.kind != "none":
        if pool is not None:
            raise ConfigInvalidError("network", "pass network= or pool=, not both (a "
                                     "pool's slots have the network policy it was made with)")
        if lv != Level.STRICT:
            raise LevelNotSupportedError(
                str(lv), ("strict",), "a snippet's network policy is enforced at strict only",
                field="network", missing=f"network policy {network.kind!r}")
        return await _with_token(cancel, lambda: _on_provider(
            provider, lv, run.on, network=network))
    if provider is not None:
        return await _with_token(cancel, lambda: _on_provider(
            provider, lv, run.on))
    if pool is not None:
        return await _with_token(cancel, lambda: run.on(pool))
    fut = _DEFAULT.submit(lambda p: _with_token(cancel, lambda: run.on(p)))
    return await asyncio.wrap_future(fut)


async def _with_token(cancel: CancelToken | None, make: Callable[[], Awaitable[T]]) -> T:
    """``make()``, stopped when ``cancel`` fires (SandboxCancelledError) through the one
    token bridge, :class:`~corral.core.cancel.CancelScope`."""
    if cancel is not None and cancel.cancelled:
        raise SandboxCancelledError(f"snippet cancelled: {cancel.reason}")
    async with CancelScope(cancel):
        return await make()
    assert cancel is not None  # only the token's cancellation ends the block here
    raise SandboxCancelledError(f"snippet cancelled: {cancel.reason}")


class _DefaultPool:
    """The process-wide pool on its own event loop thread, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: SnippetPool | None = None
        self._max: int | None = None
        #: a pool per environment (digest), made on its first run
        self._env_pools: dict[str, SnippetPool] = {}

    def _ensure(self) -> asyncio.AbstractEventLoop:
        """The pool lives on the loop every sync call shares (:mod:`corral.core.sync`)."""
        loop = background_loop()
        with self._lock:
            if self._loop is not loop:  # first use, or a forked child's new loop
                self._loop, self._pool = loop, None
                self._env_pools = {}
            return loop

    def _get(self) -> SnippetPool:
        if self._pool is None:
            self._pool = SnippetPool(max_workers=self._max)
        return self._pool

    def _get_env(self, environment: str, preload: frozenset[str] | None) -> SnippetPool:
        pool = self._env_pools.get(environment)
        if pool is None:
            pool = self._env_pools[environment] = SnippetPool(
                max_workers=self._max, environment=environment, preload=preload)
        return pool

    def submit(self, make: Callable[[SnippetPool], Awaitable[T]], *,
               environment: str | None = None, preload: frozenset[str] | None = None
               ) -> concurrent.futures.Future[T]:
        loop = self._ensure()

        async def call() -> T:
            if environment is not None:
                return await make(self._get_env(environment, preload))
            return await make(self._get())

        return asyncio.run_coroutine_threadsafe(call(), loop)

    def set_max(self, n: int) -> None:
        SnippetPool(max_workers=n, spares=0)  # validates n
        self._max = n
        if self._pool is not None:
            self.submit(self._set(n)).result()

    @staticmethod
    def _set(n: int) -> Callable[[SnippetPool], Awaitable[None]]:
        async def apply(pool: SnippetPool) -> None:
            pool.set_max_concurrent_workers(n)
        return apply

    def statistics(self) -> PoolStatistics:
        async def stats(pool: SnippetPool) -> PoolStatistics:
            return pool.statistics()
        return self.submit(stats).result()

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._lock:
            loop, pool = self._loop, self._pool
            pools = [p for p in (pool, *self._env_pools.values()) if p is not None]
            self._loop = self._pool = None
            self._env_pools = {}
        if loop is None or not pools or loop.is_closed():
            return

        async def close_all() -> None:
            for p in pools:
                await p.aclose()

        fut = asyncio.run_coroutine_threadsafe(close_all(), loop)
        try:
            fut.result(timeout)
        except Exception:
            pass


_DEFAULT: Final = _DefaultPool()
atexit.register(_DEFAULT.shutdown)

def _logs_in_calling_thread(fn: Callable[P, Coroutine[Any, Any, T]],
                            plain: Callable[P, T]) -> Callable[P, T]:
    """``plain`` (the sync twin of ``fn``), except that an ``on_log`` listener runs in
    the calling thread: the run (on the process-wide loop) queues each line, and the
    calling thread hands them out while it waits, so the listener never runs on the
    ``corral-sync`` thread and a slow one never holds up a run there."""

    def twin(*args: P.args, **kwargs: P.kwargs) -> T:
        on_log = cast("Callable[[LogLine], None] | None", kwargs.get("on_log"))
        if on_log is None:
            return plain(*args, **kwargs)
        loop = background_loop()
        if _running_loop() is loop:
            raise RuntimeError("a corral sync call from the corral-sync thread itself (an "
                               "output callback?) would wait on itself: await the async door")
        lines: queue.SimpleQueue[LogLine | None] = queue.SimpleQueue()
        finished = threading.Event()
        call = cast("Callable[..., Coroutine[Any, Any, T]]", fn)

        async def run() -> T:
            try:
                return await call(*args, **{**kwargs, "on_log": lines.put})
            finally:
                finished.set()
                lines.put(None)

        fut: concurrent.futures.Future[T] | None = None
        failures = 0
        try:
            fut = asyncio.run_coroutine_threadsafe(run(), loop)
            while (line := lines.get()) is not None:
                try:
                    on_log(line)
                except Exception:
                    failures += 1
                    if failures == 1:
                        _log.exception("a snippet's on_log listener raised; the run goes on")
            if failures > 1:
                _log.warning("a snippet's on_log listener raised %d times", failures)
            return fut.result()
        except BaseException:
            if fut is not None and not fut.done():
                fut.cancel()
                finished.wait(_CLEANUP_WAIT_S)
            raise

    twin.__name__ = twin.__qualname__ = plain.__name__
    twin.__doc__ = plain.__doc__
    twin.__wrapped__ = fn  # type: ignore[attr-defined]
    return twin


#: the synchronous twin of :func:`run_snippet` (same parameters), on the process-wide
#: pool's event loop: a ``provider=`` or ``pool=`` passed from sync code is always used
#: on that one loop. Cancel with the ``cancel`` token. An ``on_log`` listener runs in
#: the calling thread (between the run's lines, while the call waits).
run_snippet_sync = _logs_in_calling_thread(
    run_snippet, sync_twin(run_snippet, name="run_snippet_sync"))


def set_max_concurrent_workers(n: int) -> None:
    """Runs at once in the process-wide pool (default ``os.cpu_count()``); more queue FIFO."""
    _DEFAULT.set_max(n)


def snippet_pool_statistics() -> PoolStatistics:
    """A frozen snapshot of the process-wide pool."""
    return _DEFAULT.statistics()


def shutdown_snippet_pool() -> None:
    """Close the process-wide pool (its sandboxes and loop); the next run starts a new one."""
    _DEFAULT.shutdown()
