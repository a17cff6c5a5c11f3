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
import errno
import inspect
import json
import os
import shutil
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

from corral.core.contract import (
    ProcessHandle,
    Sandbox,
    SandboxProvider,
    SupportsStreamingExec,
)
from corral.core.errors import ConfigInvalidError, CorralError, LevelNotSupportedError
from corral.core.result import Outcome, RunResult
from corral.core.spec import (
    Capability,
    ExecOpts,
    Level,
    NetworkPolicy,
    ProcessOpts,
    SandboxLimits,
    SandboxSpec,
)
from corral.core.tasks import TaskSet, settle
from corral.mcp.config import LEVEL_ORDER, McpConfig, level_at_least, offered_levels
from corral.mcp.gate import HttpGate, tenant_of_scope
from corral.mcp.registry import SandboxRegistry, Scope
from corral.mcp.schemas import OUTPUT_SCHEMAS
from corral.mcp.tenants import LOCAL, McpTenant, TenantTable
from corral.serve.tenancy import TenantPolicy, admit_spec, admit_timeout, check_level

if TYPE_CHECKING:
    from corral.snippets.host.pool import SnippetPool
    from corral.snippets.host.transcript import LogLine

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import Field, ValidationError
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
    "in a restricted dialect (allow-listed stdlib imports, no open/eval/getattr, no os or "
    "sys, no dunders: snippet_rules lists them; the last expression is the result) and "
    "returns its transcript: logs, facts (top-level names), result, errors. run_command "
    "runs one command in a fresh sandbox: argv (argv[0] a name on PATH or a path) or "
    "command, one shell line run by /bin/sh -c. For work across calls, sandbox_create a "
    "named sandbox, then sandbox_exec / sandbox_write_file / sandbox_read_file in it "
    "(paths relative to its /work; sandbox_list_files, sandbox_file_info, "
    "sandbox_file_exists, sandbox_make_dir, sandbox_remove), process_start a background "
    "command there and "
    "process_poll it, and sandbox_destroy it; idle sandboxes are destroyed after a "
    "timeout. A command that ran answers how it ended (outcome exit, timeout, a limit), "
    "with output past 1 MiB cut and said in notes; a call that could not run is an error "
    "with a stable code (config-invalid, not-found, limits-exceeded, "
    "level-not-supported, ...).")


#: tool calls that run something at once for the stdio client
LOCAL_MAX_RUNS = 16


def local_tenant(config: McpConfig) -> McpTenant:
    """The one tenant of a stdio server: no token (its client started it as its own
    user), the server's caps and levels."""
    return McpTenant(name=LOCAL, token_sha256=None, max_sandboxes=config.max_sandboxes,
                     max_runs=LOCAL_MAX_RUNS, max_memory_mb=None, max_sessions=1,
                     policy=TenantPolicy(name=LOCAL, levels=offered_levels(config.level),
                                         environments=config.environments))


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
        from corral.mcp.envs import McpEnvs
        #: built environments: the operator's for a tenant, and tenants' own (mcp/envs.py)
        self.envs = McpEnvs(config)
        #: set once aclose has released everything
        self.closed = asyncio.Event()
        #: tasks that outlive the tool call that starts them (a background process's
        #: output reader): ended and awaited by :meth:`aclose`
        self.tasks = TaskSet()

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
            try:
                await self.registry.aclose()
            finally:
                await self.tasks.aclose()  # the readers of processes of those sandboxes
        finally:
            await self.envs.aclose()
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


def _run_doc(result: RunResult, cap: int | None = None) -> CallToolResult:
    """A command that ran: how it ended, whatever the outcome (the rule of every door,
    docs/errors.md: a timeout or a limit is the result's ``outcome``, not a tool error),
    each stream cut at ``cap`` bytes with a note saying so."""
    return _result(_cut(result, cap))


def _text_fields(name: str, data: bytes) -> dict[str, Any]:
    """One stream as the result's JSON gives it: UTF-8 text (a character the cut split
    is left out), else base64."""
    for trim in range(4):
        try:
            return {name: data[:len(data) - trim].decode("utf-8"),
                    f"{name}_encoding": "utf-8"}
        except UnicodeDecodeError:
            continue
    return {name: None, f"{name}_b64": base64.b64encode(data).decode("ascii"),
            f"{name}_encoding": "base64"}


