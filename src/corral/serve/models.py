"""The typed shapes of ``corral serve``'s HTTP API: one source for checking requests and
for the OpenAPI document (:mod:`corral.serve.openapi`), so the two cannot drift apart.

Request bodies are msgspec Structs that refuse unknown fields (``forbid_unknown_fields``)
and carry their constraints (``Meta``: argv not empty, timeouts and limits positive, an
id's pattern). :func:`decode` turns a body into one, or raises ``config-invalid`` naming
the JSON field (``opts.timeout_ms``) and saying what is wrong in JSON's words (integer,
string, object), never Python's. Each model's ``to_core()`` builds corral's own value
(``ExecOpts``, ``SandboxSpec``, ...), whose constructors check the rest.

Response shapes are Structs too, used for the document only (the server builds its
answers from corral's values: ``RunResult.to_dict()``, ``err.to_dict()``); the
schemathesis run in ``tests/serve/test_openapi_ci.py`` checks live answers against them.

How a route declares its body and answers: :func:`operation` on its handler in
:mod:`corral.serve.app` (``@operation("run a command", body=ExecRequest, ok=ResultBody,
errors=(422,))``). The handler then gets the decoded Struct instead of the raw bytes, and
the document is generated from the route table plus these declarations.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, TypeAlias

import msgspec

from corral.core import spec as cs
from corral.core.errors import ConfigInvalidError
from corral.providers.remote.wire import NDJSON

__all__ = [
    "NDJSON", "RAW", "CreateSandboxRequest", "Error", "ErrorBody", "Event", "ExecOpts",
    "ExecRequest",
    "FileB64", "Handle", "HandleBody", "Handler", "Health", "Info", "InvokeRequest", "Limits",
    "Network", "Operation", "ProcessOpts", "ProcessRequest", "Reply", "RestoreRequest",
    "ResultBody", "RunRequest", "RunResult", "Sandbox", "SandboxList", "SnippetFile",
    "SnippetRequest", "Spec", "Started", "Transcript", "decode", "files_to_core", "operation",
]

#: the bounds of what a request may ask for at all (the operator's caps are narrower):
#: what the kernel takes (pids.max is at most 4194304) and what a timer takes (2**31 - 1
#: ms, about 24.8 days), so a huge figure is a 400 naming its field, never a failure deep
#: in a provider
MAX_MS: Final = 2**31 - 1
MAX_PROCESSES: Final = 4194304
MAX_MIB: Final = 2**40
MAX_BYTES: Final = 2**50
Ms: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=MAX_MS)]
MiB: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=MAX_MIB)]
Bytes: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=MAX_BYTES)]
Count: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=MAX_PROCESSES)]
Argv: TypeAlias = Annotated[list[str], msgspec.Meta(
    min_length=1, description="the command and its arguments (argv[0] a path or a name)")]
LevelName: TypeAlias = Literal["strict", "context-isolated", "none"]
#: ``in-context`` (the handler in the server's own process) is never taken over HTTP
ModeName: TypeAlias = Literal["json-stdio", "handler-image"]
Env: TypeAlias = dict[str, str]
Name: TypeAlias = Annotated[str, msgspec.Meta(min_length=1)]
EnvRef: TypeAlias = Annotated[str, msgspec.Meta(
    min_length=1, max_length=128, description="a built environment: one the operator "
    "lists for the tenant, or one it built (POST /v1/environments); anything else is "
    "refused (config-invalid, field environment)")]


class _In(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A request shape: unknown fields are refused."""


class _Out(msgspec.Struct, omit_defaults=True):
    """An answer's shape (for the document)."""


# -- request parts -------------------------------------------------------------------

class Limits(_In):
    """Resource limits of a sandbox; a limit left out is the provider's default."""

    mem_mb: MiB | None = None
    cpu_ms: Ms | None = None
    disk_mb: MiB | None = None
    max_processes: Count | None = None

    def to_core(self) -> cs.SandboxLimits:
        return cs.SandboxLimits(mem_mb=self.mem_mb, cpu_ms=self.cpu_ms, disk_mb=self.disk_mb,
                             max_processes=self.max_processes)


