"""LinuxProvider and LinuxSandbox: the host side of the strict Linux provider."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, final

from corral.core.cancel import CancelToken
from corral.core.contract import SandboxProvider
from corral.core.errors import (
    ConfigInvalidError,
    CreateCancelledError,
    LevelNotSupportedError,
    ProviderError,
)
from corral.core.result import DEFAULT_MAX_STDERR_BYTES, DEFAULT_MAX_STDOUT_BYTES
from corral.core.spec import Level, SandboxLimits, SandboxSpec, SnapshotHandle
from corral.images.cache import ImageCache, UnpackedImage
from corral.providers.linux import _sys_unsafe as su
from corral.providers.linux.host.channel import Zygote
from corral.providers.linux.host.cpuwatch import CpuWatch
from corral.providers.linux.host.egress import NeverReach, Resolver
from corral.providers.linux.host.imageroot import image_root_of, read_image
from corral.providers.linux.host.launch import launch
from corral.providers.linux.host.sandbox import LinuxSandbox, SandboxHost
from corral.providers.linux.host.spares import Launched, Reaper, SparePool, kill_launched
from corral.providers.linux.init import mounts
from corral.providers.linux.policy.plan import (
    DEFAULT_LIMITS,
    Bind,
    ImageRoot,
    LinuxOptions,
    SandboxPlan,
    _extra_binds,
    _id_maps,
    build_plan,
    check_spec,
    is_image_root,
)
from corral.providers.linux.snapshots import SnapshotLimits, SnapshotStore

__all__ = ["LinuxProvider", "LinuxSandbox"]



@final
class LinuxProvider(SandboxProvider):
    """Level ``strict`` on Linux: namespaces, seccomp, cgroups and rlimits.

    One zygote (fork server) per provider builds sandboxes; each sandbox is a
    pid namespace whose pid 1 is an agent that spawns commands on request.

    Args:
        default_limits: applied where a spec leaves a limit unset. ``None``
            (default): mem_mb=512, max_processes=256, disk_mb=256 (cpu_ms unset:
            not capped), less what this host's cgroups cannot enforce (a non-root
            user without a delegated cgroup): those are left out, listed with the
            reason in ``unenforced_defaults`` and by ``corral doctor``, so the
            default spec runs; a limit the spec itself asks for is still refused.
        limits_by: ``"cgroup"`` (default): mem_mb, max_processes and cpu_ms
            for the whole sandbox, by its cgroup. ``"rlimit"``, chosen
            explicitly where there is no cgroup: mem_mb is each command's
            RLIMIT_AS (per process), max_processes the sandbox's RLIMIT_NPROC,
            cpu_ms each command's RLIMIT_CPU (per process); see
            ``LinuxOptions.limits_by``.
        outside_uid / outside_gid: host ids that uid/gid 0 inside map to (and that
            own the sandbox's user namespace); default: a host uid of each
            sandbox's own when running as root (see ``_uidpool.py``), the
            caller's own ids otherwise.
        cgroup_root: a delegated cgroup dir (or v1 mapping) to nest sandboxes in.
        stdout_cap / stderr_cap: per-exec output caps (bytes).
        image_cache_dir: where ``spec.image`` is unpacked (``images.ImageCache``;
            default ``images.default_cache_dir()``; a registry reference is pulled
            when missing, ``images.resolve``). Without a mode, or with mode
            ``handler-image`` (which runs its Entrypoint + Cmd), the image is the
            sandbox's root (its own /usr, /etc ..., read-only, its User the one id
            inside; docs/images.md); with mode ``json-stdio`` its rootfs is bound
            read-only under the host's system dirs, interpreter and corral.
        spares: how many pre-warmed spare sandboxes to keep ready (default 1;
            0: every ``create`` builds its sandbox cold). A spare is built like
            a cold sandbox before it is asked for, claimed by one ``create``
            whose plan has the same shape (its limits are written into the
            spare's cgroup before it is handed out), never reused or shared;
            see ``spares.py``. Each idle spare holds one agent process and its
            namespaces and cgroup until claimed or ``aclose``.
        ro_binds: more host paths (absolute, existing) bound read-only at the
            same path in every sandbox: another interpreter's prefix, a
            toolchain. A path under the host's system dirs is visible already;
            one that would hide the sandbox's own /proc, /dev, /etc, /work or
            /tmp is refused (ConfigInvalidError naming ``ro_binds``), and so is one
            that is or holds a unix socket (connect() ignores a read-only bind;
            see ``_bind_scan``: checked once, here). As root, sources reach
            the sandbox as detached mount trees made by the fork server (not
            root: opened before the sandbox takes its uid), so a path under a
            0700 home dir binds in; the sandbox reads it as its outside uid.
            The same-path read-only shorthand of ``binds``.
        binds: :class:`~corral.providers.linux.policy.plan.Bind` values
            (bubblewrap's ``--ro-bind SRC DST`` / ``--bind SRC DST``): host path
            ``src`` shown at ``dst`` (default: the same path), read-only unless
            ``rw=True``; nosuid and nodev either way. ``src`` is checked as
            ``ro_binds`` are (it exists, holds no unix socket: read-write binds
            too). ``dst`` must be a normalized absolute path; one that would hide
            the sandbox's /proc, /dev, /etc, /tmp or /work, or hide or sit inside
            the system dirs, the interpreter's prefixes or corral's import root,
            or that nests with another bind, is refused (ConfigInvalidError naming
            ``binds``). A dir under /work (``Bind(src, "/work/proj", rw=True)``)
            is how a project dir is shared. Writes through a read-write bind land
            on the host as uid/gid 0x70000000 (``BIND_UID``, which no sandbox
            runs as; the source must be writable by it) when the provider runs
            as root (an idmapped mount: never as the sandbox's own uid, which a
            later sandbox may be given again; refused at ``create`` with
            LevelNotSupportedError where the source's file system has no
            idmapped mounts), otherwise as the caller's own uid; and never with
            a setuid or setgid bit or as a device node (the seccomp filter
            refuses those modes). A read-only bind stays read-only (EROFS) even
            where the sandbox could write.

        egress_resolver: ``async (host, port) -> [address, ...]``, how the egress
            proxy of a sandbox with network ``allowlist``/``unrestricted`` resolves
            names on the host (default: the host's resolver, ``getaddrinfo``); tests
            map names to their loopback servers. See docs/network.md.
        egress_upstream_ssl_context: how the egress proxy verifies the upstream of a
            host whose requests get secret headers (it terminates the sandbox's TLS
            and opens its own); default: the host's CAs, hostname checked. Tests
            pass one trusting their own CA.
        snapshots: the snapshot store's bounds, a ``SnapshotLimits`` or a mapping
            of its field names (bytes and count per store and per tenant, a TTL,
            whether a destroyed sandbox's snapshots are kept, the directory of the
            nameless files); see docs/snapshots.md.
        egress_never: destinations every sandbox's egress proxy refuses whatever its
            policy lists (a ``NeverReach``, shared and updatable: the Ray node actor
            fills it with the cluster's addresses and Ray's ports).

    Network: ``none`` (loopback only), ``allowlist`` and ``unrestricted``; the latter
    two reach out only through the sandbox's egress proxy on the host (see
    ``netrelay.py``). Every sandbox has ``expose(port)`` (``preview-url``).

    Limits the host cannot enforce are refused at ``create`` with
    LevelNotSupportedError naming the missing primitive; so are a missing
    seccomp filter and missing namespaces. ``reaped_orphans`` lists the cgroups
    of dead earlier providers this one removed at start.
    """

    name = "linux"
    levels: frozenset[Level] = frozenset({Level.STRICT})

    def __init__(self, *, default_limits: SandboxLimits | None = None,
                 limits_by: str = "cgroup",
                 outside_uid: int | None = None, outside_gid: int | None = None,
                 cgroup_root: str | None = None, hostname: str = "sandbox",
                 stdout_cap: int = DEFAULT_MAX_STDOUT_BYTES,
                 stderr_cap: int = DEFAULT_MAX_STDERR_BYTES, spares: int = 1,
                 image_cache_dir: str | None = None, ro_binds: Sequence[str] = (),
                 binds: Sequence[Bind] = (),
                 egress_resolver: Resolver | None = None,
                 egress_upstream_ssl_context: ssl.SSLContext | None = None,
                 snapshots: SnapshotLimits | Mapping[str, Any] | None = None,
                 egress_never: NeverReach | None = None,
                 env_store_dir: str | None = None) -> None:
        from corral.providers.linux.host.cgroups import CgroupManager
        if isinstance(spares, bool) or not isinstance(spares, int) or not 0 <= spares <= 8:
            raise ConfigInvalidError("spares", f"must be an integer 0..8, got {spares!r}")
        self.spares = spares
        self._cgroups = CgroupManager(root=cgroup_root)
        #: the provider's default limits this host cannot enforce, left out of the
        #: defaults (``default_limits=None`` only): {field: why}; doctor and the CLI say so
        self.unenforced_defaults: dict[str, str] = {}
        if default_limits is None:
            default_limits = self._fit_defaults(limits_by)
        self.options = LinuxOptions(outside_uid=outside_uid, outside_gid=outside_gid,
                                    default_limits=default_limits, hostname=hostname,
                                    extra_ro_binds=_checked_ro_binds(ro_binds),
                                    binds=_checked_binds(binds), limits_by=limits_by)
        self.stdout_cap, self.stderr_cap = stdout_cap, stderr_cap
        self._image_cache_dir = image_cache_dir
        self._env_store_dir = env_store_dir
        self.images: ImageCache | None = None  # made on the first image
        self._host = mounts.detect_host_layout()
        if self.options.extra_ro_binds or self.options.binds:  # refuse a bad dst now
            _extra_binds(self._host, self.options, with_package=False)
        self.reaped_orphans: tuple[str, ...] = tuple(self._cgroups.reap_orphans())
        self.snapshots = SnapshotStore(SnapshotLimits.of(snapshots))
        caps = {"strict", "streaming", "streaming-exec", "warm-fork", "process-count",
                "snapshot", "restore", "network-allowlist", "network-unrestricted",
                "preview-url", "files"}
        self.egress_never = egress_never
        if self._cgroups.support.has("freezer"):
            caps.add("pause")
        self.capabilities = frozenset(caps)
        self._zygote: Zygote | None = None
        self._zlock: asyncio.Lock | None = None
        self._prog: bytes | None = None
        self._live: set[LinuxSandbox] = set()
        self._closed = False
        self._reaper = Reaper()
        self._pool = SparePool(spares, self._build_spare, self._reaper)
        #: enforces cpu_ms for every live sandbox that has one (one timer for all)
        self._cpu_watch = CpuWatch()
        #: a live sandbox's hold on its environment (EnvStore.hold), closed when it goes
        self._env_holds: dict[LinuxSandbox, int] = {}
        #: what each sandbox uses of this provider (its only way back here)
        self._sandbox_host = SandboxHost(
            cpu_watch=self._cpu_watch, reaper=self._reaper, forget=self._forget,
            snapshots=self.snapshots, capabilities=self.capabilities,
            stdout_cap=stdout_cap, stderr_cap=stderr_cap, egress_resolver=egress_resolver,
            egress_upstream_ssl=egress_upstream_ssl_context, egress_never=egress_never)
        self._plans: dict[tuple[Any, ...], SandboxPlan] = {}  # create's cache (image-less)
        self._preloaded: set[str] = set()  # modules and fork entries the zygote loaded
        self._plock: asyncio.Lock | None = None

    # -- helpers -----------------------------------------------------------------
    def _fit_defaults(self, limits_by: str) -> SandboxLimits:
        """DEFAULT_LIMITS, less what this host's cgroups cannot enforce (with
        ``limits_by="rlimit"`` every default applies, as rlimits)."""
        if limits_by != "cgroup":
            return DEFAULT_LIMITS
        s = self._cgroups.support
        keep = {}
        for name, ctrls in (("mem_mb", ("memory", "memsw")), ("max_processes", ("pids",))):
            missing = [c for c in ctrls if c not in s.available]
            if missing:
                self.unenforced_defaults[name] = s.missing.get(missing[0], "not available")
            else:
                keep[name] = getattr(DEFAULT_LIMITS, name)
        return SandboxLimits(disk_mb=DEFAULT_LIMITS.disk_mb, **keep)

    def _seccomp(self) -> bytes:
        if self._prog is None:
            from corral.providers.linux.policy import seccomp
            arch = su.machine_arch()
            try:
                self._prog = seccomp.build_filter(arch)
            except LevelNotSupportedError:
                raise
            except Exception as e:
                raise LevelNotSupportedError("strict", (), str(e),
                                             missing=f"seccomp filter for {arch}") from e
        return self._prog

    async def _zygote_for(self, prog: bytes) -> Zygote:
        if self._zlock is None:
            self._zlock = asyncio.Lock()
        async with self._zlock:
            if self._zygote is None or not self._zygote.alive:
                if self._zygote is not None:
                    self._zygote.stop()
                self._zygote = Zygote(self._host.package_root, prog)
                await self._zygote.start()
                self._preloaded = set()
            return self._zygote

    def plan(self, spec: SandboxSpec, *, image: UnpackedImage | None = None) -> SandboxPlan:
        """The plan ``create(spec)`` would apply (refusals included).

        ``image`` is ``spec.image`` unpacked; when not given it is unpacked here
        (blocking; ``create`` does it in a worker thread).
        """
        facts = None
        if spec.image is not None:
            facts = self._read_image(spec) if image is None else image_root_of(image)
        return self._resolve(spec, facts)

    def _read_image(self, spec: SandboxSpec) -> ImageRoot:
        """``spec.image`` unpacked (or found in the cache) and read, after the refusals
        that need no host facts; blocking."""
        assert spec.image is not None
        check_spec(spec)  # cheap refusals before any unpacking
        (_u, uid_out, _n), (_g, gid_out, _m) = _id_maps(self.options, self._host)
        if self.images is None:
            self.images = ImageCache(self._image_cache_dir)
        return read_image(spec.image, cache=self.images, uid_out=uid_out, gid_out=gid_out)

    def _resolve(self, spec: SandboxSpec, image: ImageRoot | None) -> SandboxPlan:
        """The one place a spec becomes a plan: built once (limits merged, egress policy
        parsed, wire form and shape derived, an environment's tree bound and on the
        PYTHONPATH), checked against this host's cgroups."""
        options, env_vars = self.options, None
        if spec.environment is not None:
            from corral.envs.store import check_root
            env = self._environment(spec.environment)
            # built for one interpreter (its ABI and paths): the host's, or an image's
            # (by its content key); never shown to another root
            check_root(env, image.key if image is not None and is_image_root(spec) else None)
            options = dataclasses.replace(options, binds=options.binds + tuple(
                Bind(src, dst) for src, dst in env.sandbox_binds()))
            env_vars = env.sandbox_env()
        plan = build_plan(spec, options=options, host=self._host, image=image,
                          env_vars=env_vars)
        self._cgroups.require(plan.cgroup_limits)
        return plan

    def _environment(self, ref: str) -> Any:
        """The built environment ``ref`` names (corral.envs; ConfigInvalidError if none)."""
        from corral.envs.store import EnvStore
        return EnvStore(self._env_store_dir).get(ref)

    async def _plan_for(self, spec: SandboxSpec) -> SandboxPlan:
        if spec.image is not None:
            return self._resolve(spec, await asyncio.to_thread(self._read_image, spec))
        # build_plan reads only these fields of a spec without an image (and the
        # environment's digest: a name may be rebuilt)
        env = (None if spec.environment is None
               else self._environment(spec.environment).digest)
        ckey = (spec.level, spec.network, spec.mode, spec.limits, env)
        hit = self._plans.get(ckey)
        if hit is None:
            if len(self._plans) >= 64:
                self._plans.clear()
            hit = self._plans[ckey] = self._resolve(spec, None)
        return hit

    # -- the contract ---------------------------------------------------------------
    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None
                     ) -> LinuxSandbox:
        if self._closed:
            raise ProviderError("the provider is closed")
        if not isinstance(spec, SandboxSpec):
            raise ConfigInvalidError("spec", "must be a SandboxSpec")
        plan = await self._plan_for(spec)
        hold = -1
        if spec.environment is not None:  # in use while the sandbox lives: never evicted
            from corral.envs.store import EnvStore
            hold = EnvStore(self._env_store_dir).hold(plan.env_base["CORRAL_ENVIRONMENT"])
        try:
            sb = await self._create(spec, plan, cancel)
        except BaseException:
            if hold >= 0:
                os.close(hold)
            raise
        if hold >= 0:
            self._env_holds[sb] = hold
        return sb

    async def _create(self, spec: SandboxSpec, plan: SandboxPlan,
                      cancel: CancelToken | None) -> LinuxSandbox:
        prog = self._seccomp()
        if cancel is not None and cancel.cancelled:
            raise CreateCancelledError(f"create cancelled: {cancel.reason}")
        item = await self._pool.take(plan, cancel)
        if item is None:
            if self._closed:  # aclose ran while this create waited for a spare
                raise ProviderError("the provider is closed")
            item = await self._launch(plan, prog, cancel, limits=plan.cgroup_limits)
        try:
            if cancel is not None and cancel.cancelled:
                raise CreateCancelledError(f"create cancelled: {cancel.reason}")
            sb = LinuxSandbox(host=self._sandbox_host, sid=item.sid, spec=spec, plan=plan,
                              channel=item.chan, pidfd=item.pidfd, cgroup=item.cg)
        except BaseException:
            await asyncio.shield(kill_launched(item, self._reaper))
            raise
        self._live.add(sb)
        if spec.network.kind != "none":
            try:  # before the sandbox is handed out: no command has run in it yet
                await sb.start_network()
            except BaseException:
                await asyncio.shield(sb.destroy())
                raise
        return sb

    async def preload_python(self, modules: Sequence[str], *,
                             fork_entries: Sequence[str] = ()) -> list[str]:
        """Import ``modules`` into the fork server, so sandboxes created from now on
        share their pages, and register ``fork_entries`` (``module:function``, the module
        preloaded) as what :meth:`LinuxSandbox.start_python_fork` may start in them (the
        ``warm-fork`` capability, :class:`corral.core.contract.SupportsWarmFork`).

        Idle spares built before are replaced. Returns the modules and entries that
        could not be loaded. Modules load from the host's interpreter and corral's import
        root, outside any sandbox; only pass names of trusted code.
        """
        if self._closed:
            raise ProviderError("the provider is closed")
        names = [str(m) for m in modules]
        entries = [str(e) for e in fork_entries]
        for entry in entries:
            mod, sep, fn = entry.partition(":")
            if not (sep and fn.isidentifier()
                    and all(part.isidentifier() for part in mod.split("."))):
                raise ConfigInvalidError("fork_entries", f"not module:function: {entry!r}")
        if self._plock is None:
            self._plock = asyncio.Lock()
        async with self._plock:
            if not (set(names) | set(entries)) - self._preloaded:
                return []
            missing = await (await self._zygote_for(self._seccomp())).preload(names, entries)
            names += entries
            self._preloaded.update(set(names) - set(missing))
            self._pool.drop_idle()  # forked before: they lack the new modules
            return missing

    # -- pre-warmed spares (see spares.py) -------------------------------------------
    async def _build_spare(self, plan: SandboxPlan) -> Launched:
        return await self._launch(plan, self._seccomp(), None, limits=SandboxLimits())

    @property
    def _spares(self) -> dict[str, list[Launched]]:
        """Idle spares by shape (the pool's; tests and the Ray node count them)."""
        return self._pool.idle

    @property
    def _building(self) -> dict[str, asyncio.Task[Launched]]:
        return self._pool.building

    async def wait_spares(self) -> int:
        """Wait for background work (spare builds, removals of destroyed sandboxes'
        cgroups); returns how many idle spares exist. For tests and benchmarks."""
        idle = await self._pool.drain()
        await self._reaper.drain()
        return idle

    # -- one launch (see _launch.py) ---------------------------------------------------
    async def _launch(self, plan: SandboxPlan, prog: bytes, cancel: CancelToken | None,
                      *, limits: SandboxLimits) -> Launched:
        return await launch(plan, prog, cancel, limits=limits, cgroups=self._cgroups,
                            zygote_for=self._zygote_for)

    def _forget(self, sb: LinuxSandbox) -> None:
        self._live.discard(sb)
        self._cpu_watch.discard(sb)
        hold = self._env_holds.pop(sb, -1)
        if hold >= 0:  # its environment may be evicted or removed from now on
            os.close(hold)

    async def aclose(self) -> None:
        """Destroy every live sandbox and spare, stop the zygote, drop the snapshots.

        Returns once their processes are gone and their cgroups removed. Idempotent.
        """
        self._closed = True
        await self._pool.aclose()
        for sb in list(self._live):
            await sb.destroy()
        self._cpu_watch.close()
        await self._reaper.stop()
        if self._zygote is not None:
            self._zygote.stop()
            self._zygote = None
        self.snapshots.clear()

    def drop_snapshot(self, handle: SnapshotHandle) -> None:
        """Delete a snapshot now (its handle no longer restores); a stale one: nothing."""
        self.snapshots.drop(handle)

    @property
    def zygote_pid(self) -> int | None:
        """The fork server's pid (None before the first create); for leak checks."""
        return self._zygote.proc.pid if self._zygote is not None else None


