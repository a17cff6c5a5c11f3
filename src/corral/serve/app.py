"""The HTTP face of :class:`~corral.serve.service.Service`: a Starlette app (ASGI), served
by uvicorn (:mod:`corral.serve.server`).

Why Starlette on uvicorn: Starlette is the small, well-kept ASGI toolkit under FastAPI
(routing, requests, responses, lifespan) without a validation or DI layer we would not
use: request bodies are decoded by msgspec models (:mod:`corral.serve.models`), which also
generate the OpenAPI document (:mod:`corral.serve.openapi`) with the route table below.
uvicorn is its reference server: HTTP/1.1 keep-alive, TLS, graceful shutdown with a deadline.

Every endpoint goes through :meth:`_Api.endpoint`: bearer auth (a tenant), the body read
under its cap (413), the service's in-flight count (503 while draining), a watch on the
client's connection (a client that goes away cancels its run at once, and the run frees
its cap slot as it unwinds), error mapping (corral's error -> its HTTP status from the
error table, body ``{"error": {code, message, ...facts}}``), a JSON log line and metrics.

One rule for how a run ended, on every route: the HTTP status says whether the request
was served; how a command ended is its result's ``outcome`` (an exec past its timeout is
``200 {"result": {"outcome": "timeout", ...}}``, as ``/v1/runs``).

Adding a route: a line in :data:`ROUTES` and a handler on :class:`_Api` decorated with
:func:`~corral.serve.models.operation` (its body model, its answer, the statuses it adds);
the document follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import re
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from corral.core.errors import ConfigInvalidError, CorralError, ProviderError
from corral.core.result import Outcome
from corral.core.spec import Level
from corral.core.tasks import settle
from corral.providers.remote import wire
from corral.serve import models as m
from corral.serve.config import ServeConfig, token_digest
from corral.serve.edge import BodyBudget, mark_authenticated
from corral.serve.files import FILE_ROUTES, FileRoutes
from corral.serve.logs import JsonLog
from corral.serve.metrics import CONTENT_TYPE
from corral.serve.models import RAW, operation
from corral.serve.service import EARLY_RELEASE, ApiError, Event, RunStream, Service
from corral.serve.sessions import (
    CellRequest,
    SessionCreateRequest,
    close_all as close_sessions,
    table as session_table,
)
from corral.serve.state import TenantState

__all__ = ["ROUTES", "create_app"]

T = TypeVar("T")
P: Final = wire.API_PREFIX

#: (method, path, handler attribute, needs a tenant); the OpenAPI test walks this table
ROUTES: Final[tuple[tuple[str, str, str, bool], ...]] = (
    ("GET", f"{P}/health", "health", False),
    ("GET", f"{P}/openapi.json", "openapi", False),
    ("GET", f"{P}/info", "info", True),
    ("POST", f"{P}/snippets", "snippets", True),
    ("POST", f"{P}/runs", "runs", True),
    ("POST", f"{P}/invoke", "invoke", True),
    # environments: the operator's for the tenant, and its own builds (serve/envbuild.py)
    ("GET", f"{P}/environments", "list_environments", True),
    ("POST", f"{P}/environments", "build_environment", True),
    ("GET", f"{P}/environments/{{name}}", "get_environment", True),
    ("DELETE", f"{P}/environments/{{name}}", "remove_environment", True),
    # sessions: live interpreters whose globals persist (issue 30: serve/sessions.py)
    ("GET", f"{P}/sessions", "list_sessions", True),
    ("POST", f"{P}/sessions", "create_session", True),
    ("DELETE", f"{P}/sessions/{{sid}}", "close_session", True),
    ("POST", f"{P}/sessions/{{sid}}/cells", "run_cell", True),
    ("PUT", f"{P}/sessions/{{sid}}/files", "session_write_file", True),
    ("GET", f"{P}/sessions/{{sid}}/files", "session_read_file", True),
    ("GET", f"{P}/sandboxes", "list_sandboxes", True),
    ("POST", f"{P}/sandboxes", "create_sandbox", True),
    ("GET", f"{P}/sandboxes/{{sid}}", "get_sandbox", True),
    ("DELETE", f"{P}/sandboxes/{{sid}}", "destroy_sandbox", True),
    ("POST", f"{P}/sandboxes/{{sid}}/exec", "exec", True),
    ("PUT", f"{P}/sandboxes/{{sid}}/files", "write_file", True),
    ("GET", f"{P}/sandboxes/{{sid}}/files", "read_file", True),
    ("POST", f"{P}/sandboxes/{{sid}}/processes", "start_process", True),
    ("GET", f"{P}/sandboxes/{{sid}}/processes/{{pid}}/output", "process_output", True),
    ("POST", f"{P}/sandboxes/{{sid}}/processes/{{pid}}/stdin", "process_stdin", True),
    ("POST", f"{P}/sandboxes/{{sid}}/processes/{{pid}}/stdin/close", "process_stdin_close",
     True),
    ("POST", f"{P}/sandboxes/{{sid}}/processes/{{pid}}/kill", "process_kill", True),
    ("GET", f"{P}/sandboxes/{{sid}}/processes/{{pid}}/wait", "process_wait", True),
    ("POST", f"{P}/sandboxes/{{sid}}/pause", "pause", True),
    ("POST", f"{P}/sandboxes/{{sid}}/resume", "resume", True),
    ("POST", f"{P}/sandboxes/{{sid}}/snapshot", "snapshot", True),
    ("POST", f"{P}/sandboxes/{{sid}}/restore", "restore", True),
    ("POST", f"{P}/sandboxes/{{sid}}/invoke", "invoke_in", True),
    # preview URLs and a live sandbox's network policy (issue 23 item 6: serve/preview.py)
    ("POST", f"{P}/sandboxes/{{sid}}/expose", "expose", True),
    ("POST", f"{P}/sandboxes/{{sid}}/unexpose", "unexpose", True),
    ("PUT", f"{P}/sandboxes/{{sid}}/network", "change_network", True),
    ("GET", "/metrics", "metrics", False),
    # list / info / exists / make_dir / remove (issue 27 item 4: serve/files.py)
    *((method, f"{P}/sandboxes/{{sid}}{tail}", name, needs)
      for method, tail, name, needs in FILE_ROUTES),
)


#: the checks a route's operation makes that can be tried before its body is read
_PRECHECK: Final[dict[str, tuple[str, ...]]] = {
    "snippets": ("run",), "exec": ("run",), "invoke_in": ("run",),
    "runs": ("run", "sandbox"), "invoke": ("run", "sandbox"), "create_sandbox": ("sandbox",),
    "run_cell": ("run",), "create_session": ("sandbox",),
}
_MIB: Final = 1 << 20


class _ClientGone(Exception):
    """The client closed its connection before the answer; its work was cancelled."""


async def _disconnected(receive: Receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def _until_disconnect(work: Awaitable[T], receive: Receive,
                            on_gone: Callable[[], None] | None = None) -> T:
    """``work``, cancelled at once when the client goes away (raises _ClientGone then);
    ``on_gone`` runs first (it frees the request's cap slots)."""
    task = asyncio.ensure_future(work)  # both tasks end here (settle) before it returns
    watch = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server cancels the request (shutdown grace)
        await settle([task, watch])
        raise
    await settle([watch])
    if task.done():
        return task.result()
    if on_gone is not None:
        on_gone()
    await settle([task])
    raise _ClientGone


def _call_all(fns: list[Callable[[], None]]) -> None:
    for fn in fns:
        fn()


def _line(ev: Event) -> bytes:
    return json.dumps(ev, separators=(",", ":")).encode() + b"\n"


class _NDJSONResponse(Response):
    """A stream of JSON lines. The client going away cancels the stream (and the run
    behind it) at once; ``stream.release()`` runs whatever happens."""

    def __init__(self, stream: RunStream | None, events: AsyncIterator[Event],
                 draining: Callable[[], bool]) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", wire.NDJSON.encode()),  # chunked: no length
                            (b"cache-control", b"no-store"), (b"x-accel-buffering", b"no")]
        self._stream, self._events, self.draining = stream, events, draining
        #: called when the stream ends, with whether the client went away (the app logs)
        self._on_done: Callable[[bool], None] = lambda gone: None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def pump() -> None:
            nonlocal started
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            started = True
            try:
                async for ev in self._events:
                    await send({"type": "http.response.body", "body": _line(ev),
                                "more_body": True})
            except (CorralError, ApiError) as e:  # the stream's source failed: say so
                await send({"type": "http.response.body", "more_body": True,
                            "body": _line(_error_event(e))})
            except OSError:
                raise
            except Exception as e:  # a bug: logged by the caller's log, answered in the stream
                await send({"type": "http.response.body", "more_body": True, "body": _line(
                    _error_event(ProviderError(f"internal error: {type(e).__name__}")))})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        gone = stopped = False
        release = self._stream.release if self._stream is not None else None
        try:
            await _until_disconnect(pump(), receive, release)
        except _ClientGone:
            gone = True
        except asyncio.CancelledError:  # the server stops: past its grace while draining
            if not self.draining():
                raise
            stopped = True
        finally:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            if self._stream is not None:
                self._stream.release()
            self._on_done(gone)
        if stopped:  # say why the stream ends, as its last line (bounded)
            await _stopped(send, started)