class Network(_In):
    """A network policy: ``none`` (no network), ``allowlist`` (only ``hosts``: names,
    ``name:port``, addresses or CIDRs, through the egress proxy) or ``unrestricted``."""

    kind: Literal["none", "allowlist", "unrestricted"] = "none"
    hosts: list[str] = []

    def to_core(self) -> cs.NetworkPolicy:
        return cs.NetworkPolicy(kind=self.kind, hosts=tuple(self.hosts))


class Resume(_In):
    token_id: Name
    value: Any = None


class Invocation(_In):
    """The invocation context a handler sees."""

    run_id: str = ""
    tenant_id: str = ""
    node_id: str | None = None
    dry_run: bool = False
    state: dict[str, Any] = {}
    node_outputs: dict[str, Any] = {}
    resume: Resume | None = None

    def to_core(self) -> cs.SandboxInvocationContext:
        r = self.resume
        return cs.SandboxInvocationContext(
            run_id=self.run_id, tenant_id=self.tenant_id, node_id=self.node_id,
            dry_run=self.dry_run, state=self.state, node_outputs=self.node_outputs,
            resume=None if r is None else cs.ResumeInfo(token_id=r.token_id, value=r.value))


class Spec(_In):
    """A sandbox spec. ``tenant_id`` is set by the server (the caller's tenant) whatever
    is sent; ``image`` is a path under the server's ``image_roots``."""

    level: LevelName = "strict"
    limits: Limits | None = None
    network: Network | None = None
    run_id: str | None = None
    node_id: str | None = None
    image: str | None = None
    mode: ModeName | None = None
    invocation: Invocation | None = None
    tenant_id: str | None = None
    #: a built environment the operator lists for the tenant (docs/environments.md)
    environment: str | None = None

    def to_core(self, tenant_id: str) -> cs.SandboxSpec:
        kw: dict[str, Any] = {"tenant_id": tenant_id, "level": cs.Level(self.level)}
        if self.limits is not None:
            kw["limits"] = self.limits.to_core()
        if self.network is not None:
            kw["network"] = self.network.to_core()
        if self.invocation is not None:
            kw["invocation"] = self.invocation.to_core()
        for name in ("run_id", "node_id", "image", "mode", "environment"):
            v = getattr(self, name)
            if v is not None:
                kw[name] = v
        return cs.SandboxSpec(**kw)


class ExecOpts(_In):
    """Options of one command: ``timeout_ms`` (wall clock), ``cwd`` (relative to the
    work dir), ``env`` (the whole environment), ``stdin_b64`` (bytes written to stdin,
    then closed), output caps in bytes."""

    timeout_ms: Ms | None = None
    cwd: str | None = None
    env: Env | None = None
    stdin_b64: bytes | None = None
    max_stdout_bytes: Bytes | None = None
    max_stderr_bytes: Bytes | None = None

    def to_core(self) -> cs.ExecOpts:
        return cs.ExecOpts(timeout_ms=self.timeout_ms, cwd=self.cwd, env=self.env,
                        stdin=self.stdin_b64, max_stdout_bytes=self.max_stdout_bytes,
                        max_stderr_bytes=self.max_stderr_bytes)


class ProcessOpts(_In):
    """Options of a started process: ``stdin`` (keep it open for writes)."""

    stdin: bool = True
    cwd: str | None = None
    timeout_ms: Ms | None = None
    env: Env | None = None

    def to_core(self) -> cs.ProcessOpts:
        return cs.ProcessOpts(stdin=self.stdin, cwd=self.cwd, timeout_ms=self.timeout_ms,
                           env=self.env)


class FileB64(_In):
    """A file's bytes, base64."""

    b64: bytes


Files: TypeAlias = dict[str, str | FileB64]


def files_to_core(files: Files | None) -> dict[str, bytes]:
    """``{path: text | {"b64"}}`` as ``{path: bytes}``."""
    return {path: v.encode("utf-8") if isinstance(v, str) else v.b64
            for path, v in (files or {}).items()}


