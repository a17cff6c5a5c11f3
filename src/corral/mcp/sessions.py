"""Session tools of ``corral mcp`` (docs/sessions.md): a live Python interpreter whose
globals persist between calls, as an agent's code interpreter.

``session_create`` makes a named sandbox (the registry's: it counts against the caller's
caps, ends with the MCP session or its idle timeout, and the ``sandbox_*`` file tools
reach its /work by the same name) holding an interpreter; ``session_run`` runs a cell and
answers with its text outputs (JSON) and each PNG it drew as MCP image content;
``session_close`` ends it. A cell that takes the session past its memory limit is a tool
error ``limits-exceeded`` (``limit: memory``), and the session is gone.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Final

from corral.core.contract import Sandbox
from corral.core.errors import (
    ConfigInvalidError,
    CorralError,
    LimitsExceededError,
    SandboxTimeoutError,
    SessionEndedError,
)
from corral.core.spec import SandboxLimits, SandboxSpec
from corral.sessions.result import CellResult
from corral.sessions.session import DEFAULT_LIMITS, AsyncSession

if TYPE_CHECKING:
    from corral.mcp.registry import Scope
    from corral.mcp.server import Backend

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from pydantic import Field

__all__ = ["MAX_PER_SCOPE", "add_session_tools", "close_sessions"]

#: interpreters alive at once per MCP session (each is also one of its named sandboxes)
MAX_PER_SCOPE: Final = 4
_ATTR: Final = "_corral_sessions"

def _table(backend: Backend) -> dict[tuple[Scope, str], AsyncSession]:
    t: dict[tuple[Scope, str], AsyncSession] | None = getattr(backend, _ATTR, None)
    if t is None:
        t = {}
        setattr(backend, _ATTR, t)
    return t


async def close_sessions(backend: Backend) -> None:
    """Close every session (the lifespan's end, before the registry's sandboxes go)."""
    t = _table(backend)
    for sess in list(t.values()):
        with contextlib.suppress(Exception):
            await sess.close()
    t.clear()


def _doc(cell: CellResult) -> tuple[dict[str, Any], list[ImageContent]]:
    """The cell as JSON without the images' bytes (each PNG is image content instead,
    its place in the JSON says ``"image/png": "<image N>"``)."""
    images: list[ImageContent] = []
    doc = cell.to_json()
    for item in [*(doc["displays"]), *([doc["result"]] if doc["result"] else [])]:
        data = item["data"]
        for mime in ("image/png", "image/jpeg"):
            if isinstance(data.get(mime), str):
                images.append(ImageContent(type="image", data=data[mime], mime_type=mime))
                data[mime] = f"<image {len(images)}>"
    doc["images"] = len(images)
    return doc, images


def add_session_tools(server: MCPServer[Any], backend: Backend,
                      guard: Callable[[Callable[[], Awaitable[CallToolResult]]],
                                      Awaitable[CallToolResult]],
                      result: Callable[[dict[str, Any]], CallToolResult]) -> None:
    """Add ``session_create``, ``session_run`` and ``session_close`` to ``server``."""
    cfg = backend.config

    def live(scope: Scope, name: str) -> AsyncSession:
        sess = _table(backend).get((scope, name))
        if sess is None:
            raise ConfigInvalidError("name", f"no session named {name!r} in this MCP session")
        return sess

    async def session_create(
        ctx: Context,
        name: Annotated[str, Field(description="the session's name (also a sandbox name: "
                                   "sandbox_write_file / sandbox_read_file reach its /work)")],
        mem_mb: Annotated[int | None, Field(description="memory limit, MiB (default 512)")
                          ] = None,
        cell_timeout_s: Annotated[float | None, Field(
            description="a cell running longer is interrupted (KeyboardInterrupt); the "
            "session keeps its variables (default 30)")] = None,
        environment: Annotated[str | None, Field(
            description="a built package environment to run in (environment_list: one "
            "the operator lists for you, or your own)")] = None,
    ) -> CallToolResult:
        """Start a Python session: a strict sandbox holding a live interpreter whose
        variables persist between session_run calls (a notebook's kernel). Upload data
        with sandbox_write_file to the same name."""
        async def call() -> CallToolResult:
            tenant, scope = backend.caller(ctx)
            mine = sum(1 for (s, _) in _table(backend) if s == scope)
            if mine >= MAX_PER_SCOPE:
                raise ConfigInvalidError("max_sessions", f"this MCP session has {mine} Python "
                                         "sessions, the most it may; close one first")
            lv = backend.level_for(tenant, "strict")
            limits = SandboxLimits(mem_mb=mem_mb or DEFAULT_LIMITS.mem_mb,
                                   max_processes=DEFAULT_LIMITS.max_processes,
                                   disk_mb=DEFAULT_LIMITS.disk_mb)
            spec = backend.envs.admit(tenant, SandboxSpec(
                tenant_id=tenant.name, run_id=uuid.uuid4().hex, level=lv, limits=limits,
                environment=environment))
            provider = await backend.provider(lv)
            made: list[AsyncSession] = []

            async def make(sp: SandboxSpec) -> Sandbox:
                sb = await provider.create(sp)
                made.append(await AsyncSession.attach(
                    sb, cell_timeout_s=cell_timeout_s or 30.0,
                    idle_timeout_s=cfg.idle_timeout_s, max_lifetime_s=24 * 3600.0))
                return sb

            try:
                await backend.registry.create(scope, name, spec, make,
                                              tenant_max=tenant.max_sandboxes,
                                              tenant_memory_mb=tenant.max_memory_mb)
            except BaseException:
                for s in made:
                    await s.close()
                raise
            _table(backend)[(scope, name)] = made[0]
            return result({"name": name, "python": made[0].python, "level": lv.value,
                           "mem_mb": spec.limits.mem_mb})
        return await guard(call)

    async def session_run(
        ctx: Context,
        name: Annotated[str, Field(description="a session made by session_create")],
        code: Annotated[str, Field(description="Python source; the last expression's value "
                                   "is the result; matplotlib figures come back as PNG")],
        timeout_s: Annotated[float | None, Field(
            description="this cell's timeout (default the session's)")] = None,
    ) -> CallToolResult:
        """Run a cell in a session: stdout, stderr, the last expression's value and display
        outputs as MIME bundles (text/plain, text/html, application/json ...), the error
        with its traceback; every PNG (a plot) also as image content."""
        async def call() -> CallToolResult:
            tenant, scope = backend.caller(ctx)
            sess = live(scope, name)
            with backend.run_slot(tenant):
                async with backend.registry.use(scope, name):
                    try:
                        cell = await sess.run(code, timeout_s=timeout_s)
                    except (LimitsExceededError, SandboxTimeoutError, SessionEndedError):
                        _table(backend).pop((scope, name), None)
                        with contextlib.suppress(CorralError):
                            await backend.registry.destroy(scope, name, "session-ended")
                        raise
            doc, images = _doc(cell)
            text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
            return CallToolResult(content=[TextContent(type="text", text=text), *images],
                                  structured_content=doc, is_error=False)
        return await guard(call)

    async def session_close(
        ctx: Context,
        name: Annotated[str, Field(description="a session made by session_create")],
    ) -> CallToolResult:
        """End a session: its interpreter, variables, files and sandbox are released."""
        async def call() -> CallToolResult:
            _, scope = backend.caller(ctx)
            sess = live(scope, name)
            _table(backend).pop((scope, name), None)
            await sess.close()
            await backend.registry.destroy(scope, name, "session-closed")
            return result({"name": name, "closed": True})
        return await guard(call)

    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                             open_world_hint=False)
    kills = ToolAnnotations(read_only_hint=False, destructive_hint=True,
                            idempotent_hint=False, open_world_hint=False)
    import inspect
    for fn, notes in ((session_create, writes), (session_run, writes),
                      (session_close, kills)):
        server.add_tool(fn, annotations=notes, description=inspect.cleandoc(fn.__doc__ or ""))
