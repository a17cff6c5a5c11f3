"""A client of the OCI distribution API (v2), on httpx: manifests, image indexes and blobs.

:class:`RegistryClient` talks to one registry the operator allows
(:class:`~corral.images.reference.RegistryPolicy`): every connection, the token
server's and a redirect's included, is checked against the policy first. On a
``401`` it answers the registry's challenge once: ``Basic`` with the credentials
found for it, ``Bearer`` by asking the token server the challenge names
(``realm``, ``service``, ``scope``) for a token, with those credentials when
there are any. Redirects are followed by hand (at most 5), never with the
registry's credentials to another host.

Everything read is capped (manifests and token answers 4 MiB, a blob its
descriptor's size) and every digest checked: :func:`fetch_manifest` hashes the
bytes it got, :func:`fetch_blob` streams into a ``.partial`` file and renames it
into place only when its size and sha256 match. A download cut off midway
leaves the partial file to be resumed (``Range``) next time; one whose bytes do
not match is deleted. Used by :mod:`corral.images.store`.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, final

from corral.core.errors import ConfigInvalidError, ProviderError
from corral.images.reference import Credentials, Reference, RegistryPolicy

if TYPE_CHECKING:
    import httpx

__all__ = ["Descriptor", "INDEX_TYPES", "MANIFEST_ACCEPT", "MANIFEST_TYPES", "RegistryClient",
           "parse_challenge"]

OCI_INDEX: Final = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST: Final = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST: Final = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES: Final = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES: Final = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
#: the distribution registry answers 404 to a manifest whose type the client does not list
MANIFEST_ACCEPT: Final = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
MAX_MANIFEST: Final = 4 << 20
_CHUNK: Final = 1 << 16
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_PARAM: Final = re.compile(r'\s*([A-Za-z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')


@final
@dataclass(frozen=True, slots=True)
class Descriptor:
    """A content descriptor: ``digest`` (``sha256:...``), ``size`` in bytes, ``media_type``."""

    digest: str
    size: int
    media_type: str = ""

    @classmethod
    def of(cls, doc: Any, what: str) -> Descriptor:
        if not isinstance(doc, dict):
            raise ConfigInvalidError("image", f"{what}: not a descriptor")
        digest, size, mt = doc.get("digest"), doc.get("size"), doc.get("mediaType", "")
        if not isinstance(digest, str) or not digest.startswith("sha256:") \
                or not _HEX64.fullmatch(digest[7:]):
            raise ConfigInvalidError("image", f"{what}: unsupported digest {digest!r} "
                                     "(sha256 only)")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigInvalidError("image", f"{what}: bad size {size!r}")
        return cls(digest, size, mt if isinstance(mt, str) else "")

    @property
    def hex(self) -> str:
        return self.digest[7:]


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``WWW-Authenticate: Bearer realm="...",service="..."`` -> ("bearer", {...})."""
    scheme, _, rest = header.strip().partition(" ")
    params: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        m = _PARAM.match(rest, pos)
        if m is None or m.end() == pos:
            break
        value = m.group(2) if m.group(2) is not None else m.group(3) or ""
        params[m.group(1).lower()] = re.sub(r"\\(.)", r"\1", value)
        pos = m.end()
    return scheme.lower(), params


def _httpx() -> Any:
    try:
        import httpx
    except ImportError as e:
        raise ProviderError("pulling images from a registry needs httpx: "
                            "pip install corral[registry]", e) from e
    return httpx