class Handler(_In):
    """Which handler to invoke: an artifact and version, and where in it."""

    artifact_id: Name
    version: Name
    module_path: str | None = None
    attribute: str = "handler"
    entrypoint_path: str | None = None

    def to_core(self) -> cs.HandlerRef:
        return cs.HandlerRef(artifact_id=self.artifact_id, version=self.version,
                          module_path=self.module_path, attribute=self.attribute,
                          entrypoint_path=self.entrypoint_path)


class Handle(_In):
    """An opaque snapshot handle, as ``POST .../snapshot`` gave it."""

    doc: dict[str, Any]
    adapter_id: Name = msgspec.field(name="adapterId")
    v: Literal[1] = 1

    def to_core(self) -> cs.SnapshotHandle:
        return cs.SnapshotHandle(v=self.v, adapter_id=self.adapter_id, doc=self.doc)


# -- request bodies ------------------------------------------------------------------

_STREAM_DOC: Final = "answer with NDJSON events (or send Accept: application/x-ndjson)"
Stream: TypeAlias = Annotated[bool, msgspec.Meta(description=_STREAM_DOC)]


class SnippetFile(_In):
    path: str
    source: str


class SnippetRequest(_In):
    """A Python snippet: ``source`` (run as main.py) or ``files`` (exactly one of the
    two), validated, then run in the service's pool."""

    source: str | msgspec.UnsetType = msgspec.UNSET
    files: list[SnippetFile] | dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    timeout_ms: Ms | None = None
    level: Literal["strict", "context-isolated"] | None = None
    stream: Stream = False
    #: its packages importable (strict only; the validator allows their modules)
    environment: EnvRef | None = None

    #: what the document adds to the generated schema (checked by :meth:`check`)
    __extra_schema__ = {"oneOf": [{"required": ["source"]}, {"required": ["files"]}]}

    def check(self) -> None:
        if (self.source is msgspec.UNSET) == (self.files is msgspec.UNSET):
            raise ConfigInvalidError("source", "give exactly one of source or files")

    def source_arg(self) -> str | None:
        return None if isinstance(self.source, msgspec.UnsetType) else self.source

    def files_arg(self) -> Any:
        if isinstance(self.files, list):
            return [{"path": f.path, "source": f.source} for f in self.files]
        return None if isinstance(self.files, msgspec.UnsetType) else self.files


#: the shell a command line (``cmd``) runs through: ``/bin/sh -c CMD``
SHELL: Final = "/bin/sh"
Cmd: TypeAlias = Annotated[str, msgspec.Meta(
    min_length=1, description="instead of argv: one shell command line, run as "
    "/bin/sh -c CMD (pipes, redirections, &&)")]
_ARGV_OR_CMD: Final = {"oneOf": [{"required": ["argv"]}, {"required": ["cmd"]}]}


class _Command(_In):
    """A command: ``argv`` (a list), or ``cmd`` (one shell line): exactly one."""

    argv: Argv | None = None
    cmd: Cmd | None = None

    __extra_schema__ = _ARGV_OR_CMD

    def check(self) -> None:
        if (self.argv is None) == (self.cmd is None):
            raise ConfigInvalidError("argv", "give exactly one of argv (a list) or cmd "
                                     "(a shell command line)")

    def command(self) -> list[str]:
        """The argv to run: ``argv``, or ``/bin/sh -c cmd``."""
        if self.cmd is not None:
            return [SHELL, "-c", self.cmd]
        assert self.argv is not None
        return self.argv


class RunRequest(_Command):
    """One command in a fresh sandbox at ``level`` (destroyed after)."""

    level: LevelName = "strict"
    limits: Limits | None = None
    network: Network | None = None
    opts: ExecOpts | None = None
    files: Files | None = None
    stream: Stream = False
    #: its packages read-only at /opt/corral/env, on PYTHONPATH (strict)
    environment: EnvRef | None = None


