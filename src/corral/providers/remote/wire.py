"""The JSON shapes of ``corral serve``'s HTTP API (``/v1``), imported by both ends.

The server (:mod:`corral.serve`) and the remote provider (this package) encode and
decode the same values here, so the two cannot drift apart: specs, exec and process
options, run results (:meth:`RunResult.to_dict`, and back), errors (``{code, message,
...facts}`` plus the run they ended, and back to the same class with the same facts),
snapshot handles. Standard library only, no I/O; docs/service.md shows every shape.

Bytes travel as base64 (``*_b64``) inside JSON; a file's content travels as the raw
request or response body instead.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, Final

from corral.core.errors import (
    MAX_ERROR_TEXT,
    ConfigInvalidError,
    CorralError,
    ProviderError,
    error_from_dict,
)
from corral.core.result import NetworkDenial, Outcome, RunResult
from corral.core.spec import (
    ExecOpts,
    NetworkPolicy,
    ProcessOpts,
    ResourceUsage,
    ResumeInfo,
    SandboxInvocationContext,
    SandboxLimits,
    SandboxSpec,
    SnapshotHandle,
)

__all__ = [
    "API_PREFIX", "HTTP_CODES", "NDJSON", "b64", "error_from_json", "error_to_json",
    "exec_opts_from_json", "exec_opts_to_json", "handle_from_json", "handle_to_json",
    "process_opts_from_json", "process_opts_to_json", "result_from_json", "result_to_json",
    "spec_from_json", "spec_to_json", "unb64",
]

#: every route of the API lives under this prefix (a new major version gets a new one)
API_PREFIX: Final = "/v1"
#: the media type of streamed responses: one JSON object per line
NDJSON: Final = "application/x-ndjson"

#: the API's own error codes, for what happens before a request reaches corral (auth,
#: routing, body size, draining); everything else carries a code of corral's closed set
HTTP_CODES: Final[Mapping[str, int]] = {
    "unauthorized": 401, "not-found": 404, "method-not-allowed": 405,
    "request-timeout": 408,  # a head or body that did not arrive in time (serve/edge.py)
    "body-too-large": 413, "head-too-large": 431, "unavailable": 503,
    "conflict": 409,  # a file operation the file system refused (serve/files.py)
    "forbidden": 403,  # a right the operator did not grant (serve/envbuild.py)
    "too-many-requests": 429,  # a tenant's builds at once (serve/envbuild.py)
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: object, what: str) -> bytes:
    """Decode base64 text; ConfigInvalidError naming ``what`` when it is not."""
    if not isinstance(text, str):
        raise ConfigInvalidError(what, "must be a base64 string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ConfigInvalidError(what, "is not valid base64") from None


def _obj(doc: object, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise ConfigInvalidError(what, "must be a JSON object")
    return doc


def _known(doc: Mapping[str, Any], what: str, allowed: Sequence[str]) -> None:
    extra = sorted(set(doc) - set(allowed))
    if extra:
        raise ConfigInvalidError(f"{what}.{extra[0]}",
                                 f"unknown field (known: {', '.join(allowed)})")


# -- specs and options --------------------------------------------------------------

_SPEC_FIELDS: Final = ("tenant_id", "run_id", "node_id", "image", "limits", "network",
                       "level", "mode", "invocation", "environment")


def spec_to_json(spec: SandboxSpec) -> dict[str, Any]:
    """A spec as JSON (limits that are unset are left out)."""
    inv = spec.invocation
    return {
        "tenant_id": spec.tenant_id, "run_id": spec.run_id, "node_id": spec.node_id,
        "image": spec.image, "limits": spec.limits.asked(),
        "network": {"kind": spec.network.kind, "hosts": list(spec.network.hosts)},
        "level": spec.level.value, "mode": None if spec.mode is None else spec.mode.value,
        "invocation": None if inv is None else _ctx_to_json(inv),
        **({} if spec.environment is None else {"environment": spec.environment}),
    }


def _ctx_to_json(ctx: SandboxInvocationContext) -> dict[str, Any]:
    return {"run_id": ctx.run_id, "tenant_id": ctx.tenant_id, "node_id": ctx.node_id,
            "dry_run": ctx.dry_run, "state": dict(ctx.state),
            "node_outputs": dict(ctx.node_outputs),
            "resume": None if ctx.resume is None else {"token_id": ctx.resume.token_id,
                                                        "value": ctx.resume.value}}


def _ctx_from_json(doc: object) -> SandboxInvocationContext | None:
    if doc is None:
        return None
    d = _obj(doc, "invocation")
    resume = d.get("resume")
    r = None
    if resume is not None:
        rd = _obj(resume, "invocation.resume")
        r = ResumeInfo(token_id=rd.get("token_id"), value=rd.get("value"))  # type: ignore[arg-type]
    return SandboxInvocationContext(
        run_id=str(d.get("run_id", "")), tenant_id=str(d.get("tenant_id", "")),
        node_id=d.get("node_id"), dry_run=bool(d.get("dry_run", False)),
        state=_obj(d.get("state", {}), "invocation.state"),
        node_outputs=_obj(d.get("node_outputs", {}), "invocation.node_outputs"), resume=r)


def spec_from_json(doc: object, *, tenant_id: str | None = None) -> SandboxSpec:
    """A spec from JSON, validated by :class:`SandboxSpec` itself; ``tenant_id``, when
    given, replaces the document's (the server sets the authenticated tenant)."""
    d = _obj(doc, "spec")
    _known(d, "spec", _SPEC_FIELDS)
    limits = _obj(d.get("limits") or {}, "limits")
    _known(limits, "limits", ("mem_mb", "cpu_ms", "disk_mb", "max_processes"))
    net = _obj(d.get("network") or {}, "network")
    _known(net, "network", ("kind", "hosts"))
    hosts = net.get("hosts") or ()
    if not isinstance(hosts, list | tuple):
        raise ConfigInvalidError("network.hosts", "must be a list")
    kw: dict[str, Any] = {
        "limits": SandboxLimits(**limits),
        "network": NetworkPolicy(kind=net.get("kind", "none"), hosts=tuple(hosts)),
        "invocation": _ctx_from_json(d.get("invocation")),
    }
    for name in ("run_id", "node_id", "image", "level", "mode", "environment"):
        if d.get(name) is not None:
            kw[name] = d[name]
    tenant = tenant_id if tenant_id is not None else d.get("tenant_id")
    if tenant is not None:
        kw["tenant_id"] = tenant
    return SandboxSpec(**kw)