def _cut(result: RunResult, cap: int | None) -> dict[str, Any]:
    """``result.to_dict()``, each stream at most ``cap`` bytes; ``notes`` say what was cut
    (and when the command wrote so much that the hard bound stopped it)."""
    doc = result.to_dict()
    notes: list[str] = []
    for name, data, over in (("stdout", result.stdout, Outcome.OVERFLOW_STDOUT),
                             ("stderr", result.stderr, Outcome.OVERFLOW_STDERR)):
        if cap is not None and len(data) > cap:
            for k in (name, f"{name}_b64", f"{name}_encoding"):
                doc.pop(k, None)
            doc.update(_text_fields(name, data[:cap]))
            doc[f"{name}_truncated"] = True
            more = "+" if result.outcome is over or getattr(result, f"{name}_truncated") \
                else ""
            notes.append(f"{name} cut to its first {cap} bytes of {len(data)}{more}: "
                         "write less, or to a file in a named sandbox and read a part")
        if result.outcome is over:
            notes.append(f"the command wrote more than {result.limit_value} bytes to "
                         f"{name} and was stopped there")
    if notes:
        doc["notes"] = notes
    return doc


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
    """What an answer shows of stdout and of stderr: the server's cap, or the tenant's
    default when lower."""
    own = tenant.policy.limits["output_bytes"].default
    return min(config.max_output_bytes, own) if own is not None else config.max_output_bytes


def _hard_cap(config: McpConfig, tenant: McpTenant) -> int:
    """Where a command's output stops it: :data:`HARD_OUTPUT_FACTOR` times what is
    shown, within the tenant's maximum."""
    shown = _output_cap(config, tenant)
    most = tenant.policy.limits["output_bytes"].maximum
    hard = shown * HARD_OUTPUT_FACTOR
    return max(shown, min(hard, most)) if most is not None else hard


#: the shell a command line runs through
SHELL = "/bin/sh"
#: the hard bound of a command's output, as a multiple of what an answer shows: past it
#: the command is stopped (outcome overflow-*); up to it, the answer is cut with a note
HARD_OUTPUT_FACTOR = 8


def _argv(argv: list[str] | None, command: str | None = None) -> list[str]:
    """The argv of a call: ``argv`` as given, or ``/bin/sh -c command``; exactly one."""
    if (argv is None) == (command is None):
        raise ConfigInvalidError("argv", "give exactly one of argv (a list of strings) or "
                                 "command (one shell line)")
    if command is not None:
        if not command.strip():
            raise ConfigInvalidError("command", "an empty command line")
        return [SHELL, "-c", command]
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigInvalidError("argv", "a non-empty list of strings")
    return list(argv)


#: the PATH of a strict sandbox (the linux provider's base environment): its /usr is the
#: host's, read-only, so a name is found there as the sandbox would find it
STRICT_PATH = "/usr/local/bin:/usr/bin:/bin"


def _on_path(argv: list[str], level: Level) -> list[str] | RunResult:
    """argv with argv[0] resolved as ``corral run`` does: a name is looked up on PATH (at
    strict the sandbox's own, :data:`STRICT_PATH`, whose files are the host's /usr: a
    shim under ~ would not be there; below strict the server's), a symlink followed to
    the file the sandbox sees; a name not found is the ``spawn-error`` result the run
    would give."""
    cmd = argv[0]
    if "/" not in cmd:
        found = shutil.which(cmd, path=STRICT_PATH if level == Level.STRICT else None)
        if found is None:
            return RunResult(outcome=Outcome.SPAWN_ERROR, spawn_errno=errno.ENOENT,
                             detail=f"command not found on PATH: {cmd!r}", level=level.value)
        cmd = found
    if os.path.isabs(cmd) and level == Level.STRICT:
        cmd = os.path.realpath(cmd)
    return [cmd, *argv[1:]]


