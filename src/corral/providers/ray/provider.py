"""RayProvider: strict sandboxes placed across a Ray cluster, one node actor per node.

The driver side. Each alive node gets one :class:`~corral.providers.ray.node.NodeHost`
actor (detached and named per node, so every driver shares it); ``create`` ranks the
nodes (:mod:`.placement`), reserves the sandbox's memory as Ray's ``memory`` resource
on the chosen node (a one-bundle placement group pinned there by the node's
``node:<ip>`` resource), and asks that node's actor to build the sandbox. The
:class:`RaySandbox` the caller gets forwards every contract method to that actor over
the actor's data channel (:mod:`._channel`: a direct, authenticated TCP connection to
the node, opened once per node; a Ray actor call costs milliseconds, a channel call a
fraction of one). Ray carries placement, creation, leases and node reports.

Faults: a call to a node that died fails with :class:`ProviderError` naming the node
as soon as its channel breaks (the actor's process died: at once), or Ray reports the
node dead (the watcher looks every second), whichever comes first (the node-loss test
measures it); the node is then left out of placement until Ray reports a node alive
there again, which is attached afresh. The provider's *lease* on its sandboxes is
renewed while it lives; a node actor destroys the sandboxes of a lease that expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, final

from corral.core.cancel import CancelToken
from corral.core.contract import OutputSink, ProcessHandle, ProcessStdin, Sandbox, SandboxProvider
from corral.core.errors import (
    ConfigInvalidError,
    CreateCancelledError,
    LevelNotSupportedError,
    ProviderError,
)
from corral.core.result import RunResult
from corral.core.spec import ExecOpts, Level, ProcessOpts, SandboxSpec, SnapshotHandle
from corral.core.tasks import TaskSet, settle
from corral.providers.ray import _wire
from corral.providers.ray._channel import Channel, ChannelBroken
from corral.providers.ray.placement import NodeView, no_candidate, rank, reserve_mb

__all__ = ["NodeRef", "RayProcess", "RayProvider", "RaySandbox"]

T = TypeVar("T")

NAMESPACE = "corral"
#: the capabilities a RaySandbox can forward
_FORWARDED = frozenset({"strict", "streaming", "streaming-exec", "warm-fork", "snapshot",
                        "restore", "pause", "process-count"})
_MIB = 1024 * 1024


def _ray() -> Any:
    try:
        import ray  # type: ignore[import-untyped,unused-ignore]
    except ImportError as e:
        raise ProviderError("the ray provider needs Ray: pip install corral[ray]", e) from e
    return ray


@dataclass(slots=True, eq=False)
class NodeRef:
    """One node as the driver sees it: its actor, its last report, whether it is lost."""

    node_id: str
    address: str
    actor: Any
    view: NodeView
    chan: Channel
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    placed: int = 0
    tenants: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"node {self.address} ({self.node_id[:12]})"

    def mark_lost(self, why: str = "lost") -> None:
        """The node is lost: every call in flight to it fails now, and every later one."""
        self.lost.set()
        self.chan.break_(f"{self.name} was {why}")


def _node_name(node_id: str, address: str) -> str:
    return f"node {address} ({node_id[:12]})"


def _channel(node_id: str, address: str, reply: Any) -> Channel:
    host, port, secret = _wire.unwrap(reply)
    return Channel(str(host), int(port), bytes(secret), name=_node_name(node_id, address))


def _view(info: dict[str, Any], address: str, free_mem_mb: float | None) -> NodeView:
    return NodeView(node_id=info["node_id"], address=address, levels=frozenset(info["levels"]),
                    why_not=info.get("why_not", ""), limits=frozenset(info["limits"]),
                    default_mem_mb=info.get("default_mem_mb"),
                    capabilities=frozenset(info["capabilities"]), free_mem_mb=free_mem_mb,
                    spares=int(info.get("spares", 0)), live=int(info.get("live", 0)),
                    tenants=dict(info.get("tenants", {})))


@contextlib.contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """``ray.init`` (in the main thread) installs its own SIGTERM handler, which raises
    SystemExit wherever the main thread is: in a host that handles SIGTERM itself
    (``corral serve`` drains) that would cut a response short and skip the drain. A
    Python handler the host installed is put back; with none (the default action),
    Ray's stays."""
    import signal
    import threading
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and callable(before):
            signal.signal(signal.SIGTERM, before)


