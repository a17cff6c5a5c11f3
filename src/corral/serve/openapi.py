"""The OpenAPI 3.1 document of the ``/v1`` API, written by hand (served at
``/v1/openapi.json``). ``tests/serve/test_openapi.py`` holds that it names every route of
:data:`corral.serve.app.ROUTES` with its method, and nothing else."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["document"]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def _ok(schema: dict[str, Any] | None, desc: str = "OK", status: str = "200",
        stream: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if schema is None:
        out[status] = {"description": desc}
    else:
        content: dict[str, Any] = {"application/json": {"schema": schema}}
        if stream:
            content["application/x-ndjson"] = {"schema": _ref("Event"),
                                               "description": "one JSON event per line"}
        out[status] = {"description": desc, "content": content}
    for code, what in (("400", "config-invalid: fix the request"),
                       ("401", "unauthorized: no or a wrong bearer token"),
                       ("404", "not-found: no such sandbox, process, file or route (another "
                               "tenant's ids are unknown too)"),
                       ("413", "body-too-large"),
                       ("422", "limits-exceeded: a run hit a limit, or a tenant cap is full "
                               "(`cap` names it)"),
                       ("499", "cancelled"),
                       ("500", "provider-error"),
                       ("501", "level-not-supported or *-not-supported"),
                       ("503", "unavailable: the server is draining"),
                       ("504", "timeout")):
        out.setdefault(code, {"description": what,
                              "content": {"application/json": {"schema": _ref("ErrorBody")}}})
    return out


_SID = {"name": "sid", "in": "path", "required": True, "schema": {"type": "string"},
        "description": "a sandbox id of the caller's tenant"}
_PID = {"name": "pid", "in": "path", "required": True, "schema": {"type": "string"},
        "description": "a process id (from POST .../processes)"}
_PATH = {"name": "path", "in": "query", "required": True, "schema": {"type": "string"},
         "description": "a path relative to the sandbox's work dir"}


_port_body: Final[dict[str, Any]] = {
    "type": "object", "required": ["port"], "additionalProperties": False,
    "properties": {"port": {"type": "integer", "minimum": 1, "maximum": 65535}}}


def _op(summary: str, responses: dict[str, Any], *, body: dict[str, Any] | None = None,
        params: list[dict[str, Any]] | None = None, public: bool = False,
        tag: str = "sandboxes") -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": [tag], "responses": responses}
    if body is not None:
        op["requestBody"] = body
    if params:
        op["parameters"] = params
    if public:
        op["security"] = []
    return op


def _schemas() -> dict[str, Any]:
    s = "string"
    i = "integer"
    obj = "object"
    nullable_s = {"type": [s, "null"]}
    return {
        "Limits": {"type": obj, "additionalProperties": False, "properties": {
            k: {"type": i, "minimum": 1} for k in ("mem_mb", "cpu_ms", "disk_mb",
                                                     "max_processes")}},
        "Network": {"type": obj, "properties": {
            "kind": {"enum": ["none", "allowlist", "unrestricted"]},
            "hosts": {"type": "array", "items": {"type": s}}}},
        "Spec": {"type": obj, "description": "a SandboxSpec; tenant_id is set by the server",
                 "properties": {
                     "level": {"enum": ["strict", "context-isolated", "none"]},
                     "limits": _ref("Limits"), "network": _ref("Network"),
                     "run_id": {"type": s}, "node_id": nullable_s, "image": nullable_s,
                     "mode": {"enum": ["in-context", "json-stdio", "handler-image", None]},
                     "invocation": {"type": [obj, "null"]}, "tenant_id": {"type": s}}},
        "ExecOpts": {"type": obj, "properties": {
            "timeout_ms": {"type": i}, "cwd": {"type": s}, "env": {
                "type": obj, "additionalProperties": {"type": s}},
            "stdin_b64": {"type": s}, "max_stdout_bytes": {"type": i},
            "max_stderr_bytes": {"type": i}}},
        "ProcessOpts": {"type": obj, "properties": {
            "stdin": {"type": "boolean"}, "cwd": {"type": s}, "timeout_ms": {"type": i},
            "env": {"type": obj, "additionalProperties": {"type": s}}}},
        "RunResult": {"type": obj, "description": "RunResult.to_dict(): a stream is UTF-8 "
                      "text, or base64 in *_b64 when *_encoding is base64", "properties": {
                          "outcome": {"enum": ["exit", "timeout", "cancelled",
                                               "overflow-stdout", "overflow-stderr",
                                               "spawn-error", "memory-limit", "cpu-limit",
                                               "processes-limit", "disk-limit"]},
                          "exit_code": {"type": [i, "null"]}, "signal": nullable_s,
                          "stdout": nullable_s, "stderr": nullable_s,
                          "stdout_b64": {"type": s}, "stderr_b64": {"type": s},
                          "stdout_encoding": {"enum": ["utf-8", "base64"]},
                          "stderr_encoding": {"enum": ["utf-8", "base64"]},
                          "duration_ms": {"type": "number"}, "usage": {"type": obj},
                          "limit_value": {"type": [i, "null"]},
                          "observed": {"type": [i, "null"]}, "detail": {"type": s}}},
        "Error": {"type": obj, "required": ["code", "message"], "properties": {
            "code": {"type": s, "description": "corral's closed error set, or the API's own "
                     "(unauthorized, not-found, method-not-allowed, body-too-large, "
                     "unavailable)"},
            "message": {"type": s}, "field": {"type": s}, "cap": {
                "enum": ["sandboxes", "runs", "memory"]},
            "what": {"enum": ["sandbox", "process", "file", "route"]},
            "result": _ref("RunResult")}, "additionalProperties": True},
        "ErrorBody": {"type": obj, "required": ["error"], "properties": {"error": _ref("Error")}},
        "Event": {"type": obj, "description": "a line of a stream", "required": ["event"],
                  "properties": {
                      "event": {"enum": ["output", "result", "error", "exit", "log",
                                         "transcript"]},
                      "fd": {"enum": [1, 2]}, "text": {"type": s}, "b64": {"type": s},
                      "stream": {"enum": ["stdout", "stderr", "log"]},
                      "result": _ref("RunResult"), "error": _ref("Error"),
                      "status": {"type": i}, "transcript": _ref("Transcript")}},
        "Transcript": {"type": obj, "description": "seed 02's transcript", "properties": {
            "logs": {"type": "array", "items": {"type": obj, "properties": {
                "stream": {"enum": ["stdout", "stderr", "log"]}, "text": {"type": s}}}},
            "facts": {"type": obj}, "result": nullable_s,
            "errors": {"type": "array", "items": {"type": obj}},
            "duration_ms": {"type": "number"}, "timed_out": {"type": "boolean"},
            "truncated": {"type": "array", "items": {"type": s}}, "level": nullable_s}},
        "Sandbox": {"type": obj, "properties": {
            "id": {"type": s}, "level": {"type": s}, "provider": {"type": s},
            "mem_mb": {"type": i}, "created": {"type": "number"},
            "processes": {"type": "array", "items": {"type": s}}, "spec": _ref("Spec")}},
        "Handle": {"type": obj, "required": ["v", "adapterId", "doc"], "properties": {
            "v": {"const": 1}, "adapterId": {"type": s}, "doc": {"type": obj}}},
        "Handler": {"type": obj, "required": ["artifact_id", "version"], "properties": {
            "artifact_id": {"type": s}, "version": {"type": s}, "module_path": nullable_s,
            "attribute": {"type": s}, "entrypoint_path": nullable_s}},
        "InvokeRequest": {"type": obj, "required": ["handler"], "properties": {
            "handler": _ref("Handler"), "input": {}, "mode": nullable_s,
            "resumed": {"type": obj}, "files": {"type": obj}, "timeout_ms": {"type": i},
            "spec": _ref("Spec")}},
        "Reply": {"type": obj, "properties": {"kind": {"enum": ["output", "suspended"]},
                                              "value": {}, "token_id": {"type": s}}},
        "Info": {"type": obj, "properties": {
            "version": {"type": s}, "tenant": {"type": s},
            "levels": {"type": "array", "items": {"type": s}},
            "providers": {"type": obj}, "caps": {"type": obj}, "usage": {"type": obj},
            "max_body_bytes": {"type": i}}},
    }


def document() -> dict[str, Any]:
    """The OpenAPI document."""
    result = {"type": "object", "properties": {"result": _ref("RunResult")}}
    exec_body = _json_body({"type": "object", "required": ["argv"], "properties": {
        "argv": {"type": "array", "items": {"type": "string"}}, "opts": _ref("ExecOpts"),
        "stream": {"type": "boolean", "description": "answer with NDJSON events (or send "
                   "Accept: application/x-ndjson)"}}})
    sid, proc = [_SID], [_SID, _PID]
    paths: dict[str, Any] = {
        "/v1/health": {"get": _op("liveness (503 while draining)", _ok(
            {"type": "object"}), public=True, tag="service")},
        "/v1/openapi.json": {"get": _op("this document", _ok({"type": "object"}), public=True,
                                        tag="service")},
        "/v1/info": {"get": _op("the levels, providers and capabilities offered; the "
                                "caller's tenant, caps and usage", _ok(_ref("Info")),
                                tag="service")},
        "/v1/snippets": {"post": _op(
            "validate and run a Python snippet; its transcript (stream: log events, then "
            "the transcript)", _ok(_ref("Transcript"), stream=True), tag="snippets",
            body=_json_body({"type": "object", "properties": {
                "source": {"type": "string"}, "files": {
                    "description": "[{path, source}] or {path: source}; main.py runs"},
                "timeout_ms": {"type": "integer"}, "level": {"type": "string"},
                "stream": {"type": "boolean"}}}))},
        "/v1/runs": {"post": _op(
            "one bounded command in a fresh sandbox at a level (destroyed after): the "
            "RunResult whatever the outcome (stream: output events, then result)",
            _ok(result, stream=True), tag="runs", body=_json_body({
                "type": "object", "required": ["argv"], "properties": {
                    "argv": {"type": "array", "items": {"type": "string"}},
                    "level": {"type": "string"}, "limits": _ref("Limits"),
                    "network": _ref("Network"), "opts": _ref("ExecOpts"),
                    "files": {"type": "object"}, "stream": {"type": "boolean"}}}))},
        "/v1/invoke": {"post": _op("handler dispatch in a fresh sandbox for spec",
                                   _ok(_ref("Reply")), body=_json_body(_ref("InvokeRequest")),
                                   tag="handlers")},
        "/v1/sandboxes": {
            "get": _op("the caller's live sandboxes", _ok({"type": "object", "properties": {
                "sandboxes": {"type": "array", "items": _ref("Sandbox")}}})),
            "post": _op("create a sandbox from a spec", _ok(_ref("Sandbox"), "Created", "201"),
                        body=_json_body({"type": "object", "properties": {
                            "spec": _ref("Spec"), "id": {
                                "type": "string", "description": "an id the client chose "
                                "(16-80 of A-Z a-z 0-9 _ -), to destroy it even when this "
                                "answer is lost"}}}))},
        "/v1/sandboxes/{sid}": {
            "get": _op("one sandbox", _ok(_ref("Sandbox")), params=sid),
            "delete": _op("destroy (an unknown id: 404, and remembered: a create of it still in "
                          "flight is rolled back)", _ok(None, "Destroyed", "204"), params=sid)},
        "/v1/sandboxes/{sid}/exec": {"post": _op(
            "run a command to completion: its RunResult (exit), or the error for any other "
            "outcome with the run as error.result (stream: output events, then result or "
            "error)", _ok(result, stream=True), body=exec_body, params=sid)},
        "/v1/sandboxes/{sid}/files": {
            "put": _op("write a file (the raw body)", _ok(None, "Written", "204"), params=[
                _SID, _PATH], body={"required": True, "content": {
                    "application/octet-stream": {"schema": {"type": "string",
                                                            "format": "binary"}}}}),
            "get": _op("read a file (the raw body)", {"200": {
                "description": "the file", "content": {
                "application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}},
                **{k: v for k, v in _ok(None).items() if k != "200"}}, params=[_SID, _PATH])},
        "/v1/sandboxes/{sid}/processes": {"post": _op(
            "start a process", _ok({"type": "object", "properties": {"id": {
                "type": "string"}}}, "Started", "201"), params=sid, body=_json_body({
                    "type": "object", "required": ["argv"], "properties": {
                        "argv": {"type": "array", "items": {"type": "string"}},
                        "opts": _ref("ProcessOpts")}}))},
        "/v1/sandboxes/{sid}/processes/{pid}/output": {"get": _op(
            "the process's output as NDJSON (output events with fd 1 or 2, then exit); one "
            "reader at a time", {"200": {"description": "events", "content": {
                "application/x-ndjson": {"schema": _ref("Event")}}}}, params=proc)},
        "/v1/sandboxes/{sid}/processes/{pid}/stdin": {"post": _op(
            "write the raw body to the process's stdin", _ok(None, "Written", "204"),
            params=proc, body={"required": True, "content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}}})},
        "/v1/sandboxes/{sid}/processes/{pid}/stdin/close": {"post": _op(
            "close the process's stdin", _ok(None, "Closed", "204"), params=proc)},
        "/v1/sandboxes/{sid}/processes/{pid}/kill": {"post": _op(
            "kill the process and what it started", _ok(None, "Killed", "204"), params=proc)},
        "/v1/sandboxes/{sid}/processes/{pid}/wait": {"get": _op(
            "wait for the process to end: how it ended", _ok(result), params=proc)},
        "/v1/sandboxes/{sid}/pause": {"post": _op(
            "freeze every process (pause-not-supported where the provider cannot)",
            _ok(None, "Paused", "204"), params=sid)},
        "/v1/sandboxes/{sid}/resume": {"post": _op("thaw", _ok(None, "Resumed", "204"),
                                                   params=sid)},
        "/v1/sandboxes/{sid}/snapshot": {"post": _op(
            "snapshot the work dir: an opaque handle only this tenant can restore",
            _ok({"type": "object", "properties": {"handle": _ref("Handle")}}), params=sid)},
        "/v1/sandboxes/{sid}/restore": {"post": _op(
            "restore a handle this tenant's sandboxes made", _ok(None, "Restored", "204"),
            params=sid, body=_json_body({"type": "object", "properties": {
                "handle": _ref("Handle")}}))},
        "/v1/sandboxes/{sid}/invoke": {"post": _op(
            "handler dispatch in this sandbox (in-context is refused)", _ok(_ref("Reply")),
            params=sid, body=_json_body(_ref("InvokeRequest")), tag="handlers")},
        # preview URLs and a live sandbox's network policy (issue 23 item 6)
        "/v1/sandboxes/{sid}/expose": {"post": _op(
            "a preview URL on the server's loopback for a port inside, and the token a "
            "connection must present (X-Corral-Preview-Token)", _ok({
                "type": "object", "required": ["url", "token", "port"], "properties": {
                    "url": {"type": "string"}, "token": {"type": "string"},
                    "port": {"type": "integer"}}}),
            params=sid, body=_json_body(_port_body))},
        "/v1/sandboxes/{sid}/unexpose": {"post": _op(
            "close a port's preview URL and its connections", _ok(None, "Closed", "204"),
            params=sid, body=_json_body(_port_body))},
        "/v1/sandboxes/{sid}/network": {"put": _op(
            "allow / revoke host entries of a live sandbox's policy (new connections)",
            _ok(None, "Changed", "204"), params=sid, body=_json_body({
                "type": "object", "additionalProperties": False, "properties": {
                    k: {"type": "array", "maxItems": 64, "items": {"type": "string"}}
                    for k in ("allow", "revoke")}}))},
        "/metrics": {"get": _op("Prometheus text format (a bearer token only when the "
                                "config sets metrics_token)", {"200": {
            "description": "metrics", "content": {"text/plain": {"schema": {
                "type": "string"}}}}}, public=True, tag="service")},
    }
    from corral import __version__
    return {
        "openapi": "3.1.0",
        "info": {"title": "corral serve", "version": __version__,
                 "description": "Run code nobody trusts behind a real boundary, over HTTP. "
                                "See docs/service.md."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {"schemas": _schemas(), "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"}}},
    }