def _network(doc: dict[str, Any] | None) -> NetworkPolicy | None:
    """A network policy argument: ``{"kind": "none" | "allowlist" | "unrestricted",
    "hosts": [...]}``."""
    if doc is None:
        return None
    extra = sorted(set(doc) - {"kind", "hosts"})
    if extra:
        raise ConfigInvalidError(f"network.{extra[0]}", "unknown field (known: kind, hosts)")
    kind, hosts = doc.get("kind", "none"), doc.get("hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise ConfigInvalidError("network.hosts", "a list of strings")
    if kind not in ("none", "allowlist", "unrestricted"):
        raise ConfigInvalidError("network.kind", "none, allowlist or unrestricted")
    return NetworkPolicy(kind=kind, hosts=tuple(hosts))


def _host_address(ip: str) -> bool:
    from corral.serve.tenancy import is_host_address
    return is_host_address(ip)


def _spec_network(tenant: McpTenant, lv: Level, asked: NetworkPolicy | None) -> NetworkPolicy:
    """The network a sandbox gets: the one asked, within the tenant's ceiling (at a
    boundary level), or the level's default (none at strict; below it the host's network,
    which those levels share: any other ask is refused, never run weaker)."""
    if lv != Level.STRICT:
        if asked is not None and asked.kind != "unrestricted":
            raise LevelNotSupportedError(
                lv.value, (Level.STRICT.value,), "a network policy other than unrestricted "
                f"needs the strict level ({lv.value} shares the host's network)",
                missing="network isolation", field="network")
        return NetworkPolicy.unrestricted()
    return asked if asked is not None else NetworkPolicy()


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

    def __init__(self, ctx: Context, cap: int | None = None) -> None:
        import codecs
        self._ctx = ctx
        #: bytes of each stream sent at most (the answer's cut; the rest is not sent)
        self._room = {1: cap, 2: cap}
        #: (what it adds to ``progress``, the message); None ends the pump
        self._queue: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in (1, 2)}
        self._seen = 0
        self._task: asyncio.Task[None] | None = None

    def on_output(self, fd: int, chunk: bytes) -> None:
        """The provider's ``on_output(fd, chunk)`` (called on the loop, in order)."""
        room = self._room.get(fd)
        if room is not None:
            chunk = chunk[:max(room, 0)]
            self._room[fd] = room - len(chunk)
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
        self._task = asyncio.ensure_future(self._pump())  # ended by __aexit__ (settle)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        try:
            if exc[0] is None:  # sent what was queued before the result goes out
                self._queue.put_nowait(None)
                await asyncio.wait([self._task], timeout=5)
        finally:
            await settle([self._task])


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

_NETWORK_DOC = ('network policy: {"kind": "none"} (default at strict), {"kind": '
                '"allowlist", "hosts": ["pypi.org", "*.example.com:443"]} (only those, '
                'through the egress proxy) or {"kind": "unrestricted"}; within what this '
                'server lets the caller ask (a private address needs the operator)')

#: pydantic's error types, in JSON's words (never the value the caller sent)
_TYPE_WORDS = {
    "int_type": "must be an integer", "int_parsing": "must be an integer",
    "int_from_float": "must be an integer", "string_type": "must be a string",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false",
    "list_type": "must be a list", "dict_type": "must be an object",
    "float_type": "must be a number", "float_parsing": "must be a number",
    "missing": "is required", "extra_forbidden": "is not an argument of this tool",
}


def _invalid_arguments(exc: ValidationError) -> CallToolResult:
    """Arguments the tool's input schema refuses, as corral's ``config-invalid`` (the
    field, in JSON's words), not the validation library's text."""
    first = exc.errors()[0] if exc.errors() else {"loc": ("arguments",), "type": ""}
    loc = [p for p in first.get("loc", ()) if not isinstance(p, str) or
           p not in ("function-after", "function-before")]
    where = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p))
                    for i, p in enumerate(loc)) or "arguments"
    reason = _TYPE_WORDS.get(str(first.get("type", "")), "has the wrong type or value")
    return _error(ConfigInvalidError(where, reason))