class EnvBuildRequest(_In):
    """Build an environment of the tenant's own from plain requirement specifiers (a
    right the operator grants: ``[tenants.env_build]``). Answered 202 at once; the
    build runs on (``GET /v1/environments/{name}``)."""

    name: Annotated[str, msgspec.Meta(pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")]
    requirements: Annotated[list[Annotated[str, msgspec.Meta(max_length=200)]],
                            msgspec.Meta(min_length=1, max_length=64, description=(
                                "plain specifiers: name[extras] and version clauses; no "
                                "option, URL, path or marker"))]
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] | None = None


class EnvironmentInfo(_Out):
    """An environment the tenant may name: the operator's (``owner: operator``) or its
    own; ``state`` building, ready, failed (``error`` says why) or missing."""

    name: str
    state: Literal["building", "ready", "failed", "missing"]
    owner: Literal["operator", "tenant"]
    digest: str | None = None
    requirements: list[str] | None = None
    modules: list[str] | None = None
    size_bytes: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: dict[str, Any] | None = None


class EnvironmentList(_Out):
    environments: list[EnvironmentInfo]


class ExecRequest(_Command):
    """One command in a live sandbox."""

    opts: ExecOpts | None = None
    stream: Stream = False


class ProcessRequest(_Command):
    """A command started in a live sandbox, driven by its id."""

    opts: ProcessOpts | None = None


class InvokeRequest(_In):
    """Handler dispatch: ``input`` is handed to the handler; ``spec`` (for
    ``POST /v1/invoke``) makes the fresh sandbox."""

    handler: Handler
    input: Any = None
    spec: Spec | None = None
    mode: ModeName | None = None
    resumed: dict[str, Any] | None = None
    files: Files | None = None
    timeout_ms: Ms | None = None


class CreateSandboxRequest(_In):
    """A sandbox from ``spec`` (default: a strict sandbox). ``id``: one the client chose,
    so it can destroy the sandbox even when this answer is lost."""

    spec: Spec | None = None
    id: Annotated[str, msgspec.Meta(pattern="^[A-Za-z0-9_-]{16,80}$")] | None = None
    #: seconds without a request before the server destroys it, and from its creation at
    #: most (within the tenant's maxima; default: the tenant's defaults)
    idle_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=10**9)] | None = None
    max_lifetime_s: Annotated[float, msgspec.Meta(gt=0, le=10**9)] | None = None


class ExposeRequest(_In):
    """A port of the sandbox's loopback to offer as a preview URL (or to take back)."""

    port: Annotated[int, msgspec.Meta(ge=1, le=65535)]


class NetworkChangeRequest(_In):
    """Allowlist entries to add to and take from a live sandbox's policy (each added
    entry within the tenant's ceiling)."""

    allow: Annotated[list[str], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list)
    revoke: Annotated[list[str], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list)


class RestoreRequest(_In):
    handle: Handle


class _NoBody(_In):
    """What an operation without a body accepts: nothing, or ``{}``."""


# -- answers (for the document) -----------------------------------------------------

Outcome: TypeAlias = Literal[
    "exit", "timeout", "cancelled", "overflow-stdout", "overflow-stderr", "spawn-error",
    "memory-limit", "cpu-limit", "processes-limit", "disk-limit"]


class Usage(_Out):
    cpu_ms: int = 0
    wall_ms: int = 0
    peak_mem_mb: int = 0


class Denial(_Out):
    host: str
    port: int
    kind: str
    reason: str


class RunResult(_Out):
    """How a run ended (``outcome``) and what it left. A stream is UTF-8 text, or null
    with the bytes base64 in ``*_b64`` when ``*_encoding`` is base64."""

    outcome: Outcome
    exit_code: int | None
    signal: str | None
    stdout: str | None
    stderr: str | None
    stdout_encoding: Literal["utf-8", "base64"]
    stderr_encoding: Literal["utf-8", "base64"]
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: float
    usage: Usage
    limit_value: int | None
    observed: int | None
    detail: str
    stdout_b64: str | None = None
    stderr_b64: str | None = None
    cwd: str = ""
    cwd_owned: bool = False
    node_heap_mb_applied: bool = False
    strays_killed: int = 0
    spawn_errno: int | None = None
    denials: list[Denial] = []
    level: LevelName | None = None


