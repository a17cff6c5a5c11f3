"""The oci provider: level ``strict`` on an existing OCI runtime (crun; gVisor's runsc).

One sandbox is one container: a bundle (``config.json`` plus a read-only root, see
:mod:`._bundle`) started detached with ``catatonit -P`` as its pid 1, and every command
a ``RUNTIME exec`` into it with its own ``process.json`` (the sandbox's uid, no
capabilities, no new privileges). Each command runs as a bounded run
(:mod:`corral.runner.engine`) of a small host-side wrapper (:mod:`._reaper`) that adopts
the command so its real wait status is reported; timeouts, output caps and the
whole-group kill are the bounded run's. Limits are the container's cgroup (v1 here:
memory + memsw, pids; CPU time read from ``cpuacct`` and enforced by the host), disk
the size of the ``/work`` and ``/tmp`` tmpfs mounts. The network is the container's own
namespace with only ``lo``; any other policy is refused.

See ``docs/providers/oci.md`` for what it enforces and what it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, final

from corral.core.cancel import CancelToken
from corral.core.contract import OutputSink, ProcessHandle, Sandbox, SandboxProvider
from corral.core.errors import (
    ConfigInvalidError,
    CreateCancelledError,
    LevelNotSupportedError,
    PauseNotSupportedError,
    ProviderError,
)
from corral.core.result import (
    DEFAULT_MAX_STDERR_BYTES,
    DEFAULT_MAX_STDOUT_BYTES,
    Outcome,
    RunResult,
)
from corral.core.spec import (
    Capability,
    ExecOpts,
    InvocationMode,
    Level,
    ProcessOpts,
    SandboxSpec,
    check_argv,
)
from corral.core.tasks import TaskSet
from corral.providers.confined import read_file_under, split_relative, write_file_under
from corral.providers.oci import _bundle
from corral.providers.oci._host import RUNTIMES, HostFacts, RuntimeInfo, probe, probe_runtime
from corral.providers.subproc._process import ChunkQueue, SubprocProcess
from corral.runner.engine import BoundedRun
from corral.runner.options import make_options
from corral.runner.tree import spawn_process

__all__ = ["OciProvider", "OciSandbox"]

_NAME: Final = "oci"
_CG_PARENT: Final = "corral-oci"
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_HERE: Final = os.path.dirname(os.path.abspath(__file__))
_REAPER: Final = os.path.join(_HERE, "_reaper.py")
_GUARDIAN: Final = os.path.join(_HERE, "_guardian.py")
#: the runtime's own commands (run, pause, resume, delete) must end within this
_RUNTIME_TIMEOUT_S: Final = 60.0
_CPU_POLL_S: Final = 0.025
_FULL_BYTES: Final = 64 << 10
#: per-sandbox uids come from here (never a host user's; no two live sandboxes share one)
_UID_BASE: Final = 1_700_000_000
_UID_SPAN: Final = 1 << 24
MIN_MEM_MB: Final = 16


def _sys_unsafe_path() -> str:
    from corral.providers.linux import _sys_unsafe
    return os.path.abspath(_sys_unsafe.__file__)


def _tail(data: bytes, n: int = 600) -> str:
    return data[-n:].decode(errors="replace").strip()


def _read_int_field(path: str, key: str) -> int:
    """``key N`` from a cgroup v1 flat-keyed file (0 when absent)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
    except (OSError, ValueError):
        pass
    return 0


def _read_int(path: str) -> int:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


@final
class _Counters:
    """The container's cgroup counters the provider turns into limit outcomes."""

    def __init__(self, facts: HostFacts, cg_path: str) -> None:
        rel = cg_path.lstrip("/")
        self.memory = os.path.join(facts.v1["memory"], rel) if "memory" in facts.v1 else None
        self.pids = os.path.join(facts.v1["pids"], rel) if "pids" in facts.v1 else None
        self.cpuacct = os.path.join(facts.v1["cpuacct"], rel) if "cpuacct" in facts.v1 \
            else None
        self.freezer = os.path.join(facts.v1["freezer"], rel) if "freezer" in facts.v1 \
            else None
        self.dirs = sorted({os.path.join(p, rel) for p in facts.v1.values()})
        #: a hierarchy holding every process of the container (pids, else any)
        self.any_dir = self.pids or (self.dirs[0] if self.dirs else "")

    def oom_kills(self) -> int:
        return 0 if self.memory is None else _read_int_field(
            os.path.join(self.memory, "memory.oom_control"), "oom_kill")

    def pids_max_hits(self) -> int:
        return 0 if self.pids is None else _read_int_field(
            os.path.join(self.pids, "pids.events"), "max")

    def cpu_ns(self) -> int:
        return 0 if self.cpuacct is None else _read_int(
            os.path.join(self.cpuacct, "cpuacct.usage"))

    def leftover(self) -> list[str]:
        return [d for d in self.dirs if os.path.isdir(d)]


