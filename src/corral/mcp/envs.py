"""Environments over ``corral mcp`` (docs/environments.md, "Over the service"): the
ones the operator lists for a tenant, and, with the right the operator grants
(``[tenants.env_build]``, :mod:`corral.serve.envbuild`), the tenant's own builds.

Tools: ``environment_list`` (on a server where some tenant has an environment listed
or the right to build) and ``environment_build`` (only where some tenant has the right;
a tenant without it is refused, typed). A build runs on
after the call: ``environment_build`` waits up to ``wait_s`` for it (default 50 s, under
the usual client timeout) and answers its state; ``environment_list`` says how it went.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Final

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from corral.core.errors import ConfigInvalidError
from corral.core.spec import Level, SandboxSpec
from corral.serve import tenancy

if TYPE_CHECKING:
    from corral.core.contract import SandboxProvider
    from corral.envs.store import Environment
    from corral.mcp.config import McpConfig
    from corral.mcp.tenants import McpTenant
    from corral.serve.envbuild import TenantBuilds
    from corral.snippets.host.pool import SnippetPool

__all__ = ["McpEnvs", "add_env_tools"]

#: the longest an ``environment_build`` call waits for its build
MAX_WAIT_S: Final = 120.0


class McpEnvs:
    """The store the server's strict provider reads, the tenants' builds on it, and a
    snippet pool per environment (made on its first snippet)."""

    def __init__(self, config: McpConfig) -> None:
        self.config = config
        self._builds: TenantBuilds | None = None
        self._pools: dict[str, SnippetPool] = {}

    @property
    def builds(self) -> TenantBuilds:
        if self._builds is None:
            from corral.envs.store import EnvStore
            from corral.serve.envbuild import TenantBuilds
            name = self.config.providers.get(Level.STRICT.value, "linux")
            root = self.config.provider_options.get(name, {}).get("env_store_dir")
            self._builds = TenantBuilds(EnvStore(root))
        return self._builds

    def own(self, tenant: McpTenant, name: str | None) -> str | None:
        """The store name of the tenant's own environment ``name`` (None: not its)."""
        policy = tenant.policy
        if name is None or name in policy.environments or policy.env_build is None:
            return None
        return self.builds.resolve(tenant.name, name)

    def admit(self, tenant: McpTenant, spec: SandboxSpec, **kw: Any) -> SandboxSpec:
        """:func:`corral.serve.tenancy.admit_spec`, with the tenant's own environments
        taken too (under their store name)."""
        own = self.own(tenant, spec.environment)
        if own is None:
            return tenancy.admit_spec(tenant.policy, spec, **kw)
        return dataclasses.replace(tenancy.admit_spec(
            tenant.policy, dataclasses.replace(spec, environment=None), **kw),
            environment=own)

    def ref(self, tenant: McpTenant, name: str) -> str:
        """What the provider is given for ``name`` (refused unless the tenant may)."""
        own = self.own(tenant, name)
        if own is not None:
            return own
        tenancy.check_environment(tenant.policy, name)
        return name

    def get(self, tenant: McpTenant, name: str) -> Environment:
        return self.builds.store.get(self.ref(tenant, name))

    def pool(self, env: Environment, provider: SandboxProvider, workers: int | None
             ) -> SnippetPool:
        pool = self._pools.get(env.digest)
        if pool is None:
            from corral.snippets.host.pool import SnippetPool
            from corral.snippets.host.runner import env_preload
            pool = self._pools[env.digest] = SnippetPool(
                providers={Level.STRICT: provider}, max_workers=workers, spares=0,
                environment=env.digest, preload=env_preload(env.modules))
        return pool

    async def aclose(self) -> None:
        if self._builds is not None:
            await self._builds.aclose()
        pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            with contextlib.suppress(Exception):
                await p.aclose()


def add_env_tools(server: Any, backend: Any,
                  guard: Callable[[Callable[[], Awaitable[CallToolResult]]],
                                  Awaitable[CallToolResult]],
                  result: Callable[[dict[str, Any]], CallToolResult]) -> None:
    """Add ``environment_list``, and ``environment_build`` when a tenant may build."""
    from mcp.types import ToolAnnotations

    envs: McpEnvs = backend.envs

    async def environment_list(ctx: Context) -> CallToolResult:
        """The built package environments you may name (environment= of
        run_in_sandbox, run_command, sandbox_create, session_create): the operator's
        for you, then your own builds (state building, ready or failed, with its
        error), each with its importable modules."""
        async def call() -> CallToolResult:
            tenant, _ = backend.caller(ctx)
            return result({"environments": envs.builds.listing(
                tenant.name, sorted(tenant.policy.environments))})
        return await guard(call)

    async def environment_build(
        ctx: Context,
        name: Annotated[str, Field(description="its name (letters, digits, ._-; up to 40)")],
        requirements: Annotated[list[str], Field(
            description="plain requirement specifiers: a project, extras, version clauses "
            "(pandas, numpy>=2,<3); no pip option, URL, path or marker")],
        timeout_s: Annotated[float | None, Field(
            description="the build's wall clock (at most the operator's)")] = None,
        wait_s: Annotated[float, Field(
            description=f"how long this call waits for the build (0..{MAX_WAIT_S:g}); "
            "past it the build runs on: environment_list says when it is ready")] = 50.0,
    ) -> CallToolResult:
        """Build a package environment of your own from a package index the operator
        chose (wheels only, in a strict sandbox), if the operator lets you: then name it
        as environment= of run_in_sandbox, run_command, sandbox_create or
        session_create. Bounded by the operator: how many you keep, their disk, one
        build's time, builds at once."""
        async def call() -> CallToolResult:
            from corral.core.errors import LimitsExceededError
            from corral.serve.envbuild import Busy
            tenant, _ = backend.caller(ctx)
            right = tenant.policy.env_build
            if right is None:
                raise ConfigInvalidError("env_build", f"tenant {tenant.name!r} may not "
                                         "build environments (the operator grants it)")
            if not 0 <= wait_s <= MAX_WAIT_S:
                raise ConfigInvalidError("wait_s", f"must be within [0, {MAX_WAIT_S:g}]")
            provider = await backend.provider(Level.STRICT)
            try:
                doc = envs.builds.start(tenant.name, right, name, requirements,
                                        timeout_s=timeout_s, provider=provider,
                                        listed=tenant.policy.environments)
            except Busy as e:
                err = LimitsExceededError("processes", right.max_concurrent,
                                          right.max_concurrent + 1, detail=str(e))
                raise err from None
            deadline = asyncio.get_running_loop().time() + wait_s
            while doc.get("state") == "building" \
                    and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.2)
                doc = envs.builds.describe(tenant.name, name) or doc
            return result(doc)
        return await guard(call)

    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                             open_world_hint=True)
    import inspect
    tools: list[tuple[Callable[..., Any], Any]] = []
    if any(t.policy.environments or t.policy.env_build is not None for t in backend.tenants):
        tools.append((environment_list, reads))
    if any(t.policy.env_build is not None for t in backend.tenants):
        tools.append((environment_build, writes))
    for fn, notes in tools:
        server.add_tool(fn, annotations=notes, description=inspect.cleandoc(fn.__doc__ or ""))