class RegistryClient:
    """One registry's distribution API, for ``ref.registry`` (checked against
    ``policy`` before any connection). ``credentials`` answer Basic challenges and
    are sent to the token server of a Bearer one. Close with :meth:`close`."""

    def __init__(self, registry: str, policy: RegistryPolicy, *,
                 credentials: Credentials | None = None, timeout_s: float = 60.0,
                 max_time_s: float | None = None, api_host: str | None = None) -> None:
        policy.check(registry)
        self.max_time_s = max_time_s
        self._deadline = None if max_time_s is None else time.monotonic() + max_time_s
        self.registry, self.policy, self.credentials = registry, policy, credentials
        self.host = api_host or registry
        if self.host != registry:
            policy.check(self.host, "registry API host")
        self.base = f"{policy.scheme(self.host)}://{self.host}"
        httpx = _httpx()
        self._http: Any = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0)),
            follow_redirects=False, trust_env=False,
            headers={"User-Agent": "corral-image-pull"})
        self._auth: str | None = None  # the Authorization header that worked last
        self._tokens: dict[str, str] = {}

    @classmethod
    def for_reference(cls, ref: Reference, policy: RegistryPolicy, **kw: Any
                      ) -> RegistryClient:
        return cls(ref.registry, policy, api_host=ref.api_host, **kw)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _in_time(self, doing: str) -> None:
        """Raise ``ProviderError`` past the pull's ``max_time_s``."""
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise ProviderError(f"registry {self.registry!r}: the pull took longer than "
                                f"max_time_s={self.max_time_s:g} s, stopped while {doing}")

    # -- requests, challenges, redirects ---------------------------------------------
    @contextlib.contextmanager
    def _get(self, path: str, headers: dict[str, str], scope: str) -> Iterator[httpx.Response]:
        """A streamed GET of ``self.base + path``; a 401 is answered once, redirects
        are followed to allowed hosts only. The response is open inside the block."""
        httpx = _httpx()
        url = self.base + path
        tried_auth = False
        for _hop in range(8):
            self._in_time(f"starting GET {path}")
            split = urllib.parse.urlsplit(url)
            host = split.netloc.lower()
            self.policy.check(host, "redirect target" if host != self.host else "registry")
            if split.scheme != self.policy.scheme(host):  # no downgrade to plain HTTP
                raise ConfigInvalidError(
                    "registry", f"registry {self.registry!r} sent the client to {url[:200]!r}; "
                    f"the operator's policy says {self.policy.scheme(host)} for {host!r}")
            same = host == self.host
            hdrs = dict(headers)
            if same and self._auth:
                hdrs["Authorization"] = self._auth
            try:
                resp = self._http.send(self._http.build_request("GET", url, headers=hdrs),
                                       stream=True)
            except httpx.HTTPError as e:
                raise ProviderError(f"registry {self.registry!r}: {type(e).__name__}: {e}",
                                    e) from e
            try:
                if resp.status_code == 401 and same and not tried_auth:
                    tried_auth = True
                    challenge = resp.headers.get("www-authenticate", "")
                    resp.close()
                    self._answer(challenge, scope)
                    continue
                if resp.status_code in (301, 302, 303, 307, 308):
                    loc = resp.headers.get("location")
                    resp.close()
                    if not loc:
                        raise ProviderError(f"registry {self.registry!r}: a redirect "
                                            "without Location")
                    url = urllib.parse.urljoin(url, loc)
                    continue
                if resp.status_code in (401, 403):
                    raise self._refused(resp)
                yield resp
                return
            finally:
                resp.close()
        raise ProviderError(f"registry {self.registry!r}: too many redirects")

    def _refused(self, resp: httpx.Response) -> ConfigInvalidError:
        who = (f"with the credentials from {self.credentials.source}"
               if self.credentials else "without credentials (none found for it: "
               "~/.docker/config.json 'auths' or $CORRAL_REGISTRY_AUTH, docs/images.md)")
        return ConfigInvalidError(
            "registry", f"registry {self.registry!r} refused access {who}: HTTP "
            f"{resp.status_code}")

    def _answer(self, challenge: str, scope: str) -> None:
        scheme, params = parse_challenge(challenge)
        if scheme == "basic":
            if self.credentials is None:
                raise ConfigInvalidError(
                    "registry", f"registry {self.registry!r} asks for credentials (Basic) "
                    "and none were found for it (~/.docker/config.json 'auths', "
                    "$REGISTRY_AUTH_FILE or $CORRAL_REGISTRY_AUTH; docs/images.md)")
            self._auth = "Basic " + base64.b64encode(
                f"{self.credentials.username}:{self.credentials.password}".encode()).decode()
        elif scheme == "bearer":
            # a token we sent was refused (expired, or too narrow): ask for a new one
            self._auth = "Bearer " + self._token(params, params.get("scope") or scope,
                                                 fresh=self._auth is not None)
        else:
            raise ProviderError(f"registry {self.registry!r} asks for authentication this "
                                f"client does not speak: {challenge[:100]!r}")

    def _token(self, params: dict[str, str], scope: str, *, fresh: bool = False) -> str:
        realm = params.get("realm", "")
        split = urllib.parse.urlsplit(realm)
        host = split.netloc.lower()
        if split.scheme not in ("http", "https") or not host:
            raise ProviderError(f"registry {self.registry!r}: bad token realm {realm[:200]!r}")
        self.policy.check(host, "token server")
        if split.scheme != self.policy.scheme(host):
            raise ConfigInvalidError(
                "registry", f"token server {realm!r} is {split.scheme}; the policy says "
                f"{self.policy.scheme(host)} for {host!r}")
        key = f"{realm} {params.get('service', '')} {scope}"
        if key in self._tokens and not fresh:
            return self._tokens[key]
        query = {k: v for k, v in (("service", params.get("service", "")),
                                   ("scope", scope)) if v}
        httpx = _httpx()
        auth = None
        if self.credentials is not None:
            auth = httpx.BasicAuth(self.credentials.username, self.credentials.password)
        try:
            with self._http.stream("GET", realm, params=query, auth=auth) as resp:
                body = _read_capped(resp, 1 << 20, "token answer", self._in_time)
                status = resp.status_code
        except httpx.HTTPError as e:
            raise ProviderError(f"token server {host!r}: {type(e).__name__}: {e}", e) from e
        if status in (401, 403):
            who = (f"the credentials from {self.credentials.source}" if self.credentials
                   else "no credentials (none found for the registry)")
            raise ConfigInvalidError("registry", f"token server {host!r} for registry "
                                     f"{self.registry!r} refused {who}: HTTP {status}")
        if status != 200:
            raise ProviderError(f"token server {host!r}: HTTP {status}")
        try:
            doc = json.loads(body)
        except ValueError:
            raise ProviderError(f"token server {host!r} answered no JSON") from None
        token = (doc.get("token") or doc.get("access_token")) if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token or len(token) > 64 << 10:
            raise ProviderError(f"token server {host!r} answered no token")
        self._tokens[key] = token
        return token

    # -- the API ----------------------------------------------------------------------
    def fetch_manifest(self, repository: str, locator: str) -> tuple[bytes, str, str]:
        """(bytes, media type, ``sha256:`` digest of the bytes) of a manifest or index.
        ``locator`` a tag or digest; a digest locator must match the bytes, and so must
        the registry's ``Docker-Content-Digest`` when it sends one."""
        scope = f"repository:{repository}:pull"
        path = f"/v2/{repository}/manifests/{locator}"
        with self._get(path, {"Accept": MANIFEST_ACCEPT}, scope) as resp:
            if resp.status_code == 404:
                raise ConfigInvalidError("image", f"registry {self.registry!r} has no "
                                         f"manifest {repository}:{locator}"
                                         if not locator.startswith("sha256:") else
                                         f"registry {self.registry!r} has no manifest "
                                         f"{repository}@{locator}")
            if resp.status_code != 200:
                raise ProviderError(f"registry {self.registry!r}: GET {path}: HTTP "
                                    f"{resp.status_code}")
            body = _read_capped(resp, MAX_MANIFEST, "manifest", self._in_time)
            media_type = resp.headers.get("content-type", "").split(";")[0].strip()
            claimed = resp.headers.get("docker-content-digest")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if locator.startswith("sha256:") and digest != locator:
            raise ConfigInvalidError("image", f"registry {self.registry!r} answered "
                                     f"{repository}@{locator} with bytes of digest {digest}: "
                                     "refused")
        if claimed and claimed != digest:
            raise ConfigInvalidError("image", f"registry {self.registry!r}: manifest "
                                     f"{repository}:{locator} hashes to {digest}, not the "
                                     f"{claimed} it claims: refused")
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise ConfigInvalidError("image", f"manifest {repository}:{locator} is not "
                                     "JSON") from None
        if isinstance(doc, dict) and isinstance(doc.get("mediaType"), str):
            media_type = doc["mediaType"]
        elif isinstance(doc, dict) and media_type not in INDEX_TYPES | MANIFEST_TYPES:
            media_type = OCI_INDEX if "manifests" in doc else OCI_MANIFEST
        return body, media_type, digest

    def fetch_blob(self, repository: str, desc: Descriptor, blobs_dir: str,
                   partial_dir: str) -> bool:
        """Make ``blobs_dir/<hex>`` hold the blob ``desc``; False if it was there already.
        Downloads go to ``partial_dir/<hex>`` (flocked: one writer), resumed with
        ``Range`` when a partial file exists, and are renamed into place only once
        their size and sha256 match. A mismatch deletes the partial file and refuses
        (``ConfigInvalidError``); a transfer cut off keeps it for the next try and
        raises ``ProviderError``."""
        final = os.path.join(blobs_dir, desc.hex)
        part = os.path.join(partial_dir, desc.hex)
        for _ in range(4):
            if os.path.isfile(final):
                return False
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not _still_at(fd, part):
                    continue  # renamed into place by another puller, or collected: again
                if os.path.isfile(final):  # another puller finished it while we waited
                    os.unlink(part)
                    return False
                try:
                    self._download(repository, desc, fd)
                except ConfigInvalidError:
                    os.unlink(part)  # wrong bytes, or no such blob: nothing to resume
                    raise
                except BaseException:
                    if os.fstat(fd).st_size == 0:
                        os.unlink(part)
                    raise
                os.fsync(fd)
                os.chmod(part, 0o644)
                os.rename(part, final)
                return True
            finally:
                os.close(fd)
        raise ProviderError(f"the partial download of {desc.digest} keeps changing hands")

    def _download(self, repository: str, desc: Descriptor, fd: int) -> None:
        have = os.fstat(fd).st_size
        if have > desc.size:
            os.ftruncate(fd, 0)
            have = 0
        sha = hashlib.sha256()
        os.lseek(fd, 0, os.SEEK_SET)
        left = have
        while left > 0:
            chunk = os.read(fd, min(1 << 20, left))
            if not chunk:
                break
            sha.update(chunk)
            left -= len(chunk)
        headers = {"Range": f"bytes={have}-"} if 0 < have < desc.size else {}
        path = f"/v2/{repository}/blobs/{desc.digest}"
        if have < desc.size:
            with self._get(path, headers, f"repository:{repository}:pull") as resp:
                if resp.status_code == 404:
                    raise ConfigInvalidError("image", f"registry {self.registry!r} has no "
                                             f"blob {desc.digest} in {repository}")
                if resp.status_code == 416 and headers:  # the partial file is no prefix
                    os.ftruncate(fd, 0)
                    raise ProviderError(f"registry {self.registry!r} refused to resume "
                                        f"{desc.digest} at byte {have} (HTTP 416); the "
                                        "partial file is discarded, the next pull starts over")
                if resp.status_code == 206 and _range_start(resp) == have:
                    pass  # resumed
                elif resp.status_code == 200:
                    os.ftruncate(fd, 0)
                    have, sha = 0, hashlib.sha256()
                else:
                    raise ProviderError(f"registry {self.registry!r}: GET {path}: HTTP "
                                        f"{resp.status_code}")
                os.lseek(fd, have, os.SEEK_SET)
                httpx = _httpx()
                try:
                    for chunk in resp.iter_raw(_CHUNK):
                        self._in_time(f"the download of {desc.digest} (the partial file is "
                                      "kept to resume)")
                        have += len(chunk)
                        if have > desc.size:
                            os.ftruncate(fd, 0)
                            raise ConfigInvalidError(
                                "image", f"blob {desc.digest} is larger than its "
                                f"descriptor's {desc.size} bytes: refused")
                        sha.update(chunk)
                        _write_all(fd, chunk)
                except httpx.HTTPError as e:
                    raise ProviderError(
                        f"registry {self.registry!r}: the download of {desc.digest} broke "
                        f"off after {have} of {desc.size} bytes ({type(e).__name__}); the "
                        "partial file is kept to resume", e) from e
        if have < desc.size:
            raise ProviderError(f"registry {self.registry!r}: the download of {desc.digest} "
                                f"ended after {have} of {desc.size} bytes; the partial file "
                                "is kept to resume")
        if "sha256:" + sha.hexdigest() != desc.digest:
            os.ftruncate(fd, 0)
            raise ConfigInvalidError("image", f"blob {desc.digest} from registry "
                                     f"{self.registry!r} does not match its digest: refused "
                                     "(the download is discarded)")


def _still_at(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _range_start(resp: httpx.Response) -> int | None:
    m = re.match(r"bytes (\d+)-", resp.headers.get("content-range", ""))
    return int(m.group(1)) if m else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_capped(resp: httpx.Response, cap: int, what: str,
                 in_time: Callable[[str], None]) -> bytes:
    out = bytearray()
    for chunk in resp.iter_bytes(_CHUNK):
        in_time(f"reading the registry's {what}")
        out += chunk
        if len(out) > cap:
            raise ConfigInvalidError("image", f"the registry's {what} is larger than "
                                     f"{cap} bytes: refused")
    return bytes(out)