@final
class OciSandbox(Sandbox):
    """One container: its bundle, its init (pid 1) and the commands exec'd into it."""

    def __init__(self, provider: OciProvider, spec: SandboxSpec, sid: str, bundle: str,
                 uid: int, env: Mapping[str, str], working_dir: str) -> None:
        self.id = sid
        self.spec = spec
        self._p = provider
        self.bundle = bundle
        self.uid = uid
        self._env = dict(env)
        self._wd = working_dir
        #: the image's ``Entrypoint`` and ``Cmd`` (mode ``handler-image`` runs them);
        #: None without an image
        self.image_entrypoint: tuple[str, ...] | None = None
        self.image_cmd: tuple[str, ...] | None = None
        self.cgroups_path = f"/{_CG_PARENT}/{sid}"
        self.counters = _Counters(provider.facts, self.cgroups_path)
        self._destroyed = False
        self._started = False
        self._init_pid = 0
        self._pidfd = -1
        self._work_fd = -1
        self._tmp_fd = -1
        self._n = 0
        self._runs: set[BoundedRun] = set()
        self._procs: set[SubprocProcess] = set()
        self._cpu_spent = False
        self._cpu_task: asyncio.Task[None] | None = None
        #: its background tasks (the CPU watcher, each process's end): destroy ends them
        self._tasks = TaskSet()
        self._paused = False

    # -- life ----------------------------------------------------------------------
    async def _start(self, cancel: CancelToken | None) -> None:
        pidfile = os.path.join(self.bundle, "init.pid")
        self._started = True  # from here on, destroy asks the runtime to delete it
        await self._p.runtime_cmd(["run", "--detach", "--bundle", self.bundle,
                                   "--pid-file", pidfile, self.id], start=True)
        try:
            with open(pidfile, "rb") as f:
                self._init_pid = int(f.read(32).strip())
            self._pidfd = os.pidfd_open(self._init_pid)
            self._work_fd = os.open(f"/proc/{self._init_pid}/root{_bundle.WORK}", _DIR)
            self._tmp_fd = os.open(f"/proc/{self._init_pid}/root/tmp", _DIR)
        except (OSError, ValueError) as e:
            raise ProviderError(f"the container {self.id} did not stay up: {e}", e) from e
        self._check_init()  # the fds above are the init's, not a reused pid's
        if cancel is not None and cancel.cancelled:
            raise CreateCancelledError(f"create cancelled: {cancel.reason}")

    def _check_init(self) -> None:
        import select
        if self._pidfd < 0 or select.select([self._pidfd], [], [], 0)[0]:
            raise ProviderError(f"sandbox {self.id}: its container's init has exited")

    @property
    def alive(self) -> bool:
        if self._destroyed or self._pidfd < 0:
            return False
        import select
        return not select.select([self._pidfd], [], [], 0)[0]

    def _alive(self, what: str) -> None:
        if self._destroyed:
            raise ProviderError(f"{what}: sandbox {self.id} was destroyed")

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        runs = list(self._runs)
        procs, self._procs = list(self._procs), set()
        for run in runs:
            run.kill()
        for proc in procs:
            with contextlib.suppress(Exception):
                await proc.kill()
        try:
            if self._paused:  # a frozen process cannot die: thaw first
                with contextlib.suppress(ProviderError):
                    await self._p.runtime_cmd(["resume", self.id])
                self._paused = False
            if self._started:  # --force: SIGKILL the container if it runs, then delete it
                await self._p.runtime_cmd(["delete", "--force", self.id], quiet=True)
        finally:
            for run in runs:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(run.wait_finished(), 10.0)
            for fd in (self._work_fd, self._tmp_fd, self._pidfd):
                if fd >= 0:
                    os.close(fd)
            self._work_fd = self._tmp_fd = self._pidfd = -1
            await self._tasks.aclose()
            await asyncio.to_thread(self._p.release, self)

    # -- files -----------------------------------------------------------------------
    def _hold_work(self, what: str) -> int:
        """A private dup of the container's ``/work`` fd for one operation: a destroy
        running meanwhile closes the original, never the number an operation walks from."""
        self._alive(what)
        if self._work_fd < 0:
            raise ProviderError(f"{what}: sandbox {self.id} has no container")
        return os.dup(self._work_fd)

    @staticmethod
    def _root(fd: int) -> str:
        return f"/proc/self/fd/{fd}/."

    async def write_file(self, path: str, data: bytes | str) -> None:
        self._alive("write_file")
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if len(raw) > self._p.max_file_bytes:
            raise ConfigInvalidError("data", f"more than {self._p.max_file_bytes} bytes")
        parts = split_relative(path, root_alias=_bundle.WORK)
        fd = self._hold_work("write_file")
        try:
            await asyncio.to_thread(self._write, fd, parts, path, raw)
        finally:
            os.close(fd)

    def _write(self, work: int, parts: list[str], path: str, raw: bytes) -> None:
        try:
            write_file_under(self._root(work), path, raw, root_alias=_bundle.WORK)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise ProviderError(f"write_file({path!r}): the sandbox's disk is full", e
                                    ) from e
            raise
        self._give(work, parts)

    def _give(self, work: int, parts: list[str]) -> None:
        """What the host made on the way to a written file becomes the sandbox user's
        (never following a symlink), so commands may change it."""
        fd = os.open(self._root(work), _DIR)
        try:
            for i, name in enumerate(parts):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if st.st_uid == 0:
                    os.chown(name, self.uid, self.uid, dir_fd=fd, follow_symlinks=False)
                if i == len(parts) - 1 or not stat.S_ISDIR(st.st_mode):
                    break
                nfd = os.open(name, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nfd
        finally:
            os.close(fd)

    async def read_file(self, path: str) -> bytes:
        self._alive("read_file")
        split_relative(path, root_alias=_bundle.WORK)  # bad paths: ConfigInvalidError first
        fd = self._hold_work("read_file")
        try:
            return await asyncio.to_thread(read_file_under, self._root(fd), path,
                                           root_alias=_bundle.WORK,
                                           max_bytes=self._p.max_file_bytes)
        finally:
            os.close(fd)

    def _cwd(self, cwd: str | None) -> str:
        """``cwd`` (relative to ``/work`` or under it) as the container's path; it must
        be a directory there (checked from the host without following a symlink)."""
        if cwd is None:
            return self._wd or _bundle.WORK
        try:
            parts = split_relative(cwd, root_alias=_bundle.WORK)
        except ConfigInvalidError as e:
            raise ConfigInvalidError("cwd", e.reason) from None
        work = self._hold_work("cwd")
        try:
            fd = os.open(self._root(work), _DIR)
        finally:
            os.close(work)
        try:
            for name in parts:
                try:
                    nfd = os.open(name, _DIR, dir_fd=fd)
                except OSError:
                    raise ConfigInvalidError(
                        "cwd", f"not a directory inside the sandbox: {cwd!r}") from None
                os.close(fd)
                fd = nfd
        finally:
            os.close(fd)
        return "/".join([_bundle.WORK, *parts])

    # -- commands ----------------------------------------------------------------------
    def _full_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        out = dict(self._env)
        out.update(env or {})
        return out

    def _start_run(self, argv: Sequence[str], *, cwd: str | None,
                   env: Mapping[str, str] | None, timeout_ms: int, stdin: bytes | None,
                   out_cap: int, err_cap: int, out: ChunkQueue | None = None,
                   err: ChunkQueue | None = None, stdin_pipe: bool = False,
                   on_output: OutputSink | None = None) -> tuple[BoundedRun, list[str]]:
        args = check_argv(argv)
        where = self._cwd(cwd)
        self._check_init()
        self._n += 1
        pjson = os.path.join(self.bundle, f"exec-{self._n}.json")
        pidfile = os.path.join(self.bundle, f"exec-{self._n}.pid")
        groupfile = os.path.join(self.bundle, f"exec-{self._n}.pgid")
        doc = _bundle.process_config(args, uid=self.uid, cwd=where, env=self._full_env(env))
        with open(pjson, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        runtime = self._p.runtime_argv(["exec", "--detach", "--pid-file", pidfile,
                                        "--process", pjson, self.id])
        opts = make_options(
            sys.executable, ["-I", "-S", "-B", _REAPER, self._p.sys_unsafe, pidfile, groupfile,
                             *runtime],
            timeout_ms=timeout_ms, cwd=self.bundle, env={},
            shutdown_signal=self._p.shutdown_signal,
            grace_period_ms=min(self._p.grace_period_ms, timeout_ms // 2), stdin=stdin,
            max_stdout_bytes=out_cap, max_stderr_bytes=err_cap, node_heap_mb=None,
            mem_mb=None, cpu_ms=None, cancel=None,
            on_stdout=out.put if out else _sink(on_output, 1),
            on_stderr=err.put if err else _sink(on_output, 2), spawner=spawn_process)
        run = BoundedRun(opts, keep_output=out is None, stdin_pipe=stdin_pipe)
        run.start()
        return run, [pjson, pidfile, groupfile]

    def _forget(self, files: list[str]) -> None:
        """After a run: kill what is left of its process group in the container (the
        command's descendants that did not leave it), then remove its files."""
        try:
            with open(files[2], "rb") as fh:
                group = int(fh.read(32).strip() or b"0")
        except (OSError, ValueError):
            group = 0
        if group > 0:
            self._kill_group(group)
        for f in files:
            with contextlib.suppress(OSError):
                os.unlink(f)

    def watch_cpu(self) -> None:
        """With ``limits.cpu_ms``: poll the sandbox's CPU time for its whole life."""
        if self.spec.limits.cpu_ms is not None and self._cpu_task is None:
            self._cpu_task = self._tasks.spawn(self._watch_cpu(self.spec.limits.cpu_ms))

    async def _watch_cpu(self, cap_ms: int) -> None:
        """At ``cpu_ms`` of CPU time (all the sandbox's processes together, since it was
        created): kill every command and every other process in the container but its
        init; later commands are refused the same way (outcome ``cpu-limit``)."""
        while not self._destroyed:
            if self.counters.cpu_ns() >= cap_ms * 1_000_000:
                self._cpu_spent = True
                for run in list(self._runs):
                    run.kill()
                await asyncio.to_thread(self._kill_all_but_init)
                return
            await asyncio.sleep(_CPU_POLL_S)

    def _kill_group(self, group: int) -> None:
        """SIGKILL the container's processes in process group ``group`` (read from its
        cgroup, so nothing outside the container is touched whatever the number)."""
        for _ in range(50):
            hit = 0
            for pid in _procs_in(self.counters.any_dir):
                if pid == self._init_pid:
                    continue
                with contextlib.suppress(OSError):
                    if os.getpgid(pid) == group:
                        os.kill(pid, signal.SIGKILL)
                        hit += 1
            if not hit:
                return
            time.sleep(0.002)

    def _kill_all_but_init(self) -> None:
        """SIGKILL every process of the container's cgroup but the init, the cgroup frozen
        meanwhile (v1 freezer) so none forks past the list."""
        freezer = None if self._paused else self.counters.freezer  # paused: leave it so
        _write(freezer, "freezer.state", "FROZEN")
        try:
            for _ in range(50):
                pids = [p for p in _procs_in(self.counters.any_dir) if p != self._init_pid]
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.005)
        finally:
            _write(freezer, "freezer.state", "THAWED")

    def _full(self) -> bool:
        for fd in (self._work_fd, self._tmp_fd):
            if fd >= 0:
                st = os.fstatvfs(fd)
                if st.f_bavail * st.f_frsize < _FULL_BYTES:
                    return True
        return False

    def _judge(self, result: RunResult, before: tuple[int, int]) -> RunResult:
        """The limit outcome the container's counters show, over the run's own."""
        lim = self.spec.limits
        if self._destroyed:
            raise ProviderError(f"sandbox {self.id} was destroyed while the command ran")
        if result.outcome is Outcome.TIMEOUT or result.outcome.value.startswith("overflow"):
            return result
        if lim.mem_mb is not None and self.counters.oom_kills() > before[0]:
            return replace(result, outcome=Outcome.MEMORY_LIMIT, limit_value=lim.mem_mb,
                           detail="the sandbox's memory cgroup killed it")
        if lim.max_processes is not None and self.counters.pids_max_hits() > before[1]:
            return replace(result, outcome=Outcome.PROCESSES_LIMIT,
                           limit_value=lim.max_processes,
                           detail="a fork was refused at the sandbox's process limit")
        if self._cpu_spent and lim.cpu_ms is not None:
            return replace(result, outcome=Outcome.CPU_LIMIT, limit_value=lim.cpu_ms,
                           observed=self.counters.cpu_ns() // 1_000_000)
        if result.outcome is Outcome.EXIT and result.exit_code and self._full():
            return replace(result, outcome=Outcome.DISK_LIMIT, limit_value=self._p.disk_mb(
                self.spec), detail="the sandbox's /work or /tmp is full")
        if result.outcome is Outcome.EXIT and result.exit_code == 125 and \
                b"corral-oci: the runtime could not start" in result.stderr:
            missing = b"not found" in result.stderr or b"No such file" in result.stderr
            return replace(result, outcome=Outcome.SPAWN_ERROR,
                           spawn_errno=errno.ENOENT if missing else None,
                           detail=_tail(result.stderr, 400))
        return result

    def _before(self) -> tuple[int, int]:
        return self.counters.oom_kills(), self.counters.pids_max_hits()

    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> RunResult:
        return await self._exec(argv, opts, None)

    async def exec_streaming(self, argv: Sequence[str], opts: ExecOpts | None = None, *,
                             on_output: OutputSink) -> RunResult:
        """``exec``, each chunk of output also handed to ``on_output(fd, chunk)`` as it
        comes (what the caps keep)."""
        return await self._exec(argv, opts, on_output)

    async def _exec(self, argv: Sequence[str], opts: ExecOpts | None,
                    on_output: OutputSink | None) -> RunResult:
        self._alive("exec")
        opts = opts or ExecOpts()
        timeout = self._p.exec_timeout_ms
        if opts.timeout_ms is not None:
            timeout = min(timeout, opts.timeout_ms)
        out_cap, err_cap = opts.output_caps(self._p.max_stdout_bytes, self._p.max_stderr_bytes)
        before = self._before()
        run, files = self._start_run(argv, cwd=opts.cwd, env=opts.env, timeout_ms=timeout,
                                     stdin=opts.stdin, out_cap=out_cap, err_cap=err_cap,
                                     on_output=on_output)
        self._runs.add(run)
        if self._cpu_spent:
            run.kill()
        try:
            result = await run.wait()
        finally:
            self._runs.discard(run)
            self._forget(files)
        return self._judge(result, before).check()

    async def start_process(self, argv: Sequence[str],
                            opts: ProcessOpts | None = None) -> ProcessHandle:
        self._alive("start_process")
        opts = opts or ProcessOpts()
        timeout = opts.timeout_ms if opts.timeout_ms is not None else self._p.process_timeout_ms
        out, err = ChunkQueue(), ChunkQueue()
        run, files = self._start_run(argv, cwd=opts.cwd, env=opts.env, timeout_ms=timeout,
                                     stdin=None, out_cap=self._p.max_process_output_bytes,
                                     err_cap=self._p.max_process_output_bytes, out=out,
                                     err=err, stdin_pipe=opts.stdin)
        proc = SubprocProcess(run, out, err, stdin_open=opts.stdin)
        self._procs.add(proc)
        self._runs.add(run)  # the CPU watcher and destroy kill it with the others
        if self._cpu_spent:
            run.kill()

        def ended(_: object) -> None:
            self._forget(files)
            self._procs.discard(proc)
            self._runs.discard(run)

        self._tasks.spawn(run.wait_finished()).add_done_callback(ended)
        return proc

    async def pause(self) -> None:
        """Freeze every process of the container (``crun pause``: the freezer cgroup)."""
        self._alive("pause")
        if Capability.PAUSE.value not in self._p.capabilities:
            raise PauseNotSupportedError("no freezer cgroup on this host: crun cannot pause")
        self._check_init()
        await self._p.runtime_cmd(["pause", self.id])
        self._paused = True

    async def resume(self) -> None:
        """Thaw what :meth:`pause` froze (``crun resume``)."""
        self._alive("resume")
        if self._paused:
            await self._p.runtime_cmd(["resume", self.id])
            self._paused = False

    def process_count(self) -> int:
        """Live processes in the container besides its init (read from the host)."""
        if not self.alive or self.counters.pids is None:
            return 0
        try:
            with open(os.path.join(self.counters.pids, "cgroup.procs"), encoding="ascii") as f:
                return max(0, sum(1 for line in f if line.strip()) - 1)
        except OSError:
            return 0


@final
class OciProvider(SandboxProvider):
    """Level ``strict`` on an OCI runtime (see the module docstring).

    Args:
        runtime: ``"crun"`` (Debian's package) or ``"runsc"`` (gVisor).
        runtime_path: the runtime's binary (default: found on PATH).
        state_dir: where bundles, roots and the runtime's state live (default: a private
            temp dir, removed by ``aclose``).
        image_cache_dir: where ``spec.image`` is unpacked (``images.ImageCache``).
        exec_timeout_ms / process_timeout_ms: the longest an ``exec`` / a started
            process may run (``ExecOpts.timeout_ms`` narrows the first).
        max_stdout_bytes / max_stderr_bytes / max_process_output_bytes: output caps.
        default_disk_mb: the size of ``/work`` and of ``/tmp`` without ``limits.disk_mb``.
        max_file_bytes: the largest file ``write_file`` / ``read_file`` moves.

    Raises:
        ConfigInvalidError: an unknown runtime or a bad option.
        LevelNotSupportedError: the runtime (or the init, ``catatonit``) is not
            installed, or the host cannot run rootful containers (not root).
    """

    name = _NAME
    levels = frozenset({Level.STRICT})
    capabilities = frozenset({Capability.STRICT.value, Capability.STREAMING.value,
                              Capability.STREAMING_EXEC.value, Capability.PAUSE.value,
                              Capability.PROCESS_COUNT.value})

    def __init__(self, runtime: str = "crun", *, runtime_path: str | None = None,
                 state_dir: str | None = None, image_cache_dir: str | None = None,
                 exec_timeout_ms: int = 600_000, process_timeout_ms: int = 3_600_000,
                 max_stdout_bytes: int = DEFAULT_MAX_STDOUT_BYTES,
                 max_stderr_bytes: int = DEFAULT_MAX_STDERR_BYTES,
                 max_process_output_bytes: int = 64 * 1024 * 1024,
                 default_disk_mb: int = 512, max_file_bytes: int = 256 * 1024 * 1024,
                 shutdown_signal: int | str = "SIGTERM", grace_period_ms: int = 2000) -> None:
        if runtime not in RUNTIMES:
            raise ConfigInvalidError("runtime", f"unknown runtime {runtime!r} (known: "
                                     f"{', '.join(RUNTIMES)})")
        for field, value in (("exec_timeout_ms", exec_timeout_ms),
                             ("process_timeout_ms", process_timeout_ms),
                             ("max_stdout_bytes", max_stdout_bytes),
                             ("max_stderr_bytes", max_stderr_bytes),
                             ("max_process_output_bytes", max_process_output_bytes),
                             ("default_disk_mb", default_disk_mb),
                             ("max_file_bytes", max_file_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigInvalidError(field, f"must be a positive integer, got {value!r}")
        self.runtime: RuntimeInfo = probe_runtime(runtime, runtime_path)
        self.facts: HostFacts = probe()
        missing = unusable_reason(self.runtime, self.facts)
        if missing:
            raise LevelNotSupportedError(
                Level.STRICT.value, (), f"provider 'oci' with runtime {runtime!r}",
                missing=missing)
        self.name = f"{_NAME}/{runtime}"
        if not self.facts.controller("freezer"):  # crun pause needs the freezer cgroup
            self.capabilities = self.capabilities - {Capability.PAUSE.value}
        self.exec_timeout_ms = exec_timeout_ms
        self.process_timeout_ms = process_timeout_ms
        self.max_stdout_bytes = max_stdout_bytes
        self.max_stderr_bytes = max_stderr_bytes
        self.max_process_output_bytes = max_process_output_bytes
        self.default_disk_mb = default_disk_mb
        self.max_file_bytes = max_file_bytes
        self.shutdown_signal = shutdown_signal
        self.grace_period_ms = grace_period_ms
        self._own_state = state_dir is None
        self._tag = secrets.token_hex(3)  # in every sandbox id of this provider
        self._state_dir = None if state_dir is None else os.path.abspath(state_dir)
        self._image_cache_dir = image_cache_dir
        self._images: Any = None
        self._roots: dict[str, _bundle.Root] = {}
        self._roots_lock = asyncio.Lock()
        self._uids: set[int] = set()
        self.sandboxes: dict[str, OciSandbox] = {}
        self.sys_unsafe = _sys_unsafe_path()
        self._closed = False
        self._guardian: subprocess.Popen[bytes] | None = None
        self._guardian_pipe = -1

    @property
    def state_dir(self) -> str:
        """Bundles, roots and the runtime's state (made on first use, so a provider that
        never creates a sandbox leaves nothing behind)."""
        if self._state_dir is None:
            self._state_dir = tempfile.mkdtemp(prefix="corral-oci-")
        os.makedirs(self._state_dir, 0o700, exist_ok=True)
        return self._state_dir

    @property
    def runtime_root(self) -> str:
        return os.path.join(self.state_dir, "runtime")

    # -- the runtime ---------------------------------------------------------------------
    def runtime_argv(self, args: Sequence[str], *, start: bool = False) -> list[str]:
        """The runtime's argv for ``args``; a start (``run``) on a hybrid cgroup host
        goes through a private mount namespace without the cgroup2 mount (crun refuses
        hybrid hosts; the host's own mounts stay as they are)."""
        rt = self.runtime
        assert rt.path is not None
        base = [rt.path, "--root", self.runtime_root]
        if rt.name == "crun":
            base.append("--cgroup-manager=cgroupfs")
        argv = [*base, *args]
        f = self.facts
        if start and rt.name == "crun" and f.hybrid:
            assert f.unshare and f.umount and f.unified
            argv = [f.unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                    'u=$1; m=$2; shift 2; "$u" "$m" && exec "$@"', "sh", f.umount,
                    f.unified, *argv]
        return argv

    async def runtime_cmd(self, args: Sequence[str], *, start: bool = False,
                          quiet: bool = False) -> None:
        """Run the runtime to completion (bounded); ProviderError with its stderr.

        Its stdout is ``/dev/null`` and its stderr a temp file: a detached container's
        init inherits them, and must not hold a pipe of ours open."""
        with tempfile.TemporaryFile(dir=self.state_dir) as errf:
            proc = await asyncio.create_subprocess_exec(
                *self.runtime_argv(args, start=start), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=errf, start_new_session=True)
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), _RUNTIME_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                raise ProviderError(f"{self.runtime.name} {args[0]} did not finish within "
                                    f"{_RUNTIME_TIMEOUT_S:g} s") from None
            except asyncio.CancelledError:  # let a start finish: destroy then deletes it
                with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                    await asyncio.wait_for(asyncio.shield(proc.wait()), _RUNTIME_TIMEOUT_S)
                raise
            if proc.returncode != 0 and not quiet:
                errf.seek(0)
                raise ProviderError(f"{self.runtime.name} {args[0]} failed "
                                    f"(exit {proc.returncode}): {_tail(errf.read(1 << 16))}")

    def _ensure_guardian(self) -> None:
        """Start the guardian (:mod:`._guardian`) before the first container: when this
        process ends, however, it deletes every container of this provider."""
        if self._guardian is not None:
            return
        state = self.state_dir
        rd, wr = os.pipe()  # both close-on-exec: no child of ours holds the write end
        try:
            rt = self.runtime.path
            assert rt is not None
            self._guardian = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", _GUARDIAN, state, self._tag,
                 "1" if self._own_state else "0", ":".join(sorted(set(self.facts.v1.values()))),
                 rt, "--root", self.runtime_root],
                stdin=rd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, cwd="/", env={})
        except BaseException:
            os.close(wr)
            raise
        finally:
            os.close(rd)
        self._guardian_pipe = wr

    def _stop_guardian(self) -> None:
        if self._guardian_pipe >= 0:
            with contextlib.suppress(OSError):
                os.write(self._guardian_pipe, b"q")  # a clean close: one sweep, no waiting
            os.close(self._guardian_pipe)
            self._guardian_pipe = -1
        if self._guardian is not None:
            try:
                self._guardian.wait(60)
            except subprocess.TimeoutExpired:
                self._guardian.kill()
                self._guardian.wait()
            self._guardian = None

    # -- create ----------------------------------------------------------------------------
    def disk_mb(self, spec: SandboxSpec) -> int:
        return spec.limits.disk_mb or self.default_disk_mb

    def _validate(self, spec: SandboxSpec) -> None:
        if not isinstance(spec, SandboxSpec):
            raise ConfigInvalidError("spec", f"must be a SandboxSpec, not {type(spec).__name__}")
        if spec.environment is not None:
            raise ConfigInvalidError(
                "environment", "the oci provider does not show environments (the linux "
                "provider does: docs/environments.md)")
        supported = (Level.STRICT.value,)
        if spec.level is not Level.STRICT:
            raise LevelNotSupportedError(
                spec.level.value, supported, "the oci provider gives only the strict level; "
                "use the subproc or inprocess provider for weaker levels")
        if spec.network.kind != "none":
            raise LevelNotSupportedError(
                spec.level.value, supported, "pass NetworkPolicy.none() or use the 'linux' "
                "provider (egress proxy)", field="network",
                missing=f"network policy {spec.network.kind!r}: the container has its own "
                "network namespace with only loopback and no egress proxy")
        for field, value in spec.limits.asked().items():
            missing = self.facts.missing_limit(field)
            if missing:
                raise LevelNotSupportedError(
                    spec.level.value, supported, f"asked {field}={value}",
                    field=f"limits.{field}", missing=missing)
        if spec.limits.mem_mb is not None and spec.limits.mem_mb < MIN_MEM_MB:
            raise ConfigInvalidError("limits.mem_mb", f"must be at least {MIN_MEM_MB} MiB "
                                     "(the runtime and init need some)")
        if spec.mode is InvocationMode.IN_CONTEXT:
            raise ConfigInvalidError("mode", "provider 'oci' runs commands in a container; "
                                     "mode 'in-context' runs in the caller")
        if spec.image is not None and (not isinstance(spec.image, str)
                                       or not os.path.exists(spec.image)):
            raise ConfigInvalidError("image", f"no local image at {spec.image!r} (an OCI "
                                     "layout, an archive of one, or a root directory)")

    def _new_uid(self) -> int:
        while True:
            uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
            if uid not in self._uids:
                self._uids.add(uid)
                return uid

    async def _root_for(self, spec: SandboxSpec) -> _bundle.Root:
        async with self._roots_lock:
            if spec.image is None:
                key = "host"
            else:
                unpacked = await asyncio.to_thread(self._unpack, spec.image)
                key = hashlib.sha256(unpacked.key.encode()).hexdigest()[:24]
            root = self._roots.get(key)
            if root is not None and os.path.isdir(root.path):
                return root
            path = os.path.join(self.state_dir, "roots", key)
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(os.path.dirname(path), 0o711, exist_ok=True)
            if spec.image is None:
                root = await asyncio.to_thread(_bundle.host_root, path)
            else:
                c = unpacked.config
                root = await asyncio.to_thread(_bundle.image_root, path, unpacked.rootfs,
                                               env=c.env, working_dir=c.working_dir,
                                               entrypoint=c.entrypoint, cmd=c.cmd)
            self._roots[key] = root
            return root

    def _unpack(self, image: str) -> Any:
        from corral.images.cache import ImageCache
        if self._images is None:
            self._images = ImageCache(self._image_cache_dir)
        return self._images.unpack(image)

    def _env_for(self, root: _bundle.Root) -> dict[str, str]:
        env = {"PATH": _bundle.DEFAULT_PATH}
        for item in root.env:
            k, sep, v = item.partition("=")
            if sep and k and "\0" not in item:
                env[k] = v
        env.update({"HOME": _bundle.WORK, "TMPDIR": "/tmp"})
        return env

    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None
                     ) -> OciSandbox:
        if self._closed:
            raise ProviderError("the provider is closed")
        self._validate(spec)
        if cancel is not None and cancel.cancelled:
            raise CreateCancelledError(f"create cancelled: {cancel.reason}")
        self._ensure_guardian()
        root = await self._root_for(spec)
        sid = f"oci-{self._tag}-{secrets.token_hex(6)}"
        bundle = os.path.join(self.state_dir, "bundles", sid)
        uid = self._new_uid()
        os.makedirs(bundle, 0o700)
        wd = root.working_dir if root.working_dir.startswith(_bundle.WORK) else ""
        sb = OciSandbox(self, spec, sid, bundle, uid, self._env_for(root), wd)
        sb.image_entrypoint, sb.image_cmd = root.entrypoint, root.cmd
        self.sandboxes[sid] = sb
        try:
            assert self.facts.init is not None
            cfg = _bundle.container_config(root, uid=uid, init=self.facts.init,
                                           cgroups_path=sb.cgroups_path, limits=spec.limits,
                                           disk_mb=self.disk_mb(spec))
            with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as f:
                json.dump(cfg, f)
            if cancel is not None and cancel.cancelled:
                raise CreateCancelledError(f"create cancelled: {cancel.reason}")
            await sb._start(cancel)
            sb.watch_cpu()
        except BaseException:
            await asyncio.shield(sb.destroy())
            raise
        return sb

    def release(self, sb: OciSandbox) -> None:
        """After a sandbox's container is deleted: its bundle, cgroup dirs, uid.

        The runtime removes the cgroups; one stopped half-way (a create cancelled while
        the runtime started the container) may leave an init it never recorded: every
        process still in the sandbox's own cgroup is killed, then the dirs removed."""
        shutil.rmtree(sb.bundle, ignore_errors=True)
        for _ in range(500):  # at most 5 s, only while something is left (a loaded host)
            left = sb.counters.leftover()
            if not left:
                break
            for d in left:
                for pid in _procs_in(d):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            time.sleep(0.01)
        self._uids.discard(sb.uid)
        self.sandboxes.pop(sb.id, None)

    def leaks(self) -> list[str]:
        """What of this provider's sandboxes is still on the host (containers in the
        runtime's state, bundles, cgroup dirs) beyond its live sandboxes."""
        out: list[str] = []
        live = set(self.sandboxes)
        mine = f"oci-{self._tag}-"
        for point in self.facts.v1.values():
            with contextlib.suppress(FileNotFoundError):
                out += [f"cgroup {point}/{_CG_PARENT}/{n}"
                        for n in os.listdir(os.path.join(point, _CG_PARENT))
                        if n.startswith(mine) and n not in live]
        state = self._state_dir
        if state is None:
            return out
        with contextlib.suppress(FileNotFoundError):
            out += [f"container {n}" for n in os.listdir(os.path.join(state, "runtime"))
                    if n.startswith(mine) and n not in live]
        with contextlib.suppress(FileNotFoundError):
            out += [f"bundle {n}" for n in os.listdir(os.path.join(state, "bundles"))
                    if n not in live]
        return out

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sb in list(self.sandboxes.values()):
            with contextlib.suppress(Exception):
                await sb.destroy()
        await asyncio.to_thread(self._stop_guardian)  # it sweeps what destroy could not
        if self._own_state and self._state_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._state_dir, True)