def _checked_ro_binds(paths: Sequence[str]) -> tuple[str, ...]:
    """``ro_binds`` as a tuple of absolute paths that exist on the host and hold no
    unix socket (a read-only bind does not stop connect(): see ``_bind_scan``)."""
    if isinstance(paths, (str, bytes)):
        raise ConfigInvalidError("ro_binds", "must be a sequence of paths, not one string")
    out: list[str] = []
    for p in paths:
        if not isinstance(p, str) or not p.startswith("/") or "\0" in p:
            raise ConfigInvalidError("ro_binds", f"not an absolute host path: {p!r}")
        _check_source(p, "ro_binds")
        out.append(p)
    return tuple(out)


def _checked_binds(binds: Sequence[Bind]) -> tuple[Bind, ...]:
    """``binds`` as a tuple of :class:`Bind` whose sources exist and hold no unix
    socket (read-write ones included: the socket's mode is all connect() checks)."""
    if isinstance(binds, (str, bytes, Bind)):
        raise ConfigInvalidError("binds", "must be a sequence of Bind values")
    out: list[Bind] = []
    for b in binds:
        if not isinstance(b, Bind):
            raise ConfigInvalidError("binds", f"must be Bind values, got {b!r}")
        _check_source(b.src, "binds")
        out.append(b)
    return tuple(out)


def _check_source(p: str, field: str) -> None:
    """Refuse a bind source that does not exist or is or holds a unix socket."""
    from corral.providers.linux.host.bind_scan import UncheckableError, find_unix_socket
    if not os.path.exists(p):
        raise ConfigInvalidError(field, f"{p!r} does not exist on the host")
    try:
        sock = find_unix_socket(p)
    except (UncheckableError, OSError) as e:
        raise ConfigInvalidError(
            field, f"cannot check {p!r} for unix sockets: {e}; bind a smaller "
            "tree") from None
    if sock is not None:
        raise ConfigInvalidError(
            field, f"{p!r} is or holds a unix socket, {sock!r}: a sandbox could "
            "connect to it through a bind (read-only or not); bind a tree without sockets")
