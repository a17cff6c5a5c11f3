"""The MCP tools for a named sandbox's file operations beside read and write (issue 27
item 4): ``sandbox_list_files`` (``depth`` levels deep, bounded), ``sandbox_file_info``,
``sandbox_file_exists``, ``sandbox_make_dir`` and ``sandbox_remove``.

The answers are those of ``corral serve``'s ``POST .../files/<op>`` (serve/files.py): a
listing past ``max_entries`` answers the first entries, sorted by path, with
``truncated: true``; nothing at a path is the tool error ``not-found`` with ``what:
"file"``; what else the file system refuses (a directory not empty, a file where a
directory is wanted) is ``conflict`` with ``what: "file"``, the ``errno`` name and the
``path``; a path outside the sandbox's /work is ``config-invalid``. Their
``outputSchema`` entries are in :mod:`corral.mcp.schemas`.
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from corral.core.filewalk import MAX_LIST_DEPTH, MAX_LIST_ENTRIES, list_tree
from corral.mcp.server import _guard, _result

__all__ = ["MCP_LIST_DEFAULT", "file_tools"]

#: the entries a listing answers unless the call asks more (up to MAX_LIST_ENTRIES):
#: an agent's context is the budget
MCP_LIST_DEFAULT = 1000

_NAME = "a sandbox made by sandbox_create"
_PATH = "relative to the sandbox's /work (or absolute under it)"
Tool = Callable[..., Awaitable[CallToolResult]]


def _fs_error(err: OSError, path: str) -> CallToolResult:
    if isinstance(err, FileNotFoundError):
        return _result({"error": {"code": "not-found", "what": "file", "path": path,
                                  "message": f"no such file: {path!r}"}}, is_error=True)
    name = _errno.errorcode.get(err.errno or 0, "EIO")
    return _result({"error": {"code": "conflict", "what": "file", "errno": name,
                              "path": path, "message": f"{path!r}: {err.strerror or name}"}},
                   is_error=True)


def file_tools(backend: Any) -> list[tuple[Tool, ToolAnnotations]]:
    """The five tools, bound to ``backend`` (the server's :class:`Backend`), with the
    annotations each is registered with."""

    async def on(ctx: Any, name: str, path: str, work: Callable[[Any], Awaitable[Any]],
                 answer: Callable[[Any], dict[str, Any]]) -> CallToolResult:
        async def call() -> CallToolResult:
            _, scope = backend.caller(ctx)
            async with backend.registry.use(scope, name) as sb:
                try:
                    got = await work(sb)
                except OSError as e:
                    return _fs_error(e, path)
            return _result({"name": name, "path": path, **answer(got)})
        return await _guard(call)

    async def sandbox_list_files(
        ctx: Context,
        name: Annotated[str, Field(description=_NAME)],
        path: Annotated[str, Field(description=_PATH + "; default /work itself")] = "",
        depth: Annotated[int, Field(ge=1, le=MAX_LIST_DEPTH, description=(
            "levels to walk down: 1 the directory's own entries"))] = 1,
        max_entries: Annotated[int, Field(ge=1, le=MAX_LIST_ENTRIES, description=(
            f"the most entries answered (default {MCP_LIST_DEFAULT}, at most "
            f"{MAX_LIST_ENTRIES}); past it: the first ones and truncated true"))
                               ] = MCP_LIST_DEFAULT,
    ) -> CallToolResult:
        """List a directory of a named sandbox, depth levels deep, sorted by path: each
        entry's name, path, type (file, dir, symlink, other), size, permissions and
        modification time. A symlink is an entry, never walked into."""
        return await on(ctx, name, path, lambda sb: list_tree(sb, path, depth, max_entries),
                        lambda got: {"entries": [e.to_dict() for e in got[0]],
                                     "truncated": got[1], "max_entries": max_entries})

    async def sandbox_file_info(
        ctx: Context,
        name: Annotated[str, Field(description=_NAME)],
        path: Annotated[str, Field(description=_PATH)],
    ) -> CallToolResult:
        """What is at a path of a named sandbox (a symlink itself, not where it points):
        type, size, permissions, modification time."""
        return await on(ctx, name, path, lambda sb: sb.get_info(path),
                        lambda got: {"info": got.to_dict()})

    async def sandbox_file_exists(
        ctx: Context,
        name: Annotated[str, Field(description=_NAME)],
        path: Annotated[str, Field(description=_PATH)],
    ) -> CallToolResult:
        """Whether anything (a dangling symlink too) is at a path of a named sandbox."""
        return await on(ctx, name, path, lambda sb: sb.exists(path),
                        lambda got: {"exists": bool(got)})

    async def sandbox_make_dir(
        ctx: Context,
        name: Annotated[str, Field(description=_NAME)],
        path: Annotated[str, Field(description=_PATH)],
        parents: Annotated[bool, Field(description="make missing parents too")] = True,
    ) -> CallToolResult:
        """Make a directory in a named sandbox; created is false when one was there."""
        return await on(ctx, name, path, lambda sb: sb.make_dir(path, parents=parents),
                        lambda got: {"created": bool(got)})

    async def sandbox_remove(
        ctx: Context,
        name: Annotated[str, Field(description=_NAME)],
        path: Annotated[str, Field(description=_PATH + " (never /work itself)")],
        recursive: Annotated[bool, Field(
            description="a directory that is not empty needs it")] = False,
    ) -> CallToolResult:
        """Remove a file, symlink or directory of a named sandbox."""
        return await on(ctx, name, path, lambda sb: sb.remove(path, recursive=recursive),
                        lambda got: {"removed": True})

    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                             open_world_hint=False)
    kills = ToolAnnotations(read_only_hint=False, destructive_hint=True,
                            idempotent_hint=True, open_world_hint=False)
    return [(sandbox_list_files, reads), (sandbox_file_info, reads),
            (sandbox_file_exists, reads), (sandbox_make_dir, writes),
            (sandbox_remove, kills)]