class _CorralServer(MCPServer[Any]):
    """The SDK's server, with corral's error shape for arguments its schema refuses, each
    tool's ``outputSchema`` (:mod:`corral.mcp.schemas`), and descriptions without the
    docstrings' indentation."""

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                return _invalid_arguments(exc.__cause__)
            raise

    async def list_tools(self) -> list[Any]:
        return [t.model_copy(update={"output_schema": OUTPUT_SCHEMAS.get(t.name)})
                if t.output_schema is None and t.name in OUTPUT_SCHEMAS else t
                for t in await super().list_tools()]


def snippet_rules_doc() -> dict[str, Any]:
    """What the snippet validator allows and refuses, as ``snippet_rules`` answers."""
    from corral.snippets.validator import policy
    return {
        "allowed_imports": sorted(policy.DEFAULT_ALLOWED_IMPORTS),
        "forbidden_names": sorted(policy.FORBIDDEN_NAMES),
        "forbidden_attributes": sorted(policy.FORBIDDEN_ATTRIBUTES),
        "forbidden_attribute_prefixes": list(policy.FORBIDDEN_ATTRIBUTE_PREFIXES),
        "module_members_forbidden": {k: sorted(v) for k, v in
                                     policy.MODULE_MEMBERS_FORBIDDEN.items()},
        "rules": [
            "import only the allowed_imports (and their members, except "
            "module_members_forbidden)",
            "no forbidden_names (open, eval, exec, getattr, globals, input, ...)",
            "no dunder names or attributes (__class__, __dict__, ...) and none of "
            "forbidden_attributes or a name starting with forbidden_attribute_prefixes",
            "print() goes to the transcript's logs; the last expression is its result; "
            "top-level names are its facts",
            "no file, network or process access: use run_command or a named sandbox",
        ],
    }


class _Background:
    """A command started by ``process_start``: its output read as it comes (the first
    ``cap`` bytes of each stream kept), then how it ended."""

    def __init__(self, pid: str, handle: ProcessHandle, cap: int, level: Level,
                 tasks: TaskSet) -> None:
        import codecs
        self.id, self.handle, self.cap, self.level = pid, handle, cap, level
        self.bufs = (bytearray(), bytearray())
        self.totals = [0, 0]
        self.sent = [0, 0]
        self.decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in range(2)]
        self.result: RunResult | None = None
        self.task = tasks.spawn(self._pump())  # the backend's: ended at its aclose

    async def _read(self, i: int, it: Any) -> None:
        async for chunk in it:
            self.totals[i] += len(chunk)
            room = self.cap - len(self.bufs[i])
            if room > 0:
                self.bufs[i].extend(chunk[:room])

    async def _pump(self) -> None:
        await asyncio.gather(self._read(0, self.handle.stdout),
                             self._read(1, self.handle.stderr), return_exceptions=True)
        try:
            result = await self.handle.wait()
        except CorralError as err:
            result = err.result or RunResult(outcome=Outcome.CANCELLED, detail=str(err))
        self.result = result.at_level(self.level)

    def poll_doc(self, name: str) -> dict[str, Any]:
        """What is new since the last poll, and how it ended once it has."""
        doc: dict[str, Any] = {"name": name, "process": self.id,
                               "running": self.result is None}
        notes: list[str] = []
        for i, stream in enumerate(("stdout", "stderr")):
            new = bytes(self.bufs[i][self.sent[i]:])
            self.sent[i] += len(new)
            doc[stream] = self.decoders[i].decode(new, final=self.result is not None)
            doc[f"{stream}_offset"] = self.sent[i]
            if self.totals[i] > self.cap:
                notes.append(f"{stream} cut to its first {self.cap} bytes of "
                             f"{self.totals[i]}")
        if self.result is not None:
            res = _cut(self.result, 0)  # the output went out in the polls above
            for stream in ("stdout", "stderr"):
                res[stream], res[f"{stream}_encoding"] = "", "utf-8"
                res.pop(f"{stream}_b64", None)
            res.pop("notes", None)
            doc["result"] = res
        if notes:
            doc["notes"] = notes
        return doc


