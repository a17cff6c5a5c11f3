"""The MCP server: corral's front doors as tools, on the official ``mcp`` SDK (v2).

:func:`build_server` makes an ``MCPServer`` whose tools call corral through its public
front doors only (``run_snippet``, ``run_strict_async`` / ``run_bounded_async``, the
provider contract); :func:`serve_stdio` and :func:`serve_http` run it on a transport.

Errors: a corral error (the closed set of :mod:`corral.core.errors`) comes back as a
tool error (``isError: true``) whose structured content is ``{"error": err.to_dict()}``
(its ``code``, ``message`` and facts) and whose text is the same JSON; a command that
ended by timeout or a limit also carries its ``result`` (output so far). A snippet that
raised or was refused by the validator is not a tool error: its transcript says so, as
seed 02's ``run_in_sandbox`` does.

Tenants and sessions: over streamable HTTP every request carries a tenant's bearer token,
checked by :class:`corral.mcp.gate.HttpGate` before the SDK sees it; over stdio the one
client is the tenant ``local``. Named sandboxes live in the caller's (tenant, session)
scope: over stdio the server has one client, whose sandboxes end when it disconnects (the
server exits). Over streamable HTTP with the handshake protocol the session is the
``mcp-session-id``: its end (a ``DELETE``, or the gate closing it when idle) destroys its
sandboxes. The sessionless protocol (2026-07-28) has no session: its sandboxes live in the
tenant's own scope and end on ``sandbox_destroy``, the idle timeout or server stop. Each
tenant runs within its caps (sandboxes, memory, runs in flight, sessions) and at the
levels offered to it.

Importing this module imports the SDK: it is the only module of corral that does
(``corral.mcp`` and the CLI import it on use).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

from corral.core.contract import Sandbox, SandboxProvider, SupportsStreamingExec
from corral.core.errors import ConfigInvalidError, CorralError
from corral.core.result import RunResult
from corral.core.spec import (
    Capability,
    ExecOpts,
    Level,
    NetworkPolicy,
    SandboxLimits,
    SandboxSpec,
)
from corral.mcp.config import LEVEL_ORDER, McpConfig, level_at_least, offered_levels
from corral.mcp.gate import HttpGate, tenant_of_scope
from corral.mcp.registry import SandboxRegistry, Scope
from corral.mcp.tenants import LOCAL, McpTenant, TenantTable
from corral.serve.tenancy import TenantPolicy, admit_spec, admit_timeout, check_level

if TYPE_CHECKING:
    from corral.snippets.host.pool import SnippetPool
    from corral.snippets.host.transcript import LogLine

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import Field
except ImportError as exc:  # pragma: no cover - the extra is installed with the tests
    raise ConfigInvalidError(
        "mcp", f"corral mcp needs the MCP SDK (v2): pip install corral[mcp] ({exc})") from None

__all__ = ["Backend", "build_server", "local_tenant", "playground_link", "serve_http",
           "serve_stdio"]


#: the default wall clock of run_command and sandbox_exec
DEFAULT_COMMAND_TIMEOUT_MS = 10_000
INSTRUCTIONS = (
    "corral runs code nobody trusts behind a real boundary (by default the strict level: "
    "namespaces, seccomp, cgroup limits, no network). run_in_sandbox runs a Python snippet "
    "(allow-listed stdlib imports; the last expression is the result) and returns its "
    "transcript: logs, facts (top-level names), result, errors. run_command runs one "
    "command (an absolute path, e.g. /usr/bin/python3) in a fresh sandbox. For work "
    "across calls, sandbox_create a named sandbox, then sandbox_exec / sandbox_write_file "
    "/ sandbox_read_file in it (paths relative to its /work), and sandbox_destroy it; "
    "idle sandboxes are destroyed after a timeout. Errors carry a stable code "
    "(config-invalid, timeout, limits-exceeded, level-not-supported, ...).")


#: tool calls that run something at once for the stdio client
LOCAL_MAX_RUNS = 16


def local_tenant(config: McpConfig) -> McpTenant:
    """The one tenant of a stdio server: no token (its client started it as its own
    user), the server's caps and levels."""
    return McpTenant(name=LOCAL, token_sha256=None, max_sandboxes=config.max_sandboxes,
                     max_runs=LOCAL_MAX_RUNS, max_memory_mb=None, max_sessions=1,
                     policy=TenantPolicy(name=LOCAL, levels=offered_levels(config.level)))