class ResultBody(_Out):
    """How the command ended, whatever the outcome (the HTTP status says the request was
    served; ``result.outcome`` says how the command ended)."""

    result: RunResult


class Error(_Out):
    """An error: corral's closed set of codes, or the API's own (unauthorized,
    not-found, method-not-allowed, body-too-large, unavailable), with its facts."""

    code: str
    message: str
    field: str | None = None
    reason: str | None = None
    #: which bound refused: a tenant cap (``sandboxes``, ``runs``, ``memory``,
    #: ``processes``), an operator ceiling (``limits.<name>``) or an edge cap
    cap: str | None = None
    what: Literal["sandbox", "process", "file", "route", "session", "environment",
                  "env_build"] | None = None
    limit: str | None = None
    limit_value: int | None = None
    observed: int | None = None
    result: RunResult | None = None

    __extra_schema__ = {"additionalProperties": True}


class ErrorBody(_Out):
    error: Error


class LogLine(_Out):
    stream: Literal["stdout", "stderr", "log"]
    text: str


class Transcript(_Out):
    """A snippet's transcript: its log lines, facts, result, errors."""

    logs: list[LogLine]
    facts: dict[str, Any]
    result: Any
    errors: list[dict[str, Any]]
    duration_ms: float
    timed_out: bool
    truncated: list[str]
    level: str | None

    __extra_schema__ = {"additionalProperties": True}


class OutputEvent(_Out, tag_field="event", tag="output"):
    """Output as it came: ``text`` (UTF-8) or ``b64``."""

    fd: Literal[1, 2]
    text: str | None = None
    b64: str | None = None


class ResultEvent(_Out, tag_field="event", tag="result"):
    result: RunResult


class ErrorEvent(_Out, tag_field="event", tag="error"):
    """The request failed after the stream began; ``status`` is the HTTP status it
    would have had."""

    status: int
    error: Error


class ExitEvent(_Out, tag_field="event", tag="exit"):
    result: RunResult | None
    error: Error | None = None


class LogEvent(_Out, tag_field="event", tag="log"):
    stream: Literal["stdout", "stderr", "log"]
    text: str


class TranscriptEvent(_Out, tag_field="event", tag="transcript"):
    transcript: Transcript


Event: TypeAlias = (OutputEvent | ResultEvent | ErrorEvent | ExitEvent | LogEvent
                    | TranscriptEvent)


class Sandbox(_Out):
    id: str
    level: str
    provider: str
    mem_mb: int
    created: float
    processes: list[str]
    spec: dict[str, Any] | None = None

    __extra_schema__ = {"additionalProperties": True}


class Preview(_Out):
    """A preview URL on the server's loopback and the token every connection to it must
    carry (``X-Corral-Preview-Token``, or a ``CORRAL-PREVIEW-TOKEN`` line first)."""

    url: str
    token: str
    port: int


class SandboxList(_Out):
    sandboxes: list[Sandbox]


class Started(_Out):
    id: str


class HandleBody(_Out):
    handle: Handle


class Reply(_Out):
    """A handler's answer: its output, a suspension to resume, or ``ended``: the handler
    ran and ended otherwise (past its ``timeout_ms``), ``result`` saying how (the one
    rule: a run that ran answers 200 with its outcome)."""

    kind: Literal["output", "suspended", "ended"]
    value: Any = None
    token_id: str | None = None
    result: RunResult | None = None


class Health(_Out):
    status: Literal["ok", "draining"]


class Info(_Out):
    """The levels offered, each level's provider and capabilities; the caller's tenant,
    caps and usage."""

    version: str
    tenant: str
    levels: list[str]
    providers: dict[str, Any]
    caps: dict[str, Any]
    usage: dict[str, Any]
    max_body_bytes: int

    __extra_schema__ = {"additionalProperties": True}


# -- decoding ------------------------------------------------------------------------

_JSON_NAMES: Final = {"int": "integer", "str": "string", "float": "number",
                      "bool": "boolean", "bytes": "base64 string"}
