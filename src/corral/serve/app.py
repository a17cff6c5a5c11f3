"""The HTTP face of :class:`~corral.serve.service.Service`: a Starlette app (ASGI), served
by uvicorn (:mod:`corral.serve.server`).

Why Starlette on uvicorn: Starlette is the small, well-kept ASGI toolkit under FastAPI
(routing, requests, responses, lifespan) without a validation or DI layer we would not
use: the JSON shapes are corral's own (:mod:`corral.providers.remote.wire`) and the
OpenAPI document is written by hand (:mod:`corral.serve.openapi`). uvicorn is its
reference server: HTTP/1.1 keep-alive, TLS, graceful shutdown with a deadline.

Every endpoint goes through :meth:`_Api.endpoint`: bearer auth (a tenant), the body read
under its cap (413), the service's in-flight count (503 while draining), a watch on the
client's connection (a client that goes away cancels its run at once, and the run frees
its cap slot as it unwinds), error mapping (corral's error -> its HTTP status from the
error table, body ``{"error": {code, message, ...facts}}``), a JSON log line and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from corral.core.errors import ConfigInvalidError, CorralError
from corral.core.spec import HandlerRef, Level, NetworkPolicy, SandboxLimits
from corral.providers.remote import wire
from corral.serve.config import ServeConfig, token_digest
from corral.serve.logs import JsonLog
from corral.serve.metrics import CONTENT_TYPE
from corral.serve.service import EARLY_RELEASE, ApiError, Event, RunStream, Service
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
    ("GET", "/metrics", "metrics", False),
)


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
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server cancels the request (shutdown grace)
        task.cancel()
        watch.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
        raise
    watch.cancel()
    if task.done():
        return task.result()
    if on_gone is not None:
        on_gone()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
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
                from corral.core.errors import ProviderError
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
    return {"event": "error", "status": err.http_status, "error": wire.error_to_json(err)}


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


def _json(doc: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(doc, status_code=status)


def _error(err: CorralError | ApiError) -> JSONResponse:
    if isinstance(err, ApiError):
        headers = {"www-authenticate": "Bearer"} if err.status == 401 else None
        return JSONResponse({"error": err.to_dict()}, status_code=err.status, headers=headers)
    doc = wire.error_to_json(err)
    cap = getattr(err, "cap", None)
    if cap is not None:
        doc["cap"] = cap
    return JSONResponse({"error": doc}, status_code=err.http_status)


def _obj(doc: Any, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ConfigInvalidError(what, "must be a JSON object")
    return doc


def _level(value: Any, default: Level | None = None) -> Level | None:
    if value is None:
        return default
    try:
        return Level(value)
    except ValueError:
        raise ConfigInvalidError("level", f"unknown level {value!r}") from None


def _files(doc: Any) -> dict[str, bytes]:
    """``files``: ``{path: text}`` or ``{path: {"b64": ...}}``."""
    out: dict[str, bytes] = {}
    for path, v in _obj(doc or {}, "files").items():
        if isinstance(v, str):
            out[path] = v.encode("utf-8")
        elif isinstance(v, dict) and "b64" in v:
            out[path] = wire.unb64(v["b64"], f"files[{path}]")
        else:
            raise ConfigInvalidError(f"files[{path}]", "must be text or {\"b64\": ...}")
    return out


def _stream_wanted(request: Request, doc: dict[str, Any]) -> bool:
    return bool(doc.get("stream")) or wire.NDJSON in request.headers.get("accept", "")


class _Api:
    def __init__(self, service: Service) -> None:
        self.s = service

    # -- the wrapper -----------------------------------------------------------------
    def endpoint(self, name: str, path: str, needs_tenant: bool
                 ) -> Callable[[Request], Awaitable[Response]]:
        handler = getattr(self, name)

        async def call(request: Request) -> Response:
            t0 = time.monotonic()
            tenant: TenantState | None = None
            resp: Response
            try:
                if needs_tenant:
                    tenant = self._tenant(request)
                    body = await self._body(request)
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
                from corral.core.errors import ProviderError
                resp = _error(ProviderError(f"internal error: {type(e).__name__}"))
            status = resp.status_code
            if isinstance(resp, _NDJSONResponse):  # logged when the stream ends
                resp._on_done = lambda gone: self._done(request, path, tenant, 499 if gone
                                                        else 200, t0)
            else:
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
        return tenant

    async def _body(self, request: Request) -> bytes:
        cap = self.s.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise ApiError("body-too-large", f"the body is larger than {cap} bytes",
                           max_body_bytes=cap)
        from starlette.requests import ClientDisconnect
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise ApiError("body-too-large", f"the body is larger than {cap} bytes",
                                   max_body_bytes=cap)
                chunks.append(chunk)
        except ClientDisconnect:
            raise _ClientGone from None
        return b"".join(chunks)

    @staticmethod
    def _doc(body: bytes) -> dict[str, Any]:
        if not body.strip():
            return {}
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigInvalidError("body", f"not JSON: {e}") from None
        return _obj(doc, "body")

    def _stream(self, stream: RunStream) -> _NDJSONResponse:
        return _NDJSONResponse(stream, stream.events(), lambda: self.s.draining)

    # -- public ------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return _json({"status": "draining" if self.s.draining else "ok"},
                     503 if self.s.draining else 200)

    async def openapi(self, request: Request) -> Response:
        from corral.serve.openapi import document
        return _json(document())

    async def metrics(self, request: Request) -> Response:
        want = self.s.config.metrics_token_sha256
        if want is not None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    token_digest(token.strip()), want):
                raise ApiError("unauthorized", "/metrics needs the metrics token")
        return Response(self.s.metrics.render(), media_type=CONTENT_TYPE)

    # -- tenant ------------------------------------------------------------------------
    async def info(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        return _json(self.s.info(tenant))

    async def snippets(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        doc = self._doc(body)
        from corral.snippets.host.runner import DEFAULT_TIMEOUT_MS
        timeout = doc.get("timeout_ms", DEFAULT_TIMEOUT_MS)
        level = _level(doc.get("level"))
        if not _stream_wanted(request, doc):
            return _json(await self.s.snippet(tenant, source=doc.get("source"),
                                              files=doc.get("files"), timeout_ms=timeout,
                                              level=level))
        # live: each log line as the snippet writes it, then the transcript. The run
        # starts now; a refusal that comes before any line (a bad argument, a full cap)
        # is still answered with its status, not as a 200 stream
        lines: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.ensure_future(self.s.snippet(
            tenant, source=doc.get("source"), files=doc.get("files"), timeout_ms=timeout,
            level=level, on_log=lines.put_nowait))
        task.add_done_callback(lambda _: lines.put_nowait(None))
        first = asyncio.ensure_future(lines.get())
        try:
            await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            first.cancel()
            raise
        nothing_written = not first.done() or first.result() is None
        if (task.done() and not task.cancelled() and task.exception() is not None
                and nothing_written):  # refused before it wrote anything
            first.cancel()
            raise task.exception()  # type: ignore[misc]

        async def events() -> AsyncIterator[Event]:
            try:
                line = await first
                while line is not None:
                    yield {"event": "log", "stream": line.stream, "text": line.text}
                    line = await lines.get()
                yield {"event": "transcript", "transcript": await task}
            finally:
                if not task.done():  # the client went away, or the server stops
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task

        return _NDJSONResponse(None, events(), lambda: self.s.draining)

    async def runs(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        doc = self._doc(body)
        argv = wire.argv_from_json(doc.get("argv"))
        level = _level(doc.get("level"), Level.STRICT)
        assert level is not None
        limits = SandboxLimits(**_obj(doc.get("limits") or {}, "limits"))
        net = doc.get("network")
        network = None if net is None else NetworkPolicy(**_obj(net, "network"))
        opts = wire.exec_opts_from_json(doc.get("opts"))
        stream = self.s.run_stream(tenant, level, limits, network, argv, opts,
                                   _files(doc.get("files")))
        if _stream_wanted(request, doc):
            return self._stream(stream)
        final: Event = {}
        try:
            async for ev in stream.events():
                final = ev
        finally:
            stream.release()
        if final.get("event") == "error":
            return _json({"error": final["error"]}, final["status"])
        return _json({"result": final["result"]})

    async def invoke(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        doc = self._doc(body)
        spec = wire.spec_from_json(doc.get("spec") or {}, tenant_id=tenant.name)
        return _json(await self._invoke(tenant, None, spec, doc))

    async def invoke_in(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        doc = self._doc(body)
        return _json(await self._invoke(tenant, request.path_params["sid"], None, doc))

    async def _invoke(self, tenant: TenantState, sid: str | None, spec: Any,
                      doc: dict[str, Any]) -> dict[str, Any]:
        h = _obj(doc.get("handler"), "handler")
        ref = HandlerRef(**h)
        resumed = doc.get("resumed")
        return await self.s.invoke(
            tenant, sid, spec, ref, doc.get("input"), mode=doc.get("mode"),
            resumed=None if resumed is None else _obj(resumed, "resumed"),
            files=_files(doc.get("files")) or None, timeout_ms=doc.get("timeout_ms"))

    async def list_sandboxes(self, request: Request, tenant: TenantState, body: bytes
                             ) -> Response:
        return _json({"sandboxes": [e.info() for e in tenant.sandboxes.values()]})

    async def create_sandbox(self, request: Request, tenant: TenantState, body: bytes
                             ) -> Response:
        doc = self._doc(body)
        spec = wire.spec_from_json(doc.get("spec") or {}, tenant_id=tenant.name)
        entry = await self.s.create(tenant, spec, doc.get("id"),  # lifetimes: tenancy.py
                                    idle_timeout_s=doc.get("idle_timeout_s"),
                                    max_lifetime_s=doc.get("max_lifetime_s"))
        # the spec as admitted: the tenant's defaults applied (what the provider enforces)
        return _json({**entry.info(), "spec": wire.spec_to_json(entry.sandbox.spec)}, 201)

    async def get_sandbox(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        entry = self.s.entry(tenant, request.path_params["sid"])
        return _json({**entry.info(), "spec": wire.spec_to_json(entry.sandbox.spec)})

    async def destroy_sandbox(self, request: Request, tenant: TenantState, body: bytes
                              ) -> Response:
        if not await self.s.destroy(tenant, request.path_params["sid"]):
            raise ApiError("not-found", "no such sandbox", what="sandbox")
        return Response(status_code=204)

    async def exec(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        doc = self._doc(body)
        sid = request.path_params["sid"]
        argv = wire.argv_from_json(doc.get("argv"))
        opts = wire.exec_opts_from_json(doc.get("opts"))
        if _stream_wanted(request, doc):
            return self._stream(self.s.exec_stream(tenant, sid, argv, opts))
        r = await self.s.exec(tenant, sid, argv, opts)
        return _json({"result": wire.result_to_json(r)})

    @staticmethod
    def _path(request: Request) -> str:
        path = request.query_params.get("path")
        if path is None:
            raise ConfigInvalidError("path", "the query parameter path is needed")
        return path

    async def write_file(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        await self.s.write_file(tenant, request.path_params["sid"], self._path(request), body)
        return Response(status_code=204)

    async def read_file(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        data = await self.s.read_file(tenant, request.path_params["sid"], self._path(request))
        return Response(data, media_type="application/octet-stream")

    async def start_process(self, request: Request, tenant: TenantState, body: bytes
                            ) -> Response:
        doc = self._doc(body)
        argv = wire.argv_from_json(doc.get("argv"))
        opts = wire.process_opts_from_json(doc.get("opts"))
        proc = await self.s.start_process(tenant, request.path_params["sid"], argv, opts)
        return _json({"id": proc.id}, 201)

    def _proc(self, request: Request, tenant: TenantState) -> Any:
        return self.s.process(tenant, request.path_params["sid"], request.path_params["pid"])

    async def process_output(self, request: Request, tenant: TenantState, body: bytes
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
                    yield {"event": "exit", "result": None, "error": wire.error_to_json(e)}
                else:
                    yield {"event": "exit", "result": wire.result_to_json(r)}
                proc.delivered = True
            finally:
                proc.reading = False

        return _NDJSONResponse(None, events(), lambda: self.s.draining)

    async def process_stdin(self, request: Request, tenant: TenantState, body: bytes
                            ) -> Response:
        await self._proc(request, tenant).handle.stdin.write(body)
        return Response(status_code=204)

    async def process_stdin_close(self, request: Request, tenant: TenantState, body: bytes
                                  ) -> Response:
        await self._proc(request, tenant).handle.stdin.close()
        return Response(status_code=204)

    async def process_kill(self, request: Request, tenant: TenantState, body: bytes
                           ) -> Response:
        await self._proc(request, tenant).handle.kill()
        return Response(status_code=204)

    async def process_wait(self, request: Request, tenant: TenantState, body: bytes
                           ) -> Response:
        proc = self._proc(request, tenant)
        r = await proc.handle.wait()
        proc.delivered = True
        return _json({"result": wire.result_to_json(r)})

    async def _life(self, request: Request, tenant: TenantState, op: str,
                    body: bytes = b"") -> Response:
        handle = None
        if op == "restore":
            handle = wire.handle_from_json(self._doc(body).get("handle"))
        out = await self.s.lifecycle(tenant, request.path_params["sid"], op, handle)
        if out is None:
            return Response(status_code=204)
        return _json({"handle": out})

    async def pause(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        return await self._life(request, tenant, "pause")

    async def resume(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        return await self._life(request, tenant, "resume")

    async def snapshot(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        return await self._life(request, tenant, "snapshot")

    async def restore(self, request: Request, tenant: TenantState, body: bytes) -> Response:
        return await self._life(request, tenant, "restore", body)


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
            await svc.close()

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        code = {404: "not-found", 405: "method-not-allowed"}.get(status)
        if code is None:
            return JSONResponse({"error": {"code": "provider-error", "message": str(exc)}},
                                status_code=status)
        return _error(ApiError(code, f"{request.method} {request.url.path}: "
                               f"{'no such route' if status == 404 else 'method not allowed'}",
                               what="route"))

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error})
    app.state.service = svc
    return app
