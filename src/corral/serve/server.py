"""Run the app under uvicorn: bind, serve, and drain on SIGTERM / SIGINT.

Draining, in order: the signal marks the service draining (a new request gets 503) and
tells uvicorn to stop: it closes the listening socket and idle connections, lets
in-flight requests finish for ``grace_s``, then cancels what is left (a cancelled run
kills its command); the app's lifespan shutdown then destroys every sandbox, closes the
snippet pool and the providers (their processes, cgroups, mounts and temp dirs), and the
process exits 0. A second signal skips the grace.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import traceback
from collections.abc import Iterator
from types import FrameType
from typing import Any

from corral.serve.config import ServeConfig
from corral.serve.logs import JsonLog

__all__ = ["serve"]


class _ToJson(logging.Handler):
    """uvicorn's own log records, as JSON lines like every other."""

    def __init__(self, log: JsonLog) -> None:
        super().__init__(logging.INFO)
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        fields: dict[str, Any] = {"message": record.getMessage()}
        if record.exc_info:
            fields["traceback"] = "".join(traceback.format_exception(*record.exc_info))
        self._log.event("server", sev=record.levelname.lower(), **fields)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY on accepted sockets only when the
    # protocol is; without it Nagle holds the body behind the headers (40 ms per answer
    # on a keep-alive connection, the peer's delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(False)
    return sock


def serve(config: ServeConfig, *, log: JsonLog | None = None) -> int:
    """Serve ``config`` until SIGTERM / SIGINT, drain, and return 0 (70 when the app
    could not start: a provider could not be made; the log says why).

    Raises:
        ConfigInvalidError: a level names an unknown provider.
    """
    import uvicorn

    from corral.providers import get_provider_class
    from corral.serve.app import create_app
    from corral.serve.service import Service
    for name in set(config.levels.values()):  # an unknown provider: config-invalid now
        get_provider_class(name)
    log = log or JsonLog(enabled=config.access_log)
    service = Service(config, log=log)
    app = create_app(config, service=service)
    for name in ("uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [_ToJson(log)]
        lg.setLevel(logging.INFO)
        lg.propagate = False
    sock = _bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    scheme = "https" if config.tls else "http"
    if host not in ("127.0.0.1", "::1") and not config.tls:
        log.event("warning", sev="warning", message="serving plain HTTP on a non-loopback "
                  "address: bearer tokens travel in clear text (use TLS or a reverse proxy)")
    # "auto": uvloop and httptools when installed (uvicorn[standard]), else asyncio and h11.
    # Under load they cut the server's CPU per request (measured: ~0.35 ms of ~1.7 per
    # snippet run, benchmarks/bench_serve.py); nothing else changes
    ucfg = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="on", loop="auto", http="auto",
        # seconds; uvicorn types it int but waits with asyncio.wait_for (a float works)
        timeout_graceful_shutdown=max(config.grace_s, 0.001),  # type: ignore[arg-type]
        limit_concurrency=config.max_connections,
        server_header=False,  # no "server: uvicorn" line: one header less to write, no banner
        ssl_certfile=config.tls_certfile, ssl_keyfile=config.tls_keyfile)
    server = _Server(ucfg, service)
    weak = {t.name: list(t.policy.not_boundaries) for t in config.tenants
            if t.policy.not_boundaries}
    if weak:
        log.event("not-a-boundary", sev="warning", tenants=weak,
                  message="these tenants are offered levels that are not a security "
                  "boundary: their commands run as this server's user, on its network")
    log.event("listening", host=host, port=port, url=f"{scheme}://{host}:{port}",
              tenants=[t.name for t in config.tenants],
              # levels offered that are no security boundary, and to whom (tenancy.py)
              not_boundaries=weak,
              snippet_workers=config.snippet_workers, **_engines())
    try:
        server.run(sockets=[sock])
    except SystemExit:  # uvicorn exits 3 when the lifespan's startup failed
        pass
    finally:
        sock.close()
    if not server.started:  # the lifespan failed (a provider could not be made): logged
        log.event("stopped", sev="error", reason="startup failed")
        return 70
    log.event("stopped")
    return 0


def _engines() -> dict[str, str]:
    """The event loop and HTTP parser uvicorn's "auto" picks here (for the log)."""
    from importlib.util import find_spec
    return {"loop": "uvloop" if find_spec("uvloop") else "asyncio",
            "http": "httptools" if find_spec("httptools") else "h11"}


class _Server:
    """uvicorn's Server with corral's signal handling: the first SIGTERM / SIGINT drains,
    the second forces; the signal is not raised again after the drain (exit 0)."""

    def __init__(self, config: Any, service: Any) -> None:
        import uvicorn

        service_ref = service

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                def on_signal(sig: int, frame: FrameType | None) -> None:
                    if self.should_exit:
                        self.force_exit = True
                        return
                    service_ref.draining = True
                    service_ref.log.event("draining", signal=signal.Signals(sig).name,
                                          grace_s=service_ref.config.grace_s)
                    self.should_exit = True

                old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
                try:
                    yield
                finally:
                    for s, h in old.items():
                        signal.signal(s, h)

        self._server = Server(config)

    def run(self, sockets: list[socket.socket]) -> None:
        self._server.run(sockets=sockets)

    @property
    def started(self) -> bool:
        """Whether the app started (its lifespan made the providers) and served."""
        return bool(self._server.started)