def _env(doc: object) -> dict[str, str] | None:
    if doc is None:
        return None
    env = _obj(doc, "env")
    return dict(env)


def exec_opts_to_json(opts: ExecOpts | None) -> dict[str, Any]:
    if opts is None:
        return {}
    names = ("timeout_ms", "cwd", "max_stdout_bytes", "max_stderr_bytes")
    out: dict[str, Any] = {k: getattr(opts, k) for k in names if getattr(opts, k) is not None}
    if opts.env is not None:
        out["env"] = dict(opts.env)
    if opts.stdin is not None:
        out["stdin_b64"] = b64(bytes(opts.stdin))
    return out


def exec_opts_from_json(doc: object) -> ExecOpts:
    d = _obj(doc or {}, "opts")
    _known(d, "opts", ("timeout_ms", "cwd", "max_stdout_bytes", "max_stderr_bytes", "env",
                       "stdin_b64"))
    stdin = None if d.get("stdin_b64") is None else unb64(d["stdin_b64"], "opts.stdin_b64")
    return ExecOpts(timeout_ms=d.get("timeout_ms"), cwd=d.get("cwd"), env=_env(d.get("env")),
                    stdin=stdin, max_stdout_bytes=d.get("max_stdout_bytes"),
                    max_stderr_bytes=d.get("max_stderr_bytes"))


def process_opts_to_json(opts: ProcessOpts | None) -> dict[str, Any]:
    if opts is None:
        return {}
    out: dict[str, Any] = {"stdin": opts.stdin}
    for k in ("cwd", "timeout_ms"):
        if getattr(opts, k) is not None:
            out[k] = getattr(opts, k)
    if opts.env is not None:
        out["env"] = dict(opts.env)
    return out


def process_opts_from_json(doc: object) -> ProcessOpts:
    d = _obj(doc or {}, "opts")
    _known(d, "opts", ("stdin", "cwd", "timeout_ms", "env"))
    return ProcessOpts(stdin=bool(d.get("stdin", True)), cwd=d.get("cwd"),
                       timeout_ms=d.get("timeout_ms"), env=_env(d.get("env")))