class Backend:
    """What the tools share for the server's life: the tenants, the providers (one per
    level, made on first use), the snippet pool, the named-sandbox registry and the runs
    in flight per tenant. Closed by the lifespan."""

    def __init__(self, config: McpConfig, tenants: TenantTable | None = None) -> None:
        self.config = config
        self.tenants = tenants if tenants is not None else TenantTable([local_tenant(config)])
        self.registry = SandboxRegistry(idle_timeout_s=config.idle_timeout_s,
                                        max_per_scope=config.max_sandboxes,
                                        max_total=config.max_total_sandboxes)
        #: tool calls running something, per tenant
        self.runs: dict[str, int] = {}
        self._providers: dict[Level, SandboxProvider] = {}
        self._lock = asyncio.Lock()
        self._pool: SnippetPool | None = None  # made on the first snippet
        #: set once aclose has released everything
        self.closed = asyncio.Event()

    async def start(self) -> None:
        self.registry.start()

    def caller(self, ctx: Context) -> tuple[McpTenant, Scope]:
        """The tenant of a tool call and the scope its names live in: ``local`` over
        stdio (no headers); over HTTP the tenant the gate authenticated (in the request's
        ASGI scope; never a header the client could forge) and its session id, if any."""
        headers = ctx.headers
        name: str | None
        if headers is None:
            name, session = LOCAL, "stdio"
        else:
            name = tenant_of_scope(getattr(ctx.request_context.request, "scope", None))
            session = headers.get("mcp-session-id") or ""
        try:
            tenant = self.tenants.get(name) if name is not None else None
        except KeyError:
            tenant = None
        if tenant is None or name is None:
            raise ConfigInvalidError("authorization", "this call has no tenant (serve HTTP "
                                     "through corral.mcp.server.http_app, behind its gate)")
        return tenant, Scope(name, session)

    def level_for(self, tenant: McpTenant, asked: str | None) -> Level:
        """The level a call of ``tenant`` runs at: ``asked`` (default: the server's level,
        or the weakest stronger one offered to the tenant), never weaker than the server's
        level, and one offered to the tenant."""
        floor = self.config.level
        if asked is None or asked == "":
            lv = next((x for x in LEVEL_ORDER if x in tenant.levels
                       and LEVEL_ORDER.index(x) >= LEVEL_ORDER.index(floor)), floor)
        else:
            lv = level_at_least(asked, floor)
        return check_level(tenant.policy, lv)

    @contextlib.contextmanager
    def run_slot(self, tenant: McpTenant) -> Iterator[None]:
        """Hold one of ``tenant``'s ``max_runs`` while a call runs something."""
        held = self.runs.get(tenant.name, 0)
        if held >= tenant.max_runs:
            raise ConfigInvalidError("max_runs", f"tenant {tenant.name!r} has {held} runs in "
                                     "flight, the most it may; wait for one to end")
        self.runs[tenant.name] = held + 1
        try:
            yield
        finally:
            self.runs[tenant.name] -= 1
            if not self.runs[tenant.name]:
                del self.runs[tenant.name]

    async def provider(self, level: Level) -> SandboxProvider:
        """The server's provider for ``level`` (made once; LevelNotSupportedError when this
        host cannot give it)."""
        async with self._lock:
            made = self._providers.get(level)
            if made is None:
                from corral.providers import provider
                name = self.config.providers.get(level.value)
                options = dict(self.config.provider_options.get(name or "", {}))
                # limits by cgroup where this user has one, else per-process rlimits (a
                # non-root client's server: docs/mcp.md); an operator's option wins
                options.setdefault("limits_by", "auto")
                made = self._providers[level] = provider(name, level=level, **options)
            return made

    def streams(self, sandbox: Sandbox) -> bool:
        """Whether ``sandbox`` streams its output (its provider advertises
        ``streaming-exec`` and the sandbox has ``exec_streaming``)."""
        made = self._providers.get(sandbox.spec.level)
        return (made is not None and Capability.STREAMING_EXEC.value in made.capabilities
                and isinstance(sandbox, SupportsStreamingExec))

    async def snippet_pool(self) -> SnippetPool:
        provider = await self.provider(self.config.level)
        async with self._lock:
            if self._pool is None:
                from corral.snippets.host.pool import SnippetPool
                self._pool = SnippetPool(providers={self.config.level: provider},
                                         max_workers=self.config.snippet_workers)
            return self._pool

    async def aclose(self) -> None:
        """Destroy every named sandbox, close the pool and the providers."""
        try:
            await self.registry.aclose()
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                await pool.aclose()
            providers, self._providers = list(self._providers.values()), {}
            try:
                for p in providers:
                    await p.aclose()
            finally:
                self.closed.set()


