"""Image references, the operator's registry allowlist, and registry credentials.

:func:`parse_reference` reads ``[REGISTRY/]REPOSITORY[:TAG][@sha256:HEX]`` the way
Docker does (``busybox`` is ``docker.io/library/busybox:latest``).
:class:`RegistryPolicy` is the list of registries the operator allows: a registry
not on it is refused with ``ConfigInvalidError("registry", ...)`` before any
connection. :func:`credentials_for` finds a user name and password for a registry
in ``$CORRAL_REGISTRY_AUTH`` or a Docker-style config file (``auths``).
Pure parsing and file reading: no network here.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any, Final, final

from corral.core.errors import ConfigInvalidError

__all__ = ["AUTH_ENV", "Credentials", "POLICY_ENV", "POLICY_FILE_ENV", "Reference",
           "RegistryPolicy", "credentials_for", "parse_reference"]

#: registries the operator allows: ``host[:port]`` entries, comma or space separated;
#: ``http://host[:port]`` allows plain HTTP to that one (a loopback test registry)
POLICY_ENV: Final = "CORRAL_REGISTRIES"
#: a TOML file with ``allow = [...]`` and ``insecure = [...]`` (when POLICY_ENV is unset)
POLICY_FILE_ENV: Final = "CORRAL_REGISTRIES_FILE"
#: JSON ``{"host[:port]": {"username": .., "password": ..} | {"auth": base64(user:pass)}}``
AUTH_ENV: Final = "CORRAL_REGISTRY_AUTH"

DOCKER_HUB: Final = "docker.io"
_HUB_API: Final = "registry-1.docker.io"
_COMPONENT: Final = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")
_HOST: Final = re.compile(r"(?:\*\.)?[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?"
                          r"|\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?")


@final
@dataclass(frozen=True, slots=True)
class Reference:
    """A parsed image reference: ``registry`` (``host[:port]``, ``docker.io`` for Docker
    Hub), ``repository`` (``library/busybox``), and a ``tag`` and/or ``digest``
    (``sha256:...``; a digest wins when both are given)."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def api_host(self) -> str:
        """The host[:port] the distribution API is served on (Docker Hub's differs)."""
        return _HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def name(self) -> str:
        """``registry/repository``."""
        return f"{self.registry}/{self.repository}"

    @property
    def locator(self) -> str:
        """What to ask the registry's manifests endpoint for: the digest, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        out = self.name
        if self.tag is not None:
            out += f":{self.tag}"
        if self.digest is not None:
            out += f"@{self.digest}"
        return out


def parse_reference(text: str) -> Reference:
    """``[REGISTRY/]REPOSITORY[:TAG][@sha256:HEX]``; without a tag or digest the tag is
    ``latest``. The first component is a registry when it has a ``.`` or ``:`` or is
    ``localhost``; else the registry is Docker Hub (``docker.io``, one-component names
    under ``library/``). Malformed -> ``ConfigInvalidError("image")``."""
    if not isinstance(text, str) or not text or len(text) > 1024 or text != text.strip():
        raise ConfigInvalidError("image", f"not an image reference: {text!r}")
    rest, digest = text, None
    if "@" in text:
        rest, _, digest = text.partition("@")
        if not _DIGEST.fullmatch(digest):
            raise ConfigInvalidError("image", f"{text!r}: the digest must be sha256:<64 hex>")
    tag = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG.fullmatch(tag):
            raise ConfigInvalidError("image", f"{text!r}: malformed tag {tag!r}")
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first.lower(), remainder
        if not _HOST.fullmatch(registry) or registry.startswith("*"):
            raise ConfigInvalidError("image", f"{text!r}: malformed registry {first!r}")
    else:
        registry, repository = DOCKER_HUB, rest
        if "/" not in repository:
            repository = f"library/{repository}"
    if registry in ("index.docker.io", "registry-1.docker.io"):
        registry = DOCKER_HUB
    parts = repository.split("/")
    if not repository or len(repository) > 255 or not all(_COMPONENT.fullmatch(p)
                                                           for p in parts):
        raise ConfigInvalidError("image", f"{text!r}: malformed repository {repository!r} "
                                 "(lower-case letters, digits, '.', '_', '-', '/')")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry, repository, tag, digest)


def _host_entry(entry: str, where: str) -> str:
    host = entry.strip().lower()
    if not _HOST.fullmatch(host):
        raise ConfigInvalidError(where, f"not a registry host[:port]: {entry!r}")
    return host


@final
@dataclass(frozen=True, slots=True)
class RegistryPolicy:
    """The registries corral may connect to (``allow``: ``host[:port]`` or
    ``*.suffix``) and which of them it reaches over plain HTTP (``insecure``, each
    also allowed; every other one is HTTPS with certificate checks). Token servers
    and redirect targets (a CDN serving blobs) are connections too: their hosts must
    be allowed as well. Empty by default: nothing is allowed."""

    allow: frozenset[str] = field(default_factory=frozenset)
    insecure: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, allow: list[str] | tuple[str, ...], insecure: list[str] | tuple[str, ...] = ()
           ) -> RegistryPolicy:
        """A policy from lists of host entries (an ``insecure`` host is also allowed)."""
        ins = frozenset(_host_entry(h, "insecure") for h in insecure)
        return cls(frozenset(_host_entry(h, "allow") for h in allow) | ins, ins)

    @classmethod
    def load(cls) -> RegistryPolicy:
        """The operator's policy: ``$CORRAL_REGISTRIES`` (``host[:port]`` entries,
        ``http://host[:port]`` for plain HTTP), else the TOML file
        ``$CORRAL_REGISTRIES_FILE``, else ``$XDG_CONFIG_HOME/corral/registries.toml``
        (``~/.config/...``), else ``/etc/corral/registries.toml``; none: allow nothing."""
        raw = os.environ.get(POLICY_ENV)
        if raw is not None:
            allow, insecure = [], []
            for item in re.split(r"[\s,]+", raw.strip()):
                if not item:
                    continue
                if item.startswith("http://"):
                    insecure.append(item[7:].rstrip("/"))
                else:
                    allow.append(item.removeprefix("https://").rstrip("/"))
            return cls.of(allow, insecure)
        config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(
            os.path.expanduser("~"), ".config")
        for path in (os.environ.get(POLICY_FILE_ENV),
                     os.path.join(config, "corral", "registries.toml"),
                     "/etc/corral/registries.toml"):
            if path and (path == os.environ.get(POLICY_FILE_ENV) or os.path.isfile(path)):
                return cls.from_file(path)
        return cls()

    @classmethod
    def from_file(cls, path: str) -> RegistryPolicy:
        """``allow = ["host[:port]", ...]`` and ``insecure = [...]`` from a TOML file."""
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigInvalidError(POLICY_FILE_ENV, f"cannot read {path!r}: {e}") from None
        unknown = set(doc) - {"allow", "insecure"}
        if unknown:
            raise ConfigInvalidError(POLICY_FILE_ENV, f"{path!r}: unknown keys {sorted(unknown)}")
        lists = {k: doc.get(k, []) for k in ("allow", "insecure")}
        for k, v in lists.items():
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ConfigInvalidError(POLICY_FILE_ENV, f"{path!r}: {k!r} must be a list "
                                         "of strings")
        return cls.of(lists["allow"], lists["insecure"])

    def allows(self, host: str) -> bool:
        host = host.lower()
        if host in self.allow:
            return True
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return any(e.startswith("*.") and name.endswith(e[1:]) for e in self.allow)

    def check(self, host: str, what: str = "registry") -> None:
        """Refuse ``host`` unless allowed (``ConfigInvalidError("registry")``)."""
        if not self.allows(host):
            allowed = ", ".join(sorted(self.allow)) or "none"
            raise ConfigInvalidError(
                "registry", f"{what} {host!r} is not one the operator allows (allowed: "
                f"{allowed}; set ${POLICY_ENV} or registries.toml, docs/images.md)")

    def scheme(self, host: str) -> str:
        return "http" if host.lower() in self.insecure else "https"


@final
@dataclass(frozen=True, slots=True)
class Credentials:
    """A user name and password for one registry (``source`` says where they came from)."""

    username: str
    password: str = field(repr=False)
    source: str = ""


def _decode(entry: Any, where: str) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    user, pw = entry.get("username"), entry.get("password")
    if isinstance(user, str) and isinstance(pw, str) and user:
        return Credentials(user, pw, where)
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            user, _, pw = base64.b64decode(auth, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            raise ConfigInvalidError("registry", f"{where}: 'auth' is not base64 of "
                                     "user:password") from None
        if user:
            return Credentials(user, pw, where)
    return None


def _keys(registry: str) -> list[str]:
    keys = [registry, f"https://{registry}", f"http://{registry}",
            f"https://{registry}/v1/", f"https://{registry}/v2/"]
    if registry == DOCKER_HUB:
        keys += ["https://index.docker.io/v1/", "index.docker.io", _HUB_API]
    return keys


def credentials_for(registry: str) -> Credentials | None:
    """Credentials for ``registry`` (as in a :class:`Reference`): ``$CORRAL_REGISTRY_AUTH``
    (JSON, host -> entry), then ``$REGISTRY_AUTH_FILE`` (podman/skopeo's), then
    ``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json`` (``auths``; entries
    ``{"auth": base64(user:password)}`` or ``username``/``password``). Credential
    helpers (``credsStore``, ``credHelpers``) are not run."""
    raw = os.environ.get(AUTH_ENV)
    if raw:
        try:
            doc = json.loads(raw)
        except ValueError:
            raise ConfigInvalidError(AUTH_ENV, "is not JSON") from None
        if not isinstance(doc, dict):
            raise ConfigInvalidError(AUTH_ENV, "must be a JSON object of host -> credentials")
        auths = doc.get("auths", doc)
        for key in _keys(registry):
            if (c := _decode(auths.get(key), f"${AUTH_ENV}")) is not None:
                return c
    docker = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"),
                                                             ".docker")
    for path in (os.environ.get("REGISTRY_AUTH_FILE"), os.path.join(docker, "config.json")):
        if not path:
            continue
        doc = None
        with contextlib.suppress(OSError, ValueError), open(path, "rb") as f:
            doc = json.loads(f.read(1 << 20))
        auths = doc.get("auths") if isinstance(doc, dict) else None
        if not isinstance(auths, dict):
            continue
        for key in _keys(registry):
            if (c := _decode(auths.get(key), path)) is not None:
                return c
    return None
