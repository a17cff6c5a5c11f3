"""LinuxSandbox: one live strict sandbox, driven through its agent."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, final

from corral.core.contract import Sandbox
from corral.core.errors import (
    ConfigInvalidError,
    CorralError,
    LimitsExceededError,
    PauseNotSupportedError,
    ProviderError,
    error_from_dict,
)
from corral.core.files import FileInfo
from corral.core.preview import PreviewURL
from corral.core.result import NetworkDenial, Outcome, OutputBuffer, RunResult
from corral.core.spec import (
    ExecOpts,
    ProcessOpts,
    ResourceUsage,
    SandboxSpec,
    SnapshotHandle,
    check_argv,
)
from corral.core.tasks import settle
from corral.providers.confined import split_relative
from corral.providers.linux.host.channel import REQUEST_TIMEOUT_S, Channel
from corral.providers.linux.host.netrelay import SandboxNetwork, proxy_env
from corral.providers.linux.host.process import (
    ExitInfo,
    LinuxProcess,
    PipeReader,
    Run,
    StdinPipe,
    look_again,
    usage_of,
)
from corral.providers.linux.host.spares import kill_and_remove, only_init_left, wait_exit
from corral.providers.linux.policy.outcomes import CPU_KILLED, limit_hit
from corral.providers.linux.policy.plan import SandboxPlan
from corral.wire import agentmsg as _msg

if TYPE_CHECKING:
    import ssl

    from corral.providers.linux.host.cpuwatch import CpuWatch
    from corral.providers.linux.host.egress import NeverReach, Resolver
    from corral.providers.linux.host.spares import Reaper
    from corral.providers.linux.snapshots import SnapshotStore

__all__ = ["LinuxSandbox", "SandboxHost"]

_EOF_GRACE_S = 0.2
#: exit events kept for pids whose spawn reply is still on its way, at most
_MAX_EARLY = 1024
#: longest error text taken from the agent
_MAX_REASON = 1000
#: payload throughput a request's deadline allows for (well below a local socket's)
_BYTES_PER_S = 32 * 1024 * 1024
#: a kill request's deadline
_KILL_TIMEOUT_S = 5.0


#: requests whose OS errors are the caller's: the builtin OSError of the errno
_FILE_OPS: Final = (_msg.Read, _msg.ListDir, _msg.Remove, _msg.MakeDir, _msg.Stat)


@final
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SandboxHost:
    """What a :class:`LinuxSandbox` uses of the provider that made it, handed over
    explicitly (one per provider): the services it shares with its siblings, and
    ``forget``, which tells the provider the sandbox is gone."""

    cpu_watch: CpuWatch
    reaper: Reaper
    forget: Callable[[LinuxSandbox], None]
    snapshots: SnapshotStore
    capabilities: frozenset[str]
    stdout_cap: int
    stderr_cap: int
    egress_resolver: Resolver | None
    egress_upstream_ssl: ssl.SSLContext | None
    egress_never: NeverReach | None


@final
class LinuxSandbox(Sandbox):
    """A sandbox of the linux provider (made by LinuxProvider.create only).

    ``read_file`` of a missing file raises ``ConfigInvalidError("path", "no such
    file: ...")``. A command that cannot be started (not found, not executable)
    gives exit code 127 (126 for other exec errors) and the reason on stderr,
    like a shell.
    """

    def __init__(self, *, host: SandboxHost, sid: str, spec: SandboxSpec,
                 plan: SandboxPlan, channel: Channel, pidfd: int, cgroup: Any) -> None:
        self.id = sid
        self.spec = spec
        self.plan = plan
        #: the image's ``Entrypoint`` and ``Cmd`` when the image is the root (mode
        #: ``handler-image`` runs them), else None
        self.image_entrypoint: tuple[str, ...] | None = None
        self.image_cmd: tuple[str, ...] | None = None
        if plan.image_root:
            self.image_entrypoint, self.image_cmd = plan.image_entrypoint, plan.image_cmd
        self._host = host
        self._chan = channel
        self._pidfd = pidfd
        self._cg = cgroup
        self._runs: dict[int, Run] = {}
        self._early: dict[int, ExitInfo] = {}
        self._destroyed = False
        self._paused = False
        self._ran = False  # whether any command was started yet
        #: CPU time (ms) seen when the provider's watcher killed the sandbox at its
        #: cpu_ms cap; 0 while it has not
        self._cpu_over = 0
        self._resumed = asyncio.Event()
        self._resumed.set()
        #: runs whose kill came while the sandbox was paused: killed at resume (a frozen
        #: agent cannot answer, and a timeout must not wait for it)
        self._kill_at_resume: dict[int, Run] = {}
        #: what every command's env gets for the network (the proxy's variables)
        self._net_env: dict[str, str] = {}
        #: (path, bytes) of the CA bundle written at create (a policy with secrets)
        self._ca_bundle: tuple[str, bytes] | None = None
        channel.set_event_handler(self._on_event)
        channel.on_violation = self._on_violation
        channel.closed.add_done_callback(lambda _f: self._on_agent_gone())
        self._watch_cpu()
        #: the egress proxy (network allowlist/unrestricted) and preview URLs, with the
        #: policy the plan parsed; started by the provider's create before the sandbox
        #: is handed out
        self.network = SandboxNetwork(spec.network, self._agent_socket, egress=plan.egress,
                                      resolver=host.egress_resolver,
                                      upstream_ssl_context=host.egress_upstream_ssl,
                                      never=host.egress_never)

    # -- plumbing -------------------------------------------------------------------
    def _live(self) -> None:
        if self._destroyed:
            raise ProviderError(f"sandbox {self.id} was destroyed")
        if self._chan.is_closed:
            self._check_cpu()  # killed at its CPU cap: say so, not "gone"
            if self._chan.violation:
                raise ProviderError(f"sandbox {self.id} was killed: its agent broke the "
                                    f"protocol ({self._chan.violation})")
            raise ProviderError(f"sandbox {self.id} is gone (its agent exited)")

    def _on_event(self, h: dict[str, Any]) -> None:
        """An event frame from the agent (an exit); a malformed one raises, and the
        channel then closes as a protocol violation."""
        ev = _msg.decode_event(h)
        if ev is None:
            return
        pid = ev.pid
        info = ExitInfo(code=ev.code, cpu_ms=ev.cpu_ms, maxrss_kb=ev.maxrss_kb,
                        disk_free=ev.disk_free)
        run = self._runs.pop(pid, None)
        if run is None:
            if len(self._early) >= _MAX_EARLY:
                raise ValueError("exit events for more processes than were started")
            self._early[pid] = info
        elif not run.exit.done():
            run.exit.set_result(info)

    def _on_violation(self, why: str) -> None:
        """The agent broke the protocol: treat the sandbox as crashed, kill it now (pid 1
        of its pid namespace: every process dies with it); destroy frees the rest."""
        if self._pidfd >= 0:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except OSError:
                pass

    def _on_agent_gone(self) -> None:
        self._resumed.set()  # a request waiting for resume finds the sandbox gone
        for run in self._runs.values():
            if not run.exit.done():
                run.exit.set_result(ExitInfo(code=-signal.SIGKILL))
        self._runs.clear()

    async def _call(self, req: _msg.Request, payload: bytes = b"",
                    fds: Sequence[int] = (), *, expect: tuple[type, ...] = (_msg.Done,),
                    reply_payload: bool = False,
                    timeout: float | None = None) -> tuple[_msg.Reply, bytes]:
        """One request to the agent (:mod:`corral.wire.agentmsg`); its reply, one of
        ``expect``. The reply may carry a payload only when ``reply_payload`` (read,
        snapshot, list), up to the most the agent could hold in memory; every request
        has a deadline (the paused time aside: a frozen agent answers once resumed),
        and a late or malformed answer kills the sandbox (ProviderError).

        An error reply raises: corral's error as the agent named it (the one error
        codec: an unknown code is ProviderError), or for a file operation the builtin
        OSError of its errno (FileNotFoundError ...), else ProviderError."""
        self._live()
        await self._resumed.wait()
        self._live()
        cap = self._payload_cap()
        if timeout is None:
            timeout = REQUEST_TIMEOUT_S + (
                len(payload) + (cap if reply_payload else 0)) / _BYTES_PER_S
        h, p, _fds = await self._chan.request(_msg.encode_request(req), payload, fds,
                                              timeout=timeout,
                                              max_reply=cap if reply_payload else 0)
        try:
            reply = _msg.decode_reply(h, expect)
        except _msg.BadMessage as e:
            raise self._chan.violate(f"a malformed reply to {type(req).__name__}: "
                                     f"{e.reason}") from None
        if type(reply) is _msg.Failed:
            raise error_from_dict(reply.error)
        if type(reply) is _msg.OsFailed:
            reason = reply.reason[:_MAX_REASON]
            if type(req) in _FILE_OPS:  # as open() and os raise it
                raise OSError(reply.errno, reason, reply.path[:_MAX_REASON])
            raise ProviderError(f"sandbox agent: {reason}")
        return reply, p

    async def _agent_socket(self) -> int:
        """A fresh unbound TCP socket of the sandbox's network namespace, from its agent
        (checked by the caller: see ``netrelay.check_agent_socket``)."""
        self._live()
        await self._resumed.wait()
        self._live()
        h, _p, fds = await self._chan.request(_msg.encode_request(_msg.SocketReq()),
                                              max_fds=1, timeout=REQUEST_TIMEOUT_S)
        try:
            reply: _msg.Reply | None = _msg.decode_reply(h, (_msg.Done,))
        except _msg.BadMessage:
            reply = None
        if type(reply) is not _msg.Done or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            why = reply.reason if isinstance(reply, _msg.OsFailed) else type(reply).__name__
            raise ProviderError(f"sandbox agent gave no socket: {why[:_MAX_REASON]}")
        return fds[0]

    async def start_network(self) -> None:
        """Serve the egress proxy inside the sandbox (policy allowlist/unrestricted) and
        point every command's env at it; called once, by the provider's create."""
        await self.network.start()
        if self.network.proxy is None:
            return
        bundle = None
        if self.network.ca_bundle_pem is not None:
            bundle = f"{self.plan.work_dir}/{CA_BUNDLE_NAME}"
            self._ca_bundle = (bundle, _system_cas() + self.network.ca_bundle_pem)
            await self.write_file(*self._ca_bundle)
        self._net_env = proxy_env(bundle)

    def _payload_cap(self) -> int:
        """The largest payload the agent may send: what it could hold in memory (it
        builds a reply whole), at least the writable area's size."""
        mib = max(self.plan.limits.mem_mb or 0, self.plan.limits.disk_mb or 0, 1)
        return (mib + 1) * 1024 * 1024

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        out = dict(self.plan.env_base)
        out.update(self._net_env)
        if env:
            out.update(env)
        return out

    def _cwd(self, cwd: str | None) -> str:
        if cwd in (None, "", ".", self.plan.work_dir, self.plan.work_dir + "/"):
            return ""
        return "/".join(split_relative(str(cwd), root_alias=self.plan.work_dir))

    async def _spawn(self, argv: Sequence[str], env: Mapping[str, str] | None,
                     cwd: str | None, *, entry: str | None = None
                     ) -> tuple[Run | None, int, int, int, str]:
        """Start a command (or, with ``entry``, a fork_call of the agent with ``argv``
        as its args); returns (run, stdin fd, stdout fd, stderr fd, spawn error)."""
        args = [str(a) for a in argv] if entry is not None else check_argv(argv)
        e, c = self._env(env), self._cwd(cwd)
        self._live()
        self._ran = True
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            cpu_s = self.plan.cpu_rlimit_s  # per command: spares share no plan
            req: _msg.Request = (_msg.Spawn(args, e, c, cpu_s) if entry is None
                                 else _msg.ForkCall(entry, args, e, c, cpu_s))
            reply, _p = await self._call(req, fds=[in_r, out_w, err_w],
                                         expect=(_msg.Started, _msg.StartFailed))
        except BaseException:
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        if not isinstance(reply, _msg.Started):
            why = reply.reason if isinstance(reply, _msg.StartFailed) else "cannot start"
            return None, in_w, out_r, err_r, why[:_MAX_REASON]
        pid = reply.pid
        run = Run(pid)
        early = self._early.pop(pid, None)
        if early is not None:
            run.exit.set_result(early)
        else:
            self._runs[pid] = run
        self._watch_cpu()
        return run, in_w, out_r, err_r, ""

    async def _kill_run(self, run: Run, why: str) -> None:
        if run.exit.done():
            return
        run.killed_for = run.killed_for or why
        if self._paused:  # frozen: it cannot run, and dies when resumed (or destroyed)
            self._kill_at_resume[run.pid] = run
            return
        try:
            # a timeout must end promptly: an agent that cannot answer a kill in a few
            # seconds is treated as crashed and the whole sandbox dies
            await self._call(_msg.Kill(run.pid, int(signal.SIGKILL)), timeout=_KILL_TIMEOUT_S)
        except ProviderError:
            pass

    # -- cpu_ms: the provider's watcher (cpuwatch.py) kills the whole sandbox ----------
    def _watch_cpu(self) -> None:
        """Have the provider's CPU watcher enforce cpu_ms for this sandbox's whole
        life (from creation to destroy, commands running or not); idempotent."""
        cap = self.plan.limits.cpu_ms
        if cap is None or self._cg is None or self._destroyed or self._cpu_over:
            return
        self._host.cpu_watch.add(self, cap, self._cg.cpu_ms, self._cpu_cap_hit)

    def _cpu_error(self) -> LimitsExceededError:
        return LimitsExceededError("cpu", self.plan.limits.cpu_ms or 0, self._cpu_over,
                                   CPU_KILLED)

    def _cpu_cap_hit(self, used: int) -> None:
        """The watcher saw ``used`` >= cpu_ms: kill the whole sandbox, now.

        Runs on the event loop, so every command awaited right now fails with
        LimitsExceededError("cpu") before the agent's death can be noticed. The
        init of the sandbox's pid namespace is SIGKILLed through its pidfd; the
        kernel then kills every other process of the namespace (setsid or not).
        A paused sandbox burns nothing and dies when thawed (resume or destroy).
        The sandbox stays dead: later calls raise the same error; destroy cleans up.
        """
        if self._destroyed or self._cpu_over:
            return
        self._cpu_over = max(used, self.plan.limits.cpu_ms or 0, 1)
        for run in list(self._runs.values()):
            self._fail_run(run)
        if self._pidfd >= 0:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except OSError:
                pass

    def _fail_run(self, run: Run) -> None:
        if not run.exit.done():
            run.killed_for = "cpu"
            run.exit.set_exception(self._cpu_error())
            run.exit.exception()  # marked seen: a handle nobody waits on logs nothing

    def _check_cpu(self) -> None:
        """Raise LimitsExceededError("cpu") once the sandbox was killed at its cap."""
        if self._cpu_over and not self._destroyed:
            raise self._cpu_error()

    async def _start(self, argv: Sequence[str], env: Mapping[str, str] | None,
                     cwd: str | None, *, entry: str | None = None
                     ) -> tuple[Run | None, int, int, int, str]:
        """:meth:`_spawn`, refused (or its run failed) once the CPU cap killed the sandbox."""
        self._check_cpu()
        try:
            got = await self._spawn(argv, env, cwd, entry=entry)
        except ProviderError:
            self._check_cpu()  # the agent died at the cap while the request was out
            raise
        if got[0] is not None and self._cpu_over:
            self._fail_run(got[0])
        return got

    def _oom_kills(self) -> int:
        if self._cg is None:
            return 0
        try:
            return int(self._cg.oom_kills())
        except (OSError, ValueError):
            return 0

    def _peak_mem_mb(self) -> int | None:
        """The sandbox's peak memory as its cgroup counted it (MiB), if known."""
        if self._cg is None:
            return None
        try:
            return int(self._cg.usage().peak_mem_mb) or None
        except (OSError, ValueError):
            return None

    def _cg_usage(self, wall_ms: int) -> ResourceUsage:
        """What the whole sandbox used, from its cgroup (a command killed with it left no
        exit record of its own)."""
        if self._cg is None:
            return ResourceUsage(wall_ms=wall_ms)
        try:
            u = self._cg.usage()
        except (OSError, ValueError):
            return ResourceUsage(wall_ms=wall_ms)
        return ResourceUsage(cpu_ms=int(u.cpu_ms), wall_ms=wall_ms,
                             peak_mem_mb=int(u.peak_mem_mb))

    def _pids_max_events(self) -> int:
        """The pids controller's count of refused forks (0 if unknown)."""
        if self._cg is None:
            return 0
        try:
            return int(self._cg.pids_max_events())
        except (OSError, ValueError):
            return 0

    def _limit_hit(self, run: Run, info: ExitInfo, before: tuple[int, int]
                   ) -> tuple[Outcome, int, int | None, str] | None:
        """Which limit ended ``run``, if one did: (outcome, limit, observed, how), by the
        one set of rules (:func:`~corral.providers.linux.policy.outcomes.limit_hit`)."""
        lim = self.plan.limits
        oom_before, pids_before = before
        killed = run.killed_for == "cpu" or info.code in (-signal.SIGKILL, -signal.SIGXCPU)
        hit = limit_hit(
            info.code, mem_mb=lim.mem_mb, cpu_ms=lim.cpu_ms, max_processes=lim.max_processes,
            disk_mb=lim.disk_mb, by_rlimit=self.plan.limits_by == "rlimit",
            cpu_killed_at=self._cpu_over if killed else 0,
            cpu_used=lambda: max(info.cpu_ms, self._cg.cpu_ms() if self._cg is not None else 0),
            oom_rose=lambda: self._oom_kills() > oom_before, peak_mb=self._peak_mem_mb,
            pids_refused=lambda: self._pids_max_events() > pids_before,
            disk_free=info.disk_free)
        if hit is None:
            return None
        outcome, limit, observed, how = hit
        return Outcome(outcome), limit, observed, how

    # -- the contract -------------------------------------------------------------------
    async def exec_streaming(self, argv: Sequence[str], opts: ExecOpts | None = None, *,
                             on_output: Callable[[int, bytes], object]) -> RunResult:
        """The ``streaming-exec`` capability
        (:class:`corral.core.contract.SupportsStreamingExec`): :meth:`exec`, with
        ``on_output(fd, chunk)`` (fd 1 or 2) seeing each chunk as it arrives."""
        return await self.exec(argv, opts, on_output=on_output)

    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None, *,
                   on_output: Callable[[int, bytes], object] | None = None) -> RunResult:
        """The contract's exec; ``on_output(fd, chunk)`` (fd 1 or 2), when given, sees
        each chunk of output as it arrives, up to the cap (see :meth:`exec_streaming`)."""
        opts = opts or ExecOpts()
        loop = asyncio.get_running_loop()
        started = loop.time()
        timeout = None if opts.timeout_ms is None else opts.timeout_ms / 1000
        deadline = None if timeout is None else started + timeout
        if self._paused:  # the timeout counts from the call, paused time too
            await self._wait_resumed(deadline, opts.timeout_ms, started)
        denial_mark = self.network.denial_mark()
        # counters before this command (a sandbox that never ran one has none yet)
        before = (self._oom_kills(), self._pids_max_events()) if self._ran else (0, 0)
        run, in_w, out_r, err_r, spawn_err = await self._start(argv, opts.env, opts.cwd)
        stdin = StdinPipe(in_w)
        caps = opts.output_caps(self._host.stdout_cap, self._host.stderr_cap)
        bufs = (OutputBuffer(caps[0], _to_fd(on_output, 1)),
                OutputBuffer(caps[1], _to_fd(on_output, 2)))
        over: list[int] = []  # the fd that passed its cap first
        killers: list[asyncio.Future[None]] = []

        def sink(i: int) -> Callable[[bytes], None]:
            def take(data: bytes) -> None:
                if bufs[i].feed(data) and run is not None and not over:
                    over.append(i + 1)
                    killers.append(asyncio.ensure_future(self._kill_run(run, "output")))
            return take

        def result(outcome: Outcome, code: int | None, info: ExitInfo | None = None, *,
                   limit: int | None = None, observed: int | None = None,
                   detail: str = "") -> RunResult:
            wall = int((loop.time() - started) * 1000)
            usage = usage_of(info, wall) if info is not None else self._cg_usage(wall)
            if outcome is Outcome.MEMORY_LIMIT and observed:
                usage = dataclasses.replace(usage, peak_mem_mb=max(usage.peak_mem_mb, observed))
            return RunResult(
                outcome=outcome, exit_code=code, stdout=bufs[0].value(), stderr=bufs[1].value(),
                stdout_truncated=bufs[0].truncated, stderr_truncated=bufs[1].truncated,
                duration_ms=float(wall), limit_value=limit, observed=observed, detail=detail,
                usage=usage, denials=self.network.denials_since(denial_mark))

        readers = [PipeReader(out_r, sink(0)), PipeReader(err_r, sink(1))]
        try:
            if run is None:  # as a shell says it: 127 not found, 126 cannot run
                stdin.close_now()
                for r in readers:
                    r.stop()
                code = 127 if "not found" in spawn_err or "No such file" in spawn_err else 126
                bufs[1].feed(spawn_err.encode() + b"\n")
                return result(Outcome.EXIT, code, detail=spawn_err)
            feeder = asyncio.ensure_future(self._feed(stdin, opts.stdin))
            try:
                async with asyncio.timeout_at(deadline):
                    info = await asyncio.shield(run.exit)
                    await asyncio.wait([r.eof for r in readers], timeout=_EOF_GRACE_S)
            except TimeoutError:
                await self._kill_run(run, "timeout")
                if not self._paused:  # a frozen command dies at resume: no waiting for it
                    await asyncio.wait([run.exit], timeout=5)
                await asyncio.wait([r.eof for r in readers], timeout=_EOF_GRACE_S)
                got = run.exit.result() if run.exit.done() and not run.exit.exception() \
                    else None
                raise _error(result(Outcome.TIMEOUT, got.code if got else None, got,
                                    limit=opts.timeout_ms)) from None
            except LimitsExceededError as e:  # the CPU watcher killed the whole sandbox
                await asyncio.wait([r.eof for r in readers], timeout=_EOF_GRACE_S)
                raise _error(result(Outcome.CPU_LIMIT, -signal.SIGKILL, limit=e.limit_value,
                                    observed=e.observed, detail=e.detail)) from None
            finally:
                await settle([feeder])
        finally:
            stdin.close_now()
            for r in readers:
                r.stop()
            if run is not None and not run.exit.done():
                await self._kill_run(run, "cancelled")
            if killers:  # an output cap's kill, started from a reader's callback
                await asyncio.wait(killers)
        if over:
            fd = over[0]
            raise _error(result(
                Outcome.OVERFLOW_STDOUT if fd == 1 else Outcome.OVERFLOW_STDERR, info.code,
                info, limit=bufs[fd - 1].cap, observed=bufs[fd - 1].total,
                detail="the command wrote more than the output cap; it was killed"))
        hit = self._limit_hit(run, info, before)
        if hit is None and not run.killed_for and info.code == -signal.SIGKILL:
            hit = await look_again(lambda: self._limit_hit(run, info, before))
        if hit is not None:
            outcome, limit, observed, detail = hit
            raise _error(result(outcome, info.code, info, limit=limit, observed=observed,
                                detail=detail))
        return result(Outcome.EXIT, info.code, info)

    async def _wait_resumed(self, deadline: float | None, timeout_ms: int | None,
                            started: float) -> None:
        """Wait for :meth:`resume` until ``deadline``; past it, the exec's timeout: its
        command never started (SandboxTimeoutError, ``err.result`` saying so)."""
        try:
            async with asyncio.timeout_at(deadline):
                await self._resumed.wait()
        except TimeoutError:
            wall = int((asyncio.get_running_loop().time() - started) * 1000)
            raise _error(RunResult(
                outcome=Outcome.TIMEOUT, exit_code=None, duration_ms=float(wall),
                limit_value=timeout_ms, usage=ResourceUsage(wall_ms=wall),
                detail="the sandbox stayed paused: the command never started")) from None

    @staticmethod
    async def _feed(stdin: StdinPipe, data: bytes | None) -> None:
        try:
            if data:
                await stdin.write(data)
        except ProviderError:
            pass
        finally:
            stdin.close_now()

    async def start_process(self, argv: Sequence[str],
                            opts: ProcessOpts | None = None) -> LinuxProcess:
        return await self._process(argv, opts or ProcessOpts(), entry=None)

    async def _process(self, argv: Sequence[str], opts: ProcessOpts, *,
                       entry: str | None) -> LinuxProcess:
        """A started command (``entry``: a fork of the agent calling it) as a handle."""
        started = asyncio.get_running_loop().time()
        mark = self.network.denial_mark()
        # counters before this command, as for exec: which limit ended it, at its end
        before = (self._oom_kills(), self._pids_max_events()) if self._ran else (0, 0)
        run, in_w, out_r, err_r, spawn_err = await self._start(argv, opts.env, opts.cwd,
                                                               entry=entry)
        if run is None:
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            raise ConfigInvalidError("argv" if entry is None else "entry",
                                     f"cannot start: {spawn_err}")
        stdin = StdinPipe(in_w)
        if not opts.stdin:
            stdin.close_now()
        return LinuxProcess(run, stdin, out_r, err_r, self._kill_run, started, opts.timeout_ms,
                            denials=lambda: self.network.denials_since(mark),
                            limit_hit=lambda info: self._limit_hit(run, info, before))

    @property
    def alive(self) -> bool:
        """Whether the sandbox's agent still serves (not destroyed, not exited)."""
        return not self._destroyed and not self._chan.is_closed

    async def start_python_fork(self, args: Sequence[str] = (),
                                opts: ProcessOpts | None = None, *,
                                entry: str) -> LinuxProcess:
        """Like :meth:`start_process`, but the process is a fork of the sandbox's agent
        calling ``entry(args)`` instead of an exec'd interpreter: it shares the pages
        the fork server preloaded (:meth:`LinuxProvider.preload_python`), so it starts
        in about a millisecond and costs far less memory than a fresh ``python``. The
        ``warm-fork`` capability (:class:`corral.core.contract.SupportsForkEntry`).

        The child is set up as a command is (new session, the pipes on 0/1/2 and no
        other descriptor, ``opts.env`` over the plan's base env, the cwd, the CPU
        rlimit) and keeps the sandbox's containment; ``sys.path`` holds only the
        interpreter's own read-only dirs. When it exits, its process group is
        killed. ``entry`` must have been registered (``fork_entries`` of
        :meth:`LinuxProvider.preload_python`) before this sandbox was created, else
        ConfigInvalidError("entry").
        """
        return await self._process(args, opts or ProcessOpts(), entry=entry)

    def host_pids(self) -> list[int]:
        """The host pids of the sandbox's processes (its agent first), e.g. to read
        their /proc/PID/smaps; empty once destroyed. For diagnostics and benchmarks."""
        agent = -1
        if self._pidfd >= 0:
            try:
                with open(f"/proc/self/fdinfo/{self._pidfd}", encoding="ascii") as f:
                    for line in f:
                        if line.startswith("Pid:"):
                            agent = int(line.split()[1])
            except (OSError, ValueError):
                pass
        if agent <= 0:
            return []
        others: list[int] = []
        if self._cg is not None:
            try:
                others = [p for p in self._cg.pids() if p != agent]
            except OSError:
                others = []
        return [agent, *sorted(others)]

    def process_count(self) -> int:
        """How many live processes the sandbox holds besides its agent (a process is live
        while any of its threads is: a zombie leader whose main thread left with exit(2)
        while another thread runs counts); 0 once it no longer serves. The
        ``process-count`` capability (:class:`corral.core.contract.SupportsProcessCount`)."""
        if not self.alive:
            return 0
        try:  # one read instead of every hierarchy's procs and tasks: the pids controller
            # counts every task of the cgroup and its children (threads and zombies too)
            # from fork until reaped, and the agent is one of them: nothing else is here
            if self._cg is not None and self._cg.pids_current() == 1:
                return 0
        except OSError:
            pass  # the full count below says
        return sum(_live(pid) for pid in self.host_pids()[1:])

    async def write_file(self, path: str, data: bytes | str) -> None:
        self._check_cpu()
        raw = data.encode() if isinstance(data, str) else bytes(data)
        split_relative(path, root_alias=self.plan.work_dir)
        await self._call(_msg.Write(path), raw)

    async def read_file(self, path: str) -> bytes:
        self._check_cpu()
        split_relative(path, root_alias=self.plan.work_dir)
        _r, payload = await self._call(_msg.Read(path), reply_payload=True)
        return payload

    # -- the file operations (capability "files"): typed agent requests ------------------
    def _info(self, e: _msg.EntryInfo, parts: list[str], *, leaf: bool) -> FileInfo:
        """A FileInfo of an agent's entry (checked: its name is one component)."""
        if not leaf and (not e.name or "/" in e.name or e.name in (".", "..")):
            raise self._chan.violate(f"a listing entry named {e.name[:80]!r}")
        if e.type not in ("file", "dir", "symlink", "other"):
            raise self._chan.violate(f"an entry of type {e.type[:40]!r}")
        names = parts if leaf else [*parts, e.name]
        path = "/".join([self.plan.work_dir.rstrip("/"), *names])
        return FileInfo(name=names[-1] if names else "", path=path,
                        type=e.type,  # type: ignore[arg-type]
                        size=e.size, mode=e.mode & 0o7777, modified=float(e.mtime),
                        symlink_target=e.target if e.type == "symlink" else None)

    async def list_files(self, path: str = "") -> list[FileInfo]:
        self._check_cpu()
        parts = split_relative(path, root_alias=self.plan.work_dir, allow_root=True)
        reply, payload = await self._call(_msg.ListDir("/".join(parts)),
                                          expect=(_msg.Listing,), reply_payload=True)
        assert isinstance(reply, _msg.Listing)
        try:
            entries = _msg.decode_listing(payload, reply.n)
        except _msg.BadMessage as e:
            raise self._chan.violate(f"a malformed listing: {e.reason}") from None
        return [self._info(e, parts, leaf=False) for e in entries]

    async def get_info(self, path: str) -> FileInfo:
        self._check_cpu()
        parts = split_relative(path, root_alias=self.plan.work_dir, allow_root=True)
        reply, _p = await self._call(_msg.Stat("/".join(parts)), expect=(_msg.EntryInfo,))
        assert isinstance(reply, _msg.EntryInfo)
        return self._info(reply, parts, leaf=True)

    async def make_dir(self, path: str, *, parents: bool = True) -> bool:
        self._check_cpu()
        parts = split_relative(path, root_alias=self.plan.work_dir, allow_root=True)
        reply, _p = await self._call(_msg.MakeDir("/".join(parts), parents),
                                     expect=(_msg.Made,))
        assert isinstance(reply, _msg.Made)
        return reply.created

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        self._check_cpu()
        parts = split_relative(path, root_alias=self.plan.work_dir)
        await self._call(_msg.Remove("/".join(parts), recursive))

    async def snapshot(self) -> SnapshotHandle:
        """Capture /work (regular files and dirs); the handle restores in this provider only."""
        self._check_cpu()
        _r, payload = await self._call(_msg.Snapshot(), reply_payload=True)
        return await self._host.snapshots.put(payload, tenant=self.spec.tenant_id,
                                                  owner=self.id)

    async def restore(self, handle: SnapshotHandle) -> None:
        """Replace /work with a snapshot's content (InvalidSnapshotHandleError if not ours);
        the sandbox's own CA bundle (a policy with secret headers) is written again."""
        self._check_cpu()
        data = await self._host.snapshots.get(handle, tenant=self.spec.tenant_id)
        await self._call(_msg.Restore(), data)
        if self._ca_bundle is not None:
            await self.write_file(*self._ca_bundle)

    def _freezer(self) -> Any:
        self._check_cpu()
        self._live()
        if self._cg is None or "pause" not in self._host.capabilities:
            raise PauseNotSupportedError("this host has no cgroup freezer for corral")
        return self._cg

    async def pause(self) -> None:
        """Freeze every process of the sandbox (cgroup freezer)."""
        await asyncio.to_thread(self._freezer().freeze)
        self._paused = True
        self._resumed.clear()

    async def resume(self) -> None:
        """Thaw what :meth:`pause` froze; a command whose timeout passed meanwhile is
        killed now (its exec raised SandboxTimeoutError at the deadline)."""
        await asyncio.to_thread(self._freezer().thaw)
        self._paused = False
        self._resumed.set()
        runs, self._kill_at_resume = list(self._kill_at_resume.values()), {}
        for run in runs:
            await self._kill_run(run, run.killed_for or "timeout")

    # -- network: the egress policy at run time and preview URLs -------------------------
    def allow_host(self, entry: str) -> None:
        """Allow ``entry`` (a host name, ``*.suffix``, IP literal or CIDR, optional
        ``:port``; see docs/network.md) for new connections from now on; lifts an
        earlier :meth:`revoke_host` of the same entry. Open tunnels are not touched.
        ConfigInvalidError for a bad entry or a sandbox with network ``none``."""
        self._live()
        self.network.allow(entry)

    def revoke_host(self, entry: str) -> None:
        """Refuse ``entry`` for new connections from now on, even under a wider rule
        (``*.suffix``) or ``unrestricted``; connections already open stay open."""
        self._live()
        self.network.revoke(entry)

    def network_denials(self) -> tuple[NetworkDenial, ...]:
        """Every connection the network policy refused so far (the most recent 1000)."""
        return self.network.all_denials()

    async def expose(self, port: int) -> PreviewURL:
        """The ``preview-url`` capability: a URL on the host's loopback
        (``http://127.0.0.1:N/``) whose connections are forwarded to TCP ``port`` on
        the sandbox's loopback (whatever protocol is spoken there), once they present
        the URL's token (``url.token``: the ``X-Corral-Preview-Token`` header, or the
        ``url.preamble()`` line for other protocols; see docs/network.md). Exposing a
        port again returns the same URL and token. Closed by :meth:`unexpose` and at
        destroy."""
        self._live()
        return await self.network.expose(port)

    async def unexpose(self, port: int) -> None:
        """Stop ``port``'s preview URL and cut its open connections (idempotent)."""
        await self.network.unexpose(port)

    async def destroy(self) -> None:
        """End the sandbox (its egress proxy and preview URLs with it). Idempotent.

        The promise: once destroy returns, no process of the sandbox executes
        another instruction of user space, and none can be started. The agent
        (the pid-namespace init) is SIGKILLed through its pidfd. If the
        sandbox's cgroup then counts that init as its only task, destroy returns
        at once (a task with SIGKILL pending never returns to user space, and
        with no other task nothing can fork). Otherwise destroy waits until the
        init has exited, which the kernel allows only after it killed and
        reaped every other process of the namespace. The rest (the init's
        exit, removing the empty cgroup) finishes on the provider's reaper
        thread, and ``aclose`` waits for it. If the init does not exit within
        a few seconds, destroy kills and removes the cgroup itself first.
        """
        if self._destroyed:
            return
        try:
            await self._destroy()
        finally:
            self._host.snapshots.drop_owner(self.id)
            await self.network.aclose()

    async def _destroy(self) -> None:
        self._destroyed = True
        self._host.forget(self)
        self._chan.close()
        cg, self._cg = self._cg, None
        gone = False
        if self._pidfd >= 0:
            pidfd, self._pidfd = self._pidfd, -1
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
            if self._paused and cg is not None:
                try:
                    cg.thaw()  # frozen tasks die only once thawed
                except Exception:
                    pass
            if cg is not None and only_init_left(cg):
                # the init is the only task and has SIGKILL pending: it never runs
                # user code again and nothing can fork; its exit finishes off-path
                self._on_agent_gone()
                self._host.reaper.submit(cg, pidfd)
                return
            try:
                gone = await wait_exit(pidfd)
            except BaseException:
                if cg is not None:  # cancelled: the reaper still kills and removes it
                    self._host.reaper.submit(cg)
                raise
            finally:
                os.close(pidfd)
        self._on_agent_gone()
        if cg is not None:
            if gone:
                self._host.reaper.submit(cg)
            else:
                await asyncio.to_thread(kill_and_remove, cg)


