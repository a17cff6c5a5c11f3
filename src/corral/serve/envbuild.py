"""A tenant's right to build environments over ``corral serve`` / ``corral mcp``
(docs/environments.md, "Over the service"): the operator grants it per tenant,

::

    [[tenants]]
    name = "alice"
    environments = ["sci"]          # operator-built ones it may use (as before)
    [tenants.env_build]             # absent: the tenant may not build (403)
    max_environments = 4            # its own environments at once (built or building)
    max_concurrent = 1              # builds running at once (one more: 429)
    max_disk_mb = 2048              # the size of all its own environments together
    build_disk_mb = 2048            # one build's sandbox disk (pip's downloads, temp, target)
    mem_mb = 2048                   # one build's sandbox memory
    timeout_s = 600                 # one build's wall clock (a tenant may ask less)
    index_url = "https://pypi.org/simple/"
    index_hosts = []                # the hosts the build reaches (default: the index's)
    allow_hosts = []                # more entries, not in the key (a LAN mirror's address)
    cert_file = ""                  # extra CA certificates pip trusts (a private index)

A tenant's environments are named in the shared store (the server's linux provider's
``env_store_dir``) under a prefix of its own (:func:`store_name`): another tenant cannot
name them, not even by digest (a digest is usable only when the operator lists it).
Requirements are plain specifiers only (:func:`check_requirements`): no pip option, no
URL, no path. Wheels only (no package code runs at install time).

Builds are **asynchronous**: ``POST /v1/environments`` answers 202 at once with the
build's state, ``GET /v1/environments/{name}`` says ``building``, ``ready`` or
``failed`` (with a typed error). A build takes tens of seconds from PyPI: longer than
clients and proxies keep a request open, and a request whose client goes away is
cancelled by the server (serve/app.py), which would throw a half-done build away.

Standard library only (the config reads it without starlette).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from corral.core.errors import ConfigInvalidError, CorralError, LimitsExceededError

if TYPE_CHECKING:
    from corral.core.contract import SandboxProvider
    from corral.envs.store import EnvStore

__all__ = ["ENV_BUILD_KEYS", "EnvBuildRight", "TenantBuilds", "check_env_name",
           "check_requirements", "parse_env_build", "store_name"]

ENV_BUILD_KEYS: Final = frozenset({
    "max_environments", "max_concurrent", "max_disk_mb", "build_disk_mb", "mem_mb",
    "timeout_s", "index_url", "index_hosts", "allow_hosts", "cert_file"})
#: the most requirement lines one build takes, and the longest line
MAX_REQUIREMENTS: Final = 64
MAX_REQUIREMENT_CHARS: Final = 200
_ENV_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")
_ID: Final = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VER: Final = r"\s*(?:===?|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+"
#: a plain requirement: a project, its extras, version clauses. No ``@`` (a URL), no
#: ``;`` (markers), no ``:`` or ``/`` (URLs, paths), no leading ``-`` or ``.``
_REQ: Final = re.compile(rf"{_ID}(?:\[\s*{_ID}(?:\s*,\s*{_ID})*\s*\])?(?:{_VER}(?:\s*,{_VER})*)?")
#: names pip would take for a file when one is there
_ARCHIVES: Final = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz",
                    ".tar.xz", ".txz", ".tar.lz", ".tar.lzma")


def _int(where: str, v: object, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigInvalidError(where, f"must be an integer >= {minimum}, got {v!r}")
    return v


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvBuildRight:
    """What the operator lets one tenant build (see the module docstring)."""

    max_environments: int = 4
    max_concurrent: int = 1
    max_disk_mb: int = 2048
    build_disk_mb: int = 2048
    mem_mb: int = 2048
    timeout_s: float = 600.0
    index_url: str = "https://pypi.org/simple/"
    index_hosts: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    cert_file: str | None = None

    def __post_init__(self) -> None:
        w = "env_build"
        for k in ("max_environments", "max_concurrent", "max_disk_mb", "mem_mb"):
            _int(f"{w}.{k}", getattr(self, k))
        _int(f"{w}.build_disk_mb", self.build_disk_mb)
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 3600:
            raise ConfigInvalidError(f"{w}.timeout_s", "must be a number of seconds in "
                                     "(0, 3600]")
        object.__setattr__(self, "index_hosts", tuple(self.index_hosts))
        object.__setattr__(self, "allow_hosts", tuple(self.allow_hosts))
        if self.cert_file is not None:
            if not self.cert_file.startswith("/"):
                raise ConfigInvalidError(f"{w}.cert_file", "must be an absolute path")
            if not os.access(self.cert_file, os.R_OK):
                raise ConfigInvalidError(f"{w}.cert_file", f"cannot read {self.cert_file}")
        self.options(self.timeout_s, 1 << 20, read_cert=False)  # the index URL checks out

    def options(self, timeout_s: float, max_bytes: int, *, read_cert: bool = True) -> Any:
        """The :class:`~corral.envs.BuildOptions` of one build."""
        from corral.core.errors import ProviderError
        from corral.core.spec import SandboxLimits
        from corral.envs.build import BUILD_LIMITS, BuildOptions
        cert = None
        if self.cert_file and read_cert:
            try:
                with open(self.cert_file, "rb") as f:
                    cert = f.read(1 << 20)
            except OSError as e:  # the operator's file went away since the start
                raise ProviderError(f"env_build.cert_file: cannot read it: "
                                    f"{e.strerror}") from None
        limits = SandboxLimits(mem_mb=self.mem_mb, disk_mb=self.build_disk_mb,
                               max_processes=BUILD_LIMITS.max_processes)
        try:
            return BuildOptions(index_url=self.index_url, index_hosts=self.index_hosts,
                                extra_hosts=self.allow_hosts, limits=limits,
                                timeout_s=timeout_s, cert_pem=cert, max_bytes=max_bytes)
        except ConfigInvalidError as e:
            raise ConfigInvalidError(f"env_build.{e.field}", e.reason) from None


def parse_env_build(doc: object, where: str) -> EnvBuildRight:
    """``[tenants.env_build]``: unknown keys refused."""
    if not isinstance(doc, Mapping):
        raise ConfigInvalidError(where, "must be a table")
    extra = sorted(set(doc) - ENV_BUILD_KEYS)
    if extra:
        raise ConfigInvalidError(f"{where}.{extra[0]}", "unknown key")
    kw: dict[str, Any] = dict(doc)
    for k in ("index_hosts", "allow_hosts"):
        if k in kw:
            v = kw[k]
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ConfigInvalidError(f"{where}.{k}", "must be a list of strings")
            kw[k] = tuple(v)
    for k in ("index_url", "cert_file"):
        if k in kw and not isinstance(kw[k], str):
            raise ConfigInvalidError(f"{where}.{k}", "must be a string")
    if kw.get("cert_file") == "":
        kw["cert_file"] = None
    try:
        return EnvBuildRight(**kw)
    except ConfigInvalidError as e:
        f = e.field.removeprefix("env_build")
        raise ConfigInvalidError(f"{where}{f}", e.reason) from None


def check_env_name(name: object) -> str:
    """A tenant's environment name: letters, digits, ``._-``, up to 40."""
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise ConfigInvalidError("name", f"not an environment name: {name!r} (letters, "
                                 "digits, '._-', up to 40, starting with a letter or digit)")
    return name


