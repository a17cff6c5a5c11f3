"""What ``corral serve`` does, without HTTP: the providers per level, the tenants, the
snippet pool, metrics and logs, and one method per API operation. :mod:`.app` maps
requests onto these methods; the methods take a tenant and values of corral's own types
and raise corral's errors (or :class:`ApiError` for the API's own cases).

Everything goes through the provider contract (``corral.core.contract``) and the front
doors (``run_snippet``, ``invoke_in``), never a provider's class: a level is served by
whichever provider the config names.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from corral.core.contract import (
    Sandbox,
    SandboxProvider,
    SupportsStreamingExec,
    pause,
    restore,
    resume,
    snapshot,
)
from corral.core.errors import (
    ConfigInvalidError,
    CorralError,
    CreateCancelledError,
    InvalidSnapshotHandleError,
    LevelNotSupportedError,
    SandboxTimeoutError,
)
from corral.core.result import Outcome, RunResult
from corral.core.spec import (
    ExecOpts,
    HandlerRef,
    InvocationMode,
    Level,
    NetworkPolicy,
    ProcessOpts,
    SandboxLimits,
    SandboxSpec,
    SnapshotHandle,
)
from corral.core.tasks import TaskSet, settle
from corral.providers.remote import wire
from corral.serve import tenancy
from corral.serve.config import ServeConfig
from corral.serve.logs import JsonLog
from corral.serve.metrics import Metrics
from corral.serve.state import ProcessEntry, SandboxEntry, TenantState, new_id
from corral.serve.tenancy import is_host_address as _is_host_address

if TYPE_CHECKING:
    from corral.snippets.host.transcript import LogLine

__all__ = ["EARLY_RELEASE", "ApiError", "Event", "RunStream", "Service"]

Event = dict[str, Any]
T = TypeVar("T")
_CLIENT_ID: Final = re.compile(r"[A-Za-z0-9_-]{16,80}")
#: the levels snippets run at (never ``none``)
_SNIPPET_LEVELS: Final = (Level.STRICT, Level.CONTEXT_ISOLATED)
#: how long close() waits for cancelled requests to finish unwinding before it destroys
_UNWIND_S: Final = 10.0
#: how often sandboxes past their lifetime are looked for (and destroyed)
_EXPIRE_EVERY_S: Final = 0.5
#: the releases of the cap slots a request holds, set by the app per request: called as
#: soon as the client goes away (see :meth:`Service._slot`)
EARLY_RELEASE: contextvars.ContextVar[list[Callable[[], None]] | None] = \
    contextvars.ContextVar("corral_serve_early_release", default=None)


class RunStream:
    """The events of one streamed run, and what it holds (cap slots): ``release()``
    gives them back, once, whether or not the events were ever read."""

    def __init__(self, events: Callable[[], AsyncIterator[Event]],
                 releases: list[Callable[[], None]]) -> None:
        self._events, self._releases = events, releases

    async def events(self) -> AsyncIterator[Event]:
        try:
            async for ev in self._events():
                yield ev
        finally:
            self.release()

    def release(self) -> None:
        releases, self._releases = self._releases, []
        for r in reversed(releases):
            r()


class ApiError(Exception):
    """An answer of the API's own (not one of corral's errors): 401, 404, 405, 413, 503.
    ``code`` is one of :data:`corral.providers.remote.wire.HTTP_CODES`."""

    def __init__(self, code: str, message: str, **facts: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.facts = code, message, facts
        self.status = wire.HTTP_CODES[code]

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.facts}


def _handle_key(handle: SnapshotHandle) -> str:
    doc = json.dumps(handle.to_json(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(doc.encode()).hexdigest()


class Service:
    """The service's state and operations. ``start()`` makes the providers (those not
    passed in), ``close()`` drains: it refuses new work, lets in-flight work unwind,
    destroys every sandbox and closes what it made."""

    def __init__(self, config: ServeConfig, *,
                 providers: Mapping[Level | str, SandboxProvider] | None = None,
                 log: JsonLog | None = None) -> None:
        self.config = config
        self.log = log or JsonLog(enabled=config.access_log)
        self.tenants = {t.name: TenantState(t) for t in config.tenants}
        self.providers: dict[Level, SandboxProvider] = {
            Level(k): v for k, v in (providers or {}).items()}
        self._owned: list[SandboxProvider] = []
        self._pool: Any = None  # SnippetPool, made on the first snippet
        #: a snippet pool per environment (digest), made on its first snippet
        self._env_pools: dict[str, Any] = {}
        self._env_builds: Any = None  # envbuild.TenantBuilds, made on first use
        self._expirer: asyncio.Task[None] | None = None
        #: the service's own tasks (the expiry loop, each streamed run's work): ended by
        #: :meth:`close` (the app's lifespan end), none outlives the service
        self.tasks = TaskSet()
        #: destroys that must finish even when the request that asked is cancelled
        #: (shielded): :meth:`close` waits for them
        self._cleanups = TaskSet()
        self.draining = False
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.started = time.time()
        self.metrics = m = Metrics()
        m.counter("corral_requests_total", "HTTP requests answered, by route and status")
        m.counter("corral_runs_total", "runs finished (exec, run, snippet, invoke), by kind "
                  "and how they ended")
        m.counter("corral_cancelled_total", "requests whose client went away mid-run")
        m.histogram("corral_request_duration_seconds", "time to answer, by route (a stream: "
                    "until it ends)")
        m.counter("corral_refused_total", "requests refused by a tenant cap, by cap")
        m.counter("corral_sandboxes_created_total", "sandboxes created, by level")
        m.counter("corral_sandboxes_expired_total", "sandboxes the server destroyed at the "
                  "end of their lifetime, by why (idle, lifetime)")
        m.gauge("corral_sandboxes_alive", "live sandboxes, by tenant", lambda: [
            ({"tenant": t.name}, float(len(t.sandboxes))) for t in self.tenants.values()])
        m.gauge("corral_runs_in_flight", "runs in flight, by tenant", lambda: [
            ({"tenant": t.name}, float(t.runs)) for t in self.tenants.values()])
        m.gauge("corral_memory_reserved_mb", "memory counted against tenant caps, MiB",
                lambda: [({"tenant": t.name}, float(t.mem_mb)) for t in self.tenants.values()])
        m.gauge("corral_snippet_pool", "the snippet pool: runs running and queued, warm "
                "slots idle, runs cancelled so far", self._pool_figures)
        m.gauge("corral_draining", "1 while the server drains", lambda: [
            ({}, 1.0 if self.draining else 0.0)])
        m.gauge("corral_uptime_seconds", "seconds since start", lambda: [
            ({}, round(time.time() - self.started, 3))])
        m.gauge("corral_snapshot_bytes", "bytes of snapshots held on disk, by tenant "
                "(providers with a snapshot store: linux)", self._snapshot_figures)

    def _snapshot_figures(self) -> list[tuple[dict[str, str], float]]:
        """Per tenant, the bytes the providers' snapshot stores hold (issue 23 item 7)."""
        stores = [st for p in {id(p): p for p in self.providers.values()}.values()
                  if (st := getattr(p, "snapshots", None)) is not None
                  and callable(getattr(st, "tenant_usage", None))]
        return [({"tenant": t.name}, float(sum(st.tenant_usage(t.name)[0] for st in stores)))
                for t in self.tenants.values()]

    def _pool_figures(self) -> list[tuple[dict[str, str], float]]:
        if self._pool is None:
            return []
        st = self._pool.statistics()
        return [({"state": k}, float(getattr(st, k)))
                for k in ("running", "queued", "idle", "cancelled")]

    # -- life ------------------------------------------------------------------------
    async def start(self) -> None:
        """Make the configured providers (those not passed in)."""
        from corral.providers import get_provider_class
        for lv_name, pname in self.config.levels.items():
            lv = Level(lv_name)
            if lv in self.providers:
                continue
            options = dict(self.config.provider_options.get(pname, {}))
            made: SandboxProvider = get_provider_class(pname)(**options)
            if lv not in made.levels:
                await made.aclose()
                raise LevelNotSupportedError(lv.value, tuple(v.value for v in made.levels),
                                             f"provider {pname!r} does not give it here")
            self.providers[lv] = made
            self._owned.append(made)
        # what a provider found left by an earlier process and removed (linux: cgroups of
        # dead owners); after a clean drain a restart finds none
        reaped = {p.name: list(getattr(p, "reaped_orphans", ())) for p in self._owned}
        self.log.event("providers", levels={lv.value: p.name for lv, p in self.providers.items()},
                       reaped_orphans=reaped)
        self._expirer = self.tasks.spawn(self._expire_loop())

    async def close(self) -> None:
        """Drain: refuse new work, wait (bounded) for in-flight work to unwind, destroy
        every sandbox, close the snippet pool and the providers this service made."""
        self.draining = True
        await settle([self._expirer])
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_UNWIND_S):
                await self._idle.wait()
        await self.tasks.aclose()  # what still runs past the unwind time is cancelled
        await self._cleanups.drain()
        entries = [e for t in self.tenants.values() for e in t.sandboxes.values()]
        for t in self.tenants.values():
            t.sandboxes.clear()
        await asyncio.gather(*(self._destroy_entry(e) for e in entries), return_exceptions=True)
        if self._env_builds is not None:
            await self._env_builds.aclose()
        for pool in [self._pool, *self._env_pools.values()]:
            if pool is not None:
                with contextlib.suppress(Exception):
                    await pool.aclose()
        self._env_pools.clear()
        for p in self._owned:
            with contextlib.suppress(Exception):
                await p.aclose()
        self._owned.clear()
        await self.tasks.aclose()  # anything spawned while the sandboxes went
        self.log.event("drained", sandboxes_destroyed=len(entries))

    async def shielded(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` run to its end even if the caller is cancelled meanwhile (a destroy:
        never half of one), as a task the service owns (:meth:`close` waits for it)."""
        return await asyncio.shield(self._cleanups.spawn(work))

    @contextlib.contextmanager
    def operation(self) -> Any:
        """Count one request's work in flight (close() waits for it to unwind); refuses
        with 503 while draining."""
        self._enter_op()
        try:
            yield
        finally:
            self._exit_op()

    def _enter_op(self) -> None:
        if self.draining:
            raise ApiError("unavailable", "the server is draining (shutting down)")
        self._active += 1
        self._idle.clear()

    def _exit_op(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    # -- tenants and lookups -----------------------------------------------------------
    def authenticate(self, token: str) -> TenantState | None:
        found = None
        for t in self.tenants.values():  # every digest compared: no early exit to time
            if t.config.matches(token):
                found = t
        return found

    def provider_for(self, level: Level) -> SandboxProvider:
        p = self.providers.get(level)
        if p is None:
            raise LevelNotSupportedError(
                level.value, tuple(sorted(lv.value for lv in self.providers)),
                "this server does not offer it")
        return p

    def info(self, tenant: TenantState) -> dict[str, Any]:
        from corral import __version__
        c = tenant.config
        return {
            "version": __version__, "api": wire.API_PREFIX, "tenant": tenant.name,
            "levels": sorted(lv.value for lv in self.providers
                             if lv in tenant.config.policy.levels),
            "providers": {lv.value: {"name": p.name,
                                     "capabilities": sorted(p.capabilities)}
                          for lv, p in self.providers.items()
                          if lv in tenant.config.policy.levels},
            # the levels offered to this tenant that are not a security boundary: their
            # commands run as the server's user, on its network (docs/service.md)
            "not_boundaries": tenant.ceiling["not_boundaries"],
            "ceiling": tenant.ceiling,
            "caps": {"max_sandboxes": c.max_sandboxes, "max_runs": c.max_runs,
                     "max_memory_mb": c.max_memory_mb, "max_processes": c.max_processes},
            "usage": {"sandboxes": tenant.sandbox_count, "runs": tenant.runs,
                      "memory_mb": tenant.mem_mb},
            "max_body_bytes": self.config.max_body_bytes,
            "default_sandbox_mem_mb": self.config.default_sandbox_mem_mb,
        }

    def entry(self, tenant: TenantState, sandbox_id: str, *, touch: bool = False
              ) -> SandboxEntry:
        """The tenant's sandbox (404 otherwise). ``touch``: this request uses it (its
        idle time starts again); looking at it (GET, a list) does not."""
        e = tenant.sandboxes.get(sandbox_id)
        if e is None:
            raise ApiError("not-found", "no such sandbox", what="sandbox")
        if touch:
            e.touch()
        return e

    def process(self, tenant: TenantState, sandbox_id: str, pid: str) -> ProcessEntry:
        p = self.entry(tenant, sandbox_id, touch=True).processes.get(pid)
        if p is None:
            raise ApiError("not-found", "no such process", what="process")
        return p

    def check_image(self, spec: SandboxSpec) -> None:
        """``spec.image`` is a path on this host: only one under ``image_roots`` (after
        symlinks are resolved) is taken, so a tenant cannot name any host directory."""
        if spec.image is None:
            return
        real = os.path.realpath(spec.image)
        for root in self.config.image_roots:
            r = os.path.realpath(root)
            if real == r or real.startswith(r.rstrip("/") + "/"):
                return
        raise ConfigInvalidError("image", "this server takes images only under its "
                                 "image_roots" if self.config.image_roots else
                                 "this server takes no images (image_roots is empty)")

    def _mem(self, spec: SandboxSpec) -> int:
        """What a sandbox counts against ``max_memory_mb``: its memory limit as applied
        (after the tenant's default, :meth:`admit`), or at a level enforcing none the
        server's ``default_sandbox_mem_mb``."""
        return spec.limits.mem_mb or self.config.default_sandbox_mem_mb

    # -- the tenant's ceiling (corral.serve.tenancy) -------------------------------------
    def admit(self, tenant: TenantState, spec: SandboxSpec) -> SandboxSpec:
        """``spec`` within the tenant's ceiling (level, network, limits), its unset limits
        given the tenant's defaults: what the provider is asked to enforce and the caps
        count. Refused before anything runs (a typed error, counted by
        ``corral_refused_total{cap=...}``)."""
        try:
            own = self.own_environment(tenant, spec.environment)
            if own is None:
                return tenancy.admit_spec(tenant.config.policy, spec,
                                          host_address=_is_host_address)
            # the tenant's own environment (envbuild): its name in the shared store
            return dataclasses.replace(tenancy.admit_spec(
                tenant.config.policy, dataclasses.replace(spec, environment=None),
                host_address=_is_host_address), environment=own)
        except CorralError as e:
            self._refused(e, "ceiling")
            raise

    def _admitted(self, tenant: TenantState, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(tenant.config.policy, *args)
        except CorralError as e:
            self._refused(e, "ceiling")
            raise

    async def _expire_loop(self) -> None:
        """Destroy the sandboxes past their lifetime (idle or too old): they stop
        counting against the tenant's caps the moment they are taken out."""
        while True:
            await asyncio.sleep(_EXPIRE_EVERY_S)
            now = time.time()
            gone: list[Any] = []
            for t in self.tenants.values():
                for sid, e in list(t.sandboxes.items()):
                    if e.expired(now):
                        assert e.lifetime is not None
                        why = ("lifetime" if now >= e.created + e.lifetime.max_lifetime_s
                               else "idle")
                        self.metrics.inc("corral_sandboxes_expired_total", why=why)
                        self.log.event("sandbox-expired", tenant=t.name, id=sid, why=why)
                        gone.append(self.destroy(t, sid))  # out of its caps at once
            if gone:
                for r in await asyncio.gather(*gone, return_exceptions=True):
                    if isinstance(r, Exception):
                        self.log.event("destroy-failed", sev="error", error=repr(r))

    def _refused(self, err: CorralError, default: str | None = None) -> None:
        cap = getattr(err, "cap", default)
        if cap is not None:
            self.metrics.inc("corral_refused_total", cap=cap)

    @contextlib.contextmanager
    def _slot(self, cm: Any) -> Any:
        """Hold a cap slot while the block runs. The release is also offered to the
        request (:data:`EARLY_RELEASE`), which calls it the moment its client goes away:
        the slot is free at once, while the cancelled run is still being killed."""
        try:
            cm.__enter__()
        except CorralError as e:
            self._refused(e)
            raise
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                cm.__exit__(None, None, None)

        early = EARLY_RELEASE.get()
        if early is not None:
            early.append(release)
        try:
            yield
        finally:
            release()

    def run_slot(self, tenant: TenantState) -> Any:
        """One run in flight for ``tenant`` while the block runs (refused at max_runs)."""
        return self._slot(tenant.run_slot())

    def sandbox_slot(self, tenant: TenantState, mem_mb: int) -> Any:
        """Room for one more sandbox of ``mem_mb`` while the block runs."""
        return self._slot(tenant.sandbox_slot(mem_mb))

    # -- sandboxes -----------------------------------------------------------------------
    async def create(self, tenant: TenantState, spec: SandboxSpec,
                     client_id: str | None = None, *, idle_timeout_s: object = None,
                     max_lifetime_s: object = None) -> SandboxEntry:
        """Create a sandbox for ``tenant`` (its ``tenant_id`` is the tenant's name).

        ``client_id``: an id the client chose, so it can destroy the sandbox even when
        the answer to this request never reaches it (a cancelled create). A create
        whose id was destroyed meanwhile is rolled back (CreateCancelledError).
        ``idle_timeout_s`` / ``max_lifetime_s``: within the tenant's maxima (its defaults
        when None); the server destroys the sandbox when either passes."""
        if client_id is not None:
            if not _CLIENT_ID.fullmatch(client_id):
                raise ConfigInvalidError("id", "must be 16-80 of [A-Za-z0-9_-]")
            if client_id in tenant.sandboxes:
                raise ConfigInvalidError("id", "a sandbox with this id exists")
            if client_id in tenant.tombstones:
                raise CreateCancelledError("the sandbox was destroyed before it was created")
        spec = self.admit(tenant, spec)
        life = self._admitted(tenant, tenancy.admit_lifetime, idle_timeout_s, max_lifetime_s)
        provider = self.provider_for(spec.level)
        self.check_image(spec)
        mem = self._mem(spec)
        with self.sandbox_slot(tenant, mem):
            sb = await provider.create(spec)
            sid = client_id or new_id("sb")
            if sid in tenant.tombstones:  # its DELETE came while it was being made
                await self.shielded(self._destroy_sandbox(sb))
                raise CreateCancelledError("the sandbox was destroyed while being created")
            entry = SandboxEntry(id=sid, sandbox=sb, level=spec.level.value,
                                 provider=provider.name, mem_mb=mem, lifetime=life)
            tenant.sandboxes[sid] = entry
        self.metrics.inc("corral_sandboxes_created_total", level=spec.level.value)
        self.log.event("sandbox-created", tenant=tenant.name, id=sid, level=spec.level.value)
        return entry

    async def _destroy_sandbox(self, sb: Sandbox) -> None:
        try:
            await sb.destroy()
        except Exception as e:
            self.log.event("destroy-failed", sev="error", error=repr(e))

    async def _destroy_entry(self, entry: SandboxEntry) -> None:
        procs = list(entry.processes.values())
        entry.processes.clear()
        await asyncio.gather(*(p.close() for p in procs), return_exceptions=True)
        await self._destroy_sandbox(entry.sandbox)

    async def destroy(self, tenant: TenantState, sandbox_id: str) -> bool:
        """Destroy a sandbox; idempotent (an unknown id is remembered, so a create of it
        still in flight is rolled back). Whether it existed."""
        tenant.bury(sandbox_id)
        entry = tenant.sandboxes.pop(sandbox_id, None)
        if entry is None:
            return False
        await self.shielded(self._destroy_entry(entry))
        self.log.event("sandbox-destroyed", tenant=tenant.name, id=sandbox_id)
        return True

    def _count_run(self, kind: str, result: RunResult | None, err: BaseException | None
                   ) -> None:
        if isinstance(err, asyncio.CancelledError):
            how = "cancelled"
        elif err is not None:
            how = str(getattr(err, "code", "error"))
        else:
            how = str(result.outcome) if result is not None else "ok"
        self.metrics.inc("corral_runs_total", kind=kind, outcome=how)

    async def exec(self, tenant: TenantState, sandbox_id: str, argv: Sequence[str],
                   opts: ExecOpts) -> RunResult:
        entry = self.entry(tenant, sandbox_id)
        opts = self._admitted(tenant, tenancy.admit_exec, opts)
        with self.run_slot(tenant), entry.in_use():
            try:
                r = await _leveled(_when_running(entry, opts, entry.sandbox.exec(argv, opts)),
                                   entry.sandbox.spec.level)
            except BaseException as e:
                self._count_run("exec", None, e)
                raise
            self._count_run("exec", r, None)
            return r

    def exec_stream(self, tenant: TenantState, sandbox_id: str, argv: Sequence[str],
                    opts: ExecOpts) -> RunStream:
        """Take the run slot now (a refusal is an HTTP status), and return the events of
        the run: ``output`` events as the output arrives, then ``result`` or ``error``."""
        entry = self.entry(tenant, sandbox_id)
        opts = self._admitted(tenant, tenancy.admit_exec, opts)
        sb = entry.sandbox

        async def run(on_output: Callable[[int, bytes], None]) -> RunResult:
            with entry.in_use():
                return await _leveled(_when_running(entry, opts, _exec_with(
                    sb, argv, opts, on_output)), sb.spec.level)

        return self._streamed(tenant, "exec", run)

    def _streamed(self, tenant: TenantState, kind: str,
                  run: Callable[[Callable[[int, bytes], None]], Any],
                  releases: list[Callable[[], None]] | None = None) -> RunStream:
        releases = releases if releases is not None else []
        slot = self.run_slot(tenant)
        try:
            self._enter_op()  # a stream outlives its request handler: close() waits for it
            releases.append(self._exit_op)
            slot.__enter__()  # refuses (LimitsExceededError) before any byte is sent
        except BaseException:
            for r in reversed(releases):
                r()
            raise
        releases.append(lambda: _exit(slot))

        async def events() -> AsyncIterator[Event]:
            q: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()

            async def go() -> RunResult:
                try:
                    return await run(lambda fd, chunk: q.put_nowait((fd, bytes(chunk))))  # type: ignore[no-any-return]
                finally:
                    q.put_nowait(None)

            task = self.tasks.spawn(go())  # owned by the service too: ended at close
            try:
                while (item := await q.get()) is not None:
                    yield _output_event(*item)
                try:
                    result = await task
                except CorralError as e:
                    self._count_run(kind, None, e)
                    yield {"event": "error", "status": e.http_status,
                           "error": wire.error_to_json(e)}
                else:
                    self._count_run(kind, result, None)
                    yield {"event": "result", "result": wire.result_to_json(result)}
            finally:
                if not task.done():
                    self._count_run(kind, None, asyncio.CancelledError())
                await settle([task])

        return RunStream(events, releases)

    async def write_file(self, tenant: TenantState, sandbox_id: str, path: str,
                         data: bytes) -> None:
        entry = self.entry(tenant, sandbox_id)
        with entry.in_use():
            await entry.sandbox.write_file(path, data)

    async def read_file(self, tenant: TenantState, sandbox_id: str, path: str) -> bytes:
        entry = self.entry(tenant, sandbox_id)
        with entry.in_use():
            return await entry.sandbox.read_file(path)

    async def start_process(self, tenant: TenantState, sandbox_id: str, argv: Sequence[str],
                            opts: ProcessOpts) -> ProcessEntry:
        entry = self.entry(tenant, sandbox_id, touch=True)
        opts = self._admitted(tenant, tenancy.admit_process, opts)
        entry.prune()
        try:
            tenant.check_processes(entry)
        except CorralError as e:
            self._refused(e)
            raise
        handle = await entry.sandbox.start_process(argv, opts)
        proc = ProcessEntry(id=new_id("p"), handle=handle)
        proc.start_pumps()
        entry.processes[proc.id] = proc
        return proc

    async def lifecycle(self, tenant: TenantState, sandbox_id: str, op: str,
                        handle: SnapshotHandle | None = None) -> dict[str, Any] | None:
        """pause / resume / snapshot / restore, through the contract's functions (which
        raise the matching not-supported error where the provider has none). A handle is
        restored only into a sandbox of the tenant whose sandbox made it."""
        entry = self.entry(tenant, sandbox_id, touch=True)
        sb = entry.sandbox
        if op == "pause":
            await pause(sb)
            entry.running.clear()
        elif op == "resume":
            await resume(sb)
            entry.running.set()
        elif op == "snapshot":
            h = await snapshot(sb)
            tenant.handles.add(_handle_key(h))
            return wire.handle_to_json(h)
        elif op == "restore":
            assert handle is not None
            if _handle_key(handle) not in tenant.handles:
                raise InvalidSnapshotHandleError(
                    "not a snapshot handle this tenant's sandboxes made (or it was changed)")
            await restore(sb, handle)
        return None

    # -- runs, snippets, invokes ---------------------------------------------------------
    def _run_spec(self, tenant: TenantState, level: Level, limits: SandboxLimits,
                  network: NetworkPolicy | None, environment: str | None = None
                  ) -> SandboxSpec:
        if network is None:  # context-isolated shares the host network by definition
            network = (NetworkPolicy.unrestricted() if level == Level.CONTEXT_ISOLATED
                       else NetworkPolicy.none())
        return SandboxSpec(tenant_id=tenant.name, run_id=new_id("run"), level=level,
                           limits=limits, network=network, environment=environment)

    def run_stream(self, tenant: TenantState, level: Level, limits: SandboxLimits,
                   network: NetworkPolicy | None, argv: Sequence[str], opts: ExecOpts,
                   files: Mapping[str, bytes], environment: str | None = None) -> RunStream:
        """One bounded command in a fresh sandbox at ``level``, destroyed after it: the
        events of the run (``output``..., then ``result``, whatever the outcome, or
        ``error`` when it could not run). Caps are taken now. ``environment``: one the
        operator lists for the tenant, or one it built (refused otherwise)."""
        spec = self.admit(tenant, self._run_spec(tenant, level, limits, network,
                                                 environment))
        opts = self._admitted(tenant, tenancy.admit_exec, opts)
        provider = self.provider_for(level)
        mem = self._mem(spec)
        box = self.sandbox_slot(tenant, mem)
        box.__enter__()
        return self._streamed(tenant, "run", lambda on_output: _one_run(
            provider, spec, argv, opts, files, on_output, self.shielded),
            [lambda: _exit(box)])

    # -- environments (docs/environments.md, "Over the service") ---------------------------
    @property
    def env_builds(self) -> Any:
        """The tenants' builds (:class:`corral.serve.envbuild.TenantBuilds`) on the store
        the strict level's provider reads (``[provider_options.linux] env_store_dir``, or
        its provider's table when another serves strict)."""
        if self._env_builds is None:
            from corral.envs.store import EnvStore
            from corral.serve.envbuild import TenantBuilds
            strict = self.config.levels.get(Level.STRICT.value, "linux")
            root = self.config.provider_options.get(strict, {}).get("env_store_dir")
            self._env_builds = TenantBuilds(EnvStore(root))
        return self._env_builds

    def own_environment(self, tenant: TenantState, name: str | None) -> str | None:
        """The store name of ``name`` when it is one the tenant built (and not one the
        operator lists for it, which is used as named); None otherwise."""
        policy = tenant.config.policy
        if name is None or name in policy.environments or policy.env_build is None:
            return None
        ref: str | None = self.env_builds.resolve(tenant.name, name)
        return ref

    def _environment(self, tenant: TenantState, name: str) -> Any:
        """The built environment ``name`` as the tenant may use it (listed by the
        operator, or its own), from the server's store; ConfigInvalidError (field
        ``environment``) otherwise."""
        try:
            ref = self.own_environment(tenant, name)
            if ref is None:
                tenancy.check_environment(tenant.config.policy, name)
                ref = name
            return self.env_builds.store.get(ref)
        except CorralError as e:
            self._refused(e, "ceiling")
            raise

    def _env_pool(self, env: Any) -> Any:
        pool = self._env_pools.get(env.digest)
        if pool is None:
            from corral.snippets import SnippetPool
            from corral.snippets.host.runner import env_preload
            strict: dict[Level | str, SandboxProvider] = {
                Level.STRICT: self.provider_for(Level.STRICT)}
            pool = self._env_pools[env.digest] = SnippetPool(
                providers=strict, max_workers=self.config.snippet_workers,
                environment=env.digest, preload=env_preload(env.modules), spares=0)
        return pool

    def build_environment(self, tenant: TenantState, name: object, requirements: object,
                          timeout_s: object = None) -> dict[str, Any]:
        """Start a build of the tenant's own environment (202): its state as JSON."""
        right = tenant.config.policy.env_build
        if right is None:
            raise ApiError("forbidden", f"tenant {tenant.name!r} may not build environments "
                           "(the operator grants it: [tenants.env_build])", what="env_build")
        from corral.serve.envbuild import Busy
        try:
            return dict(self.env_builds.start(
                tenant.name, right, name, requirements, timeout_s=timeout_s,
                provider=self.provider_for(Level.STRICT),
                listed=tenant.config.policy.environments))
        except Busy as e:
            self.metrics.inc("corral_refused_total", cap="env_builds")
            raise ApiError("too-many-requests", str(e), what="env_build") from None
        except CorralError as e:
            self._refused(e)
            raise

    def environments(self, tenant: TenantState) -> list[dict[str, Any]]:
        """The environments the tenant may name: the operator's, then its own."""
        return list(self.env_builds.listing(tenant.name,
                                            sorted(tenant.config.policy.environments)))

    def environment_info(self, tenant: TenantState, name: str) -> dict[str, Any]:
        for doc in self.environments(tenant):
            if doc["name"] == name:
                return dict(doc)
        raise ApiError("not-found", "no such environment", what="environment")

    async def remove_environment(self, tenant: TenantState, name: str) -> None:
        """Remove the tenant's own environment ``name``: the service's warm snippet pool
        of it is closed first (its sandboxes hold it); one the tenant's live sandbox or
        session still uses is a 409 ``conflict`` (the store never removes an environment
        from under a sandbox)."""
        from corral.serve.envbuild import Busy
        if name in tenant.config.policy.environments:
            raise ApiError("forbidden", "an environment the operator lists is the "
                           "operator's to remove", what="environment")
        sname = self.env_builds.resolve(tenant.name, name)
        if sname is not None:
            digest = self.env_builds.own(tenant.name).get(name)
            pool = self._env_pools.pop(digest, None) if digest else None
            if pool is not None:
                await pool.aclose()
        try:
            gone = self.env_builds.remove(tenant.name, name)
        except Busy as e:
            raise ApiError("conflict", str(e), what="environment") from None
        except ConfigInvalidError as e:  # in use by a live sandbox
            raise ApiError("conflict", e.message, what="environment") from None
        if not gone:
            raise ApiError("not-found", "no such environment", what="environment")

    def _snippet_pool(self) -> Any:
        if self._pool is None:
            from corral.snippets import SnippetPool
            levels: dict[Level | str, SandboxProvider] = {
                lv: p for lv, p in self.providers.items() if lv in _SNIPPET_LEVELS}
            self._pool = SnippetPool(providers=levels, max_workers=self.config.snippet_workers)
        return self._pool

    async def snippet(self, tenant: TenantState, *, source: str | None, files: Any,
                      timeout_ms: int, level: Level | None,
                      on_log: Callable[[LogLine], None] | None = None,
                      environment: str | None = None) -> dict[str, Any]:
        """Validate and run a snippet in the service's pool; its transcript as JSON.
        ``on_log`` gets each log line as the snippet writes it (on this loop).
        ``environment``: one the tenant may use (strict only), run in a pool of its own."""
        from corral.snippets import run_snippet
        offered = tenant.config.policy.levels
        env = None
        if environment is not None:
            env = self._environment(tenant, environment)
            if level is not None and level != Level.STRICT:
                raise LevelNotSupportedError(level.value, ("strict",), "an environment is "
                                             "shown at strict only", field="environment")
            level = Level.STRICT
        if level is not None:
            self._admitted(tenant, tenancy.check_level, level)
        self._admitted(tenant, tenancy.admit_timeout, timeout_ms)  # within its maximum
        lv = level or next((x for x in _SNIPPET_LEVELS if x in self.providers
                            and x in offered), None)
        if lv is None or lv not in self.providers:
            raise LevelNotSupportedError((level or Level.STRICT).value,
                                         tuple(sorted(x.value for x in self.providers)),
                                         "this server offers no snippet level")
        with self.run_slot(tenant):
            try:
                t = await run_snippet(source, files=files, timeout_ms=timeout_ms, level=lv,
                                      tenant_id=tenant.name, on_log=on_log,
                                      pool=self._snippet_pool() if env is None
                                      else self._env_pool(env), environment=env)
            except BaseException as e:
                self._count_run("snippet", None, e)
                raise
            outcome = ("rejected" if t.rejected else "timeout" if t.timed_out
                       else "ok" if t.ok else "error")
            self.metrics.inc("corral_runs_total", kind="snippet", outcome=outcome)
            return t.to_dict()

    async def invoke(self, tenant: TenantState, sandbox_id: str | None, spec: SandboxSpec | None,
                     ref: HandlerRef, payload: Any, *, mode: str | None,
                     resumed: Mapping[str, Any] | None, files: Mapping[str, bytes] | None,
                     timeout_ms: int | None) -> dict[str, Any]:
        """Handler dispatch: in the tenant's sandbox ``sandbox_id`` (``invoke_in``), or in
        a fresh sandbox for ``spec`` (``invoke``). Mode ``in-context`` (the handler in
        the server's own process) is refused."""
        from corral.dispatch import DEFAULT_INVOKE_TIMEOUT_MS, invoke, invoke_in
        the_mode = mode if mode is not None else (spec.mode if spec is not None else None)
        if the_mode is not None and InvocationMode(the_mode) == InvocationMode.IN_CONTEXT:
            raise ConfigInvalidError("mode", "in-context runs the handler in the server's "
                                     "process; the service refuses it")
        if spec is not None:
            spec = self.admit(tenant, spec)
        if timeout_ms is None:  # dispatch's own default, within the tenant's maximum
            most = tenant.config.policy.limits["timeout_ms"].maximum
            timeout_ms = min(DEFAULT_INVOKE_TIMEOUT_MS, most or DEFAULT_INVOKE_TIMEOUT_MS)
        timeout_ms = self._admitted(tenant, tenancy.admit_timeout, timeout_ms)
        kw: dict[str, Any] = dict(resumed=resumed, files=files, timeout_ms=timeout_ms)
        level = (spec.level if spec is not None
                 else self.entry(tenant, sandbox_id or "").sandbox.spec.level)
        with self.run_slot(tenant):
            try:
                if sandbox_id is not None:
                    entry = self.entry(tenant, sandbox_id)
                    if the_mode is None and entry.sandbox.spec.mode == InvocationMode.IN_CONTEXT:
                        raise ConfigInvalidError("mode", "in-context is refused by the service")
                    with entry.in_use():
                        reply = await invoke_in(entry.sandbox, ref, payload, mode=the_mode,
                                                **kw)
                else:
                    assert spec is not None
                    self.check_image(spec)
                    with self.sandbox_slot(tenant, self._mem(spec)):
                        reply = await invoke(self.provider_for(spec.level), spec, ref, payload,
                                             **kw)
            except SandboxTimeoutError as e:  # the handler ran, and ended by its timeout
                self._count_run("invoke", None, e)
                return {"kind": "ended", "result": wire.result_to_json(_timed_out(e, level))}
            except BaseException as e:
                self._count_run("invoke", None, e)
                raise
        self.metrics.inc("corral_runs_total", kind="invoke", outcome=reply.kind)
        if reply.kind == "output":
            return {"kind": "output", "value": reply.value}
        return {"kind": "suspended", "token_id": reply.token_id}


def _timed_out(err: SandboxTimeoutError, level: Level) -> RunResult:
    """How a handler that ran past its timeout ended, as a result (the one rule: a run
    that ran answers its outcome, docs/errors.md)."""
    if err.result is not None:
        return err.result.at_level(level)
    return RunResult(outcome=Outcome.TIMEOUT, limit_value=err.timeout_ms,
                     stdout=bytes(err.stdout or b""), stderr=bytes(err.stderr or b""),
                     detail=str(err), level=level.value)


def _exit(cm: Any) -> None:
    cm.__exit__(None, None, None)


def _output_event(fd: int, chunk: bytes) -> Event:
    ev: Event = {"event": "output", "fd": fd}
    try:
        ev["text"] = chunk.decode("utf-8")
    except UnicodeDecodeError:
        ev["b64"] = wire.b64(chunk)
    return ev


async def _when_running(entry: SandboxEntry, opts: ExecOpts,
                        work: Coroutine[Any, Any, RunResult]) -> RunResult:
    """``work`` (an exec) once the sandbox runs: an exec sent to a paused sandbox waits
    for its resume within its own ``timeout_ms`` (the command cannot start while every
    process is frozen), and past it ends as a ``timeout`` result that never started."""
    if entry.running.is_set() or opts.timeout_ms is None:
        return await work
    try:
        async with asyncio.timeout(opts.timeout_ms / 1000):
            await entry.running.wait()
    except TimeoutError:
        work.close()
        return RunResult(outcome=Outcome.TIMEOUT, limit_value=opts.timeout_ms,
                         detail=f"the sandbox stayed paused for the command's whole "
                         f"timeout ({opts.timeout_ms} ms): it never started")
    return await work


async def _leveled(work: Awaitable[RunResult], level: Level) -> RunResult:
    """``work``'s result, or the result its error carries, saying at which level it ran."""
    try:
        return (await work).at_level(level)
    except CorralError as e:
        if e.result is not None:
            e.result = e.result.at_level(level)
        raise


async def _exec_with(sb: Sandbox, argv: Sequence[str], opts: ExecOpts,
                     on_output: Callable[[int, bytes], None]) -> RunResult:
    """exec, streaming where the sandbox can (``streaming-exec``); elsewhere the output
    is sent when the command ends. A non-exit outcome raises its error, as exec does."""
    if isinstance(sb, SupportsStreamingExec):
        return await sb.exec_streaming(argv, opts, on_output=on_output)
    r = await sb.exec(argv, opts)
    for fd, data in ((1, r.stdout), (2, r.stderr)):
        if data:
            on_output(fd, data)
    return r


async def _one_run(provider: SandboxProvider, spec: SandboxSpec, argv: Sequence[str],
                   opts: ExecOpts, files: Mapping[str, bytes],
                   on_output: Callable[[int, bytes], None],
                   shielded: Callable[[Coroutine[Any, Any, None]], Awaitable[None]]
                   ) -> RunResult:
    """A fresh sandbox, the files written, the command run, the sandbox destroyed (by
    ``shielded``: the service owns that destroy, so a cancelled run still finishes it and
    :meth:`Service.close` waits for it). A run that ended otherwise than by exiting is
    returned as its value (as ``run_strict``)."""
    sb = await provider.create(spec)
    try:
        for path, data in files.items():
            await sb.write_file(path, data)
        try:
            return await _leveled(_exec_with(sb, argv, opts, on_output), spec.level)
        except CorralError as e:
            if e.result is not None:
                return e.result
            raise
    finally:
        await shielded(sb.destroy())