@final
class RayProvider(SandboxProvider):
    """Level ``strict`` on every node of a Ray cluster that can enforce it.

    Args:
        address: the cluster (``"127.0.0.2:6379"``, ``"auto"``); ignored when this
            process is connected to Ray already. Default: ``RAY_ADDRESS`` or ``"auto"``.
        lease_s: how long a node keeps this provider's sandboxes after its last renewal
            (renewed every third of it); a dead driver's sandboxes go after about this.
        spares: warm spares each node's strict provider keeps (set when its actor is
            first made; shared by every driver).
        reserve_memory: reserve each sandbox's memory limit (or the node's default) as
            Ray's ``memory`` resource on its node, so Ray's other work and other
            sandboxes cannot be given it.
        poll_s: how long one poll for a process's output waits on the node.
        linger_s: once a process has output, how long the node waits more for its end
            before answering the poll (a short run then costs one round trip, not one per
            chunk; a long-running process's output is that much later).
        node_resource: when set, only nodes offering this custom Ray resource (``ray start
            --resources='{"corral": 1}'``) get sandboxes: keeps them off the head, or to a
            pool of nodes; its amount is not consumed.
        init_kwargs: more arguments for ``ray.init`` when this provider connects.

    A Ray error from a node (its actor or node died) becomes :class:`ProviderError`
    naming the node; a spec no node can take gets the refusal a single provider would
    give (:func:`~corral.providers.ray.placement.no_candidate`).
    """

    name = "ray"
    levels: frozenset[Level] = frozenset({Level.STRICT})

    def __init__(self, *, address: str | None = None, lease_s: float = 30.0, spares: int = 1,
                 reserve_memory: bool = True, poll_s: float = 5.0, linger_s: float = 0.01,
                 node_resource: str | None = None,
                 init_kwargs: dict[str, Any] | None = None) -> None:
        if not lease_s > 0:
            raise ConfigInvalidError("lease_s", f"must be > 0, got {lease_s!r}")
        ray = _ray()
        self._owns_ray = False
        if not ray.is_initialized():
            import os
            kw = {"address": address or os.environ.get("RAY_ADDRESS") or "auto",
                  "logging_level": "ERROR", "log_to_driver": False, **(init_kwargs or {})}
            try:
                with _keep_sigterm_handler():
                    ray.init(**kw)
            except Exception as e:
                raise ProviderError(f"cannot connect to Ray at {kw['address']!r}: {e}", e) from e
            self._owns_ray = True
        self.lease_s = float(lease_s)
        self.spares = spares
        self.reserve_memory = reserve_memory
        self.poll_s = poll_s
        self.linger_s = linger_s
        self.node_resource = node_resource
        #: this provider's id on every node: its lease and its sandboxes are under it
        self.owner = f"owner-{uuid.uuid4().hex[:16]}"
        self._nodes: dict[str, NodeRef] = {}
        self._refreshed = 0.0
        self._rlock: asyncio.Lock | None = None
        self._live: set[RaySandbox] = set()
        self._preloads: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        self._renewer: asyncio.Future[None] | None = None
        self._watcher: asyncio.Future[None] | None = None
        #: rollbacks of creates cancelled while a node built them: aclose waits for them
        self._chores = TaskSet()
        self._closed = False
        #: nodes that could not be attached: address -> why
        self.attach_errors: dict[str, str] = {}
        self._refresh_sync()
        caps = [n.view.capabilities for n in self._nodes.values() if "strict" in n.view.levels]
        common = frozenset.intersection(*caps) if caps else frozenset({"strict"})
        #: what every sandbox gets: the capabilities every strict node offers, that a
        #: RaySandbox forwards (a node without one never decides the set's absence alone)
        self.capabilities = frozenset(common & _FORWARDED) | {"strict"}

    # -- nodes ------------------------------------------------------------------------------
    def _alive_nodes(self) -> list[tuple[str, str]]:
        ray = _ray()
        want = self.node_resource
        return [(n["NodeID"], n["NodeManagerAddress"]) for n in ray.nodes()
                if n.get("Alive") and (want is None or n.get("Resources", {}).get(want, 0) > 0)]

    @staticmethod
    def _free_mem() -> dict[str, float]:
        from ray._private import state  # type: ignore[import-untyped,unused-ignore]
        try:
            per = state.available_resources_per_node()  # type: ignore[no-untyped-call,unused-ignore]
        except Exception:  # unknown: placement then skips the check
            return {}
        return {nid: float(r.get("memory", 0.0)) / _MIB for nid, r in per.items()}

    def _actor_for(self, node_id: str) -> Any:
        ray = _ray()
        from ray.util.scheduling_strategies import (  # type: ignore[import-untyped,unused-ignore]
            NodeAffinitySchedulingStrategy,
        )

        from corral.providers.ray.node import NodeHost
        cls = ray.remote(NodeHost)
        return cls.options(
            name=f"corral-node-{node_id}", namespace=NAMESPACE, lifetime="detached",
            get_if_exists=True, num_cpus=0, max_concurrency=1000, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(node_id, spares=self.spares)

    def _refresh_sync(self) -> None:
        """Attach every alive node (blocking: used once, at construction)."""
        ray = _ray()
        alive = self._alive_nodes()
        free = self._free_mem()
        for nid, addr in alive:
            if nid in self._nodes:
                continue
            actor = self._actor_for(nid)
            try:
                info, ch = ray.get([actor.info.remote(), actor.channel.remote()], timeout=120)
                info, chan = _wire.unwrap(info), _channel(nid, addr, ch)
            except Exception as e:  # a node that cannot answer is left out
                self.attach_errors[addr] = f"{type(e).__name__}: {e}"
                continue
            self._nodes[nid] = NodeRef(node_id=nid, address=addr, actor=actor,
                                       view=_view(info, addr, free.get(nid)), chan=chan)
        self._refreshed = time.monotonic()

    async def refresh(self, *, force: bool = False) -> list[NodeRef]:
        """Bring the node list up to date (at most once a second unless ``force``): lost
        nodes are dropped, new ones (a node that came back) attached. Returns the nodes."""
        if not force and time.monotonic() - self._refreshed < 1.0:
            return list(self._nodes.values())  # without waiting for a refresh in progress
        if self._rlock is None:
            self._rlock = asyncio.Lock()
        async with self._rlock:
            if not force and time.monotonic() - self._refreshed < 1.0:
                return list(self._nodes.values())
            alive, free = await asyncio.to_thread(lambda: (self._alive_nodes(), self._free_mem()))
            ids = {nid for nid, _ in alive}
            for nid in [n for n in self._nodes if n not in ids]:
                self._nodes.pop(nid).mark_lost("reported dead by Ray")
            new = [(nid, addr) for nid, addr in alive if nid not in self._nodes]
            actors = {nid: self._actor_for(nid) for nid, _ in new}
            infos = await asyncio.gather(*(_guard(actors[nid].info.remote(), 60.0)
                                           for nid, _ in new), return_exceptions=True)
            chans = await asyncio.gather(*(_guard(actors[nid].channel.remote(), 60.0)
                                           for nid, _ in new), return_exceptions=True)
            for (nid, addr), info, ch in zip(new, infos, chans, strict=True):
                if isinstance(info, BaseException) or isinstance(ch, BaseException):
                    continue
                try:
                    chan = _channel(nid, addr, ch)
                except Exception:  # its channel did not start: left out
                    continue
                ref = NodeRef(node_id=nid, address=addr, actor=actors[nid],
                              view=_view(_wire.unwrap(info), addr, free.get(nid)), chan=chan)
                for modules, entries in self._preloads:
                    with contextlib.suppress(Exception):
                        await self._call(ref, "preload", modules, entries)
                self._nodes[nid] = ref
            for nid, ref in self._nodes.items():
                if nid in free:
                    ref.view = replace(ref.view, free_mem_mb=free[nid])
            self._refreshed = time.monotonic()
            return list(self._nodes.values())

    def nodes(self) -> list[NodeRef]:
        """The nodes attached now (no refresh)."""
        return list(self._nodes.values())

    def node_lost(self, node: NodeRef) -> None:
        """Mark ``node`` lost: its in-flight calls fail, placement leaves it out."""
        node.mark_lost()
        if self._nodes.get(node.node_id) is node:
            del self._nodes[node.node_id]
        self._refreshed = 0.0

    # -- the contract ------------------------------------------------------------------------
    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None
                     ) -> RaySandbox:
        if self._closed:
            raise ProviderError("the provider is closed")
        if not isinstance(spec, SandboxSpec):
            raise ConfigInvalidError("spec", "must be a SandboxSpec")
        if spec.level not in self.levels:
            raise LevelNotSupportedError(spec.level.value,
                                         tuple(sorted(lv.value for lv in self.levels)),
                                         "the ray provider places strict sandboxes only")
        if cancel is not None and cancel.cancelled:
            raise CreateCancelledError(f"create cancelled: {cancel.reason}")
        self._start_renewer()
        nodes = await self.refresh()
        tried: set[str] = set()
        while True:
            cands = [n for n in rank([n.view for n in nodes], spec,
                                     extra_tenant={n.node_id: n.tenants.get(spec.tenant_id, 0)
                                                   for n in nodes},
                                     extra_live={n.node_id: n.placed for n in nodes})
                     if n.node_id not in tried]
            if not cands:
                if tried:
                    raise ProviderError(f"no node could take the sandbox (tried "
                                        f"{len(tried)}: lost or full)")
                raise no_candidate([n.view for n in nodes], spec)
            node = self._nodes.get(cands[0].node_id)
            tried.add(cands[0].node_id)
            if node is None:
                continue
            # counted before the node answers, so concurrent creates spread too
            tenant = spec.tenant_id
            node.placed += 1
            node.tenants[tenant] = node.tenants.get(tenant, 0) + 1
            try:
                sb = await self._create_on(node, spec, cancel)
            except BaseException:
                node.tenants[tenant] = max(0, node.tenants.get(tenant, 1) - 1)
                raise
            finally:
                node.placed -= 1
            if sb is not None:
                return sb
            node.tenants[tenant] = max(0, node.tenants.get(tenant, 1) - 1)
            nodes = await self.refresh(force=True)

    async def _create_on(self, node: NodeRef, spec: SandboxSpec, cancel: CancelToken | None
                         ) -> RaySandbox | None:
        """The sandbox built on ``node``, or None when the node is full or lost (the caller
        tries the next); refusals and cancellation raise."""
        pg = None
        mem = reserve_mb(spec, node.view) if self.reserve_memory else 0
        if mem:
            pg = await self._reserve(node, mem)
            if pg is None:
                return None
        fut = asyncio.ensure_future(_await(node.actor.create.remote(self.owner, self.lease_s,
                                                                     spec)))
        try:
            if cancel is not None:
                waiter = asyncio.ensure_future(cancel.wait_cancelled_async())
                try:
                    await asyncio.wait([fut, waiter], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    await settle([waiter])
            reply = await asyncio.shield(fut)
        except asyncio.CancelledError:
            self._chores.spawn(self._rollback(node, fut, pg))
            raise
        except Exception as e:
            self._unreserve(pg)
            if _is_ray_error(e):
                self.node_lost(node)
                return None
            raise
        try:
            got = _wire.unwrap(reply)
        except Exception:
            self._unreserve(pg)
            raise
        sb = RaySandbox(provider=self, node=node, sid=got["sid"], spec=spec, pg=pg)
        node.view = replace(node.view, spares=int(got.get("spares", 0)),
                            live=int(got.get("live", 0)))
        if cancel is not None and cancel.cancelled:
            await sb.destroy()
            raise CreateCancelledError(f"create cancelled: {cancel.reason}")
        self._live.add(sb)
        return sb

    async def _rollback(self, node: NodeRef, fut: asyncio.Future[Any], pg: Any) -> None:
        try:
            got = _wire.unwrap(await fut)
            await self._call(node, "destroy", got["sid"])
        except Exception:  # nothing was built, or the node is gone
            pass
        finally:
            self._unreserve(pg)

    async def _reserve(self, node: NodeRef, mem_mb: int) -> Any:
        """A placement group holding ``mem_mb`` of ``node``'s memory, or None (no room)."""
        from ray.util.placement_group import (  # type: ignore[import-untyped,unused-ignore]
            placement_group,
        )
        pg = placement_group([{"memory": float(mem_mb * _MIB), f"node:{node.address}": 0.001}],
                             strategy="STRICT_PACK")
        try:
            await asyncio.wait_for(_await(pg.ready()), 2.0)
        except asyncio.CancelledError:
            self._unreserve(pg)
            raise
        except Exception:  # not placeable there now
            self._unreserve(pg)
            return None
        return pg

    @staticmethod
    def _unreserve(pg: Any) -> None:
        if pg is None:
            return
        from ray.util.placement_group import (  # type: ignore[import-untyped,unused-ignore]
            remove_placement_group,
        )
        with contextlib.suppress(Exception):
            remove_placement_group(pg)

    def _forget(self, sb: RaySandbox) -> None:
        if sb in self._live:
            self._live.discard(sb)
            t = sb.node.tenants
            t[sb.spec.tenant_id] = max(0, t.get(sb.spec.tenant_id, 1) - 1)
        self._unreserve(sb.pg)
        sb.pg = None

    async def preload_python(self, modules: Sequence[str], *,
                             fork_entries: Sequence[str] = ()) -> list[str]:
        """``warm-fork`` on every node: each node's provider preloads ``modules`` and
        registers ``fork_entries``; a node attached later gets them too. Returns what some
        node could not load."""
        if self._closed:
            raise ProviderError("the provider is closed")
        mods, ents = tuple(str(m) for m in modules), tuple(str(e) for e in fork_entries)
        self._preloads.append((mods, ents))
        nodes = await self.refresh()
        replies = await asyncio.gather(*(self._call(n, "preload", mods, ents) for n in nodes),
                                       return_exceptions=True)
        missing: set[str] = set()
        for r in replies:
            if isinstance(r, BaseException):
                if isinstance(r, ProviderError):
                    continue
                raise r
            missing.update(r)
        return sorted(missing)

    # -- calls and leases -------------------------------------------------------------------
    async def _call(self, node: NodeRef, method: str, *args: Any) -> Any:
        """Call ``method`` of a node actor over its data channel: the reply's value, its
        error rebuilt, or ProviderError naming the node when the node is lost (its channel
        broke, or Ray reported it dead, before or while this call waited)."""
        if node.lost.is_set():
            raise ProviderError(f"{node.name} was lost")
        try:
            reply = await node.chan.call(method, *args)
        except ChannelBroken as e:
            self.node_lost(node)
            raise ProviderError(f"{node.name} was lost: {e}") from None
        return _wire.unwrap(reply)

    def _start_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.ensure_future(self._renew_loop())
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._watch_loop())

    async def _renew_loop(self) -> None:
        """Renew this provider's lease on every node (all at once) each third of it."""
        while not self._closed:
            await asyncio.gather(*(_guard(n.actor.renew.remote(self.owner, self.lease_s),
                                          self.lease_s / 3)
                                   for n in list(self._nodes.values())),
                                 return_exceptions=True)
            await asyncio.sleep(self.lease_s / 3)

    async def _watch_loop(self) -> None:
        """Once a second, while this provider has sandboxes, look at Ray's node list: a
        node Ray reports dead is marked lost at once (calls in flight there fail even if no
        reply ever comes), a node that came back is attached."""
        while not self._closed:
            if self._live:
                with contextlib.suppress(Exception):
                    await self.refresh(force=True)
            await asyncio.sleep(1.0)

    async def aclose(self) -> None:
        """Destroy this provider's sandboxes on every node and end its lease. Idempotent;
        the node actors and their warm spares stay for other drivers."""
        if self._closed:
            return
        self._closed = True
        for task in (self._renewer, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        for sb in list(self._live):
            with contextlib.suppress(Exception):
                await sb.destroy()
        await self._chores.drain()
        await asyncio.gather(*(_guard(n.actor.release.remote(self.owner), 10.0)
                               for n in self._nodes.values()), return_exceptions=True)
        for n in self._nodes.values():
            n.chan.close()
        if self._owns_ray:
            _ray().shutdown()


def _is_ray_error(e: BaseException) -> bool:
    ray = _ray()
    return isinstance(e, ray.exceptions.RayError)


async def _await(ref: Any) -> Any:
    return await ref


async def _guard(ref: Any, seconds: float) -> Any:
    return await asyncio.wait_for(_await(ref), seconds)


_BACKGROUND: set[asyncio.Future[Any]] = set()


def _quiet(f: asyncio.Future[Any]) -> None:
    """Mark a background call's failure as seen."""
    if not f.cancelled():
        f.exception()


class RaySandbox(Sandbox):
    """A sandbox on one node, served by that node's actor (see the module doc).

    Its optional methods are those of the provider's ``capabilities``
    (:func:`_sandbox_class` picks the class)."""

    def __new__(cls, *, provider: RayProvider, **_kw: Any) -> RaySandbox:
        return super().__new__(_sandbox_class(provider.capabilities))

    def __init__(self, *, provider: RayProvider, node: NodeRef, sid: str, spec: SandboxSpec,
                 pg: Any = None) -> None:
        self._provider = provider
        self.node = node
        self.id = sid
        self.spec = spec
        self.pg = pg
        self._destroyed = False
        #: ``process-count`` as last read on the node: (serves, processes besides its agent)
        self._pc: tuple[bool, int] = (True, 0)
        self._pc_task: asyncio.Future[None] | None = None

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def _live(self) -> None:
        if self._destroyed:
            raise ProviderError(f"sandbox {self.id} was destroyed")

    async def _call(self, method: str, *args: Any) -> Any:
        self._live()
        return await self._provider._call(self.node, method, *args)

    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> RunResult:
        r: RunResult = await self._call("exec", self.id, list(argv), opts)
        return r

    async def exec_streaming(self, argv: Sequence[str], opts: ExecOpts | None = None, *,
                             on_output: OutputSink) -> RunResult:
        pid = await self._call("exec_start", self.id, list(argv), opts)
        while True:
            got = await self._provider._call(self.node, "poll", pid, self._provider.poll_s,
                                             self._provider.linger_s)
            if got["out"]:
                on_output(1, got["out"])
            if got["err"]:
                on_output(2, got["err"])
            if got["final"] is not None:
                self._note_count(got.get("pc"))
                r: RunResult = _wire.unwrap(got["final"])
                return r

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self._call("write_file", self.id, path, data)

    async def read_file(self, path: str) -> bytes:
        data: bytes = await self._call("read_file", self.id, path)
        return data

    async def start_process(self, argv: Sequence[str],
                            opts: ProcessOpts | None = None) -> ProcessHandle:
        pid = await self._call("start", self.id, list(argv), opts)
        return RayProcess(self, pid)

    async def start_python_fork(self, args: Sequence[str] = (),
                                opts: ProcessOpts | None = None, *,
                                entry: str) -> ProcessHandle:
        pid = await self._call("start", self.id, list(args), opts, entry)
        return RayProcess(self, pid)

    # -- process-count: read from the node at each process's end, refreshed on demand ----
    @property
    def alive(self) -> bool:
        """Whether the sandbox serves: not destroyed, its node not lost, and its agent alive
        when last read (at the end of its latest process, or a refresh)."""
        return not self._destroyed and not self.node.lost.is_set() and self._pc[0]

    def process_count(self) -> int:
        """Its processes besides its agent, as last read on the node (the end of its latest
        process comes with a fresh count). A count above 0 also starts a refresh, so a
        caller polling it (the snippet pool, for processes on their way out) sees the node
        again a round trip later."""
        if not self.alive:
            return 0
        if self._pc[1] > 0 and (self._pc_task is None or self._pc_task.done()):
            self._pc_task = asyncio.ensure_future(self._refresh_count())
        return self._pc[1]

    def _note_count(self, pc: Any) -> None:
        if pc is not None:
            self._pc = (bool(pc[0]), int(pc[1]))

    async def _refresh_count(self) -> None:
        with contextlib.suppress(Exception):
            self._note_count(await self._call("count", self.id))

    async def _lifecycle(self, op: str, handle: SnapshotHandle | None = None) -> Any:
        return await self._call("lifecycle", self.id, op, handle)

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        await settle([self._pc_task])
        try:
            if not self.node.lost.is_set():
                with contextlib.suppress(ProviderError):
                    await self._provider._call(self.node, "destroy", self.id)
        finally:
            self._provider._forget(self)


_CLASSES: dict[tuple[bool, bool, bool], type[RaySandbox]] = {}


def _sandbox_class(caps: frozenset[str]) -> type[RaySandbox]:
    """RaySandbox with exactly the optional lifecycle methods ``caps`` advertise."""
    from corral.providers.ray import _lifecycle
    key = ("snapshot" in caps, "restore" in caps, "pause" in caps)
    cls = _CLASSES.get(key)
    if cls is None:
        cls = _lifecycle.make(RaySandbox, *key)
        _CLASSES[key] = cls
    return cls


#: stdin writes in flight to a node before ``write`` waits for the oldest
_WRITES_IN_FLIGHT = 8


@final
class _Stdin(ProcessStdin):
    """A process's stdin on a node. Writes are gathered until the loop's next turn (or a
    close) and sent in order without waiting for each to land: a snippet's frame and the
    close go in one call and cost no round trip of their own. ``write`` waits once more
    than a few calls are in flight; a write that failed on the node raises
    ``ProviderError`` from the next ``write``; a failed close shows as the process's end."""

    def __init__(self, proc: RayProcess) -> None:
        self._proc = proc
        self._closed = False
        self._seq = 0
        self._buf = bytearray()
        self._flush_soon: asyncio.Handle | None = None
        self._inflight: list[asyncio.Future[Any]] = []

    def _flush(self, close: bool = False) -> None:
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None
        if not (self._buf or close):
            return
        data, self._buf = bytes(self._buf), bytearray()
        self._inflight.append(asyncio.ensure_future(self._proc._send(self._seq, data, close)))
        self._seq += 1

    async def write(self, data: bytes) -> None:
        if self._closed:
            raise ProviderError("stdin is closed")
        for f in [f for f in self._inflight if f.done()]:
            self._inflight.remove(f)
            f.result()  # a failed earlier write raises here
        self._buf += data
        if len(self._buf) >= 1 << 20:
            self._flush()
        elif self._flush_soon is None:
            self._flush_soon = asyncio.get_running_loop().call_soon(self._flush)
        while len(self._inflight) > _WRITES_IN_FLIGHT:
            await self._inflight.pop(0)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush(close=True)
        for f in self._inflight:
            f.add_done_callback(_quiet)
            _BACKGROUND.add(f)
            f.add_done_callback(_BACKGROUND.discard)
        self._inflight.clear()


@final
class RayProcess(ProcessHandle):
    """A process on a node: its output polled from the node actor as it comes."""

    def __init__(self, sb: RaySandbox, pid: str) -> None:
        self._sb = sb
        self._pid = pid
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._err: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._final: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self.stdin = _Stdin(self)
        self.stdout = _iterate(self._out)
        self.stderr = _iterate(self._err)
        self._pump_task = asyncio.ensure_future(self._pump())

    async def _send(self, seq: int, data: bytes, close: bool) -> None:
        node = self._sb.node
        await self._sb._provider._call(node, "write", self._pid, seq, data, close)

    async def _pump(self) -> None:
        node, prov = self._sb.node, self._sb._provider
        out_eof = err_eof = False
        try:
            while True:
                got = await prov._call(node, "poll", self._pid, prov.poll_s, prov.linger_s)
                if got["out"]:
                    self._out.put_nowait(got["out"])
                if got["err"]:
                    self._err.put_nowait(got["err"])
                if got["out_eof"] and not out_eof:
                    out_eof = True
                    self._out.put_nowait(None)
                if got["err_eof"] and not err_eof:
                    err_eof = True
                    self._err.put_nowait(None)
                if got["final"] is not None:
                    self._sb._note_count(got.get("pc"))
                    try:
                        self._final.set_result(_wire.unwrap(got["final"]))
                    except Exception as e:  # wait() raises it
                        self._final.set_exception(e)
                    return
        except Exception as e:  # the node was lost: wait() raises it
            if not self._final.done():
                self._final.set_exception(e)
        finally:
            if not out_eof:
                self._out.put_nowait(None)
            if not err_eof:
                self._err.put_nowait(None)

    async def wait(self) -> RunResult:
        return await asyncio.shield(self._final)

    async def kill(self) -> None:
        node = self._sb.node
        if self._final.done():
            return
        with contextlib.suppress(ProviderError):
            await self._sb._provider._call(node, "kill", self._pid)


async def _iterate(q: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    while True:
        chunk = await q.get()
        if chunk is None:
            return
        yield chunk