def check_requirements(reqs: object) -> tuple[str, ...]:
    """Plain requirement specifiers (``pandas``, ``numpy>=2,<3``, ``rich[jupyter]==13.7``):
    at most :data:`MAX_REQUIREMENTS` lines of :data:`MAX_REQUIREMENT_CHARS`; no option
    (``--index-url``, ``-e``, ``-r``), no URL or ``name @ url``, no path, no marker.
    ConfigInvalidError (field ``requirements[i]``) otherwise."""
    if not isinstance(reqs, list | tuple) or not reqs:
        raise ConfigInvalidError("requirements", "must be a non-empty list of strings")
    if len(reqs) > MAX_REQUIREMENTS:
        raise ConfigInvalidError("requirements", f"{len(reqs)} lines: at most "
                                 f"{MAX_REQUIREMENTS}")
    out = []
    for i, r in enumerate(reqs):
        where = f"requirements[{i}]"
        if not isinstance(r, str):
            raise ConfigInvalidError(where, "must be a string")
        if len(r) > MAX_REQUIREMENT_CHARS:
            raise ConfigInvalidError(where, f"{len(r)} characters: at most "
                                     f"{MAX_REQUIREMENT_CHARS}")
        line = r.strip()
        if not _REQ.fullmatch(line) or line.lower().endswith(_ARCHIVES):
            raise ConfigInvalidError(where, f"not a plain requirement: {r[:80]!r} (a "
                                     "project name, extras and version clauses only: no "
                                     "option, URL, path or marker)")
        out.append(" ".join(line.split()))
    return tuple(out)


