"""``corral mcp``: corral's front doors as an MCP server (the official ``mcp`` SDK).

Tools: ``run_in_sandbox`` (a Python snippet, its transcript back, as seed 02's tool of
that name), ``run_command`` (one bounded command at a level) and named sandboxes that
live across calls (``sandbox_create``, ``sandbox_exec``, ``sandbox_write_file``,
``sandbox_read_file``, ``sandbox_list``, ``sandbox_destroy``). Transports: stdio and
streamable HTTP (loopback by default). See ``docs/mcp.md``.

The SDK is the ``mcp`` extra (``pip install corral[mcp]``); it is imported only by
:mod:`corral.mcp.server`, so importing this package, :mod:`corral.mcp.config` or
:mod:`corral.mcp.registry` costs nothing and needs no extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.mcp.config import McpConfig as McpConfig
    from corral.mcp.registry import SandboxRegistry as SandboxRegistry
    from corral.mcp.server import (
        build_server as build_server,
        serve_http as serve_http,
        serve_stdio as serve_stdio,
    )

__all__ = ["McpConfig", "SandboxRegistry", "build_server", "serve_http", "serve_stdio"]

_HOMES = {"McpConfig": "config", "SandboxRegistry": "registry", "build_server": "server",
          "serve_http": "server", "serve_stdio": "server"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