def _sink(on_output: OutputSink | None, fd: int) -> Callable[[bytes], object] | None:
    if on_output is None:
        return None
    return lambda chunk: on_output(fd, chunk)


def _write(cgroup_dir: str | None, name: str, value: str) -> None:
    if cgroup_dir is not None:
        with contextlib.suppress(OSError), \
                open(os.path.join(cgroup_dir, name), "w", encoding="ascii") as f:
            f.write(value)


def _procs_in(cgroup_dir: str) -> list[int]:
    try:
        with open(os.path.join(cgroup_dir, "cgroup.procs"), encoding="ascii") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def unusable_reason(rt: RuntimeInfo, facts: HostFacts) -> str:
    """'' when the provider can run ``rt`` here, else what is missing."""
    if not rt.usable:
        return rt.missing
    if rt.name == "runsc":
        return (f"the oci provider's runsc support (runsc found: {rt.path}, "
                f"{rt.version or 'version unknown'}): runsc reports a command killed by "
                "signal N as exit 128+N, with no way to tell it from that exit code, and "
                "keeps a sandbox's tmpfs inside gVisor, out of the host's file access; "
                "until both are solved runtime='runsc' is refused rather than run weaker "
                "(use runtime='crun')")
    if os.geteuid() != 0:
        return ("root: the oci provider starts rootful containers (rootless crun cannot "
                "start on hybrid cgroup hosts; use the 'linux' provider)")
    if facts.init is None:
        return "catatonit, the containers' init (apt-get install catatonit)"
    if rt.name == "crun" and facts.hybrid and not (facts.unshare and facts.umount):
        return "unshare(1) and umount(1), to hide the cgroup2 mount from crun"
    return ""
