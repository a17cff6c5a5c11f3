"""Building an environment: ``pip install`` inside a strict sandbox, out as a tar
stream, checked and published into the store.

The untrusted part (pip, the packages' build back ends, ``setup.py``) runs only in
the sandbox: its network is the index's hosts alone, its writable area a tmpfs of
``disk_mb``, its memory, processes and wall time bounded. The host reads back one
tar stream of the installed tree, capped in bytes and members, and unpacks it with
``tarfile``'s ``data`` filter (no absolute paths, no ``..``, no links out, no device
files, no setuid bits), then makes it read-only and renames it into the store.

On a base image (``image=``) the sandbox's root is the image and the install is its own
``python3 -m pip``; the key holds the image's content digest and what its python3
said of itself inside it (:func:`base_image`), in place of the host's interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import posixpath
import stat
import sys
import sysconfig
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from corral.core.contract import SandboxProvider
from corral.core.errors import ConfigInvalidError, LimitsExceededError, ProviderError
from corral.core.spec import ExecOpts, NetworkPolicy, ProcessOpts, SandboxLimits, SandboxSpec
from corral.core.tasks import settle
from corral.envs.store import Environment, EnvStore, digest_of, normalize_requirements, valid_name

__all__ = ["BaseImage", "BuildOptions", "DEFAULT_INDEX", "BUILD_LIMITS", "base_image",
           "build_environment", "build_inputs", "stats"]

DEFAULT_INDEX: Final = "https://pypi.org/simple/"
#: the hosts the default index serves from (the simple pages, then the files)
DEFAULT_INDEX_HOSTS: Final = ("pypi.org:443", "files.pythonhosted.org:443")
#: the build sandbox's limits unless the caller gives others
BUILD_LIMITS: Final = SandboxLimits(mem_mb=2048, disk_mb=2048, max_processes=256)
_TAR_MAX_MEMBERS: Final = 200_000
_SANDBOX_TARGET: Final = "/work/env"
#: dirs pip --target makes for scripts and data files, not importable packages
_NOT_MODULES: Final = frozenset({"bin", "share", "include", "etc", "man", "__pycache__"})

#: counters for tests and benchmarks: builds that ran a sandbox, cache hits
stats: dict[str, int] = {"sandbox_builds": 0, "cache_hits": 0}

_TAR_OUT = (
    "import sys, tarfile\n"
    "t = tarfile.open(fileobj=sys.stdout.buffer, mode='w|', format=tarfile.PAX_FORMAT)\n"
    f"t.add({_SANDBOX_TARGET!r}, arcname='site')\n"
    "t.close()\n"
    "sys.stdout.flush()\n")


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildOptions:
    """How an environment is built (all of it but ``timeout_s``, ``limits`` and
    ``cert_pem`` is part of the digest).

    Attributes:
        index_url: the package index (PEP 503 simple API).
        index_hosts: the hosts the build's network allows (``host:port`` entries, see
            docs/network.md); default: the index URL's host, and for PyPI
            files.pythonhosted.org too.
        allow_source: let pip build sdists (runs their build back ends, in the
            sandbox); default wheels only (``--only-binary=:all:``).
        limits: the build sandbox's limits (:data:`BUILD_LIMITS`).
        timeout_s: wall-clock bound of the install.
        cert_pem: extra CA certificates pip trusts (over the host's system bundle).
        max_bytes: cap on the installed tree read back from the sandbox.
        extra_hosts: more network entries for the build (not part of the digest), e.g.
            the index's address as a CIDR where the host's resolver maps it to a
            non-public range (a mirror or proxy on the LAN): the egress proxy refuses
            non-public addresses unless listed (docs/network.md).
    """

    index_url: str = DEFAULT_INDEX
    index_hosts: tuple[str, ...] = ()
    allow_source: bool = False
    limits: SandboxLimits = BUILD_LIMITS
    timeout_s: float = 900.0
    cert_pem: bytes | None = None
    max_bytes: int = 2 * 1024 * 1024 * 1024
    extra_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        u = urlsplit(self.index_url)
        if u.scheme not in ("https", "http") or not u.hostname:
            raise ConfigInvalidError("index_url", f"not an http(s) index URL: {self.index_url!r}")
        object.__setattr__(self, "index_hosts", tuple(self.index_hosts))
        object.__setattr__(self, "extra_hosts", tuple(self.extra_hosts))
        if not isinstance(self.timeout_s, int | float) or self.timeout_s <= 0:
            raise ConfigInvalidError("timeout_s", "must be a positive number")

    def hosts(self) -> tuple[str, ...]:
        if self.index_hosts:
            return self.index_hosts
        u = urlsplit(self.index_url)
        port = u.port or (443 if u.scheme == "https" else 80)
        if self.index_url.rstrip("/") == DEFAULT_INDEX.rstrip("/"):
            return DEFAULT_INDEX_HOSTS
        return (f"{u.hostname}:{port}",)


def non_public_index_entries(options: BuildOptions) -> tuple[str, ...]:
    """``ip/32:port`` entries for the index hosts' addresses, as the host resolves them,
    that are not public (what :attr:`BuildOptions.extra_hosts` needs on a host whose
    resolver sends the index to a mirror or proxy in a private range)."""
    import ipaddress
    import socket
    out: list[str] = []
    for entry in options.hosts():
        host, _, port = entry.rpartition(":")
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except (OSError, ValueError):
            continue
        for info in infos:
            ip = ipaddress.ip_address(info[4][0])
            bits = 32 if ip.version == 4 else 128
            e = f"{ip}/{bits}:{port}" if ip.version == 4 else f"[{ip}/{bits}]:{port}"
            if not ip.is_global and e not in out:
                out.append(e)
    return tuple(out)


#: what a base image's python3 tells of itself, read inside the image (one JSON line)
_PROBE = (
    "import importlib.util, json, platform, sys, sysconfig\n"
    "print(json.dumps({'implementation': sys.implementation.name,\n"
    "  'version': list(sys.version_info[:3]), 'version_text': sys.version,\n"
    "  'soabi': sysconfig.get_config_var('SOABI') or '',\n"
    "  'abiflags': getattr(sys, 'abiflags', ''), 'machine': platform.machine(),\n"
    "  'libc': list(platform.libc_ver()), 'executable': sys.executable,\n"
    "  'pip': importlib.util.find_spec('pip') is not None}))\n")
_DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseImage:
    """A base image an environment is built on: its reference as given, its content
    key (``sha256:<config digest>``: the tag is not what is hashed) and what its own
    ``python3`` said of itself inside it (:func:`base_image`).

    Attributes:
        ref: the image as the user wrote it (a registry reference or a local layout).
        key: ``sha256:<config digest>`` (the config lists every layer's digest).
        python: the image's python3, a path inside it (found on the config's PATH).
        interpreter: implementation, version, SOABI, ABI flags (part of the key).
        machine / libc: the platform as the image's python reports it (part of the key).
        version_text: its ``sys.version``.
    """

    ref: str
    key: str
    python: str
    interpreter: dict[str, Any]
    machine: str
    libc: tuple[str, str]
    version_text: str = ""


def _interpreter() -> dict[str, Any]:
    return {"implementation": sys.implementation.name,
            "version": list(sys.version_info[:3]),
            "soabi": sysconfig.get_config_var("SOABI") or "",
            "abiflags": getattr(sys, "abiflags", "")}


def build_inputs(requirements: Sequence[str] | str, options: BuildOptions,
                 *, image: BaseImage | None = None) -> dict[str, Any]:
    """Everything a build's result depends on: the digest is their sha256. On a base
    image: the image's content key and its interpreter and platform (read inside it),
    not the host's."""
    if image is None:
        interp = _interpreter()
        plat = {"machine": platform.machine(), "system": platform.system(),
                "libc": list(platform.libc_ver())}
    else:
        interp = dict(image.interpreter)
        plat = {"machine": image.machine, "system": "Linux", "libc": list(image.libc)}
    return {"v": 1,
            "interpreter": interp,
            "platform": plat,
            "requirements": list(normalize_requirements(requirements)),
            "index_url": options.index_url,
            "index_hosts": list(options.hosts()),
            "allow_source": options.allow_source,
            "image": None if image is None else image.key}


async def build_environment(
        name: str, requirements: Sequence[str] | str, *,
        options: BuildOptions | None = None, store: EnvStore | None = None,
        provider: SandboxProvider | None = None, image: str | None = None,
        image_cache_dir: str | None = None) -> Environment:
    """Build (or find) the environment of ``requirements`` and name it ``name``.

    Same inputs, same digest: a second call finds the built tree and touches no
    sandbox and no network. Otherwise one build runs at a time per digest (a file
    lock); the install runs in a strict sandbox of ``provider`` (default: a private
    :class:`~corral.providers.linux.LinuxProvider`, closed after).

    ``image``: a base image (a registry reference or a local OCI layout/tar): the
    install runs in a sandbox whose root is the image, with the image's own python3
    and pip; the key holds the image's content digest and its interpreter's version
    and SOABI (:func:`base_image`). The image is resolved in the image cache
    ``image_cache_dir`` (default: the image cache's default dir; a given
    ``provider`` must use the same one).

    Raises:
        ConfigInvalidError: a bad name, requirement or option.
        ProviderError: pip failed in the sandbox (its output's tail in the message,
            and the hosts the sandbox tried and was refused).
        LimitsExceededError / SandboxTimeoutError: the build hit a limit.
        ConfigInvalidError (field ``image``): the base image has no python3 or no pip,
            or is a rootfs dir (no content digest).
    """
    valid_name(name)
    options = options or BuildOptions()
    store = store or EnvStore()
    normalize_requirements(requirements)  # a bad list is refused before any image work
    base = None
    if image is not None:
        base = await base_image(image, store=store, options=options, provider=provider,
                                image_cache_dir=image_cache_dir)
    inputs = build_inputs(requirements, options, image=base)
    digest = digest_of(inputs)
    hit = store.find(digest, name)
    if hit is not None:
        stats["cache_hits"] += 1
        store.set_name(name, digest)
        store.touch(digest)
        return hit
    async with _locked(store, digest):
        hit = store.find(digest, name)
        if hit is None:
            hit = await _build(store, digest, inputs, options, provider, base,
                               image_cache_dir)
        else:
            stats["cache_hits"] += 1
        store.set_name(name, digest)
    store.evict(keep=[digest])
    return Environment(name=name, digest=hit.digest, path=hit.path, modules=hit.modules,
                       requirements=hit.requirements, size_bytes=hit.size_bytes, meta=hit.meta)


@contextlib.asynccontextmanager
async def _locked(store: EnvStore, digest: str) -> Any:
    cm = store.lock(digest)
    await asyncio.to_thread(cm.__enter__)
    try:
        yield
    finally:
        cm.__exit__(None, None, None)


async def _build(store: EnvStore, digest: str, inputs: dict[str, Any],
                 options: BuildOptions, provider: SandboxProvider | None,
                 base: BaseImage | None = None,
                 image_cache_dir: str | None = None) -> Environment:
    store.clean_temp()
    temp = store.new_temp()
    try:
        t0 = time.monotonic()
        tar_path = temp / "out.tar"
        own = provider is None
        if provider is None:
            provider = _own_provider(base is not None, image_cache_dir)
        try:
            log = await _install(provider, inputs, options, tar_path, base)
        finally:
            if own:
                await provider.aclose()
        if base is not None:  # the image the sandbox ran is still the one hashed
            again = await _resolve_image(base.ref, image_cache_dir)
            if again.key != base.key:
                raise ProviderError(f"the image {base.ref!r} changed during the build "
                                    f"({base.key} -> {again.key}); build again")
        stats["sandbox_builds"] += 1
        size, modules = await asyncio.to_thread(_unpack, tar_path, temp, options.max_bytes)
        tar_path.unlink()
        meta = {"digest": digest, "inputs": inputs, "requirements": inputs["requirements"],
                "modules": sorted(modules), "size_bytes": size,
                "built_at": time.time(), "build_seconds": round(time.monotonic() - t0, 3),
                "pip_log_tail": log[-4000:]}
        import json
        (temp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        return store.publish(temp, digest)
    except BaseException:
        from corral.envs.store import remove_tree
        remove_tree(temp)
        raise


def _own_provider(image: bool, image_cache_dir: str | None) -> SandboxProvider:
    """A private linux provider for one build (on an image: resolving it in the image
    cache the build resolved it in)."""
    from corral.providers.linux import LinuxProvider
    if not image:
        return LinuxProvider(spares=0)
    return LinuxProvider(spares=0, image_cache_dir=_image_cache(image_cache_dir).root)


def _image_cache(image_cache_dir: str | None) -> Any:
    from corral.images.cache import ImageCache
    return ImageCache(image_cache_dir)


async def _resolve_image(ref: str, image_cache_dir: str | None) -> Any:
    """``ref`` unpacked (or found) in the image cache, as the provider will (pulled when
    missing); blocking work in a thread."""
    from corral.images import resolve
    cache = _image_cache(image_cache_dir)
    return await asyncio.to_thread(resolve, ref, cache=cache, pull_policy="missing")


async def base_image(ref: str, *, store: EnvStore, options: BuildOptions,
                     provider: SandboxProvider | None = None,
                     image_cache_dir: str | None = None) -> BaseImage:
    """The base image ``ref``: resolved to its content key, and its python3's facts,
    read once inside the image (a strict sandbox whose root is the image, no network)
    and kept in the store under that key (a function of the image's content: a
    second build on the same image reads them from there, with no sandbox).

    Raises ConfigInvalidError (field ``image``): a rootfs dir (no content digest),
    no ``python3`` on the image's PATH (or one that does not run), or no ``pip``."""
    unpacked = await _resolve_image(ref, image_cache_dir)
    key = unpacked.key
    if not key.startswith("sha256:"):
        raise ConfigInvalidError(
            "image", f"an environment is built on an image with a content digest (a "
            f"registry reference, an OCI layout or tar), not the rootfs dir {ref!r}")
    facts = store.image_facts(key)
    if facts is None:
        facts = await _probe(ref, unpacked, options, provider, image_cache_dir)
        store.set_image_facts(key, facts)
    try:
        return BaseImage(ref=ref, key=key, python=str(facts["python"]),
                         interpreter={k: facts[k] for k in ("implementation", "version",
                                                            "soabi", "abiflags")},
                         machine=str(facts["machine"]),
                         libc=(str(facts["libc"][0]), str(facts["libc"][1])),
                         version_text=str(facts.get("version_text", "")))
    except (KeyError, IndexError, TypeError) as e:  # a store file of another version
        raise ConfigInvalidError(
            "image", f"unreadable facts of {key} in the store: {e}") from None


def _python_on_path(unpacked: Any) -> str | None:
    """The first ``python3`` on the image config's PATH (default a Debian-like one),
    as a path inside the image; None when none is there."""
    from corral.providers.linux.host.imageroot import env_of
    path = env_of(unpacked.config.env).get("PATH") or _DEFAULT_PATH
    for d in path.split(":"):
        if not d.startswith("/") or ".." in d.split("/"):
            continue
        inside = posixpath.join(posixpath.normpath(d), "python3")
        if os.path.lexists(os.path.join(unpacked.rootfs, inside.lstrip("/"))):
            return inside
    return None


async def _probe(ref: str, unpacked: Any, options: BuildOptions,
                 provider: SandboxProvider | None,
                 image_cache_dir: str | None) -> dict[str, Any]:
    """The image's python3 asked, inside the image, what it is (:data:`_PROBE`)."""
    import json
    py = _python_on_path(unpacked)
    if py is None:
        raise ConfigInvalidError(
            "image", f"the image {ref!r} has no python3 on its PATH: an environment is "
            "installed by the image's own python3 and pip")
    own = provider is None
    if provider is None:
        provider = _own_provider(True, image_cache_dir)
    try:
        spec = SandboxSpec(tenant_id="corral-envs", image=ref, limits=options.limits)
        async with await provider.create(spec) as sb:
            r = await sb.exec([py, "-I", "-c", _PROBE], ExecOpts(timeout_ms=60_000))
    finally:
        if own:
            await provider.aclose()
    if r.exit_code != 0:
        raise ConfigInvalidError(
            "image", f"the image {ref!r}'s python3 ({py}) does not run: exit "
                     f"{r.exit_code}: {_tail(r.stderr_text, 500)}")
    try:
        doc = json.loads(r.stdout_text.strip().splitlines()[-1])
        version = [int(v) for v in doc["version"]][:3]
        facts: dict[str, Any] = {"python": py,
                 "implementation": str(doc["implementation"]),
                 "version": version,
                 "version_text": str(doc["version_text"])[:500],
                 "soabi": str(doc["soabi"])[:200], "abiflags": str(doc["abiflags"])[:20],
                 "machine": str(doc["machine"])[:50],
                 "libc": [str(doc["libc"][0])[:50], str(doc["libc"][1])[:50]],
                 "pip": doc["pip"] is True}
    except (ValueError, KeyError, IndexError, TypeError):
        raise ConfigInvalidError(
            "image", f"the image {ref!r}'s python3 ({py}) did not say what it is: "
                     f"{_tail(r.stdout_text + r.stderr_text, 500)!r}") from None
    if not facts["pip"]:
        v = ".".join(str(x) for x in version)
        raise ConfigInvalidError(
            "image", f"the image {ref!r}'s python3 ({py}, Python {v}) has no pip: an "
                     "environment is installed by the image's own pip (add it to the "
                     "image: python3-pip, or ensurepip)")
    return facts


async def _install(provider: SandboxProvider, inputs: dict[str, Any],
                   options: BuildOptions, tar_path: Path,
                   base: BaseImage | None = None) -> str:
    """pip install in a fresh strict sandbox (whose root is ``base`` when given: its
    own python3 and pip); the installed tree streamed to ``tar_path``."""
    spec = SandboxSpec(tenant_id="corral-envs", network=NetworkPolicy.allowlist(
        *options.hosts(), *options.extra_hosts),
                       limits=options.limits, image=None if base is None else base.ref)
    from corral.providers.linux.host.sandbox import _system_cas
    ca = _system_cas() + (options.cert_pem or b"")
    py = sys.executable if base is None else base.python
    deadline = time.monotonic() + options.timeout_s
    async with await provider.create(spec) as sb:
        await sb.write_file("requirements.txt", "\n".join(inputs["requirements"]) + "\n")
        await sb.write_file("ca.pem", ca)
        argv = [py, "-m", "pip", "install", "--isolated", "--no-cache-dir", "--no-input",
                "--disable-pip-version-check", "--no-warn-script-location",
                "--progress-bar", "off", "--target", _SANDBOX_TARGET,
                "--index-url", options.index_url, "--cert", "/work/ca.pem",
                "--retries", "2", "--timeout", "60", "-r", "/work/requirements.txt"]
        if not options.allow_source:
            argv.insert(4, "--only-binary=:all:")
        r = await sb.exec(argv, ExecOpts(timeout_ms=int(options.timeout_s * 1000),
                                         env={"HOME": "/work", "TMPDIR": "/tmp"}))
        log = r.stdout_text + r.stderr_text
        if r.exit_code != 0 or r.denials:
            refused = sorted({f"{d.host} ({d.kind})" for d in r.denials})
            why = f"pip exited {r.exit_code}" if r.exit_code != 0 else "pip exited 0"
            if refused:
                why += "; the sandbox was refused: " + ", ".join(refused)
            if r.exit_code != 0 and "No space left on device" in log:  # its disk_mb
                raise LimitsExceededError(
                    "disk", options.limits.disk_mb or 0, 0,
                    f"the build sandbox's disk ran out ({why})\n{_tail(log, 600)}")
            raise ProviderError(
                f"environment build failed in the sandbox: {why}\n{_tail(log)}")
        left = max(1.0, deadline - time.monotonic())
        proc = await sb.start_process([py, "-I", "-S", "-c", _TAR_OUT],
                                      ProcessOpts(stdin=False, timeout_ms=int(left * 1000)))
        written = 0

        async def drain_err() -> None:
            async for _ in proc.stderr:
                pass

        err_task = asyncio.ensure_future(drain_err())  # awaited below, or ended (settle)
        try:
            with open(tar_path, "wb") as f:
                async for chunk in proc.stdout:
                    written += len(chunk)
                    if written > options.max_bytes:
                        await proc.kill()
                        raise LimitsExceededError(
                            "disk", options.max_bytes >> 20, written >> 20,
                            "the built environment read back from the sandbox")
                    f.write(chunk)
        except BaseException:  # the stream may not end before the sandbox does: cancel
            await settle([err_task])
            raise
        await err_task
        res = await proc.wait()
        if res.exit_code != 0:
            raise ProviderError(f"reading the built environment failed: exit {res.exit_code}")
        return log


def _tail(text: str, n: int = 2000) -> str:
    return text[-n:]


def _unpack(tar_path: Path, temp: Path, max_bytes: int) -> tuple[int, set[str]]:
    """Unpack the sandbox's tar into ``temp/site``; return (size, top-level modules).

    Bytes from a sandbox: every name must be a plain relative path under ``site/``
    (no ``..``, none absolute), only regular files, dirs, symlinks that stay inside
    ``site/`` and hard links to a file already out are taken; no parent of an entry
    may be a symlink (a file is never written through one); modes are 0644/0755 and
    0755 for dirs; the total size and the member count are capped."""
    total = 0
    count = 0
    done: set[str] = set()
    with tarfile.open(tar_path, mode="r:") as t:
        for m in t:
            count += 1
            total += max(m.size, 0)
            if count > _TAR_MAX_MEMBERS or total > max_bytes:
                raise LimitsExceededError("disk", max_bytes >> 20, total >> 20,
                                          f"the built environment ({count} entries)")
            parts = _parts(m.name)
            dest = temp.joinpath(*parts)
            parent = temp
            for part in parts[:-1]:
                parent = parent / part
                st = os.lstat(parent)
                if not stat.S_ISDIR(st.st_mode):
                    raise ProviderError(f"the build's tree has {m.name!r} under a non-dir")
            if m.isdir():
                try:
                    if not stat.S_ISDIR(os.lstat(dest).st_mode):
                        raise ProviderError(f"the build's tree has {m.name!r} twice")
                except FileNotFoundError:
                    os.mkdir(dest, 0o755)
                continue
            if "/".join(parts) in done:
                raise ProviderError(f"the build's tree has {m.name!r} twice")
            if m.isfile():
                src = t.extractfile(m)
                if src is None:
                    raise ProviderError(f"the build's tree has an unreadable {m.name!r}")
                with src:
                    _write_new(dest, src, 0o755 if m.mode & 0o100 else 0o644)
            elif m.issym():
                target = m.linkname
                inside = posixpath.normpath(posixpath.join(posixpath.dirname("/".join(parts)),
                                                           target))
                if target.startswith("/") or not (inside == "site" or inside.startswith("site/")):
                    raise ProviderError(f"the build's tree has a link out: {m.name!r} -> "
                                        f"{target!r}")
                os.symlink(target, dest)
            elif m.islnk():
                other = "/".join(_parts(m.linkname))
                if other not in done or not os.path.isfile(temp / other) or os.path.islink(
                        temp / other):
                    raise ProviderError(f"the build's tree has a bad hard link {m.name!r}")
                with open(temp / other, "rb") as src2:
                    _write_new(dest, src2, stat.S_IMODE(os.stat(temp / other).st_mode))
            else:
                raise ProviderError(f"the build's tree has a special file {m.name!r}")
            done.add("/".join(parts))
    site = temp / "site"
    if not site.is_dir() or site.is_symlink():
        raise ProviderError("the build produced no tree")
    return total, top_level_modules(site)


def _parts(name: str) -> tuple[str, ...]:
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if (name.startswith("/") or not parts or parts[0] != "site" or ".." in parts
            or any("\0" in p for p in parts)):
        raise ProviderError(f"the build's tree holds an unexpected entry {name!r}")
    return parts


def _write_new(dest: Path, src: Any, mode: int) -> None:
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    with os.fdopen(fd, "wb") as f:
        while chunk := src.read(1 << 20):
            f.write(chunk)
    os.chmod(dest, mode)


def top_level_modules(site: Path) -> set[str]:
    """The importable top-level names under ``site``: packages (dirs that are
    identifiers), modules (``*.py``, extension ``*.so``), plus each dist's
    ``top_level.txt``."""
    names: set[str] = set()
    for p in site.iterdir():
        n = p.name
        if p.is_symlink():
            continue
        if p.is_dir():
            if n.endswith(".dist-info"):
                tl = p / "top_level.txt"
                with contextlib.suppress(OSError):
                    if tl.is_file() and not tl.is_symlink() and tl.stat().st_size < 65536:
                        for line in tl.read_text(errors="replace").splitlines():
                            line = line.strip().split("/")[0]
                            if line.isidentifier():
                                names.add(line)
                continue
            if n.isidentifier() and n not in _NOT_MODULES:
                names.add(n)
        elif p.is_file():
            stem = n.split(".", 1)[0]
            if (n.endswith(".py") or n.endswith(".so")) and stem.isidentifier():
                names.add(stem)
    # only names that are there (a stale top_level.txt may list what the wheel lacks)
    return {n for n in names if (site / n).is_dir() or any(site.glob(f"{n}.*"))}


