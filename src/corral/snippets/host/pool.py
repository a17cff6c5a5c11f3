"""The warm snippet pool: bounded, FIFO, per-tenant sandboxes; one fresh process per run.

Built on the provider contract only, plus two optional capabilities it negotiates
(``warm-fork``, :class:`~corral.core.contract.SupportsWarmFork` /
:class:`~corral.core.contract.SupportsForkEntry`; ``process-count``,
:class:`~corral.core.contract.SupportsProcessCount`, to retire a slot in which a
run left a process behind): the same code for every provider. A
*slot* is a sandbox created ahead of time (for one tenant; a fresh *spare*
is bound to the first tenant that takes it and never serves another). On a
provider with ``warm-fork`` (linux) the slot holds no process but the sandbox's
agent: the pool preloads the worker (:mod:`corral.snippets.sandbox.worker`) into the
provider and registers its ``main`` as a fork entry, and per job the sandbox forks a
fresh worker (``start_python_fork``, ``--once``) that reads the job on its
stdin, runs it and exits; the host collects its records and kills it at
timeout + grace. Elsewhere the slot holds a long-lived template
(``python -I -S`` started with ``start_process``) that forks a fresh child
per job and never runs caller code itself. Either way no process ever runs
code twice. The host speaks to a template in the frames of
:mod:`corral.wire.protocol` (one ``invoke`` in, one ``output`` out); a forked
worker reads one ``invoke`` frame.

Following anyio's ``to_process``: the job is serialised before a slot is
reserved; the reply line is capped; any failure kills and discards the slot
(a replacement spare is warmed in the background) and raises one
:class:`~corral.core.errors.UnhandledWorkerError`; asyncio cancellation passes
through untouched (the slot is discarded, the concurrency permit freed at
once); idle slots are reused most-recent-first and retired when idle for
``idle_ttl_s`` or beyond ``max_idle``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeVar, final

from corral.core.contract import (
    ProcessHandle,
    Sandbox,
    SandboxProvider,
    SupportsForkEntry,
    SupportsProcessCount,
    SupportsWarmFork,
)
from corral.core.errors import ConfigInvalidError, ProviderError, UnhandledWorkerError
from corral.core.spec import (
    Capability,
    Level,
    NetworkPolicy,
    ProcessOpts,
    SandboxLimits,
    SandboxSpec,
)
from corral.core.tasks import TaskSet
from corral.snippets.host.limiter import FifoLimiter
from corral.snippets.sandbox.worker import (
    CAPS as _CAPS,
    LOGS_PREFIX,
    RECORDS_FILE,
    BadRecord,
    Collector,
)
from corral.wire import records as _records
from corral.wire.protocol import (
    ErrorFrame,
    FrameDecoder,
    FrameErr,
    OutputFrame,
    encode_own_invoke,
)

__all__ = ["GRACE_MS", "PoolStatistics", "SnippetPool", "WORKER_FILE"]

T = TypeVar("T")

#: The worker's file name inside each sandbox's work dir.
WORKER_FILE: Final = "_corral_snippet_worker.py"
#: The template SIGKILLs a child this long after its timeout (the soft timer goes first).
GRACE_MS: Final = 200
#: The host kills the whole slot if no answer comes this long after timeout + grace.
_BACKSTOP_MS: Final = 3000
_MAX_REPLY_BYTES: Final = 4 * 1024 * 1024
#: Headroom over ``mem_mb`` for the template itself (a strict sandbox's cgroup cap).
_TEMPLATE_MB: Final = 64
#: what an environment template runs once after its preloads, per module it loaded: the
#: lazy imports and caches of a first use, paid there instead of in every forked run
_WARMUPS: Final = {
    "numpy": "import numpy\nnumpy.arange(4).reshape(2, 2).sum(axis=0).mean()\n",
    "pandas": ("import pandas\nd = pandas.DataFrame({'a': [1, 2], 'b': ['x', 'y']})\n"
               "d.sum(); d.describe(); d.groupby('b').a.mean(); repr(d); d.to_dict()\n"),
}


def _code_for(table: Mapping[str, str], preloaded: frozenset[str]) -> str:
    return "".join(code for name, code in sorted(table.items()) if name in preloaded)


def env_warmup(preloaded: frozenset[str]) -> str:
    """The warm-up code for a template that preloaded ``preloaded``."""
    return _code_for(_WARMUPS, preloaded)


#: what each spare of an environment template (forked ahead of its job, ``--prefork``)
#: runs while it waits, per module preloaded: the common first steps of a run (build a
#: frame, reduce it, print it), whose reference counts and caches write to pages the
#: fork shares; run there, those pages are copied before the job comes, not during it
#: (a line a step: the spare stops between two as soon as its job comes)
_PREFAULTS: Final = {
    "numpy": "import numpy\nrepr(numpy.arange(4).sum())\n",
    "pandas": ("import pandas\nd = pandas.DataFrame({'a': [1, 2], 'b': ['x', 'y']})\n"
               "s = d.sum()\nrepr(s)\nrepr(d)\nrepr(d['a'].sum())\n"),
}


def env_prefault(preloaded: frozenset[str]) -> str:
    """The prefault code for the spares of a template that preloaded ``preloaded``."""
    return _code_for(_PREFAULTS, preloaded)


#: a template that imported an environment's packages (pandas: ~100 MiB) needs more
_ENV_TEMPLATE_MB: Final = 768
_START_TIMEOUT_S: Final = 30.0
#: how long a template closed by its slot may take to end its run and exit before it is killed
_CLOSE_WAIT_S: Final = 2.0
_WORKER_MODULE: Final = "corral.snippets.sandbox.worker"
#: the fork entry the pool registers with a ``warm-fork`` provider
_WORKER_ENTRY: Final = _WORKER_MODULE + ":main"
#: Preloaded last: installs the worker's run-time guards in the fork server, once.
_GUARDS_MODULE: Final = "corral.snippets.sandbox.guards"
_FORK_OPTS: Final = ProcessOpts(stdin=True, env={})
#: After a job, how long processes the run left behind may take to disappear before the
#: slot is retired (they are SIGKILLed with the run's process group, or not at all).
_LEFTOVER_POLLS: Final = 10
_LEFTOVER_POLL_S: Final = 0.01


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PoolStatistics:
    """A snapshot of a pool. ``idle`` counts warm slots waiting (spares included)."""

    max_workers: int
    running: int
    queued: int
    idle: int
    spares: int
    completed: int
    cancelled: int
    timed_out: int
    crashed: int
    replaced: int
    created: int


class _Slot:
    """One warm sandbox and its template process (which forks a child per run)."""

    def __init__(self, sandbox: Sandbox, process: ProcessHandle, level: Level,
                 view: SupportsProcessCount | None, *, spare: bool = False) -> None:
        self.sandbox, self.process, self.level = sandbox, process, level
        self.tenant: str | None = None
        self.server_pid = 0  # the template's pid inside the sandbox
        self.last_used = time.monotonic()
        self._out = aiter(process.stdout)
        self._decoder = FrameDecoder(_MAX_REPLY_BYTES)
        self._buf = bytearray()  # an unfinished line of the template's stdout
        self._pending: list[Any] = []
        self._stderr = b""
        self._tasks = TaskSet()  # the stderr reader: ended by close
        self._tasks.spawn(self._drain_stderr())
        # the template, and its spare (the next run's child, forked ahead: ``--prefork``),
        # which it forks before it answers a job, so that one is always there
        self._view = _ProcessView(view, own=2 if spare else 1)

    async def _drain_stderr(self) -> None:
        with contextlib.suppress(Exception):
            async for chunk in self.process.stderr:
                self._stderr = (self._stderr + chunk)[-4096:]

    @property
    def alive(self) -> bool:
        return True  # a dead template shows on the next call

    async def call(self, frame: bytes, job: Mapping[str, Any],
                   on_logs: _LogSink | None = None) -> Any:
        """Send one invoke frame, return its output; ErrorFrame/EOF/garbage raise
        UnhandledWorkerError. A job with ``options["stream"]`` gets the run's log lines
        as the template reads them (lines starting ``{"logs":``, see ``worker._run``),
        each batch handed to ``on_logs``; they are the output's ``logs``."""
        options = job.get("options")
        streamed = _Streamed(options if isinstance(options, Mapping) else {}, on_logs)
        await self.process.stdin.write(frame)
        while not self._pending:
            try:
                chunk = await anext(self._out)
            except StopAsyncIteration:
                status = await self.process.wait()
                raise UnhandledWorkerError(
                    "the snippet template exited without answering", exit_code=status.exit_code,
                    stderr_tail=self._stderr.decode("utf-8", "replace")) from None
            self._feed(chunk, streamed)
        result = self._pending.pop(0)
        if isinstance(result, FrameErr):
            raise UnhandledWorkerError(f"the snippet template sent a bad frame: "
                                       f"{result.error.message}")
        frame_ = result.frame
        if isinstance(frame_, ErrorFrame):
            raise UnhandledWorkerError(f"the snippet template refused the job: "
                                       f"{frame_.error.code}: {frame_.error.message}")
        if not isinstance(frame_, OutputFrame):
            raise UnhandledWorkerError(f"unexpected {frame_.kind!r} frame from the template")
        output = frame_.output
        if isinstance(output, dict) and "logs" in output:
            if streamed.wanted:
                return {**output, "logs": streamed.lines}
            if on_logs is not None and isinstance(output["logs"], list) and output["logs"]:
                on_logs(output["logs"])  # not streamed: every line at once, at the end
        return output

    def _feed(self, chunk: bytes, streamed: _Streamed) -> None:
        """Split the template's stdout into lines: streamed log lines to ``streamed``,
        frames to the frame decoder. A line past the reply cap raises
        UnhandledWorkerError."""
        self._buf += chunk
        start = 0
        while (nl := self._buf.find(b"\n", start)) >= 0:
            line = bytes(self._buf[start:nl + 1])
            start = nl + 1
            if line.startswith(LOGS_PREFIX) and streamed.wanted:
                streamed.take(line)
            else:
                self._pending.extend(self._decoder.feed(line))
        del self._buf[:start]
        if len(self._buf) > _MAX_REPLY_BYTES:
            raise UnhandledWorkerError("the snippet template sent a line past the reply cap")

    async def leftovers(self) -> bool:
        """Whether the sandbox holds a process beyond its agent and the template."""
        return await self._view.leftovers()

    async def close(self) -> None:
        # the template's EOF: it kills a run in progress (and its spare sees its own EOF)
        # and exits; then the kill, whatever it does, and the sandbox with all it holds
        with contextlib.suppress(Exception):
            await self.process.stdin.close()
            await asyncio.wait_for(self.process.wait(), _CLOSE_WAIT_S)
        with contextlib.suppress(Exception):
            await self.process.kill()
        with contextlib.suppress(Exception):
            await self.sandbox.destroy()
        await self._tasks.aclose()


class _ForkSlot:
    """One warm sandbox (of a ``warm-fork`` provider) that forks a fresh worker per job
    (``start_python_fork`` of the worker's entry, ``--once``): the slot holds no
    process but the agent. The host collects the run's records and kills the run's
    process group at timeout + grace."""

    def __init__(self, sandbox: Sandbox, fork: SupportsForkEntry, level: Level,
                 view: SupportsProcessCount | None) -> None:
        self.sandbox, self.level = sandbox, level
        self._fork = fork  # the same sandbox, seen through its capability
        self.tenant: str | None = None
        self.server_pid = 1  # the agent
        self.last_used = time.monotonic()
        self._view = _ProcessView(view, own=0)

    @property
    def alive(self) -> bool:
        """False once the sandbox's agent exited (seen through ``process-count``)."""
        return self._view.alive

    async def call(self, frame: bytes, job: Mapping[str, Any],
                   on_logs: _LogSink | None = None) -> Any:
        """Fork one worker, hand it ``frame``, return the run's output (the run's log lines
        also go to ``on_logs`` as they are read, a batch per chunk). A worker that
        cannot start, refuses the job or writes a record no honest worker writes (the run's
        own process writes them: hostile input), or an agent that exits, raise
        UnhandledWorkerError (the worker is killed first); a run whose process dies is a
        WorkerCrashed output."""
        options = dict(job.get("options") or {})
        collector = Collector(options, on_logs)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            proc = await self._fork.start_python_fork(["--once"], _FORK_OPTS,
                                                      entry=_WORKER_ENTRY)
        except (ProviderError, ConfigInvalidError) as e:
            raise UnhandledWorkerError(f"cannot start the snippet's process: {e}") from None
        killed = False
        bad: str | None = None
        # stderr is not read: the worker puts 0/1/2 on /dev/null before the run starts and
        # the pipe's last write end goes with them, so no run can write there
        try:
            try:
                await proc.stdin.write(frame)
            except ProviderError:
                pass  # it died first: its exit says how
            await proc.stdin.close()
            grace = options.get("timeout_ms", 10_000) + options.get("grace_ms", GRACE_MS)
            try:
                async with asyncio.timeout_at(started + grace / 1000):
                    async for chunk in proc.stdout:
                        collector.feed(chunk)
            except TimeoutError:
                killed = True
            except BadRecord as e:
                bad = str(e)
            if killed or bad is not None:
                await proc.kill()
            status = await proc.wait()
        except BaseException:
            with contextlib.suppress(Exception):
                await proc.kill()
            raise
        if bad is not None:
            raise UnhandledWorkerError(f"the snippet worker wrote a malformed record: {bad}; "
                                       "it was killed", exit_code=status.exit_code)
        if not self.alive:
            raise UnhandledWorkerError("the slot's sandbox agent exited during the run",
                                       exit_code=status.exit_code)
        if collector.reply is not None:
            if "refused" in collector.reply:
                raise UnhandledWorkerError(f"the snippet worker refused the job: "
                                           f"{collector.reply['refused']}")
            return collector.reply
        if not collector.started and collector.end is None:
            raise UnhandledWorkerError("the snippet worker exited before the run started",
                                       exit_code=status.exit_code)
        try:
            return collector.finish(-9 if status.exit_code is None else status.exit_code, killed,
                                    round((loop.time() - started) * 1000, 3))
        except BadRecord as e:
            raise UnhandledWorkerError(f"the snippet worker wrote a malformed record: {e}",
                                       exit_code=status.exit_code) from None

    async def leftovers(self) -> bool:
        """Whether a process other than the agent is still in the sandbox after a job."""
        return await self._view.leftovers()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.sandbox.destroy()


_AnySlot = _Slot | _ForkSlot
#: where a run's log lines go as they arrive: a batch of the ``{"stream", "text"}`` dicts
#: of the output's ``logs``, called on the pool's loop; it must not block
_LogSink = Callable[[list[dict[str, str]]], None]


class _Streamed:
    """The log lines a template streams for one run (hostile input: the template's
    sandbox runs the caller's snippet): each line is checked (a known stream, text), no
    more lines than the log cap and no more bytes than an honest run writes, else
    UnhandledWorkerError."""

    def __init__(self, options: Mapping[str, Any], sink: _LogSink | None) -> None:
        self.wanted = options.get("stream") is True
        self.sink = sink
        self.lines: list[dict[str, str]] = []
        caps = options.get("caps")
        caps = caps if isinstance(caps, Mapping) else {}

        def cap(name: str) -> int:
            value = caps.get(name, _CAPS[name])
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        self.max_lines = cap("log_lines")
        self.left = _records.size_limit(cap("log_lines"), cap("log_bytes"), cap("facts_bytes"))

    def take(self, line: bytes) -> None:
        self.left -= len(line)
        try:
            doc = json.loads(line) if self.left >= 0 else None
        except (ValueError, RecursionError):
            doc = None
        batch = doc.get("logs") if isinstance(doc, dict) and len(doc) == 1 else None
        if not isinstance(batch, list) or len(self.lines) + len(batch) > self.max_lines:
            raise UnhandledWorkerError("the snippet template streamed malformed log lines")
        out: list[dict[str, str]] = []
        for item in batch:
            if not (isinstance(item, list) and len(item) == 2 and item[0] in _records.LOG_STREAMS
                    and isinstance(item[1], str)):
                raise UnhandledWorkerError("the snippet template streamed a malformed log line")
            out.append({"stream": item[0], "text": item[1]})
        self.lines.extend(out)
        if self.sink is not None and out:
            self.sink(out)


def _process_view(sandbox: Sandbox, provider: SandboxProvider) -> SupportsProcessCount | None:
    """The sandbox seen through the ``process-count`` capability, or None without it."""
    if Capability.PROCESS_COUNT.value in provider.capabilities and isinstance(
            sandbox, SupportsProcessCount):
        return sandbox
    return None


class _ProcessView:
    """Whether a slot's sandbox holds, after a job, a live process beyond its own ones:
    something a run detached (``setsid``) from its process group and left behind.

    Read through the ``process-count`` capability
    (:class:`~corral.core.contract.SupportsProcessCount`: the live processes of the
    sandbox besides the one its provider serves it with, linux's agent), less the slot's
    own (``own``: the template, if any). A sandbox without that view (subproc) is never
    checked."""

    def __init__(self, view: SupportsProcessCount | None, *, own: int) -> None:
        self.view, self.own = view, own

    @property
    def alive(self) -> bool:
        return True if self.view is None else self.view.alive  # else: shows on the next call

    def extra(self) -> int:
        if self.view is None or not self.view.alive:
            return 0  # unchecked, or its agent exited: the slot is discarded anyway
        return self.view.process_count() - self.own

    async def leftovers(self) -> bool:
        for _ in range(_LEFTOVER_POLLS):
            if self.extra() <= 0:
                return False
            await asyncio.sleep(_LEFTOVER_POLL_S)  # killed ones may be on their way out
        return self.extra() > 0


_log = logging.getLogger(__name__)


def _guarded(sink: _LogSink) -> _LogSink:
    """``sink``, with an exception it raises logged instead of ending the run."""
    def call(batch: list[dict[str, str]]) -> None:
        try:
            sink(batch)
        except Exception:
            _log.exception("a snippet run's log listener raised; the run goes on")
    return call


def _worker_source() -> str:
    return (Path(__file__).parent.parent / "sandbox" / "worker.py").read_text(encoding="utf-8")


def _frame(job: Mapping[str, Any], tenant_id: str) -> bytes:
    """The job's invoke frame (the codec's bytes, without its parse-back check)."""
    return encode_own_invoke(job, f"snippet-{uuid.uuid4().hex[:12]}", tenant_id)


#: Transcript.limits where the provider does not say how it holds them (not the linux one)
_NOT_SAID: Final[Mapping[str, str]] = MappingProxyType({
    "memory": "the provider's own (not said)", "processes": "the provider's own (not said)",
    "cpu": "wall clock only (the run's timeout)"})


@final
class SnippetPool:
    """Bounded concurrency (FIFO) over warm per-tenant slots; one fresh process per run.

    Args:
        providers: level -> provider; missing levels are made on first use from the
            registry (``strict`` -> ``linux``, ``context-isolated`` -> ``subproc``)
            and closed with the pool. Providers passed in are not closed.
        max_workers: runs at once (default ``os.cpu_count()``); more wait FIFO.
        mem_mb: address-space cap of each run (RLIMIT_AS over the template's own size);
            a strict sandbox also gets a cgroup cap of ``mem_mb`` + 64 MiB.
        spares: fresh, never-used slots kept warm per level in use.
        max_idle / idle_ttl_s: idle slots kept at most, and for how long.
    """

    def __init__(self, *, providers: Mapping[Level | str, SandboxProvider] | None = None,
                 max_workers: int | None = None, mem_mb: int = 256, spares: int = 1,
                 max_idle: int | None = None, idle_ttl_s: float = 60.0,
                 preload: frozenset[str] | None = None,
                 network: NetworkPolicy | None = None,
                 environment: str | None = None) -> None:
        from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS
        #: the environment every slot shows (docs/environments.md): slots are strict
        #: sandboxes running a template that imported ``preload`` (the environment's
        #: heavy modules) inside the sandbox once, forked per run
        self.environment = environment
        #: the network policy of every strict slot (default ``none``); a pool's slots all
        #: share it, so a pool serves one policy (``run_snippet(network=)`` makes its own)
        self.network = network or NetworkPolicy.none()
        self._providers = {Level(k): v for k, v in (providers or {}).items()}
        self._owned: list[SandboxProvider] = []
        self._limiter = FifoLimiter(max_workers or os.cpu_count() or 1)
        if isinstance(mem_mb, bool) or not isinstance(mem_mb, int) or mem_mb < 16:
            raise ConfigInvalidError("mem_mb", "must be an integer >= 16")
        self.mem_mb = mem_mb
        self.spares = spares
        self.max_idle = max_idle
        self.idle_ttl_s = idle_ttl_s
        self._preload = ",".join(sorted(preload if preload is not None
                                        else DEFAULT_ALLOWED_IMPORTS | {"traceback", "ast"}))
        self._idle: dict[tuple[Level, str | None], deque[_AnySlot]] = {}
        #: spares being warmed in the background: cancelled and awaited by aclose
        self._tasks = TaskSet()
        #: slots being closed in the background: awaited, never cancelled, by aclose
        self._closing = TaskSet()
        #: the slots serving a job now (aclose closes them: the job fails at once)
        self._busy: set[_AnySlot] = set()
        self._running = 0  # jobs past the limiter; aclose waits until none is left
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._warming: dict[Level, int] = {}
        self._ids = itertools.count(1)
        self._limits: dict[Level, Mapping[str, str]] = {}  # limits_for's answers
        self._counts = dict.fromkeys(
            ("completed", "cancelled", "timed_out", "crashed", "replaced", "created"), 0)
        self._closed = False
        #: an environment template keeps a spare (``--prefork``); False only to measure
        #: the pool without (benchmarks/bench_envs.py ``--interleave``)
        self._prefork = True
        #: (tenant, level, sandbox id, pid of the slot's server inside its sandbox: the
        #: template, or 1 for a strict slot's agent) per run served; for tests and audits
        self.served: deque[tuple[str, str, str, int]] = deque(maxlen=1000)

    # -- configuration and state ----------------------------------------------------
    def set_max_concurrent_workers(self, n: int) -> None:
        """Change the number of runs at once; waiting jobs start if it grew."""
        self._limiter.set_limit(n)

    def statistics(self) -> PoolStatistics:
        spares = sum(len(q) for (_lv, t), q in self._idle.items() if t is None)
        return PoolStatistics(
            max_workers=self._limiter.limit, running=self._limiter.running,
            queued=self._limiter.waiting, idle=sum(len(q) for q in self._idle.values()),
            spares=spares, **self._counts)

    def _provider(self, level: Level) -> SandboxProvider:
        if level not in self._providers:
            from corral.providers import get_provider_class
            names = {Level.STRICT: "linux", Level.CONTEXT_ISOLATED: "subproc"}
            if level not in names:
                raise ConfigInvalidError("level", f"no snippet provider for level {level.value!r}")
            options: dict[str, Any] = {}
            if level == Level.STRICT:  # the strongest this user has: cgroup, else rlimits
                from corral.providers.linux.host.hostinfo import strongest_limits_by
                options["limits_by"] = strongest_limits_by()
            self._providers[level] = provider = get_provider_class(names[level])(**options)
            self._owned.append(provider)
        return self._providers[level]

    def limits_for(self, level: Level | str) -> Mapping[str, str]:
        """How this pool's runs at ``level`` are held: ``{"memory", "processes", "cpu"}``
        -> how, for a person (``Transcript.limits``; ``corral doctor`` says the same).
        Each run's memory is also its worker's RLIMIT_AS of ``mem_mb``."""
        lv = Level(level)
        if lv in self._limits:
            return self._limits[lv]
        if lv == Level.STRICT:
            from corral.providers.linux.host.hostinfo import limits_how
            options = getattr(self._provider(lv), "options", None)
            by = getattr(options, "limits_by", None)
            how: Mapping[str, str] = _NOT_SAID
            if isinstance(by, str):  # cpu: the pool asks no cpu_ms, the timeout holds it
                said = limits_how(by)
                how = MappingProxyType({"memory": said["memory"],
                                        "processes": said["processes"],
                                        "cpu": "wall clock only (the run's timeout)"})
        else:  # context-isolated: the worker's own rlimit, no sandbox-wide limit
            how = MappingProxyType({"memory": "rlimit per process (the run's RLIMIT_AS)",
                                    "processes": "not limited at context-isolated",
                                    "cpu": "wall clock only (the run's timeout)"})
        self._limits[lv] = how
        return how

    # -- slots -----------------------------------------------------------------------
    async def _new_slot(self, level: Level, tenant: str | None) -> _AnySlot:
        provider = self._provider(level)
        limits, network = SandboxLimits(), NetworkPolicy.none()
        if level == Level.STRICT:
            limits = SandboxLimits(mem_mb=self.mem_mb + _TEMPLATE_MB, max_processes=64,
                                   disk_mb=16)
            network = self.network
        else:  # context-isolated shares the host's network by definition (subproc refuses
            network = NetworkPolicy.unrestricted()  # 'none'); the snippet has no socket
        if self.environment is not None:
            # the packages are imported in the sandbox's template, never in the host's
            # fork server: more memory for the template, no fork-server slot
            limits = dataclasses.replace(limits, mem_mb=self.mem_mb + _ENV_TEMPLATE_MB,
                                         disk_mb=64)
        spec = SandboxSpec(tenant_id=tenant or "corral-snippet-spare", level=level,
                           run_id=f"snippet-slot-{next(self._ids)}", limits=limits,
                           network=network, environment=self.environment)
        forked = self.environment is None and await self._preload_into(provider)
        sandbox = await provider.create(spec)
        try:
            view = _process_view(sandbox, provider)
            slot: _AnySlot | None = (await self._fork_slot(sandbox, level, view) if forked
                                     else None)
            if slot is None:
                template = _Slot(sandbox, await self._start_template(sandbox), level, view,
                                 spare=self.environment is not None and self._prefork)
                try:
                    pong = await asyncio.wait_for(
                        template.call(_frame({"op": "ping"}, spec.tenant_id), {}),
                        _START_TIMEOUT_S)
                    template.server_pid = int(pong["pid"])
                except BaseException:
                    await template.close()
                    raise
                slot = template
        except BaseException:
            await sandbox.destroy()
            raise
        self._counts["created"] += 1
        return slot

    @staticmethod
    async def _fork_slot(sandbox: Sandbox, level: Level,
                         view: SupportsProcessCount | None) -> _ForkSlot | None:
        """A fork-per-job slot, or None (the sandbox cannot fork the worker: no
        ``warm-fork``, or its provider's fork server restarted since the preload)."""
        if not isinstance(sandbox, SupportsForkEntry):
            return None
        slot = _ForkSlot(sandbox, sandbox, level, view)
        try:
            await asyncio.wait_for(slot.call(_frame({"op": "ping"}, sandbox.spec.tenant_id), {}),
                                   _START_TIMEOUT_S)
        except UnhandledWorkerError:
            if not slot.alive:
                raise
            return None
        return slot

    async def _preload_into(self, provider: SandboxProvider) -> bool:
        """Preload the worker into a ``warm-fork`` provider and register its entry (once);
        whether workers can be forked there."""
        if Capability.WARM_FORK.value not in provider.capabilities or not isinstance(
                provider, SupportsWarmFork):
            return False
        names = [_WORKER_MODULE, *self._preload.split(","), _GUARDS_MODULE]
        try:
            missing = await provider.preload_python([n for n in names if n],
                                                    fork_entries=[_WORKER_ENTRY])
        except ProviderError:
            return False
        return _WORKER_MODULE not in missing and _WORKER_ENTRY not in missing

    async def _start_template(self, sandbox: Sandbox) -> ProcessHandle:
        """A template slot's process: ``python -I -S`` of the worker file."""
        await sandbox.write_file(WORKER_FILE, _worker_source())
        await sandbox.write_file(RECORDS_FILE, Path(_records.__file__).read_text(encoding="utf-8"))
        argv = [sys.executable, "-I", "-S", WORKER_FILE, "--preload", self._preload,
                "--eof-ends-run"]
        env: dict[str, str] = {}
        if self.environment is not None:
            from corral.envs.store import ENV_MOUNT
            argv += ["--path", ENV_MOUNT]
            # one BLAS thread: the template forks per run (threads do not survive a fork)
            env = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                    "MKL_NUM_THREADS")}
            env["MPLBACKEND"] = "Agg"
            warm = env_warmup(frozenset(self._preload.split(",")))
            if warm:
                argv += ["--warmup", warm]
            # the next run's child forked ahead, while the slot waits (the fork of a
            # template holding the packages costs milliseconds): one spare per template
            prefault = env_prefault(frozenset(self._preload.split(",")))
            if self._prefork:
                argv += ["--prefork"] + (["--prefault", prefault] if prefault else [])
        return await sandbox.start_process(argv, ProcessOpts(stdin=True, env=env))

    def _close_later(self, slot: _AnySlot) -> None:
        self._closing.spawn(slot.close())

    async def _warm_spare(self, level: Level) -> None:
        self._warming[level] = self._warming.get(level, 0) + 1
        try:
            slot = await self._new_slot(level, None)
        except Exception:
            return  # the next run makes its slot in the foreground and reports the error
        finally:
            self._warming[level] -= 1
        if self._closed:
            await slot.close()
        else:
            self._put(slot)

    def _top_up(self, level: Level) -> None:
        if self._closed:
            return
        have = len(self._idle.get((level, None), ())) + self._warming.get(level, 0)
        for _ in range(self.spares - have):
            self._tasks.spawn(self._warm_spare(level))

    def _put(self, slot: _AnySlot) -> None:
        if self._closed:  # a job that ended while the pool closed: its slot goes too
            self._close_later(slot)
            return
        slot.last_used = time.monotonic()
        self._idle.setdefault((slot.level, slot.tenant), deque()).append(slot)
        self._retire()

    def _retire(self) -> None:
        now = time.monotonic()
        slots = sorted((s for q in self._idle.values() for s in q), key=lambda s: s.last_used)
        cap = self.max_idle if self.max_idle is not None else 2 * self._limiter.limit + self.spares
        over = len(slots) - cap
        for s in slots:
            if over > 0 or now - s.last_used > self.idle_ttl_s:
                over -= 1
                self._idle[(s.level, s.tenant)].remove(s)
                self._close_later(s)

    async def _take(self, level: Level, tenant: str) -> _AnySlot:
        self._retire()
        for key in ((level, tenant), (level, None)):
            queue = self._idle.get(key)
            while queue and not queue[-1].alive:  # its sandbox died while idle
                self._discard(queue.pop())
            if queue:
                slot = queue.pop()  # most recently used first
                if key[1] is None:
                    self._top_up(level)
                slot.tenant = tenant
                return slot
        slot = await self._new_slot(level, tenant)
        slot.tenant = tenant
        self._top_up(level)
        return slot

    def _discard(self, slot: _AnySlot) -> None:
        self._counts["replaced"] += 1
        self._close_later(slot)
        self._top_up(slot.level)

    async def prewarm(self, *, level: Level | str = Level.STRICT, tenant_id: str | None = None,
                      count: int = 1) -> None:
        """Create ``count`` warm slots now: for ``tenant_id``, or fresh spares if None."""
        level = Level(level)
        slots = await asyncio.gather(*(self._new_slot(level, tenant_id) for _ in range(count)))
        for slot in slots:
            slot.tenant = tenant_id
            self._put(slot)

    # -- running ---------------------------------------------------------------------
    async def run_job(self, job: Mapping[str, Any], *, tenant_id: str, level: Level,
                      timeout_ms: int, parse: Callable[[Any], T] | None = None,
                      on_logs: Callable[[list[dict[str, str]]], None] | None = None) -> Any:
        """Run one worker job (``{"op": "run", ...}``) and return the worker's raw output,
        or ``parse(output)`` when given (which raises UnhandledWorkerError for output no
        honest worker gives: the slot is then discarded like a crashed one).

        ``on_logs``: called on this pool's loop with the run's log lines as the worker
        writes them, a batch (the records read together, in order) of the
        ``{"stream", "text"}`` dicts that make up the output's ``logs``, before the caps of
        the transcript (:class:`~corral.snippets.host.transcript.LogCaps`); at most the
        log cap's lines in all. It must return quickly (the run's records are read on the
        same loop); an exception it raises is logged and the run goes on. A template slot
        streams lines only for a job with ``options["stream"]`` (``run_snippet`` sets it).

        Returns None when the host backstop fired (the slot was killed).
        Raises UnhandledWorkerError when the template died or misbehaved.
        After the job, a slot holding a process the run left behind (a ``setsid`` child
        outside the run's process group) is retired instead of serving again.
        """
        if self._closed:
            raise ProviderError("the snippet pool is closed")
        frame = _frame(job, tenant_id)  # serialise before reserving a slot
        try:
            await self._limiter.acquire()
        except asyncio.CancelledError:
            self._counts["cancelled"] += 1
            raise
        if self._closed:  # it closed while this job waited for its turn
            self._limiter.release()
            raise ProviderError("the snippet pool is closed")
        self._running += 1
        self._quiet.clear()
        slot: _AnySlot | None = None
        try:
            slot = await self._take(level, tenant_id)
            if self._closed:  # it closed while the slot was made
                self._close_later(slot)
                raise ProviderError("the snippet pool is closed")
            self._busy.add(slot)
            self.served.append((tenant_id, level.value, slot.sandbox.id, slot.server_pid))
            wait_s = (timeout_ms + GRACE_MS + _BACKSTOP_MS) / 1000
            try:
                async with asyncio.timeout(wait_s):  # in this task (wait_for makes one a run)
                    output = await slot.call(frame, job,
                                             None if on_logs is None else _guarded(on_logs))
                parsed = output if parse is None else parse(output)
            except asyncio.CancelledError:
                self._counts["cancelled"] += 1
                self._discard(slot)
                raise
            except TimeoutError:
                self._counts["timed_out"] += 1
                self._discard(slot)
                return None
            except BaseException:
                self._counts["crashed"] += 1
                self._discard(slot)
                raise
            self._counts["completed"] += 1
            if isinstance(output, dict):
                if output.get("timed_out"):
                    self._counts["timed_out"] += 1
                if any(isinstance(e, dict) and e.get("type") == "WorkerCrashed"
                       for e in output.get("errors", ())):
                    self._counts["crashed"] += 1
            if await slot.leftovers():
                self._discard(slot)  # a run left a process behind: never reuse the sandbox
            else:
                self._put(slot)
            return parsed
        finally:
            if slot is not None:
                self._busy.discard(slot)
            self._running -= 1
            if not self._running:
                self._quiet.set()
            self._limiter.release()

    async def aclose(self) -> None:
        """Destroy every slot (those serving a job too: the job fails at once), stop
        background work, close the providers the pool made. When it returns no task of
        the pool is pending and no job runs in it (a job still waiting for its turn
        raises ProviderError when it gets it)."""
        self._closed = True
        await self._tasks.aclose()  # spares being warmed: their sandboxes are destroyed
        slots = [s for q in self._idle.values() for s in q] + list(self._busy)
        self._idle.clear()
        await asyncio.gather(*(s.close() for s in slots), return_exceptions=True)
        await self._quiet.wait()  # the jobs whose slot was just closed end
        await self._closing.drain()
        for provider in self._owned:
            with contextlib.suppress(Exception):
                await provider.aclose()
        self._owned.clear()

    async def __aenter__(self) -> SnippetPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
