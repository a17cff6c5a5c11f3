"""``corral serve``: run corral as an HTTP service (docs/service.md).

Binds 127.0.0.1 unless ``--host`` says otherwise; TLS with ``--tls-cert`` and
``--tls-key``. Tenants and their bearer tokens come from the ``--config`` TOML file;
without one, a single tenant ``default`` is made whose token is read from the
``CORRAL_SERVE_TOKEN`` environment variable, or generated and logged once. Logs are
JSON lines on stderr; the first is ``{"event": "listening", "port": ...}``. SIGTERM
drains and exits 0. Needs ``pip install corral[serve]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    """Register the ``serve`` verb."""
    p = subparsers.add_parser(
        "serve", help="run corral as an HTTP service (JSON API under /v1)",
        description="Serve corral's JSON API (/v1: snippets, runs, sandboxes) on "
                    "127.0.0.1 unless --host says otherwise. See docs/service.md.")
    p.add_argument("--config", metavar="FILE", help="TOML config: [server], [levels], "
                   "[[tenants]] with tokens and caps")
    p.add_argument("--host", help="address to bind (default 127.0.0.1, or the config's)")
    p.add_argument("--port", type=int, help="port (default 8580, or the config's; 0: any "
                   "free port, logged in the 'listening' line)")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate")
    p.add_argument("--tls-key", metavar="PEM", help="... and this key")
    p.add_argument("--grace", type=float, metavar="S", help="SIGTERM: seconds in-flight "
                   "requests may finish before they are cancelled (default 10)")
    p.add_argument("--no-access-log", action="store_true", help="no log line per request")
    p.set_defaults(handler=run)


def _config(args: argparse.Namespace) -> Any:
    from corral.serve.config import ServeConfig, TenantConfig, load_config, token_digest
    if args.config:
        cfg = load_config(args.config)
    else:
        token = os.environ.get("CORRAL_SERVE_TOKEN")
        if not token:
            token = secrets.token_urlsafe(32)
            from corral.serve.logs import JsonLog
            JsonLog().event("token", sev="warning", tenant="default", token=token,
                            message="no --config and no CORRAL_SERVE_TOKEN: a token was "
                                    "generated for tenant 'default'")
        cfg = ServeConfig(tenants=(TenantConfig(name="default",
                                                token_sha256=token_digest(token)),))
    changes: dict[str, Any] = {}
    for attr, value in (("host", args.host), ("port", args.port),
                        ("tls_certfile", args.tls_cert), ("tls_keyfile", args.tls_key),
                        ("grace_s", args.grace)):
        if value is not None:
            changes[attr] = value
    if args.no_access_log:
        changes["access_log"] = False
    return dataclasses.replace(cfg, **changes) if changes else cfg


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM / SIGINT; 0 after a clean drain."""
    from corral.core.errors import ConfigInvalidError
    cfg = _config(args)
    try:
        from corral.serve.server import serve
    except ImportError as e:
        raise ConfigInvalidError("serve", f"corral serve needs its extra: pip install "
                                 f"corral[serve] ({e})") from None
    return serve(cfg)
