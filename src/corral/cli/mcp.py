"""``corral mcp [--http [--host H] [--port N]]``: serve corral's tools over MCP.

Without ``--http`` the server speaks MCP on stdin/stdout, for an MCP client that
starts it as a subprocess (its one client; every sandbox ends when the client
closes stdin). With ``--http`` it serves streamable HTTP at
``http://127.0.0.1:PORT/mcp`` (loopback unless ``--host`` says otherwise) and
prints that URL on stderr once listening. SIGTERM or SIGINT stop it; every
sandbox is destroyed first. Exit status: 0 when stopped, 64 for a bad option or a
missing ``mcp`` extra, 69 when the level is not available here. See docs/mcp.md.
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--path", default="/mcp", help="URL path with --http (default /mcp)")
    p.add_argument("--level", choices=("strict", "context-isolated"), default="strict",
                   help="the weakest level a tool runs at, and the default (default strict)")
    p.add_argument("--idle-timeout", type=duration_ms, default=600_000, metavar="TIME",
                   help="destroy a named sandbox unused for this long (default 10m)")
    p.add_argument("--max-sandboxes", type=int, default=8, metavar="N",
                   help="named sandboxes alive at once per session (default 8)")
    p.add_argument("--max-command-timeout", type=duration_ms, default=60_000, metavar="TIME",
                   help="the longest timeout a command may ask for (default 60s)")
    p.add_argument("--playground-url", default=None, metavar="URL",
                   help="a corral serve playground page (e.g. http://127.0.0.1:8580/"
                        "playground/): run_in_sandbox answers link to it with the snippet")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Serve until the client leaves (stdio) or a signal (both)."""
    from corral.core.spec import Level
    from corral.mcp.config import McpConfig
    config = McpConfig(level=Level(args.level), idle_timeout_s=args.idle_timeout / 1000,
                       max_sandboxes=args.max_sandboxes,
                       max_command_timeout_ms=args.max_command_timeout,
                       playground_url=args.playground_url)
    from corral.mcp import server
    if not args.http:
        server.serve_stdio(config)
        return 0

    def announce(url: str) -> None:
        print(f"corral mcp: serving streamable HTTP at {url}", file=sys.stderr, flush=True)
        if args.host not in ("127.0.0.1", "::1", "localhost"):
            print("corral mcp: warning: not on loopback, and MCP over HTTP here has no "
                  "authentication: whoever reaches this address runs code in your sandboxes "
                  "(use corral serve, with tenants, to serve others)", file=sys.stderr,
                  flush=True)

    server.serve_http(config, host=args.host, port=args.port, path=args.path,
                      announce=announce)
    return 0