def store_name(tenant: str, name: str) -> str:
    """The name a tenant's environment has in the shared store: a prefix of its own
    (``t`` and 16 hex digits of its name's sha-256), so tenants never meet."""
    return f"t{hashlib.sha256(tenant.encode()).hexdigest()[:16]}.{name}"


@dataclass(slots=True)
class _Build:
    name: str
    requirements: tuple[str, ...]
    state: str = "building"
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    error: dict[str, Any] | None = None
    task: asyncio.Task[None] | None = None


class TenantBuilds:
    """The builds tenants asked for, on one store and one provider (the strict level's).

    A build's record lives while it runs and, once failed, until the next build of
    its name; a ready environment is whatever the store holds under the tenant's
    prefix."""

    def __init__(self, store: EnvStore) -> None:
        self.store = store
        self._builds: dict[tuple[str, str], _Build] = {}

    # -- what a tenant has -------------------------------------------------------------
    def own(self, tenant: str) -> dict[str, str]:
        """name -> digest of the tenant's built environments."""
        prefix = store_name(tenant, "")
        return {n[len(prefix):]: d for n, d in self.store.names().items()
                if n.startswith(prefix)}

    def _used_bytes(self, tenant: str, but: str | None = None) -> int:
        digests = {d for n, d in self.own(tenant).items() if n != but}
        total = 0
        for d in digests:
            env = self.store.find(d)
            total += env.size_bytes if env is not None else 0
        return total

    def running(self, tenant: str) -> int:
        return sum(1 for (t, _), b in self._builds.items()
                   if t == tenant and b.state == "building")

    def resolve(self, tenant: str, name: str) -> str | None:
        """The store name of the tenant's own environment ``name`` (None: not its)."""
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            return None
        return store_name(tenant, name) if name in self.own(tenant) else None

    def describe(self, tenant: str, name: str) -> dict[str, Any] | None:
        b = self._builds.get((tenant, name))
        digest = self.own(tenant).get(name)
        if b is not None and (b.state != "ready" or digest is None):
            doc: dict[str, Any] = {"name": name, "state": b.state, "owner": "tenant",
                                   "requirements": list(b.requirements),
                                   "started_at": b.started_at}
            if b.finished_at is not None:
                doc["finished_at"] = b.finished_at
            if b.error is not None:
                doc["error"] = b.error
            return doc
        if digest is None:
            return None
        return _env_doc(self.store, name, digest, "tenant")

    def listing(self, tenant: str, listed: Sequence[str]) -> list[dict[str, Any]]:
        """The operator's environments for the tenant, then its own (built or not)."""
        out: list[dict[str, Any]] = []
        for name in sorted(listed):
            try:
                env = self.store.get(name)
            except ConfigInvalidError:
                out.append({"name": name, "state": "missing", "owner": "operator"})
                continue
            out.append(_env_doc(self.store, name, env.digest, "operator"))
        names = set(self.own(tenant)) | {n for (t, n) in self._builds if t == tenant}
        for name in sorted(names):
            doc = self.describe(tenant, name)
            if doc is not None:
                out.append(doc)
        return out

    # -- building ------------------------------------------------------------------------
    def start(self, tenant: str, right: EnvBuildRight, name: str, requirements: object,
              *, timeout_s: object, provider: SandboxProvider,
              listed: frozenset[str]) -> dict[str, Any]:
        """Check a build and start it (a task); its record as JSON. Refusals: bad input
        (ConfigInvalidError), the count or disk cap (LimitsExceededError), a build
        already running at ``max_concurrent`` (:class:`Busy`)."""
        check_env_name(name)
        reqs = check_requirements(requirements)
        if name in listed:
            raise ConfigInvalidError("name", f"{name!r} is an environment the operator "
                                     "lists for you: choose another name")
        if timeout_s is None:
            t = float(right.timeout_s)
        elif isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) \
                or not timeout_s > 0:
            raise ConfigInvalidError("timeout_s", "must be a number of seconds > 0")
        elif timeout_s > right.timeout_s:
            raise ConfigInvalidError("timeout_s", f"{timeout_s} is above the most this "
                                     f"tenant may ask ({right.timeout_s})")
        else:
            t = float(timeout_s)
        prior = self._builds.get((tenant, name))
        if prior is not None and prior.state == "building":
            raise Busy(f"environment {name!r} is being built already")
        if self.running(tenant) >= right.max_concurrent:
            raise Busy(f"{self.running(tenant)} build(s) running: at most "
                       f"{right.max_concurrent} at once for this tenant")
        mine = set(self.own(tenant)) | {n for (tt, n), b in self._builds.items()
                                        if tt == tenant and b.state == "building"}
        if name not in mine and len(mine) + 1 > right.max_environments:
            err = LimitsExceededError(
                "processes", right.max_environments, len(mine) + 1,
                detail=f"tenant {tenant!r}: env_build.max_environments reached (remove "
                "one: DELETE /v1/environments/{name})")
            err.cap = "environments"  # type: ignore[attr-defined]
            raise err
        room = right.max_disk_mb * (1 << 20) - self._used_bytes(tenant, but=name)
        if room <= 0:
            raise _over_disk(tenant, right, -room + right.max_disk_mb * (1 << 20))
        # what comes back from the sandbox is capped by the room the tenant has left
        options = right.options(t, min(room, right.build_disk_mb * (1 << 20)))
        b = _Build(name=name, requirements=reqs)
        self._builds[(tenant, name)] = b
        b.task = asyncio.ensure_future(self._run(b, tenant, right, options, provider))
        return self.describe(tenant, name) or {}

    async def _run(self, b: _Build, tenant: str, right: EnvBuildRight, options: Any,
                   provider: SandboxProvider) -> None:
        from corral.core.errors import SandboxTimeoutError
        from corral.envs.build import build_environment
        from corral.providers.remote import wire
        sname = store_name(tenant, b.name)
        try:
            # the host side bounds the whole build too (a sandbox that hangs in create)
            async with asyncio.timeout(options.timeout_s + 30):
                env = await build_environment(sname, list(b.requirements), options=options,
                                              store=self.store, provider=provider)
            used = self._used_bytes(tenant, but=b.name) + env.size_bytes
            if used > right.max_disk_mb * (1 << 20):  # a cache hit bigger than the room
                self.store.remove(sname)
                raise _over_disk(tenant, right, used)
            b.state = "ready"
        except TimeoutError as e:
            if not isinstance(e, SandboxTimeoutError):
                e = SandboxTimeoutError(f"the build took longer than {options.timeout_s} s",
                                        timeout_ms=int(options.timeout_s * 1000))
            b.state, b.error = "failed", wire.error_to_json(e)
        except CorralError as e:
            b.state, b.error = "failed", wire.error_to_json(e)
        except asyncio.CancelledError:
            b.state = "failed"
            b.error = {"code": "cancelled", "message": "the server stopped"}
            raise
        except Exception as e:
            b.state = "failed"
            b.error = {"code": "provider-error", "message": f"internal error: "
                       f"{type(e).__name__}"}
        finally:
            b.finished_at = time.time()

    def remove(self, tenant: str, name: str) -> bool:
        """Drop the tenant's environment ``name`` (False: none; a running build: Busy)."""
        b = self._builds.get((tenant, name))
        if b is not None and b.state == "building":
            raise Busy(f"environment {name!r} is being built")
        gone = self._builds.pop((tenant, name), None) is not None
        sname = self.resolve(tenant, name)
        if sname is not None:
            self.store.remove(sname)
            gone = True
        return gone

    async def aclose(self) -> None:
        tasks = [b.task for b in self._builds.values() if b.task is not None
                 and not b.task.done()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t


class Busy(Exception):
    """A build is running already (its tenant's ``max_concurrent``): HTTP 429."""


def _over_disk(tenant: str, right: EnvBuildRight, used: int) -> LimitsExceededError:
    return LimitsExceededError("disk", right.max_disk_mb, -(-used >> 20),
                               detail=f"tenant {tenant!r}: env_build.max_disk_mb (its "
                               "environments together)")


def _env_doc(store: EnvStore, name: str, digest: str, owner: str) -> dict[str, Any]:
    env = store.find(digest)
    if env is None:
        return {"name": name, "state": "missing", "owner": owner}
    return {"name": name, "state": "ready", "owner": owner, "digest": digest,
            "requirements": list(env.requirements), "modules": sorted(env.modules),
            "size_bytes": env.size_bytes}
