"""What a run needs: frozen value types for sandbox specs and process I/O.

Everything here is a frozen, slotted, keyword-only dataclass validated at
construction: a bad value raises :class:`~corral.core.errors.ConfigInvalidError`
naming the field. Strings are accepted where an enum is expected and coerced.

This module is pure: no I/O imports.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from corral.core.errors import ConfigInvalidError

__all__ = [
    "DEFAULT_ENTRYPOINT_PATH",
    "DEFAULT_TENANT",
    "KNOWN_CAPABILITIES",
    "Capability",
    "ExecOpts",
    "HandlerRef",
    "InvocationMode",
    "Level",
    "NetworkPolicy",
    "ProcessOpts",
    "ResourceUsage",
    "ResumeInfo",
    "SandboxInvocationContext",
    "SandboxLimits",
    "SandboxSpec",
    "SandboxSuspensionRequest",
    "SnapshotHandle",
    "check_argv",
]

#: Where an image carries corral's handler-base entrypoint by convention (copy
#: ``corral.handler.entrypoint_script()`` there) for mode ``json-stdio`` with
#: ``HandlerRef(entrypoint_path=DEFAULT_ENTRYPOINT_PATH)``. Mode ``handler-image`` runs the
#: image's own Entrypoint + Cmd instead (docs/handlers.md, "Handler images").
DEFAULT_ENTRYPOINT_PATH: Final = "/corral/handler-base/entrypoint.py"
#: the tenant of a SandboxSpec that names none
DEFAULT_TENANT: Final = "default"


class Level(enum.StrEnum):
    """Isolation levels, weakest first. Only ``strict`` is a security boundary."""

    NONE = "none"
    CONTEXT_ISOLATED = "context-isolated"
    STRICT = "strict"

    @property
    def rank(self) -> int:
        return _LEVEL_RANK[self]


_LEVEL_RANK = {Level.NONE: 0, Level.CONTEXT_ISOLATED: 1, Level.STRICT: 2}


class InvocationMode(enum.StrEnum):
    """How a handler is invoked. ``json-stdio`` and ``handler-image`` need an image."""

    IN_CONTEXT = "in-context"
    JSON_STDIO = "json-stdio"
    HANDLER_IMAGE = "handler-image"


class Capability(enum.StrEnum):
    """The capability strings seed 01 knows. Providers may add their own strings."""

    PREVIEW_URL = "preview-url"
    STREAMING = "streaming"
    WARM_POOL = "warm-pool"
    STRICT = "strict"
    CONTEXT_ISOLATED = "context-isolated"
    NETWORK_ALLOWLIST = "network-allowlist"
    NETWORK_UNRESTRICTED = "network-unrestricted"
    # corral's own, for the optional lifecycle methods
    SNAPSHOT = "snapshot"
    RESTORE = "restore"
    PAUSE = "pause"
    # corral's own optional front-door features (see corral.core.contract)
    #: sandboxes have ``exec_streaming`` (SupportsStreamingExec)
    STREAMING_EXEC = "streaming-exec"
    #: the provider has ``preload_python`` (SupportsWarmFork), its sandboxes
    #: ``start_python_fork`` (SupportsForkEntry)
    WARM_FORK = "warm-fork"
    #: sandboxes have ``alive`` and ``process_count()`` (SupportsProcessCount)
    PROCESS_COUNT = "process-count"
    #: sandboxes have the file operations ``list_files``, ``get_info``, ``exists``,
    #: ``make_dir`` and ``remove`` (see :class:`corral.core.contract.Sandbox`)
    FILES = "files"


KNOWN_CAPABILITIES: Final = frozenset(c.value for c in Capability)


def _coerce_enum(cls: type[enum.StrEnum], value: object, name: str) -> Any:
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return cls(value)
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise ConfigInvalidError(
            name, f"unknown value {value!r} (expected one of {allowed})") from None


def _check_count(name: str, value: object, *, allow_none: bool = True, minimum: int = 1) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigInvalidError(name, f"must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ConfigInvalidError(name, f"must be >= {minimum}, got {value}")


def _check_str(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, str) or not value:
        raise ConfigInvalidError(name, "must be a non-empty string")


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLimits:
    """Resource limits for one sandbox (the whole process tree).

    ``None`` means the caller asks for no limit; a provider may still apply
    its own documented defaults. A provider that cannot enforce a limit that
    is set refuses the spec with a typed error; it never ignores it.

    Attributes:
        mem_mb: memory plus swap, MiB.
        cpu_ms: CPU time of all processes together, ms.
        disk_mb: size of the writable file area (work dir and /tmp), MiB.
        max_processes: processes and threads alive at once.
    """

    mem_mb: int | None = None
    cpu_ms: int | None = None
    disk_mb: int | None = None
    max_processes: int | None = None

    def __post_init__(self) -> None:
        _check_count("limits.mem_mb", self.mem_mb)
        _check_count("limits.cpu_ms", self.cpu_ms)
        _check_count("limits.disk_mb", self.disk_mb)
        _check_count("limits.max_processes", self.max_processes)

    def merged(self, defaults: SandboxLimits) -> SandboxLimits:
        """These limits with every unset field taken from ``defaults``."""
        return SandboxLimits(
            mem_mb=self.mem_mb if self.mem_mb is not None else defaults.mem_mb,
            cpu_ms=self.cpu_ms if self.cpu_ms is not None else defaults.cpu_ms,
            disk_mb=self.disk_mb if self.disk_mb is not None else defaults.disk_mb,
            max_processes=(self.max_processes if self.max_processes is not None
                           else defaults.max_processes),
        )

    def asked(self) -> dict[str, int]:
        """The limits that are set, by field name."""
        return {k: v for k in ("mem_mb", "cpu_ms", "disk_mb", "max_processes")
                if (v := getattr(self, k)) is not None}


NetworkKind = Literal["none", "allowlist", "unrestricted"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkPolicy:
    """Network access. ``none`` (the default) leaves loopback only.

    ``allowlist``: only ``hosts`` (names, ``*.suffix`` wildcards, IP literals or
    CIDRs, each with an optional ``:port``; see docs/network.md). ``unrestricted``:
    every public destination; its ``hosts`` can only open non-public ranges (e.g.
    ``10.0.0.0/8``). ``secret_headers``: ``{host entry: {header: value}}`` that a
    provider adds at egress to requests for that host only, so the sandbox never
    sees the values (the entry must also be allowed); ``repr`` shows the header
    names, never the values.

    Providers fail closed: a policy they cannot enforce is refused.
    """

    kind: NetworkKind = "none"
    hosts: tuple[str, ...] = ()
    secret_headers: Mapping[str, Mapping[str, str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in ("none", "allowlist", "unrestricted"):
            raise ConfigInvalidError("network.kind", f"unknown value {self.kind!r}")
        hosts = tuple(self.hosts)
        object.__setattr__(self, "hosts", hosts)
        for i, h in enumerate(hosts):
            if not isinstance(h, str) or not h.strip() or any(c.isspace() for c in h):
                raise ConfigInvalidError(f"network.hosts[{i}]", f"not a host name: {h!r}")
        if self.kind == "allowlist" and not hosts:
            raise ConfigInvalidError("network.hosts", "an allowlist needs at least one host")
        if self.kind == "none" and hosts:
            raise ConfigInvalidError("network.hosts", "hosts do not go with kind 'none'")
        secrets: dict[str, dict[str, str]] = {}
        for entry, headers in dict(self.secret_headers).items():
            if not isinstance(entry, str) or not entry.strip():
                raise ConfigInvalidError("network.secret_headers", "keys must be host entries")
            if self.kind == "none":
                raise ConfigInvalidError("network.secret_headers",
                                         "secret headers do not go with kind 'none'")
            hs: dict[str, str] = {}
            for name, value in dict(headers).items():
                if not (isinstance(name, str) and isinstance(value, str) and name.strip()
                        and ":" not in name and not any(c in name + value for c in "\r\n\0")):
                    raise ConfigInvalidError(f"network.secret_headers[{entry!r}]",
                                             f"not a usable header: {name!r}")
                hs[name] = value
            secrets[entry] = hs
        object.__setattr__(self, "secret_headers", secrets)

    def __repr__(self) -> str:
        shown = {e: sorted(h) for e, h in self.secret_headers.items()}
        extra = f", secret_headers={shown!r} (values hidden)" if shown else ""
        return f"NetworkPolicy(kind={self.kind!r}, hosts={self.hosts!r}{extra})"

    def __hash__(self) -> int:
        return hash((self.kind, self.hosts, tuple(sorted(
            (e, tuple(sorted(h.items()))) for e, h in self.secret_headers.items()))))

    @classmethod
    def none(cls) -> NetworkPolicy:
        return cls(kind="none")

    @classmethod
    def allowlist(cls, *hosts: str) -> NetworkPolicy:
        return cls(kind="allowlist", hosts=hosts)

    @classmethod
    def unrestricted(cls, *listed: str) -> NetworkPolicy:
        """Every public destination, plus the non-public ranges ``listed``."""
        return cls(kind="unrestricted", hosts=listed)


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerRef:
    """Names a handler: an artifact and, inside it, a module and attribute.

    ``module_path`` is a dotted module name or a path to a ``.py`` file;
    ``attribute`` the callable in it. ``entrypoint_path``: in mode ``json-stdio`` the
    script the host's interpreter runs instead of corral's handler-base entrypoint;
    in mode ``handler-image`` the path that takes the image's ``Cmd``'s place
    (``Entrypoint + [entrypoint_path]``).
    """

    artifact_id: str
    version: str
    module_path: str | None = None
    attribute: str = "handler"
    entrypoint_path: str | None = None

    def __post_init__(self) -> None:
        _check_str("handler.artifact_id", self.artifact_id)
        _check_str("handler.version", self.version)
        _check_str("handler.module_path", self.module_path, allow_none=True)
        _check_str("handler.attribute", self.attribute)
        _check_str("handler.entrypoint_path", self.entrypoint_path, allow_none=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeInfo:
    """The token a suspended handler waited on, and the value it resumes with."""

    token_id: str
    value: Any = None

    def __post_init__(self) -> None:
        _check_str("resume.token_id", self.token_id)


class SandboxSuspensionRequest(Exception):
    """Raised by handler code to wait durably on a token (``ctx.wait_token``); the
    handler-base entrypoint turns it into a ``suspend`` frame and exits with
    :data:`corral.wire.protocol.SUSPEND_EXIT_CODE`."""

    def __init__(self, token_id: str) -> None:
        if not isinstance(token_id, str) or not token_id:
            raise ConfigInvalidError("token_id", "must be a non-empty string")
        super().__init__(f"handler suspended on wait token {token_id!r}")
        self.token_id = token_id


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxInvocationContext:
    """The one run context: what a caller gives ``invoke``, what travels to the
    handler as ``ctx`` on the invoke frame, and what the handler gets next to its
    input.

    Attributes:
        run_id / tenant_id / node_id: whose run this is. ``invoke`` fills them
            from the :class:`SandboxSpec` (a caller leaves them empty); the wire
            requires them.
        dry_run / state / node_outputs: the flow's context, passed through.
        resume: the token whose completion triggered this run, with its value.
        resumed_tokens: handler side only (never on the wire): every completed
            token and its value (the resume frames, plus ``resume``), read with
            :meth:`wait_token`.
    """

    run_id: str = ""
    tenant_id: str = ""
    node_id: str | None = None
    dry_run: bool = False
    state: Mapping[str, Any] = field(default_factory=dict)
    node_outputs: Mapping[str, Any] = field(default_factory=dict)
    resume: ResumeInfo | None = None
    resumed_tokens: Mapping[str, Any] = field(default_factory=dict)

    def wait_token(self, token_id: str) -> Any:
        """The value token ``token_id`` completed with; if it has not completed yet,
        raise :class:`SandboxSuspensionRequest` (the run suspends)."""
        if token_id in self.resumed_tokens:
            return self.resumed_tokens[token_id]
        raise SandboxSuspensionRequest(token_id)


def _new_run_id() -> str:
    """A random run id; uuid is loaded on first use (the CLI's one-shot path never needs
    it, and importing it costs a few ms)."""
    import uuid
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxSpec:
    """What a sandbox must provide.

    ``mode`` is ``None`` for a general-purpose sandbox (exec, files, processes)
    and names an :class:`InvocationMode` for handler dispatch; ``json-stdio``
    and ``handler-image`` need ``image``. A general-purpose sandbox with an
    ``image`` runs in that image's root file system where the provider has one
    (linux and oci, docs/images.md); others refuse it. For quick use every
    field has a default: ``SandboxSpec()`` is a strict sandbox with the provider's default
    limits, tenant ``"default"`` and a fresh random run id; a multi-tenant
    caller names its tenant (the snippet pool keys its slots by it).
    ``environment`` names a built environment (``corral env build``): a provider
    that cannot show it refuses the spec.
    """

    tenant_id: str = DEFAULT_TENANT
    run_id: str = field(default_factory=lambda: _new_run_id())
    node_id: str | None = None
    image: str | None = None
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    level: Level = Level.STRICT
    mode: InvocationMode | None = None
    invocation: SandboxInvocationContext | None = None
    #: an environment's name or digest (docs/environments.md): its packages shown
    #: read-only at /opt/corral/env and on every command's PYTHONPATH
    environment: str | None = None

    def __post_init__(self) -> None:
        _check_str("tenant_id", self.tenant_id)
        _check_str("environment", self.environment, allow_none=True)
        _check_str("run_id", self.run_id)
        _check_str("node_id", self.node_id, allow_none=True)
        _check_str("image", self.image, allow_none=True)
        object.__setattr__(self, "level", _coerce_enum(Level, self.level, "level"))
        if self.mode is not None:
            mode = _coerce_enum(InvocationMode, self.mode, "mode")
            object.__setattr__(self, "mode", mode)
            if mode in (InvocationMode.JSON_STDIO, InvocationMode.HANDLER_IMAGE) and not self.image:
                raise ConfigInvalidError("image", f"mode {mode.value!r} requires an image")
        if not isinstance(self.limits, SandboxLimits):
            raise ConfigInvalidError("limits", "must be a SandboxLimits")
        if not isinstance(self.network, NetworkPolicy):
            raise ConfigInvalidError("network", "must be a NetworkPolicy")


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceUsage:
    """What a run used. 0 means not measured."""

    cpu_ms: int = 0
    wall_ms: int = 0
    peak_mem_mb: int = 0


def check_argv(argv: Sequence[str]) -> list[str]:
    """The one argv rule of every provider's ``exec`` and ``start_process``: a
    non-empty sequence (not one string) of strings without NUL whose first names a
    command. Returns it as a list; ConfigInvalidError names ``argv`` or the bad
    ``argv[i]`` otherwise."""
    if isinstance(argv, str | bytes) or not argv:
        raise ConfigInvalidError("argv", "must be a non-empty sequence of strings")
    out = list(argv)
    for i, a in enumerate(out):
        if not isinstance(a, str) or "\0" in a:
            raise ConfigInvalidError(f"argv[{i}]", f"must be a string without NUL, got "
                                                   f"{repr(a)[:80]}")
    if not out[0]:
        raise ConfigInvalidError("argv[0]", "must name a command, not be empty")
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecOpts:
    """Options for one ``Sandbox.exec``.

    Attributes:
        timeout_ms: wall-clock deadline for this call; narrows, never widens,
            the provider's own.
        env: the environment, an allowlist (the host's is never merged).
        cwd: working directory inside the sandbox (relative to its work dir).
        stdin: bytes written to the command's stdin, then closed.
        max_stdout_bytes / max_stderr_bytes: output caps for this call; they
            narrow, never widen, the provider's own. Passing one kills the
            command (``LimitsExceededError("output")``).
    """

    timeout_ms: int | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    stdin: bytes | None = None
    max_stdout_bytes: int | None = None
    max_stderr_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_count("timeout_ms", self.timeout_ms)
        _check_count("max_stdout_bytes", self.max_stdout_bytes)
        _check_count("max_stderr_bytes", self.max_stderr_bytes)
        _check_env(self.env)
        if self.stdin is not None and not isinstance(self.stdin, bytes | bytearray):
            raise ConfigInvalidError("stdin", "must be bytes")

    def output_caps(self, stdout_cap: int, stderr_cap: int) -> tuple[int, int]:
        """The caps for this call: the provider's, narrowed by this call's own."""
        return (min(stdout_cap, self.max_stdout_bytes or stdout_cap),
                min(stderr_cap, self.max_stderr_bytes or stderr_cap))


def _check_env(env: Mapping[str, str] | None) -> None:
    if env is None:
        return
    for k, v in env.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise ConfigInvalidError("env", f"bad variable name {k!r}")
        if not isinstance(v, str) or "\0" in v:
            raise ConfigInvalidError(f"env[{k}]", "value must be a string without NUL")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessOpts:
    """Options for ``Sandbox.start_process``. ``stdin=True`` gives a writable pipe."""

    stdin: bool = True
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    timeout_ms: int | None = None

    def __post_init__(self) -> None:
        _check_env(self.env)
        _check_count("timeout_ms", self.timeout_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotHandle:
    """An opaque envelope only the producing provider can restore."""

    v: Literal[1] = 1
    adapter_id: str
    doc: Mapping[str, Any]

    def __post_init__(self) -> None:
        if self.v != 1:
            raise ConfigInvalidError("snapshot.v", f"unsupported version {self.v!r}")
        _check_str("snapshot.adapter_id", self.adapter_id)

    def to_json(self) -> dict[str, Any]:
        return {"v": self.v, "adapterId": self.adapter_id, "doc": dict(self.doc)}