# -- results --------------------------------------------------------------------------
def _result(doc: dict[str, Any], *, is_error: bool = False) -> CallToolResult:
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=doc, is_error=is_error)


def _error(err: CorralError) -> CallToolResult:
    doc: dict[str, Any] = {"error": err.to_dict()}
    if err.result is not None:
        doc["result"] = err.result.to_dict()
    return _result(doc, is_error=True)


async def _guard(call: Callable[[], Awaitable[CallToolResult]]) -> CallToolResult:
    """``call()``, with a corral error turned into a tool error carrying its code."""
    try:
        return await call()
    except CorralError as err:
        return _error(err)


def _run_doc(result: RunResult) -> CallToolResult:
    """A finished command: its result; one that did not end by exiting (timeout, a limit,
    output cap) is a tool error with the contract's error for it and the result."""
    err = result.error()
    if err is None:
        return _result(result.to_dict())
    doc = {"error": err.to_dict(), "result": result.to_dict()}
    return _result(doc, is_error=True)


def _timeout(config: McpConfig, tenant: McpTenant, timeout_ms: int | None) -> int:
    """A command's wall clock: the one asked, within the server's and the tenant's
    maxima, or the default (10 s, or the lower of those maxima)."""
    most = tenant.policy.limits["timeout_ms"].maximum
    if timeout_ms is None:
        return min(DEFAULT_COMMAND_TIMEOUT_MS, config.max_command_timeout_ms,
                   most if most is not None else DEFAULT_COMMAND_TIMEOUT_MS)
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0:
        raise ConfigInvalidError("timeout_ms", "must be a positive integer (milliseconds)")
    if timeout_ms > config.max_command_timeout_ms:
        raise ConfigInvalidError("timeout_ms", f"at most {config.max_command_timeout_ms} ms "
                                 "on this server")
    return admit_timeout(tenant.policy, timeout_ms)


def _output_cap(config: McpConfig, tenant: McpTenant) -> int:
    """The stdout and stderr caps of a command: the server's, or the tenant's default
    when lower."""
    own = tenant.policy.limits["output_bytes"].default
    return min(config.max_output_bytes, own) if own is not None else config.max_output_bytes


def _argv(argv: list[str]) -> list[str]:
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigInvalidError("argv", "a non-empty list of strings")
    if not argv[0].startswith("/"):
        raise ConfigInvalidError("argv", f"argv[0] must be an absolute path (e.g. "
                                 f"/usr/bin/python3), got {argv[0]!r}")
    return argv


def _decode(content: str, encoding: str) -> bytes:
    if encoding == "utf-8":
        return content.encode("utf-8", "surrogatepass")
    if encoding == "base64":
        try:
            return base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigInvalidError("content", "not valid base64") from None
    raise ConfigInvalidError("encoding", "'utf-8' or 'base64'")


class _LiveOutput:
    """A command's output (or a snippet's log lines) while it runs, as MCP progress
    notifications, in order. For a command each chunk is one notification whose
    ``progress`` is the bytes seen so far and whose ``message`` is ``{"stream":
    "stdout"|"stderr", "text": ...}`` as JSON; for a snippet each log line is one whose
    ``progress`` is the lines seen so far and whose ``message`` is ``{"stream":
    "stdout"|"stderr"|"log", "text": line}`` (the transcript's ``logs`` entry). Sent only
    to a client that asked for progress (a ``progressToken``); the final result carries
    all the output anyway."""

    def __init__(self, ctx: Context) -> None:
        import codecs
        self._ctx = ctx
        #: (what it adds to ``progress``, the message); None ends the pump
        self._queue: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in (1, 2)}
        self._seen = 0
        self._task: asyncio.Task[None] | None = None

    def on_output(self, fd: int, chunk: bytes) -> None:
        """The provider's ``on_output(fd, chunk)`` (called on the loop, in order)."""
        if chunk and fd in self._decoders:
            text = self._decoders[fd].decode(chunk)
            self._queue.put_nowait((len(chunk), json.dumps(
                {"stream": "stdout" if fd == 1 else "stderr", "text": text},
                ensure_ascii=False) if text else ""))

    def on_log(self, line: LogLine) -> None:
        """``run_snippet``'s ``on_log`` (called on the loop, in order)."""
        self._queue.put_nowait((1, json.dumps({"stream": line.stream, "text": line.text},
                                              ensure_ascii=False)))

    async def _pump(self) -> None:
        while (item := await self._queue.get()) is not None:
            step, message = item
            self._seen += step
            if message:
                with contextlib.suppress(Exception):  # progress is advisory
                    await self._ctx.report_progress(self._seen, None, message)

    async def __aenter__(self) -> _LiveOutput:
        self._task = asyncio.ensure_future(self._pump())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        if exc[0] is None:  # sent what was queued before the result goes out
            self._queue.put_nowait(None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), 5)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