#: how long a cancelled server's lifespan waits for its sandboxes to be released
_RELEASE_S = 30.0
#: background processes one named sandbox keeps at once
MAX_BACKGROUND = 16


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
            from corral.mcp.sessions import close_sessions

            async def release() -> None:
                try:
                    await close_sessions(backend)
                finally:
                    await backend.aclose()

            # finished even if the server's task is cancelled meanwhile (bounded), and
            # awaited here: a cancellation waits for it, then goes on
            closing = asyncio.ensure_future(release())
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError:
                try:
                    await asyncio.wait([closing], timeout=_RELEASE_S)
                finally:
                    await settle([closing])
                raise

    server: MCPServer[Any] = _CorralServer(
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
        environment: Annotated[str | None, Field(
            description="a built package environment you may use (environment_list): "
            "its modules importable (strict only)")] = None,
    ) -> CallToolResult:
        """Validate and run a Python snippet in a strict sandbox; return its transcript
        (logs, facts, result, errors, duration_ms, timed_out, truncated, level).

        Snippets are a restricted dialect of Python, checked before they run: only
        allow-listed standard-library imports (math, json, re, datetime, collections,
        itertools, statistics, ...), no open, eval, exec, getattr or other I/O and
        reflection builtins, no os, sys or subprocess, no dunder names or attributes.
        Call snippet_rules (or read the resource corral://snippets/rules) for the full
        lists. A snippet the validator refuses is not run: its errors are
        ValidationError entries naming the line and the rule. print() goes to logs; the
        last expression is the result. For files, packages or other languages use
        run_command or a named sandbox. With a progress token, each log line also
        arrives as a progress notification as the snippet writes it."""
        async def call() -> CallToolResult:
            from corral.snippets.host.runner import run_snippet
            tenant, _ = backend.caller(ctx)
            if cfg.level not in tenant.levels:
                raise ConfigInvalidError("level", f"snippets run at {cfg.level.value!r}, "
                                         f"not offered to tenant {tenant.name!r}")
            env = None
            if environment is not None:
                env = backend.envs.get(tenant, environment)
                if cfg.level != Level.STRICT:
                    raise LevelNotSupportedError(cfg.level.value, ("strict",), "an "
                                                 "environment is shown at strict only",
                                                 field="environment")
            with backend.run_slot(tenant):
                pool = (await backend.snippet_pool() if env is None else backend.envs.pool(
                    env, await backend.provider(Level.STRICT), cfg.snippet_workers))
                async with _LiveOutput(ctx) as live:
                    transcript = await run_snippet(
                        source, files=files, timeout_ms=timeout_ms, level=cfg.level,
                        tenant_id=tenant.name, pool=pool, on_log=live.on_log,
                        environment=env)
            doc = transcript.to_dict()
            link = playground_link(cfg.playground_url, source)
            if link is not None:
                doc["playground_url"] = link
            return _result(doc)
        return await _guard(call)

    async def run_command(
        ctx: Context,
        argv: Annotated[list[str] | None, Field(
            description="the command and its arguments; argv[0] a name looked up on PATH "
            "(as corral run does) or a path")] = None,
        command: Annotated[str | None, Field(
            description="instead of argv: one shell command line, run as /bin/sh -c "
            "COMMAND (pipes, redirections, &&)")] = None,
        level: Annotated[str | None, Field(
            description="strict or context-isolated (default: the server's level)")] = None,
        timeout_ms: Annotated[int | None, Field(description="wall clock in ms (default 10000)")
                              ] = None,
        stdin: Annotated[str | None, Field(description="text written to stdin")] = None,
        env: Annotated[dict[str, str] | None, Field(description="environment (allowlist)")
                       ] = None,
        network: Annotated[dict[str, Any] | None, Field(
            description=_NETWORK_DOC)] = None,
        environment: Annotated[str | None, Field(
            description="a built package environment you may use (environment_list): "
            "its packages on PYTHONPATH, read-only at /opt/corral/env (strict only)")
            ] = None,
    ) -> CallToolResult:
        """Run one bounded command in a fresh sandbox at a level and return how it ended:
        outcome (exit, timeout, a limit), exit_code, stdout, stderr, duration and usage.
        Output past 1 MiB per stream is cut, and notes say so. With a progress token,
        its output also arrives as progress notifications while it runs."""
        async def call() -> CallToolResult:
            tenant, _ = backend.caller(ctx)
            lv = backend.level_for(tenant, level)
            args, timeout = _argv(argv, command), _timeout(cfg, tenant, timeout_ms)
            net = _spec_network(tenant, lv, _network(network))
            env_ref = None
            if environment is not None:
                env_ref = backend.envs.ref(tenant, environment)
                if lv != Level.STRICT:
                    raise LevelNotSupportedError(lv.value, ("strict",), "an environment "
                                                 "is shown at strict only",
                                                 field="environment")
            resolved = _on_path(args, lv)
            if isinstance(resolved, RunResult):
                return _run_doc(resolved)
            cap = _output_cap(cfg, tenant)
            with backend.run_slot(tenant):
                return await run(tenant, lv, resolved, timeout, cap, net, env_ref)

        async def run(tenant: McpTenant, lv: Level, args: list[str], timeout: int,
                      cap: int, net: NetworkPolicy, env_ref: str | None) -> CallToolResult:
            hard = _hard_cap(cfg, tenant)
            async with _LiveOutput(ctx, cap) as live:
                def out(chunk: bytes) -> None:
                    live.on_output(1, chunk)

                def err(chunk: bytes) -> None:
                    live.on_output(2, chunk)

                if lv == Level.STRICT:
                    from corral.run.strict import run_strict_async
                    spec = admit_spec(tenant.policy, SandboxSpec(level=lv, network=net),
                                      host_address=_host_address)
                    result = await run_strict_async(
                        args[0], args[1:], timeout_ms=timeout, env=env, stdin=stdin,
                        max_stdout_bytes=hard, max_stderr_bytes=hard, on_stdout=out,
                        on_stderr=err, provider=await backend.provider(lv),
                        tenant_id=tenant.name, limits=spec.limits, network=spec.network,
                        environment=env_ref)
                else:
                    from corral.run.bounded import run_bounded_async
                    result = await run_bounded_async(
                        args[0], args[1:], timeout_ms=timeout, env=env, stdin=stdin,
                        max_stdout_bytes=hard, max_stderr_bytes=hard, on_stdout=out,
                        on_stderr=err)
            return _run_doc(result.at_level(lv), cap)
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
        network: Annotated[dict[str, Any] | None, Field(
            description=_NETWORK_DOC)] = None,
        environment: Annotated[str | None, Field(
            description="a built environment you may use (environment_list: the "
            "operator's for you, or your own; its packages on PYTHONPATH, read-only at "
            "/opt/corral/env; strict only)")] = None,
    ) -> CallToolResult:
        """Create a named sandbox that lives across calls in this session (until
        sandbox_destroy, the session's end, or the idle timeout)."""
        async def call() -> CallToolResult:
            tenant, scope = backend.caller(ctx)
            lv = backend.level_for(tenant, level)
            limits = SandboxLimits(mem_mb=mem_mb, max_processes=max_processes,
                                   disk_mb=disk_mb, cpu_ms=cpu_ms)
            # context-isolated is no network boundary: say so instead of asking for none
            net = _spec_network(tenant, lv, _network(network))
            # the tenant's ceiling: maxima refused, defaults filled in at a boundary level
            # (what is counted is what is enforced)
            spec = backend.envs.admit(tenant, SandboxSpec(
                tenant_id=tenant.name, run_id=uuid.uuid4().hex, level=lv, limits=limits,
                network=net, environment=environment), host_address=_host_address)
            provider = await backend.provider(lv)
            entry = await backend.registry.create(
                scope, name, spec, provider.create, tenant_max=tenant.max_sandboxes,
                tenant_memory_mb=tenant.max_memory_mb)
            return _result({"name": entry.name, "id": entry.sandbox.id, "level": lv.value,
                            "provider": provider.name,
                            "idle_timeout_s": cfg.idle_timeout_s,
                            "network": {"kind": spec.network.kind,
                                        "hosts": list(spec.network.hosts)}})
        return await _guard(call)

    async def sandbox_exec(
        ctx: Context,
        name: Annotated[str, Field(description="a sandbox made by sandbox_create")],
        argv: Annotated[list[str] | None, Field(
            description="the command and its arguments (argv[0] a name on the sandbox's "
            "PATH or a path)")] = None,
        command: Annotated[str | None, Field(
            description="instead of argv: one shell line, run as /bin/sh -c COMMAND")
                           ] = None,
        timeout_ms: Annotated[int | None, Field(description="wall clock in ms (default 10000)")
                              ] = None,
        stdin: Annotated[str | None, Field(description="text written to stdin")] = None,
        cwd: Annotated[str | None, Field(description="working dir, relative to /work")
                       ] = None,
        env: Annotated[dict[str, str] | None, Field(description="environment (allowlist)")
                       ] = None,
    ) -> CallToolResult:
        """Run a command to completion in a named sandbox (its files persist between
        calls) and return how it ended, as run_command does. With a progress token, its
        output also arrives as progress notifications."""
        async def call() -> CallToolResult:
            tenant, scope = backend.caller(ctx)
            args, timeout = _argv(argv, command), _timeout(cfg, tenant, timeout_ms)
            cap, hard = _output_cap(cfg, tenant), _hard_cap(cfg, tenant)
            opts = ExecOpts(timeout_ms=timeout, env=env, cwd=cwd,
                            stdin=None if stdin is None else stdin.encode(),
                            max_stdout_bytes=hard, max_stderr_bytes=hard)
            with backend.run_slot(tenant):
                return await run(scope, args, opts, cap)

        async def run(scope: Scope, args: list[str], opts: ExecOpts, cap: int
                      ) -> CallToolResult:
            async with backend.registry.use(scope, name) as sb, _LiveOutput(ctx, cap) as live:
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
            return _run_doc(result.at_level(sb.spec.level), cap)
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
                except FileNotFoundError:  # as over HTTP: not-found, what: file
                    return _result({"error": {
                        "code": "not-found", "what": "file", "path": path,
                        "message": f"no such file: {path!r}"}}, is_error=True)
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

    async def snippet_rules(ctx: Context) -> CallToolResult:
        """What run_in_sandbox's restricted dialect allows: the imports, and the names,
        attributes and module members the validator refuses (also the resource
        corral://snippets/rules)."""
        return _result(snippet_rules_doc())

    async def process_start(
        ctx: Context,
        name: Annotated[str, Field(description="a sandbox made by sandbox_create")],
        argv: Annotated[list[str] | None, Field(
            description="the command and its arguments")] = None,
        command: Annotated[str | None, Field(
            description="instead of argv: one shell line, run as /bin/sh -c COMMAND")
                           ] = None,
        timeout_ms: Annotated[int | None, Field(
            description="wall clock in ms, then it is killed (default: none, it runs "
            "until it ends, process_kill, or the sandbox ends)")] = None,
        cwd: Annotated[str | None, Field(description="working dir, relative to /work")
                       ] = None,
        env: Annotated[dict[str, str] | None, Field(description="environment (allowlist)")
                       ] = None,
    ) -> CallToolResult:
        """Start a command in the background in a named sandbox (a server, a long build)
        and return its process id at once; read its output and how it ended with
        process_poll, stop it with process_kill."""
        async def call() -> CallToolResult:
            tenant, scope = backend.caller(ctx)
            args = _argv(argv, command)
            if timeout_ms is not None:
                _timeout(cfg, tenant, timeout_ms)  # within the maxima
            async with backend.registry.use(scope, name) as sb:
                procs = backend.registry.processes(scope, name)
                for pid in [p for p, b in procs.items() if b.result is not None]:
                    if len(procs) < MAX_BACKGROUND:
                        break
                    del procs[pid]  # the oldest that ended make room
                if len(procs) >= MAX_BACKGROUND:
                    raise ConfigInvalidError("name", f"sandbox {name!r} has "
                                             f"{MAX_BACKGROUND} background processes "
                                             "running: process_kill one first")
                handle = await sb.start_process(args, ProcessOpts(
                    stdin=False, env=env, cwd=cwd, timeout_ms=timeout_ms))
                pid = f"p{uuid.uuid4().hex[:12]}"
                procs[pid] = _Background(pid, handle, _output_cap(cfg, tenant),
                                         sb.spec.level, backend.tasks)
            return _result({"name": name, "process": pid})
        return await _guard(call)

    def _background(scope: Scope, name: str, process: str) -> _Background:
        found = backend.registry.processes(scope, name).get(process)
        if not isinstance(found, _Background):
            raise ConfigInvalidError("process", f"no process {process!r} in sandbox {name!r}")
        return found

    async def process_poll(
        ctx: Context,
        name: Annotated[str, Field(description="the sandbox the process runs in")],
        process: Annotated[str, Field(description="the id process_start gave")],
        wait_ms: Annotated[int, Field(
            description="wait up to this long for it to end (0: answer at once; at most "
            "30000)")] = 0,
    ) -> CallToolResult:
        """The output the process wrote since the last poll (stdout, stderr), whether it
        still runs, and, once it has ended, how (result)."""
        async def call() -> CallToolResult:
            if not 0 <= wait_ms <= 30_000:
                raise ConfigInvalidError("wait_ms", "from 0 to 30000")
            _, scope = backend.caller(ctx)
            async with backend.registry.use(scope, name):
                bg = _background(scope, name, process)
                if wait_ms and bg.result is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(bg.task), wait_ms / 1000)
                return _result(bg.poll_doc(name))
        return await _guard(call)

    async def process_kill(
        ctx: Context,
        name: Annotated[str, Field(description="the sandbox the process runs in")],
        process: Annotated[str, Field(description="the id process_start gave")],
    ) -> CallToolResult:
        """Kill a background process and what it started; answers as process_poll."""
        async def call() -> CallToolResult:
            _, scope = backend.caller(ctx)
            async with backend.registry.use(scope, name):
                bg = _background(scope, name, process)
                await bg.handle.kill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(bg.task), 10)
                return _result(bg.poll_doc(name))
        return await _guard(call)

    @server.resource("corral://snippets/rules", name="snippet-rules",
                     mime_type="application/json",
                     description="what run_in_sandbox's restricted dialect allows")
    def snippet_rules_resource() -> str:
        return json.dumps(snippet_rules_doc(), indent=1)

    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                             open_world_hint=False)
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    kills = ToolAnnotations(read_only_hint=False, destructive_hint=True,
                            idempotent_hint=False, open_world_hint=False)
    tools: list[tuple[Callable[..., Awaitable[CallToolResult]], ToolAnnotations]] = [
        (run_in_sandbox, writes), (snippet_rules, reads), (run_command, writes),
        (sandbox_create, writes), (sandbox_exec, writes), (sandbox_write_file, writes),
        (sandbox_read_file, reads), (sandbox_list, reads), (process_start, writes),
        (process_poll, reads), (process_kill, kills), (sandbox_destroy, kills)]
    from corral.mcp.files import file_tools  # list, info, exists, make_dir, remove
    tools += file_tools(backend)
    for fn, notes in tools:
        # the description without the docstring's indentation
        server.add_tool(fn, annotations=notes, description=inspect.cleandoc(fn.__doc__ or ""))
    from corral.mcp.sessions import add_session_tools  # sessions (issue 30)
    add_session_tools(server, backend, _guard, _result)
    from corral.mcp.envs import add_env_tools  # environments (docs/environments.md)
    add_env_tools(server, backend, _guard, _result)
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
        await settle([stopping])
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
        task = asyncio.ensure_future(server.serve())  # awaited below, or ended (settle)
        try:
            while not server.started and not task.done():
                await asyncio.sleep(0.01)
            if server.started and announce is not None:
                sock = server.servers[0].sockets[0]
                bound = sock.getsockname()[1]
                shown = f"[{host}]" if ":" in host else host
                scheme = "https" if tls_certfile else "http"
                announce(f"{scheme}://{shown}:{bound}{path}")
        except BaseException:
            await settle([task])
            raise
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