#: the CA bundle's name under /work when the policy has secrets (system CAs + the
#: sandbox's own egress CA)
CA_BUNDLE_NAME = ".corral-ca-bundle.pem"


def _system_cas() -> bytes:
    """The host's system CA bundle (the file OpenSSL's default names), or nothing."""
    import ssl
    paths = ssl.get_default_verify_paths()
    for path in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if path:
            try:
                with open(path, "rb") as f:
                    data = f.read()
                return data if data.endswith(b"\n") else data + b"\n"
            except OSError:
                continue
    return b""


def _to_fd(on_output: Callable[[int, bytes], object] | None, fd: int
           ) -> Callable[[bytes], object] | None:
    if on_output is None:
        return None
    return lambda chunk: on_output(fd, chunk)


def _error(result: RunResult) -> CorralError:
    """The contract's error for a run that did not end by exiting (``err.result`` is it)."""
    err = result.error()
    assert err is not None, result.outcome
    return err


def _state(stat_path: str) -> bytes | None:
    """The state letter of a /proc/.../stat file; None if the task is gone."""
    try:
        with open(stat_path, "rb") as f:
            return f.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return None


def _live(pid: int) -> bool:
    """Whether the host process ``pid`` has a thread that is not a zombie. Its own state
    is not enough: a leader whose main thread left with exit(2) (not exit_group) stays a
    zombie while its other threads run, and cgroup v2's cgroup.procs lists only the
    leader (v1's tasks file lists every thread; v2's is cgroup.threads). So for a
    zombie, its threads are read too, up to the first live one (at most the sandbox's
    task count: ``pids.max`` counts threads)."""
    state = _state(f"/proc/{pid}/stat")
    if state is None:
        return False
    if state not in (b"Z", b"X"):
        return True
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    return any(_state(f"/proc/{pid}/task/{tid}/stat") not in (None, b"Z", b"X")
               for tid in tids)