#: the longest playground link made (browsers and clients handle far longer; a link is a
#: convenience, the transcript is the answer)
MAX_LINK_CHARS = 16_384


def playground_link(page: str | None, source: str | None) -> str | None:
    """``page`` with ``source`` in its fragment (``#source=<base64url of UTF-8>``, read
    by the playground page; a fragment never reaches the server), or None without a page,
    a single source, or when the link would pass :data:`MAX_LINK_CHARS`."""
    if page is None or source is None:
        return None
    encoded = base64.urlsafe_b64encode(source.encode("utf-8", "surrogatepass"))
    link = f"{page}#source={encoded.decode('ascii').rstrip('=')}"
    return link if len(link) <= MAX_LINK_CHARS else None


# -- the server -----------------------------------------------------------------------
FileItem = dict[str, str]


def build_server(config: McpConfig | None = None, tenants: TenantTable | None = None
                 ) -> tuple[MCPServer[Any], Backend]:
    """An ``MCPServer`` with corral's tools, and the backend its lifespan opens and closes
    (every sandbox is destroyed when the server stops). ``tenants``: who may call it over
    HTTP (default: the stdio server's one tenant, ``local``)."""
    from corral import __version__
    cfg = config or McpConfig()
    backend = Backend(cfg, tenants)

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[Backend]:
        await backend.start()
        try:
            yield backend
        finally:
            await asyncio.shield(backend.aclose())

    server: MCPServer[Any] = MCPServer(
        "corral", title="corral sandboxes", version=__version__, instructions=INSTRUCTIONS,
        lifespan=lifespan, log_level="WARNING")

    async def run_in_sandbox(
        ctx: Context,
        source: Annotated[str | None, Field(
            description="Python source, run as main.py (the last expression is the result)"
        )] = None,
        files: Annotated[list[FileItem] | None, Field(
            description="instead of source: [{path, source}], main.py runs, the others import"
        )] = None,
        timeout_ms: Annotated[int, Field(description="wall clock, clamped to [100, 10000]")
                              ] = 5000,
    ) -> CallToolResult:
        """Validate and run a Python snippet in a strict sandbox; return its transcript
        (logs, facts, result, errors, duration_ms, timed_out, truncated, level). A snippet
        the validator refuses is not run: its errors are ValidationError entries. With a
        progress token, each log line also arrives as a progress notification as the
        snippet writes it."""
        async def call() -> CallToolResult:
            from corral.snippets.host.runner import run_snippet
            tenant, _ = backend.caller(ctx)
            if cfg.level not in tenant.levels:
                raise ConfigInvalidError("level", f"snippets run at {cfg.level.value!r}, "
                                         f"not offered to tenant {tenant.name!r}")
            with backend.run_slot(tenant):
                pool = await backend.snippet_pool()
                async with _LiveOutput(ctx) as live:
                    transcript = await run_snippet(
                        source, files=files, timeout_ms=timeout_ms, level=cfg.level,
                        tenant_id=tenant.name, pool=pool, on_log=live.on_log)
            doc = transcript.to_dict()
            link = playground_link(cfg.playground_url, source)
            if link is not None:
                doc["playground_url"] = link
            return _result(doc)
        return await _guard(call)

    async def run_command(
        ctx: Context,
        argv: Annotated[list[str], Field(description="the command: argv[0] an absolute path")],
        level: Annotated[str | None, Field(
            description="strict or context-isolated (default: the server's level)")] = None,
        timeout_ms: Annotated[int | None, Field(description="wall clock in ms (default 10000)")
                              ] = None,
        stdin: Annotated[str | None, Field(description="text written to stdin")] = None,
        env: Annotated[dict[str, str] | None, Field(description="environment (allowlist)")
                       ] = None,
    ) -> CallToolResult:
        """Run one bounded command in a fresh sandbox at a level and return how it ended:
        outcome, exit_code, stdout, stderr, duration and usage. With a progress token,
        its output also arrives as progress notifications while it runs."""
        async def call() -> CallToolResult:
            tenant, _ = backend.caller(ctx)
            lv = backend.level_for(tenant, level)
            args, timeout = _argv(argv), _timeout(cfg, tenant, timeout_ms)
            cap = _output_cap(cfg, tenant)
            with backend.run_slot(tenant):
                return await run(tenant, lv, args, timeout, cap)

        async def run(tenant: McpTenant, lv: Level, args: list[str], timeout: int,
                      cap: int) -> CallToolResult:
            async with _LiveOutput(ctx) as live:
                def out(chunk: bytes) -> None:
                    live.on_output(1, chunk)

                def err(chunk: bytes) -> None:
                    live.on_output(2, chunk)

                if lv == Level.STRICT:
                    from corral.run.strict import run_strict_async
                    result = await run_strict_async(
                        args[0], args[1:], timeout_ms=timeout, env=env, stdin=stdin,
                        max_stdout_bytes=cap, max_stderr_bytes=cap, on_stdout=out,
                        on_stderr=err, provider=await backend.provider(lv),
                        tenant_id=tenant.name,
                        limits=admit_spec(tenant.policy, SandboxSpec(level=lv)).limits)
                else:
                    from corral.run.bounded import run_bounded_async
                    result = await run_bounded_async(
                        args[0], args[1:], timeout_ms=timeout, env=env, stdin=stdin,
                        max_stdout_bytes=cap, max_stderr_bytes=cap, on_stdout=out,
                        on_stderr=err)
            return _run_doc(result)
        return await _guard(call)

    async def sandbox_create(
        ctx: Context,
        name: Annotated[str, Field(description="the sandbox's name in this session")],
        level: Annotated[str | None, Field(
            description="strict or context-isolated (default: the server's level)")] = None,
        mem_mb: Annotated[int | None, Field(description="memory limit, MiB")] = None,
        max_processes: Annotated[int | None, Field(description="processes at once")] = None,
        disk_mb: Annotated[int | None, Field(description="size of /work and /tmp, MiB")
                           ] = None,
        cpu_ms: Annotated[int | None, Field(description="CPU time limit, ms")] = None,
    ) -> CallToolResult:
        """Create a named sandbox that lives across calls in this session (until
        sandbox_destroy, the session's end, or the idle timeout)."""
        async def call() -> CallToolResult:
            tenant, scope = backend.caller(ctx)
            lv = backend.level_for(tenant, level)
            limits = SandboxLimits(mem_mb=mem_mb, max_processes=max_processes,
                                   disk_mb=disk_mb, cpu_ms=cpu_ms)
            # context-isolated is no network boundary: say so instead of asking for none
            network = (NetworkPolicy.unrestricted() if lv == Level.CONTEXT_ISOLATED
                       else NetworkPolicy())
            # the tenant's ceiling: maxima refused, defaults filled in at a boundary level
            # (what is counted is what is enforced)
            spec = admit_spec(tenant.policy, SandboxSpec(
                tenant_id=tenant.name, run_id=uuid.uuid4().hex, level=lv, limits=limits,
                network=network))
            provider = await backend.provider(lv)
            entry = await backend.registry.create(
                scope, name, spec, provider.create, tenant_max=tenant.max_sandboxes,
                tenant_memory_mb=tenant.max_memory_mb)
            return _result({"name": entry.name, "id": entry.sandbox.id, "level": lv.value,
                            "provider": provider.name,
                            "idle_timeout_s": cfg.idle_timeout_s})
        return await _guard(call)

    async def sandbox_exec(
        ctx: Context,
        name: Annotated[str, Field(description="a sandbox made by sandbox_create")],
        argv: Annotated[list[str], Field(description="the command: argv[0] an absolute path")],
        timeout_ms: Annotated[int | None, Field(description="wall clock in ms (default 10000)")
                              ] = None,
        stdin: Annotated[str | None, Field(description="text written to stdin")] = None,
        cwd: Annotated[str | None, Field(description="working dir, relative to /work")
                       ] = None,
        env: Annotated[dict[str, str] | None, Field(description="environment (allowlist)")
                       ] = None,
    ) -> CallToolResult:
        """Run a command to completion in a named sandbox; its files persist between calls.
        With a progress token, its output also arrives as progress notifications."""
        async def call() -> CallToolResult:
            tenant, scope = backend.caller(ctx)
            args, timeout = _argv(argv), _timeout(cfg, tenant, timeout_ms)
            cap = _output_cap(cfg, tenant)
            opts = ExecOpts(timeout_ms=timeout, env=env, cwd=cwd,
                            stdin=None if stdin is None else stdin.encode(),
                            max_stdout_bytes=cap, max_stderr_bytes=cap)
            with backend.run_slot(tenant):
                return await run(scope, args, opts)

        async def run(scope: Scope, args: list[str], opts: ExecOpts) -> CallToolResult:
            async with backend.registry.use(scope, name) as sb, _LiveOutput(ctx) as live:
                try:
                    if backend.streams(sb):
                        assert isinstance(sb, SupportsStreamingExec)
                        result = await sb.exec_streaming(args, opts, on_output=live.on_output)
                    else:
                        result = await sb.exec(args, opts)
                except CorralError as err:
                    if err.result is None:
                        raise
                    result = err.result
            return _run_doc(result)
        return await _guard(call)

    async def sandbox_write_file(
        ctx: Context,
        name: Annotated[str, Field(description="a sandbox made by sandbox_create")],
        path: Annotated[str, Field(description="relative to the sandbox's /work")],
        content: Annotated[str, Field(description="the file's content")],
        encoding: Annotated[str, Field(description="utf-8 (default) or base64")] = "utf-8",
    ) -> CallToolResult:
        """Create or replace a file in a named sandbox (parents are created)."""
        async def call() -> CallToolResult:
            data = _decode(content, encoding)
            if len(data) > cfg.max_file_bytes:
                raise ConfigInvalidError("content", f"at most {cfg.max_file_bytes} bytes")
            _, scope = backend.caller(ctx)
            async with backend.registry.use(scope, name) as sb:
                await sb.write_file(path, data)
            return _result({"name": name, "path": path, "size": len(data)})
        return await _guard(call)

    async def sandbox_read_file(
        ctx: Context,
        name: Annotated[str, Field(description="a sandbox made by sandbox_create")],
        path: Annotated[str, Field(description="relative to the sandbox's /work")],
    ) -> CallToolResult:
        """Read a file of a named sandbox: UTF-8 text, or base64 when it is not text."""
        async def call() -> CallToolResult:
            _, scope = backend.caller(ctx)
            async with backend.registry.use(scope, name) as sb:
                try:
                    data = await sb.read_file(path)
                except FileNotFoundError:
                    raise ConfigInvalidError("path", f"no such file: {path!r}") from None
            if len(data) > cfg.max_file_bytes:
                raise ConfigInvalidError("path", f"the file has {len(data)} bytes; this "
                                         f"server moves at most {cfg.max_file_bytes}")
            try:
                text, enc = data.decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                text, enc = base64.b64encode(data).decode("ascii"), "base64"
            return _result({"name": name, "path": path, "size": len(data),
                            "encoding": enc, "content": text})
        return await _guard(call)

    async def sandbox_list(ctx: Context) -> CallToolResult:
        """The named sandboxes alive in this session."""
        async def call() -> CallToolResult:
            _, scope = backend.caller(ctx)
            return _result({"sandboxes": backend.registry.names(scope),
                            "idle_timeout_s": cfg.idle_timeout_s})
        return await _guard(call)

    async def sandbox_destroy(
        ctx: Context,
        name: Annotated[str, Field(description="a sandbox made by sandbox_create")],
    ) -> CallToolResult:
        """Destroy a named sandbox: every process, file and limit of it is released."""
        async def call() -> CallToolResult:
            backend.registry.check_name(name)
            _, scope = backend.caller(ctx)
            done = await backend.registry.destroy(scope, name)
            if not done:
                raise ConfigInvalidError("name", f"no sandbox named {name!r} in this session")
            return _result({"name": name, "destroyed": True})
        return await _guard(call)

    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                             open_world_hint=False)
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    tools: list[tuple[Callable[..., Awaitable[CallToolResult]], ToolAnnotations]] = [
        (run_in_sandbox, writes), (run_command, writes), (sandbox_create, writes),
        (sandbox_exec, writes), (sandbox_write_file, writes), (sandbox_read_file, reads),
        (sandbox_list, reads)]
    for fn, notes in tools:
        server.add_tool(fn, annotations=notes)
    server.add_tool(sandbox_destroy, annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=False,
        open_world_hint=False))
    return server, backend