def argv_from_json(doc: object) -> list[str]:
    """argv: a list of strings (the provider refuses an empty one or a NUL, as ever)."""
    if not isinstance(doc, list) or not all(isinstance(a, str) for a in doc):
        raise ConfigInvalidError("argv", "must be a list of strings")
    return list(doc)


__all__ += ["argv_from_json"]


# -- results and errors -------------------------------------------------------------

def result_to_json(result: RunResult) -> dict[str, Any]:
    """:meth:`RunResult.to_dict`, plus ``spawn_errno`` (so the client rebuilds the same
    error for a ``spawn-error``)."""
    doc = result.to_dict()
    doc["spawn_errno"] = result.spawn_errno
    return doc


def _stream(doc: Mapping[str, Any], name: str) -> bytes:
    if doc.get(f"{name}_encoding") == "base64":
        return unb64(doc.get(f"{name}_b64"), f"result.{name}_b64")
    text = doc.get(name) or ""
    if not isinstance(text, str):
        raise ConfigInvalidError(f"result.{name}", "must be a string")
    return text.encode("utf-8")


def result_from_json(doc: object) -> RunResult:
    """The :class:`RunResult` a server sent (:func:`result_to_json`)."""
    d = _obj(doc, "result")
    usage = _obj(d.get("usage") or {}, "result.usage")
    try:
        outcome = Outcome(d.get("outcome", "exit"))
    except ValueError:
        raise ConfigInvalidError("result.outcome", f"unknown outcome {d.get('outcome')!r}"
                                 ) from None
    return RunResult(
        outcome=outcome, exit_code=d.get("exit_code"), stdout=_stream(d, "stdout"),
        stderr=_stream(d, "stderr"), stdout_truncated=bool(d.get("stdout_truncated")),
        stderr_truncated=bool(d.get("stderr_truncated")),
        duration_ms=float(d.get("duration_ms") or 0.0),
        usage=ResourceUsage(cpu_ms=int(usage.get("cpu_ms") or 0),
                            wall_ms=int(usage.get("wall_ms") or 0),
                            peak_mem_mb=int(usage.get("peak_mem_mb") or 0)),
        limit_value=d.get("limit_value"), observed=d.get("observed"),
        detail=str(d.get("detail") or ""), spawn_errno=d.get("spawn_errno"),
        cwd=str(d.get("cwd") or ""), cwd_owned=bool(d.get("cwd_owned")),
        node_heap_mb_applied=bool(d.get("node_heap_mb_applied")),
        strays_killed=int(d.get("strays_killed") or 0),
        level=None if d.get("level") is None else str(d["level"]),
        denials=tuple(NetworkDenial(host=str(x.get("host", "")), port=int(x.get("port") or 0),
                                    kind=str(x.get("kind", "")), reason=str(x.get("reason", "")))
                      for x in d.get("denials") or ()))


def error_to_json(err: CorralError) -> dict[str, Any]:
    """``err.to_dict()`` (code, message, the class's facts), plus ``result`` when the
    error ended a run (with the output captured up to then)."""
    doc = err.to_dict()
    if err.result is not None:
        doc["result"] = result_to_json(err.result)
    return doc


def error_from_json(doc: object) -> CorralError:
    """The error a server sent, as the same class with the same facts (and ``result``),
    by corral's one error codec (:func:`corral.core.errors.error_from_dict`); an unknown
    code becomes ``ProviderError`` (the set is closed), and so does one of the API's own
    codes (:data:`HTTP_CODES`) that reaches here."""
    if isinstance(doc, Mapping) and doc.get("code") in HTTP_CODES:
        return ProviderError(f"corral serve: {doc['code']!s}: "
                             f"{str(doc.get('message', ''))[:MAX_ERROR_TEXT]}")
    res = doc.get("result") if isinstance(doc, Mapping) else None
    try:
        result = result_from_json(res) if res is not None else None
    except (ConfigInvalidError, ValueError, TypeError, AttributeError):
        result = None  # a malformed result: the error stands without it
    return error_from_dict(doc, result=result)


# -- snapshot handles ---------------------------------------------------------------

def handle_to_json(handle: SnapshotHandle) -> dict[str, Any]:
    return handle.to_json()


def handle_from_json(doc: object) -> SnapshotHandle:
    d = _obj(doc, "handle")
    return SnapshotHandle(v=d.get("v", 1), adapter_id=d.get("adapterId"),  # type: ignore[arg-type]
                          doc=_obj(d.get("doc") or {}, "handle.doc"))
