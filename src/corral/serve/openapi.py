"""The OpenAPI 3.1 document of the ``/v1`` API (served at ``/v1/openapi.json``),
generated, never written by hand: the paths from the route table
(:data:`corral.serve.app.ROUTES`), each operation from its handler's
:func:`~corral.serve.models.operation` declaration, and the schemas from the same msgspec
models that decode the request bodies (:mod:`corral.serve.models`), so the document and
the server cannot drift apart.

Every status an operation can give is listed: a tenant operation 401 (no or a wrong
token), 413 (body over the cap), 400 (a body that is not its shape), 503 (draining) and
500; one with a sandbox or process in its path 404; and what its declaration adds (422
for a cap or a limit, 501 for what a level's provider lacks, ...). Tests:
``tests/serve/test_openapi*.py`` (every route and nothing else; openapi-spec-validator;
a bounded schemathesis run against a live server).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Final

import msgspec

from corral.serve import models as m
from corral.serve.files import BODY_NAMED

__all__ = ["document", "document_bytes", "operations"]

_REF: Final = "#/components/schemas/{name}"
_PARAM: Final = re.compile(r"{(\w+)}")
_PARAMS: Final = {
    "sid": "a sandbox id of the caller's tenant (another tenant's ids are unknown: 404)",
    "pid": "a process id (from POST .../processes)",
    "name": "an environment's name",
}
_STATUS_TEXT: Final = {
    400: "config-invalid (or invalid-snapshot-handle): the request is not its shape; "
         "`field` names the JSON field",
    401: "unauthorized: no or a wrong bearer token",
    403: "forbidden: a right the operator did not grant the tenant (`what` names it)",
    404: "not-found: no such sandbox, process or file (`what` says which); another "
         "tenant's ids are unknown too",
    499: "create-cancelled: the sandbox was destroyed (DELETE of its id) while it was "
         "being created",
    409: "conflict: the file system refused a file operation (`errno` names why: "
         "ENOTEMPTY, ENOTDIR, EEXIST, EISDIR; `path` the path); an environment being "
         "built cannot be removed yet",
    410: "session-ended: the session ended (closed, idle, past its lifetime, its "
         "interpreter exited); `reason` says which",
    413: "body-too-large: the body is over the server's max_body_bytes",
    422: "limits-exceeded: a tenant cap is full (`cap` names it), or a limit was refused",
    429: "too-many-requests: the tenant's builds at once (env_build.max_concurrent)",
    500: "provider-error: anything else (logged)",
    501: "level-not-supported or *-not-supported: not offered here",
    502: "unhandled-worker: a worker or handler died without an answer",
    503: "unavailable: the server is draining",
    504: "timeout: the handler went past its timeout_ms",
}
#: what every operation that needs a tenant can answer besides its own
_TENANT: Final = (400, 401, 413, 500, 503)


def operations() -> list[tuple[str, str, str, bool, m.Operation]]:
    """The route table with each handler's declaration: (method, path, handler name,
    needs a tenant, Operation)."""
    from corral.serve.app import ROUTES, _Api
    out = []
    for method, path, name, needs in ROUTES:
        op = getattr(getattr(_Api, name), "__corral_op__", None)
        if not isinstance(op, m.Operation):
            raise TypeError(f"handler {name} ({method} {path}) has no @operation")
        out.append((method, path, name, needs, op))
    return out


def _ref(t: Any) -> dict[str, str]:
    return {"$ref": _REF.format(name=t.__name__)}


def _content(schema_of: Any) -> dict[str, Any]:
    if isinstance(schema_of, dict):  # a schema of its own (the document itself)
        return {"application/json": {"schema": schema_of}}
    if schema_of == m.NDJSON:  # a stream of events only
        return {m.NDJSON: {"schema": {"$ref": _REF.format(name="Event")}}}
    if isinstance(schema_of, str):  # a media type with raw bytes or text
        kind = ({"type": "string"} if schema_of.startswith("text/")
                else {"type": "string", "format": "binary"})
        return {schema_of: {"schema": kind}}
    return {"application/json": {"schema": _ref(schema_of)}}


def _responses(path: str, needs: bool, op: m.Operation) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": op.summary.split(":")[0]}
    if op.ok is not None:
        ok["content"] = _content(op.ok)
        if op.stream:
            ok["content"][m.NDJSON] = {"schema": {"$ref": _REF.format(name="Event")}}
    out: dict[str, Any] = {str(op.status): ok}
    codes = set(op.errors)
    if needs:
        codes |= set(_TENANT)
        if _PARAM.search(path):
            codes.add(404)
    for code in sorted(codes):
        resp: dict[str, Any] = {"description": _STATUS_TEXT[code],
                                "content": {"application/json": {"schema": _ref(m.ErrorBody)}}}
        if code == 401:
            resp["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"},
                                                    "description": "Bearer"}}
        out[str(code)] = resp
    return out


def _operation(method: str, path: str, name: str, needs: bool,
               op: m.Operation) -> dict[str, Any]:
    doc: dict[str, Any] = {"operationId": name, "summary": op.summary, "tags": [op.tag],
                           "responses": _responses(path, needs, op)}
    params = [{"name": p, "in": "path", "required": True,
               "schema": {"type": "string", "minLength": 1}, "description": _PARAMS[p]}
              for p in _PARAM.findall(path)]
    params += [{"name": q, "in": "query", "required": True,
                "schema": {"type": "string", "minLength": 1}, "description": d}
               for q, d in op.query]
    if params:
        doc["parameters"] = params
    if op.body == m.RAW:
        doc["requestBody"] = {"required": False,  # an empty file, no bytes: both fine
                              "content": _content("application/octet-stream")}
    elif isinstance(op.body, type):
        doc["requestBody"] = {"required": not op.body_optional,
                              "content": _content(op.body)}
    if not needs:
        doc["security"] = []
    return doc


def _links(ops: list[tuple[str, str, str, bool, m.Operation]], paths: dict[str, Any]) -> None:
    """OpenAPI links from an operation whose answer's ``id`` names a new object (a
    sandbox, a process) to every operation that takes it in its path."""
    for method, path, _name, _needs, op in ops:
        if op.creates is None:
            continue
        mine = set(_PARAM.findall(path))
        links: dict[str, Any] = {}
        for _m, other, oname, _n, _op in ops:
            wants = _PARAM.findall(other)
            if op.creates not in wants or not set(wants) <= mine | {op.creates}:
                continue
            if oname in BODY_NAMED:  # what it acts on is named in its body, not linked
                continue
            links[oname] = {"operationId": oname, "parameters": {
                p: "$response.body#/id" if p == op.creates else f"$request.path.{p}"
                for p in wants}}
        paths[path][method.lower()]["responses"][str(op.status)]["links"] = links


def _shapes(ops: list[tuple[str, str, str, bool, m.Operation]]) -> list[Any]:
    types: list[Any] = [m.ErrorBody]
    for *_, op in ops:
        for t in (op.body, op.ok):
            if isinstance(t, type) and t not in types:
                types.append(t)
    return types


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document (made once per process)."""
    from corral import __version__
    ops = operations()
    types = _shapes(ops)
    _, schemas = msgspec.json.schema_components([*types, m.Event], ref_template=_REF)
    schemas["Event"] = {"description": "a line of an NDJSON stream", **msgspec.json.schema(
        m.Event, ref_template=_REF)}
    schemas["Event"].pop("$defs", None)
    for name, schema in schemas.items():
        extra = getattr(getattr(m, name, None), "__extra_schema__", None)
        if isinstance(extra, dict):
            schema.update(extra)
    paths: dict[str, Any] = {}
    for method, path, name, needs, op in ops:
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, name, needs, op)
    _links(ops, paths)
    return {
        "openapi": "3.1.0",
        "info": {"title": "corral serve", "version": __version__,
                 "description": "Run code nobody trusts behind a real boundary, over HTTP. "
                                "The HTTP status says whether the request was served; how "
                                "a command ended is its result's `outcome`. See "
                                "docs/service.md."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"}}},
    }


@functools.cache
def document_bytes() -> bytes:
    """The document as JSON (encoded once per process)."""
    return msgspec.json.encode(document())