def _error_event(err: CorralError | ApiError) -> Event:
    if isinstance(err, ApiError):
        return {"event": "error", "status": err.status, "error": err.to_dict()}
    return {"event": "error", "status": err.http_status, "error": _error_json(err)}


_STOPPED: Final = "the server stopped (SIGTERM) before the run ended; it was cancelled"


async def _stopped(send: Send, started: bool) -> None:
    err = ApiError("unavailable", _STOPPED)
    with contextlib.suppress(Exception):
        async with asyncio.timeout(0.5):
            if not started:
                await _error(err)({"type": "http"}, _nothing, send)
                return
            line = _line({"event": "error", "status": err.status, "error": err.to_dict()})
            await send({"type": "http.response.body", "body": line, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _nothing() -> dict[str, Any]:
    return {"type": "http.disconnect"}


class _JSON(Response):
    """A JSON answer, encoded by msgspec (faster than ``json.dumps``)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return _JSON(doc, status_code=status, headers=headers)


#: Python spellings in library messages, and what an HTTP client sends instead
_PY_SPELLINGS: Final = (
    (re.compile(r"NetworkPolicy\.(\w+)\(\)"), r'network {"kind": "\1"}'),
    (re.compile(r"\bSandboxLimits\b"), "limits"),
    (re.compile(r"\bNetworkPolicy\b"), "network"),
    (re.compile(r"\bSandboxSpec\b"), "spec"),
    (re.compile(r"\b(source|files)="), r"\1"),
)
_CAP_UNITS: Final = {"sandboxes": "sandboxes", "runs": "runs in flight", "memory": "MiB",
                     "processes": "processes", "environments": "environments"}


def _for_http(text: str) -> str:
    for pat, repl in _PY_SPELLINGS:
        text = pat.sub(repl, text)
    return text


def _http_error_doc(doc: dict[str, Any], cap: str | None = None) -> dict[str, Any]:
    """An error as HTTP clients get it: JSON spellings, a cap named as a cap."""
    for k in ("message", "detail", "reason", "missing"):
        v = doc.get(k)
        if isinstance(v, str) and v:
            doc[k] = _for_http(v)
    if cap is not None:
        doc["cap"] = cap
        doc["message"] = (f"{cap} cap reached ({doc.get('limit_value')} "
                          f"{_CAP_UNITS.get(cap, '')}; this request would make "
                          f"{doc.get('observed')}): {doc.get('detail', '')}").rstrip(": ")
    return doc


def _error_json(err: CorralError) -> dict[str, Any]:
    return _http_error_doc(wire.error_to_json(err), getattr(err, "cap", None))


def _error(err: CorralError | ApiError, headers: dict[str, str] | None = None) -> Response:
    if isinstance(err, ApiError):
        if err.status == 401:
            headers = {**(headers or {}), "www-authenticate": "Bearer"}
        return _json({"error": err.to_dict()}, err.status, headers)
    return _json({"error": _error_json(err)}, err.http_status, headers)


def _ran(err: CorralError) -> dict[str, Any] | None:
    """The run an error ended (a timeout, a limit, a spawn error), as JSON: that is how
    the command ended, answered as a result, not as a failed request."""
    r = err.result
    if r is None or r.outcome is Outcome.EXIT:
        return None
    return wire.result_to_json(r)


async def _outcomes(events: AsyncIterator[Event]) -> AsyncIterator[Event]:
    """A run's events as HTTP clients get them: an ``error`` event that carries the run
    it ended becomes its ``result``; error texts in JSON's spellings."""
    async for ev in events:
        if ev.get("event") == "error":
            err = ev.get("error") or {}
            res = err.get("result")
            if isinstance(res, dict) and res.get("outcome", "exit") != "exit":
                ev = {"event": "result", "result": res}
            else:
                ev = {**ev, "error": _http_error_doc(dict(err), err.get("cap"))}
        yield ev


def _stream_wanted(request: Request, stream: bool) -> bool:
    return stream or wire.NDJSON in request.headers.get("accept", "")


def _level(name: str | None) -> Level | None:
    return None if name is None else Level(name)


_NO_LIMITS: Final = m.Limits().to_core()
_DEFAULT_SPEC: Final = m.Spec()
_DEFAULT_POPTS: Final = m.ProcessOpts()
_PATH_Q: Final = (("path", "a path relative to the sandbox's work dir"),)


def _opts(opts: m.ExecOpts | None) -> Any:
    return _NO_OPTS if opts is None else opts.to_core()


_NO_OPTS: Final = m.ExecOpts().to_core()


class _Api(FileRoutes):
    def __init__(self, service: Service) -> None:
        self.s = service
        c = service.config
        #: request-body bytes held now, per tenant and in all (serve/edge.py)
        self.bodies = BodyBudget(c.max_body_bytes_in_flight, c.max_body_bytes_in_flight_total)
        service.metrics.gauge("corral_body_bytes_in_flight", "request-body bytes held now "
                              "(reserved before they are read)", lambda: [
                                  ({}, float(self.bodies.held_total))])

    # -- the wrapper -----------------------------------------------------------------
    def endpoint(self, name: str, path: str, needs_tenant: bool
                 ) -> Callable[[Request], Awaitable[Response]]:
        handler = getattr(self, name)

        async def call(request: Request) -> Response:
            t0 = time.monotonic()
            tenant: TenantState | None = None
            holding: tuple[str, int] | None = None  # body bytes reserved (edge.BodyBudget)
            resp: Response
            try:
                if needs_tenant:
                    tenant = self._tenant(request)
                    self._precheck(name, request, tenant)  # refusals before the body
                    body, held = await self._body(request, tenant, spool=name == "write_file")
                    holding = (tenant.name, held)
                    early: list[Callable[[], None]] = []
                    token = EARLY_RELEASE.set(early)  # copied into the work's task
                    try:
                        with self.s.operation():
                            resp = await _until_disconnect(
                                handler(request, tenant, body), request.receive,
                                lambda: _call_all(early))
                    finally:
                        EARLY_RELEASE.reset(token)
                else:
                    resp = await handler(request)
            except _ClientGone:
                resp = Response(status_code=499)
            except asyncio.CancelledError:  # the server stops: past its grace, draining
                if not self.s.draining:
                    self._give(holding)
                    raise
                resp = _error(ApiError("unavailable", _STOPPED))
            except (CorralError, ApiError) as e:
                resp = _error(e)
            except FileNotFoundError as e:
                resp = _error(ApiError("not-found", f"no such file: {e.filename or ''}",
                                       what="file"))
            except Exception as e:  # a bug: logged, answered as provider-error
                self.s.log.event("internal-error", sev="error", path=path,
                                 error=f"{type(e).__name__}: {e}")
                resp = _error(ProviderError(f"internal error: {type(e).__name__}"))
            status = resp.status_code
            if status in (401, 408, 413) or (status == 503 and not self.s.draining):
                resp.headers["connection"] = "close"  # nothing more is read from it
            if isinstance(resp, _NDJSONResponse):  # logged when the stream ends
                def on_done(gone: bool) -> None:
                    self._give(holding)
                    self._done(request, path, tenant, 499 if gone else 200, t0)
                resp._on_done = on_done
            else:
                self._give(holding)
                self._done(request, path, tenant, status, t0)
            return resp

        return call

    def _done(self, request: Request, path: str, tenant: TenantState | None, status: int,
              t0: float) -> None:
        took = time.monotonic() - t0
        ms = round(took * 1000, 2)
        route = f"{request.method} {path}"
        self.s.metrics.inc("corral_requests_total", route=route, status=str(status))
        self.s.metrics.observe("corral_request_duration_seconds", took, route=route)
        if status == 499:
            self.s.metrics.inc("corral_cancelled_total")
        if self.s.log.enabled:  # the scope's path: building request.url costs more
            self.s.log.event("request", method=request.method, path=request.scope["path"],
                             status=status, ms=ms, tenant=tenant.name if tenant else None)

    def _tenant(self, request: Request) -> TenantState:
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        tenant = self.s.authenticate(token.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise ApiError("unauthorized", "a valid bearer token is needed")
        if not mark_authenticated(request.scope):  # the authenticated pool is full
            raise ApiError("unavailable", "the server has max_connections authenticated "
                           "connections open; retry later")
        return tenant

    def _precheck(self, name: str, request: Request, tenant: TenantState) -> None:
        """What can be refused before the body is read, is: an unknown sandbox (404) and a
        full cap (422), so a tenant at its cap does not make the server hold its bodies.
        The slots are only tried here; the operation takes them for real."""
        sid = request.path_params.get("sid")
        entry = self.s.entry(tenant, sid) if sid is not None else None
        kinds = _PRECHECK.get(name, ())
        if "run" in kinds:
            with self.s.run_slot(tenant):
                pass
        if "sandbox" in kinds:
            with self.s.sandbox_slot(tenant, 0):
                pass
        if name == "start_process" and entry is not None:
            entry.prune()
            tenant.check_processes(entry)

    def _give(self, holding: tuple[str, int] | None) -> None:
        if holding is not None:
            self.bodies.give(*holding)

    def _take(self, tenant: TenantState, n: int) -> None:
        full = self.bodies.take(tenant.name, n)
        if full is None:
            return
        c = self.s.config
        if full == "total":
            raise ApiError("unavailable", "the server holds max_body_bytes_in_flight_total "
                           f"({c.max_body_bytes_in_flight_total}) bytes of request bodies; "
                           "retry later", max_body_bytes_in_flight_total=c.
                           max_body_bytes_in_flight_total)
        from corral.core.errors import LimitsExceededError
        held = self.bodies.held.get(tenant.name, 0)
        err = LimitsExceededError(
            "memory", -(-c.max_body_bytes_in_flight // _MIB), -(-(held + n) // _MIB),
            detail=f"tenant {tenant.name!r}: cap max_body_bytes_in_flight "
            f"({c.max_body_bytes_in_flight} bytes of request bodies at once) reached")
        err.cap = "body_bytes"  # type: ignore[attr-defined]
        self.s.metrics.inc("corral_refused_total", cap="body_bytes")
        raise err

    async def _body(self, request: Request, tenant: TenantState, *, spool: bool = False
                    ) -> tuple[bytes, int]:
        """The body, read under its bounds: ``max_body_bytes`` (413), the tenant's and the
        server's body bytes in flight (reserved before they are read: the declared
        length at once, a chunked body as it comes), and its pace (``body_timeout_s``,
        then ``min_body_bytes_per_s``: 408). With ``spool`` the bytes wait in a temp
        file (past 1 MiB on disk, not in memory) until the body is whole. Returns the
        body and the bytes reserved (given back when the request ends)."""
        c = self.s.config
        cap = c.max_body_bytes
        declared = request.headers.get("content-length")
        length = int(declared) if declared is not None and declared.isdigit() else None
        if length is not None and length > cap:
            raise ApiError("body-too-large", f"the body is larger than {cap} bytes",
                           max_body_bytes=cap)
        if length == 0 or (length is None and "transfer-encoding" not in request.headers):
            return b"", 0
        held = [0]  # bytes reserved so far
        if length is not None:
            self._take(tenant, length)
            held[0] = length
        try:
            return await self._read(request, tenant, cap, held, spool), held[0]
        except BaseException:
            self.bodies.give(tenant.name, held[0])
            raise

    async def _read(self, request: Request, tenant: TenantState, cap: int, held: list[int],
                    spool: bool) -> bytes:
        c = self.s.config
        loop = asyncio.get_running_loop()
        start = loop.time() + c.body_timeout_s
        rate = float(c.min_body_bytes_per_s)
        chunks: list[bytes] = []
        sink = tempfile.SpooledTemporaryFile(max_size=_MIB) if spool else None  # noqa: SIM115
        size = 0
        try:
            while True:
                try:  # the pace: by t, (t - body_timeout_s) * rate bytes at least
                    async with asyncio.timeout_at(start + size / rate):
                        msg = await request.receive()
                except TimeoutError:
                    raise ApiError("request-timeout", "the body did not arrive in time "
                                   f"(body_timeout_s {c.body_timeout_s}, then at least "
                                   f"{c.min_body_bytes_per_s} bytes/s)") from None
                if msg["type"] == "http.disconnect":
                    raise _ClientGone
                chunk: bytes = msg.get("body", b"")
                size += len(chunk)
                if size > cap:
                    raise ApiError("body-too-large", f"the body is larger than {cap} bytes",
                                   max_body_bytes=cap)
                if size > held[0]:  # a chunked body: reserved as it comes
                    self._take(tenant, size - held[0])
                    held[0] = size
                if sink is not None:
                    sink.write(chunk)
                elif chunk:
                    chunks.append(chunk)
                if not msg.get("more_body", False):
                    break
            if sink is not None:
                sink.seek(0)
                return sink.read()
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            if sink is not None:
                sink.close()

    def _stream(self, stream: RunStream) -> _NDJSONResponse:
        return _NDJSONResponse(stream, _outcomes(stream.events()), lambda: self.s.draining)

    # -- public ------------------------------------------------------------------------
    @operation("liveness: ok, or draining (503) while the server stops", ok=m.Health,
               errors=(503,), tag="service")
    async def health(self, request: Request) -> Response:
        return _json({"status": "draining" if self.s.draining else "ok"},
                     503 if self.s.draining else 200)

    @operation("this document", ok={"type": "object"}, tag="service")
    async def openapi(self, request: Request) -> Response:
        from corral.serve.openapi import document_bytes
        return Response(document_bytes(), media_type="application/json")

    @operation("Prometheus text format 0.0.4 (a bearer token only when the config sets "
               "metrics_token)", ok="text/plain", errors=(401,), tag="service")
    async def metrics(self, request: Request) -> Response:
        want = self.s.config.metrics_token_sha256
        if want is not None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    token_digest(token.strip()), want):
                raise ApiError("unauthorized", "/metrics needs the metrics token")
        return Response(self.s.metrics.render(), media_type=CONTENT_TYPE)

    # -- tenant ------------------------------------------------------------------------
    @operation("the levels, providers and capabilities offered; the caller's tenant, caps "
               "and usage", ok=m.Info, tag="service")
    async def info(self, request: Request, tenant: TenantState, body: Any) -> Response:
        return _json(self.s.info(tenant))

    @operation("validate and run a Python snippet: its transcript (stream: log events, then "
               "the transcript)", body=m.SnippetRequest, ok=m.Transcript, stream=True,
               errors=(422, 501), tag="snippets")
    async def snippets(self, request: Request, tenant: TenantState, body: m.SnippetRequest
                       ) -> Response:
        from corral.snippets.host.runner import DEFAULT_TIMEOUT_MS
        timeout = body.timeout_ms or DEFAULT_TIMEOUT_MS
        level, files = _level(body.level), body.files_arg()
        if not _stream_wanted(request, body.stream):
            return _json(await self.s.snippet(tenant, source=body.source_arg(), files=files,
                                              timeout_ms=timeout, level=level,
                                              environment=body.environment))
        # live: each log line as the snippet writes it, then the transcript. The run
        # starts now; a refusal that comes before any line (a bad argument, a full cap)
        # is still answered with its status, not as a 200 stream
        lines: asyncio.Queue[Any] = asyncio.Queue()
        # the service owns both tasks (its close ends them); the stream below ends them
        # when it ends, the handler when it answers otherwise
        task = self.s.tasks.spawn(self.s.snippet(
            tenant, source=body.source_arg(), files=files, timeout_ms=timeout,
            level=level, on_log=lines.put_nowait, environment=body.environment))
        task.add_done_callback(lambda _: lines.put_nowait(None))
        first = self.s.tasks.spawn(lines.get())
        try:
            await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await settle([task, first])
            raise
        nothing_written = not first.done() or first.result() is None
        if (task.done() and not task.cancelled() and task.exception() is not None
                and nothing_written):  # refused before it wrote anything
            await settle([first])
            raise task.exception()  # type: ignore[misc]

        async def events() -> AsyncIterator[Event]:
            try:
                line = await first
                while line is not None:
                    yield {"event": "log", "stream": line.stream, "text": line.text}
                    line = await lines.get()
                yield {"event": "transcript", "transcript": await task}
            finally:  # the client went away, or the server stops: ends both tasks
                await settle([task, first])

        return _NDJSONResponse(None, events(), lambda: self.s.draining)

    @operation("one bounded command in a fresh sandbox at a level (destroyed after): the "
               "RunResult whatever the outcome (stream: output events, then result)",
               body=m.RunRequest, ok=m.ResultBody, stream=True, errors=(404, 422, 501),
               tag="runs")
    async def runs(self, request: Request, tenant: TenantState, body: m.RunRequest
                   ) -> Response:
        stream = self.s.run_stream(
            tenant, Level(body.level), body.limits.to_core() if body.limits else
            _NO_LIMITS, None if body.network is None else body.network.to_core(), body.command(),
            _opts(body.opts), m.files_to_core(body.files), body.environment)
        if _stream_wanted(request, body.stream):
            return self._stream(stream)
        final: Event = {}
        try:
            async for ev in _outcomes(stream.events()):
                final = ev
        finally:
            stream.release()
        if final.get("event") == "error":
            return _json({"error": final["error"]}, final["status"])
        return _json({"result": final["result"]})

    @operation("handler dispatch in a fresh sandbox for spec: its output, or a suspension",
               body=m.InvokeRequest, ok=m.Reply, errors=(404, 422, 501, 502),
               tag="handlers")
    async def invoke(self, request: Request, tenant: TenantState, body: m.InvokeRequest
                     ) -> Response:
        spec = (body.spec or _DEFAULT_SPEC).to_core(tenant.name)
        return _json(await self._invoke(tenant, None, spec, body))

    @operation("handler dispatch in this sandbox (in-context is refused)",
               body=m.InvokeRequest, ok=m.Reply, errors=(422, 501, 502),
               tag="handlers")
    async def invoke_in(self, request: Request, tenant: TenantState, body: m.InvokeRequest
                        ) -> Response:
        if body.spec is not None:
            raise ConfigInvalidError("spec", "an invoke in a live sandbox takes no spec")
        sb = self.s.entry(tenant, request.path_params["sid"]).sandbox
        if sb.spec.image is None and body.handler.entrypoint_path is None:
            raise ConfigInvalidError("handler.entrypoint_path", "this sandbox was made "
                                     "without an image: name the handler's entrypoint file")
        return _json(await self._invoke(tenant, request.path_params["sid"], None, body))

    async def _invoke(self, tenant: TenantState, sid: str | None, spec: Any,
                      body: m.InvokeRequest) -> dict[str, Any]:
        return await self.s.invoke(
            tenant, sid, spec, body.handler.to_core(), body.input, mode=body.mode,
            resumed=body.resumed, files=m.files_to_core(body.files) or None,
            timeout_ms=body.timeout_ms)

    # -- environments (docs/environments.md, "Over the service") -----------------------
    @operation("the environments the caller may name: the operator's for it, then its own "
               "(built, building or failed)", ok=m.EnvironmentList, tag="environments")
    async def list_environments(self, request: Request, tenant: TenantState, body: Any
                                ) -> Response:
        return _json({"environments": self.s.environments(tenant)})

    @operation("build an environment of the caller's own (a right the operator grants, "
               "else 403); answered at once, the build runs on: poll GET "
               "/v1/environments/{name}", body=m.EnvBuildRequest, ok=m.EnvironmentInfo,
               status=202, errors=(403, 422, 429), tag="environments")
    async def build_environment(self, request: Request, tenant: TenantState,
                                body: m.EnvBuildRequest) -> Response:
        doc = self.s.build_environment(tenant, body.name, list(body.requirements),
                                       body.timeout_s)
        return _json(doc, 202, {"location": f"{P}/environments/{body.name}"})

    @operation("one environment the caller may name: its state (building, ready, failed "
               "with its typed error), digest, modules, size", ok=m.EnvironmentInfo,
               tag="environments")
    async def get_environment(self, request: Request, tenant: TenantState, body: Any
                              ) -> Response:
        return _json(self.s.environment_info(tenant, request.path_params["name"]))

    @operation("remove an environment of the caller's own", status=204,
               errors=(403, 409), tag="environments")
    async def remove_environment(self, request: Request, tenant: TenantState, body: Any
                                 ) -> Response:
        await self.s.remove_environment(tenant, request.path_params["name"])
        return Response(status_code=204)

    @operation("the caller's live sandboxes", ok=m.SandboxList)
    async def list_sandboxes(self, request: Request, tenant: TenantState, body: Any
                             ) -> Response:
        return _json({"sandboxes": [e.info() for e in tenant.sandboxes.values()]})

    @operation("create a sandbox from a spec (no body, or {}: a strict sandbox with the "
               "defaults)", body=m.CreateSandboxRequest, body_optional=True, ok=m.Sandbox,
               status=201, errors=(422, 499, 501), creates="sid")
    async def create_sandbox(self, request: Request, tenant: TenantState,
                             body: m.CreateSandboxRequest) -> Response:
        spec = (body.spec or _DEFAULT_SPEC).to_core(tenant.name)
        entry = await self.s.create(tenant, spec, body.id,  # lifetimes: tenancy.py
                                    idle_timeout_s=body.idle_timeout_s,
                                    max_lifetime_s=body.max_lifetime_s)
        # the spec as admitted: the tenant's defaults applied (what the provider enforces)
        return _json({**entry.info(), "spec": wire.spec_to_json(entry.sandbox.spec)}, 201)

    @operation("one sandbox", ok=m.Sandbox)
    async def get_sandbox(self, request: Request, tenant: TenantState, body: Any) -> Response:
        entry = self.s.entry(tenant, request.path_params["sid"])
        return _json({**entry.info(), "spec": wire.spec_to_json(entry.sandbox.spec)})

    @operation("destroy (an unknown id: 404, and remembered: a create of it still in "
               "flight is rolled back)", status=204)
    async def destroy_sandbox(self, request: Request, tenant: TenantState, body: Any
                              ) -> Response:
        if not await self.s.destroy(tenant, request.path_params["sid"]):
            raise ApiError("not-found", "no such sandbox", what="sandbox")
        return Response(status_code=204)

    @operation("run a command to its end: the RunResult whatever the outcome (exit, "
               "timeout, a limit: result.outcome says; stream: output events, then result)",
               body=m.ExecRequest, ok=m.ResultBody, stream=True, errors=(422,))
    async def exec(self, request: Request, tenant: TenantState, body: m.ExecRequest
                   ) -> Response:
        sid, opts = request.path_params["sid"], _opts(body.opts)
        if _stream_wanted(request, body.stream):
            return self._stream(self.s.exec_stream(tenant, sid, body.command(), opts))
        try:
            r = wire.result_to_json(await self.s.exec(tenant, sid, body.command(), opts))
        except CorralError as e:  # a run that ended otherwise than by exiting: its result
            ran = _ran(e)
            if ran is None:
                raise
            r = ran
        return _json({"result": r})

    @staticmethod
    def _path(request: Request) -> str:
        path = request.query_params.get("path")
        if not path:
            raise ConfigInvalidError("path", "the query parameter path is needed")
        return path

    @operation("write a file (the raw body)", body=RAW, status=204, query=_PATH_Q)
    async def write_file(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        await self.s.write_file(tenant, request.path_params["sid"], self._path(request), body)
        return Response(status_code=204)

    @operation("read a file (the raw body)", ok="application/octet-stream", query=_PATH_Q)
    async def read_file(self, request: Request, tenant: TenantState, body: Any) -> Response:
        data = await self.s.read_file(tenant, request.path_params["sid"], self._path(request))
        return Response(data, media_type="application/octet-stream")

    @operation("start a process: its id", body=m.ProcessRequest, ok=m.Started, status=201,
               errors=(422,), creates="pid")
    async def start_process(self, request: Request, tenant: TenantState,
                            body: m.ProcessRequest) -> Response:
        opts = (body.opts or _DEFAULT_POPTS).to_core()
        proc = await self.s.start_process(tenant, request.path_params["sid"], body.command(), opts)
        return _json({"id": proc.id}, 201)

    def _proc(self, request: Request, tenant: TenantState) -> Any:
        return self.s.process(tenant, request.path_params["sid"], request.path_params["pid"])

    @operation("the process's output as NDJSON (output events with fd 1 or 2, then exit); "
               "one reader at a time", ok=m.NDJSON)
    async def process_output(self, request: Request, tenant: TenantState, body: Any
                             ) -> Response:
        proc = self._proc(request, tenant)
        if proc.reading:
            raise ConfigInvalidError("output", "this process's output is being read already")
        proc.reading = True

        async def events() -> AsyncIterator[Event]:
            from corral.serve.service import _output_event
            try:
                while (item := await proc.output.get()) is not None:
                    yield _output_event(*item)
                with contextlib.suppress(asyncio.QueueFull):
                    proc.output.put_nowait(None)  # a later reader sees the end too
                try:
                    r = await proc.handle.wait()
                except CorralError as e:  # its sandbox was destroyed under it
                    yield {"event": "exit", "result": None, "error": _error_json(e)}
                else:
                    yield {"event": "exit", "result": wire.result_to_json(r)}
                proc.delivered = True
            finally:
                proc.reading = False

        return _NDJSONResponse(None, events(), lambda: self.s.draining)

    @operation("write the raw body to the process's stdin", body=RAW, status=204)
    async def process_stdin(self, request: Request, tenant: TenantState, body: bytes
                            ) -> Response:
        stdin = self._proc(request, tenant).handle.stdin
        try:
            await stdin.write(body)
        except ProviderError as e:  # the contract's "closed": by the client, or never opened
            raise ConfigInvalidError("stdin", "this process's stdin is closed (or was not "
                                     f"asked for: opts.stdin): {_for_http(str(e))}") from None
        return Response(status_code=204)

    @operation("close the process's stdin", status=204)
    async def process_stdin_close(self, request: Request, tenant: TenantState, body: Any
                                  ) -> Response:
        await self._proc(request, tenant).handle.stdin.close()
        return Response(status_code=204)

    @operation("kill the process and what it started", status=204)
    async def process_kill(self, request: Request, tenant: TenantState, body: Any
                           ) -> Response:
        await self._proc(request, tenant).handle.kill()
        return Response(status_code=204)

    @operation("wait for the process to end: how it ended", ok=m.ResultBody)
    async def process_wait(self, request: Request, tenant: TenantState, body: Any
                           ) -> Response:
        proc = self._proc(request, tenant)
        r = await proc.handle.wait()
        proc.delivered = True
        return _json({"result": wire.result_to_json(r)})

    async def _life(self, request: Request, tenant: TenantState, op: str,
                    handle: m.Handle | None = None) -> Response:
        out = await self.s.lifecycle(tenant, request.path_params["sid"], op,
                                     None if handle is None else handle.to_core())
        if out is None:
            return Response(status_code=204)
        return _json({"handle": out})

    @operation("freeze every process of the sandbox", status=204, errors=(501,))
    async def pause(self, request: Request, tenant: TenantState, body: Any) -> Response:
        return await self._life(request, tenant, "pause")

    @operation("thaw", status=204, errors=(501,))
    async def resume(self, request: Request, tenant: TenantState, body: Any) -> Response:
        return await self._life(request, tenant, "resume")

    @operation("snapshot the work dir: an opaque handle only this tenant can restore",
               ok=m.HandleBody, errors=(501,))
    async def snapshot(self, request: Request, tenant: TenantState, body: Any) -> Response:
        return await self._life(request, tenant, "snapshot")

    @operation("restore a handle this tenant's sandboxes made", body=m.RestoreRequest,
               status=204, errors=(501,))
    async def restore(self, request: Request, tenant: TenantState, body: m.RestoreRequest
                      ) -> Response:
        return await self._life(request, tenant, "restore", body.handle)

    # -- preview URLs, live network policy (serve/preview.py) ---------------------------
    @operation("offer a port of the sandbox's loopback as a preview URL with its own token",
               body=m.ExposeRequest, ok=m.Preview, errors=(501,))
    async def expose(self, request: Request, tenant: TenantState, body: m.ExposeRequest
                     ) -> Response:
        from corral.serve import preview
        return _json(await preview.expose(self.s, tenant, request.path_params["sid"],
                                          {"port": body.port}))

    @operation("take a preview URL back", body=m.ExposeRequest, status=204, errors=(501,))
    async def unexpose(self, request: Request, tenant: TenantState, body: m.ExposeRequest
                       ) -> Response:
        from corral.serve import preview
        await preview.unexpose(self.s, tenant, request.path_params["sid"],
                               {"port": body.port})
        return Response(status_code=204)

    @operation("add and take allowlist entries of a live sandbox's network policy",
               body=m.NetworkChangeRequest, status=204, errors=(501,))
    async def change_network(self, request: Request, tenant: TenantState,
                             body: m.NetworkChangeRequest) -> Response:
        from corral.serve import preview
        await preview.change_network(self.s, tenant, request.path_params["sid"],
                                     {"allow": body.allow, "revoke": body.revoke})
        return Response(status_code=204)

    # -- sessions (serve/sessions.py) --------------------------------------------------
    @operation("create a session: a strict sandbox holding a live Python interpreter "
               "whose globals persist between cells", body=SessionCreateRequest,
               body_optional=True, ok={"type": "object"}, status=201, errors=(422, 501),
               tag="sessions", creates="sid")
    async def create_session(self, request: Request, tenant: TenantState,
                             body: SessionCreateRequest | None) -> Response:
        t = session_table(self.s)
        sid, sess = await t.create(tenant, body or SessionCreateRequest())
        return _json(t.describe(sid, sess), 201)

    @operation("the caller's live sessions", ok={"type": "object"}, tag="sessions")
    async def list_sessions(self, request: Request, tenant: TenantState, body: Any
                            ) -> Response:
        return _json({"sessions": await session_table(self.s).list(tenant)})

    @operation("close a session (and destroy its sandbox)", status=204, errors=(404,),
               tag="sessions")
    async def close_session(self, request: Request, tenant: TenantState, body: Any
                            ) -> Response:
        await session_table(self.s).close(tenant, request.path_params["sid"])
        return Response(status_code=204)

    @operation("run a cell: its outputs, shaped as a notebook cell's (stream: stdout, "
               "stderr, display and result events as they come, then the cell)",
               body=CellRequest, ok={"type": "object"}, stream=True,
               errors=(404, 410, 422, 504), tag="sessions")
    async def run_cell(self, request: Request, tenant: TenantState, body: CellRequest
                       ) -> Response:
        t = session_table(self.s)
        sid = request.path_params["sid"]
        if not _stream_wanted(request, body.stream):
            return _json((await t.run(tenant, sid, body)).to_json())
        return _NDJSONResponse(None, t.stream(tenant, sid, body), lambda: self.s.draining)

    @operation("create or replace a file of the session's work dir (the raw body)", body=RAW,
               status=204, errors=(404,), query=_PATH_Q, tag="sessions")
    async def session_write_file(self, request: Request, tenant: TenantState, body: bytes
                                 ) -> Response:
        sid = request.path_params["sid"]
        session_table(self.s).get(tenant, sid)
        await self.s.write_file(tenant, sid, self._path(request), body)
        return Response(status_code=204)

    @operation("read a file of the session's work dir (the raw body)",
               ok="application/octet-stream", errors=(404,), query=_PATH_Q, tag="sessions")
    async def session_read_file(self, request: Request, tenant: TenantState, body: Any
                                ) -> Response:
        sid = request.path_params["sid"]
        session_table(self.s).get(tenant, sid)
        data = await self.s.read_file(tenant, sid, self._path(request))
        return Response(data, media_type="application/octet-stream")


def _playground_routes() -> list[BaseRoute]:
    """The playground page (another module), mounted when it is there."""
    try:
        from corral.serve import playground  # type: ignore[attr-defined, unused-ignore]
    except ImportError:
        return []
    make = getattr(playground, "routes", None)
    if make is None:
        return []
    routes: list[BaseRoute] = make()
    return routes


def _allowed(routes: list[BaseRoute], scope: Scope) -> list[str]:
    """The methods of the routes whose path matches (HEAD goes with GET)."""
    from starlette.routing import Match
    methods: set[str] = set()
    for r in routes:
        if isinstance(r, Route) and r.methods and r.matches(
                {**scope, "method": "GET"})[0] is not Match.NONE:
            methods |= r.methods
    return sorted(methods)


def create_app(config: ServeConfig, *, service: Service | None = None,
               log: JsonLog | None = None) -> Starlette:
    """The ASGI app for ``config``. Its lifespan starts the service (makes the providers)
    and, at shutdown, drains it (destroys every sandbox, closes the providers)."""
    svc = service or Service(config, log=log)
    api = _Api(svc)
    routes: list[BaseRoute] = [
        Route(path, api.endpoint(name, path, needs), methods=[method], name=f"{method} {path}")
        for method, path, name, needs in ROUTES]
    routes += _playground_routes()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await svc.start()
        try:
            yield
        finally:
            await close_sessions(svc)
            await svc.close()

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        code = {404: "not-found", 405: "method-not-allowed"}.get(status)
        if code is None:
            return _json({"error": {"code": "provider-error", "message": str(exc)}}, status)
        headers = None
        if status == 405:  # every method the path has (the router names only one route's)
            headers = {"allow": ", ".join(_allowed(routes, request.scope))}
        return _error(ApiError(code, f"{request.method} {request.url.path}: "
                               f"{'no such route' if status == 404 else 'method not allowed'}",
                               what="route"), headers)

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error})
    app.state.service = svc
    return app
