"""``corral mcp [--http [--host H] [--port N]]``: serve corral's tools over MCP.

Without ``--http`` the server speaks MCP on stdin/stdout, for an MCP client that
starts it as a subprocess (its one client, with no token; every sandbox ends when
the client closes stdin). With ``--http`` it serves streamable HTTP at
``http://127.0.0.1:PORT/mcp`` (loopback unless ``--host`` says otherwise) and
prints that URL on stderr once listening; every request needs a tenant's bearer
token: the ``[[tenants]]`` of ``--config`` (``corral serve``'s file), else
``$CORRAL_MCP_TOKEN``, else (on loopback only) a token generated and printed once.
SIGTERM or SIGINT stop it; every sandbox is destroyed first. Exit status: 0 when
stopped, 64 for a bad option or a missing ``mcp`` extra, 69 when the level is not
available here. See docs/mcp.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from corral.cli._common import duration_ms

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    """Register the ``mcp`` verb."""
    p = subparsers.add_parser(
        "mcp", help="serve corral's tools to an MCP client (stdio, or --http)",
        description="An MCP server (the official mcp SDK; pip install corral[mcp]) with "
                    "tools to run a Python snippet, run a command, and work in named "
                    "sandboxes across calls. stdio by default; --http for streamable HTTP.")
    p.add_argument("--http", action="store_true",
                   help="serve streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on with --http (default 127.0.0.1, loopback)")
    p.add_argument("--port", type=int, default=8765,
                   help="port with --http (default 8765; 0: any free port, printed)")
    p.add_argument("--environment", action="append", default=[], metavar="NAME",
                   help="a built environment (corral env build) the stdio client may name "
                        "in sandbox_create and session_create (repeatable; docs/environments.md)")
    p.add_argument("--path", default="/mcp", help="URL path with --http (default /mcp)")
    p.add_argument("--level", choices=("strict", "context-isolated"), default="strict",
                   help="the weakest level a tool runs at, and the default (default strict)")
    p.add_argument("--idle-timeout", type=duration_ms, default=600_000, metavar="TIME",
                   help="destroy a named sandbox unused for this long (default 10m)")
    p.add_argument("--max-sandboxes", type=int, default=8, metavar="N",
                   help="named sandboxes alive at once per session (default 8)")
    p.add_argument("--max-command-timeout", type=duration_ms, default=60_000, metavar="TIME",
                   help="the longest timeout a command may ask for (default 60s)")
    p.add_argument("--config", metavar="FILE",
                   help="with --http: corral serve's TOML config, whose [[tenants]] (tokens, "
                        "caps) and [levels] this server uses")
    p.add_argument("--max-sessions", type=int, default=64, metavar="N",
                   help="with --http: MCP sessions open at once in all (default 64)")
    p.add_argument("--max-sessions-per-tenant", type=int, default=8, metavar="N",
                   help="with --http: MCP sessions open at once per tenant (default 8)")
    p.add_argument("--session-start-timeout", type=duration_ms, default=30_000,
                   metavar="TIME", help="with --http: close a session that did nothing "
                   "after its handshake for this long (default 30s)")
    p.add_argument("--tls-cert", metavar="PEM", help="with --http: serve HTTPS with this "
                   "certificate")
    p.add_argument("--tls-key", metavar="PEM", help="... and this key")
    p.add_argument("--playground-url", default=None, metavar="URL",
                   help="a corral serve playground page (e.g. http://127.0.0.1:8580/"
                        "playground/): run_in_sandbox answers link to it with the snippet")
    p.set_defaults(handler=run)


def _tenants(args: argparse.Namespace, config: Any) -> Any:
    """The HTTP server's tenants: --config's, $CORRAL_MCP_TOKEN's ``default``, or (on
    loopback only) ``default`` with a generated token printed once."""
    import dataclasses

    from corral.core.errors import ConfigInvalidError
    from corral.mcp.config import offered_levels
    from corral.mcp.tenants import (
        McpTenant,
        TenantTable,
        generated_token,
        is_loopback,
        load_tenants,
    )
    from corral.serve.config import token_digest
    if args.config:
        loaded = load_tenants(args.config, config.level,
                              max_sessions=args.max_sessions_per_tenant)
        return loaded.tenants, dataclasses.replace(
            config, providers=loaded.providers, provider_options=loaded.provider_options)
    token = os.environ.get("CORRAL_MCP_TOKEN")
    if token is not None and len(token) < 16:
        raise ConfigInvalidError("CORRAL_MCP_TOKEN", "must be 16 characters or more")
    if not token:
        if not is_loopback(args.host):
            raise ConfigInvalidError(
                "config", f"--http on {args.host} (not loopback) needs tenants with tokens: "
                "--config FILE ([[tenants]], as corral serve) or $CORRAL_MCP_TOKEN")
        token = generated_token()
        print("corral mcp: no --config and no CORRAL_MCP_TOKEN: generated a bearer token "
              f"for tenant 'default' (send Authorization: Bearer <token>): {token}",
              file=sys.stderr, flush=True)
    from corral.serve.tenancy import TenantPolicy
    tenant = McpTenant(name="default", token_sha256=token_digest(token),
                       max_sandboxes=args.max_sandboxes, max_runs=16, max_memory_mb=None,
                       max_sessions=args.max_sessions_per_tenant,
                       policy=TenantPolicy(name="default",
                                           levels=offered_levels(config.level)))
    return TenantTable([tenant]), config


def run(args: argparse.Namespace) -> int:
    """Serve until the client leaves (stdio) or a signal (both)."""
    from corral.core.errors import ConfigInvalidError
    from corral.core.spec import Level
    from corral.mcp.config import McpConfig
    config = McpConfig(level=Level(args.level), idle_timeout_s=args.idle_timeout / 1000,
                       max_sandboxes=args.max_sandboxes,
                       max_command_timeout_ms=args.max_command_timeout,
                       playground_url=args.playground_url, max_sessions=args.max_sessions,
                       session_start_timeout_s=args.session_start_timeout / 1000,
                       environments=frozenset(args.environment))
    if not args.http:
        for opt in ("config", "tls_cert", "tls_key"):
            if getattr(args, opt):
                raise ConfigInvalidError(opt, f"--{opt.replace('_', '-')} is for --http "
                                         "(over stdio the client that started the server "
                                         "is its one tenant)")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigInvalidError("tls_cert", "TLS needs both --tls-cert and --tls-key")
    from corral.mcp import server
    if not args.http:
        server.serve_stdio(config)
        return 0
    tenants, config = _tenants(args, config)
    from corral.mcp.tenants import is_loopback

    def announce(url: str) -> None:
        print(f"corral mcp: serving streamable HTTP at {url}", file=sys.stderr, flush=True)
        if not is_loopback(args.host) and args.tls_cert is None:
            print("corral mcp: warning: not on loopback and no TLS: bearer tokens cross the "
                  "network in clear (use --tls-cert/--tls-key, or a TLS proxy)",
                  file=sys.stderr, flush=True)

    server.serve_http(config, tenants=tenants, host=args.host, port=args.port,
                      path=args.path, announce=announce, tls_certfile=args.tls_cert,
                      tls_keyfile=args.tls_key)
    return 0