_WORD: Final = re.compile(r"`(int|str|float|bool|bytes)`")
_AT: Final = re.compile(r" - at `\$(.*)`$")
_UNKNOWN: Final = re.compile(r"Object contains unknown field `([^`]*)`")
_MISSING: Final = re.compile(r"Object missing required field `([^`]*)`")


def _field_of(message: str) -> tuple[str, str]:
    """(field path, message in JSON's words) of a msgspec validation message."""
    m = _AT.search(message)
    path = m.group(1).lstrip(".") if m else ""
    text = message[:m.start()] if m else message
    for pat, what in ((_UNKNOWN, "unknown field"), (_MISSING, "required field missing")):
        k = pat.search(text)
        if k is not None:
            path = f"{path}.{k.group(1)}" if path else k.group(1)
            text = what
    text = _WORD.sub(lambda w: f"`{_JSON_NAMES[w.group(1)]}`", text).replace("`", "")
    return path or "body", text


def decode(decoder: msgspec.json.Decoder[Any], body: bytes, *, optional: bool = False) -> Any:
    """``body`` decoded by ``decoder``; ``config-invalid`` naming the JSON field when it
    is not the shape. An empty body is ``{}`` when ``optional``, else refused."""
    if not body.strip():
        if not optional:
            raise ConfigInvalidError("body", "a JSON object is needed")
        body = b"{}"
    try:
        value = decoder.decode(body)
    except msgspec.ValidationError as e:
        field, text = _field_of(str(e))
        raise ConfigInvalidError(field, text) from None
    except msgspec.DecodeError as e:
        raise ConfigInvalidError("body", f"not JSON: {e}") from None
    except RecursionError:  # arrays in arrays... in a field that takes any JSON value
        raise ConfigInvalidError("body", "nested too deeply") from None
    check = getattr(value, "check", None)
    if check is not None:
        check()
    return value


# -- operations ----------------------------------------------------------------------

#: ``body=RAW``: the operation takes the raw request body (a file, stdin bytes)
RAW: Final = "raw"


@dataclass(frozen=True, slots=True)
class Operation:
    """What the document says of one route's handler (set by :func:`operation`)."""

    summary: str
    body: type | str | None = None
    body_optional: bool = False
    ok: Any = None                   #: a Struct, a media type string, or None (no content)
    status: int = 200
    stream: bool = False             #: also answers NDJSON events
    errors: Sequence[int] = ()       #: statuses beyond those every operation of its kind has
    tag: str = "sandboxes"
    query: Sequence[tuple[str, str]] = ()  #: required query parameters (name, description)
    #: the path parameter its answer's ``id`` fills (``sid``: a create; ``pid``: a start),
    #: for the document's links from this operation to those that take it
    creates: str | None = None


_NO_BODY: Final = msgspec.json.Decoder(_NoBody)


def operation(summary: str, *, body: type | str | None = None, body_optional: bool = False,
              ok: Any = None, status: int = 200, stream: bool = False,
              errors: Sequence[int] = (), tag: str = "sandboxes",
              query: Sequence[tuple[str, str]] = (), creates: str | None = None
              ) -> Callable[[Any], Any]:
    """Declare a handler's body and answers. A tenant handler ``(self, request, tenant,
    body)`` with ``body=SomeStruct`` then gets the decoded Struct as ``body``; without
    one, a body other than nothing or ``{}`` is refused; ``RAW`` passes the bytes."""
    op = Operation(summary, body, body_optional, ok, status, stream, tuple(errors), tag,
                   tuple(query), creates)

    def deco(fn: Any) -> Any:
        if len(inspect.signature(fn).parameters) != 4 or body == RAW:
            fn.__corral_op__ = op
            return fn
        dec = msgspec.json.Decoder(body) if isinstance(body, type) else _NO_BODY
        optional = body_optional or body is None

        @functools.wraps(fn)
        async def wrapper(self: Any, request: Any, tenant: Any, raw: bytes) -> Any:
            return await fn(self, request, tenant, decode(dec, raw, optional=optional))

        wrapper.__corral_op__ = op  # type: ignore[attr-defined]
        return wrapper

    return deco