# -- transports -----------------------------------------------------------------------
async def _stdio_main(server: MCPServer[Any], backend: Backend) -> int:
    """Serve stdio until the client closes stdin (0), or SIGTERM / SIGINT: then the
    server's task is cancelled, its lifespan destroys every sandbox, and the process
    leaves at once (0 once everything is released, 70 if that took over 30 s) without
    waiting for the SDK's thread that reads stdin: it blocks until the client closes
    stdin, which a client still connected never does."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(server.run_stdio_async())
    stop = asyncio.Event()

    def on_signal() -> None:
        stop.set()
        task.cancel()

    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    if not stop.is_set():
        stopping.cancel()
        await task  # the client left: the lifespan has destroyed every sandbox
        return 0
    try:
        await asyncio.wait_for(backend.closed.wait(), 30)
    except TimeoutError:
        pass
    sys.stderr.flush()
    os._exit(0 if backend.closed.is_set() else 70)


def serve_stdio(config: McpConfig | None = None) -> None:
    """Serve over stdin/stdout until the client closes stdin (or SIGTERM / SIGINT);
    every sandbox is destroyed before this returns (or the process exits)."""
    server, backend = build_server(config)
    asyncio.run(_stdio_main(server, backend))


def http_app(config: McpConfig | None = None, *, tenants: TenantTable, host: str = "127.0.0.1",
             path: str = "/mcp") -> tuple[HttpGate, Backend]:
    """The streamable HTTP ASGI app (its lifespan runs the server) behind its gate
    (bearer tokens of ``tenants``, session caps and expiry), and its backend."""
    server, backend = build_server(config, tenants)
    cfg = backend.config
    # the SDK's own bounds back the gate's up: its cap a little above the gate's (the gate
    # answers first, with its reason), its idle expiry after the gate's
    app = server.streamable_http_app(streamable_http_path=path, host=host,
                                     session_idle_timeout=cfg.idle_timeout_s + 60,
                                     max_sessions=cfg.max_sessions + 16)

    async def ended(tenant: str, session_id: str) -> None:
        await backend.registry.end_scope(Scope(tenant, session_id))

    gate = HttpGate(app, tenants=backend.tenants, path=path, max_sessions=cfg.max_sessions,
                    start_timeout_s=cfg.session_start_timeout_s,
                    idle_timeout_s=cfg.idle_timeout_s, on_end=ended)
    return gate, backend


def serve_http(config: McpConfig | None = None, *, tenants: TenantTable,
               host: str = "127.0.0.1", port: int = 8765, path: str = "/mcp",
               announce: Callable[[str], None] | None = None,
               tls_certfile: str | None = None, tls_keyfile: str | None = None) -> None:
    """Serve streamable HTTP at ``http://host:port/path`` until SIGTERM or SIGINT: uvicorn
    stops accepting, gives requests in flight ``shutdown_grace_s`` to finish (an open
    event stream never does) and cancels the rest, the sessions end, and the lifespan
    destroys every sandbox. ``announce(url)`` is called once listening (port 0: the port
    the kernel chose)."""
    import uvicorn

    cfg = config or McpConfig()
    app, _ = http_app(cfg, tenants=tenants, host=host, path=path)
    server = uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="on",
        timeout_graceful_shutdown=max(1, round(cfg.shutdown_grace_s)),
        ssl_certfile=tls_certfile, ssl_keyfile=tls_keyfile))

    async def main() -> None:
        task = asyncio.ensure_future(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started and announce is not None:
            sock = server.servers[0].sockets[0]
            bound = sock.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            scheme = "https" if tls_certfile else "http"
            announce(f"{scheme}://{shown}:{bound}{path}")
        await task

    # uvicorn re-raises the signal that stopped it once it has shut down gracefully; a
    # stop we asked for is a clean exit (0), so the re-raised signal is ignored here
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM,
                                                                     signal.SIGINT)}
    try:
        asyncio.run(main())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        print("corral mcp: could not start the HTTP server (see above)", file=sys.stderr)
        raise SystemExit(70)
