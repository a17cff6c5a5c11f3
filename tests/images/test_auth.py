"""Registries that need credentials: htpasswd (Basic) and a bearer-token server, both on
loopback, serving the session registry's storage. Without credentials the pull is
refused; with them (a Docker-style config file, or the environment) it works."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import regsupport as rs

from corral.core.errors import ConfigInvalidError
from corral.images.cache import ImageCache
from corral.images.reference import RegistryPolicy, credentials_for

USER, PASSWORD = "tester", "s3cret"


@pytest.fixture(scope="module")
def image(plain_registry: rs.Registry) -> rs.Image:
    img = rs.busybox_image({"app/hello.txt": "auth"})
    plain_registry.push("corral/private", "1", img)
    return img


@pytest.fixture(scope="module")
def basic_registry(plain_registry: rs.Registry, image: rs.Image,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[rs.Registry]:
    if rs.HTPASSWD_BIN is None:
        pytest.skip("htpasswd (apache2-utils) is not installed")
    root = str(tmp_path_factory.mktemp("basic"))
    with rs.registry(root, rs.htpasswd_auth(root, USER, PASSWORD),
                     data=f"{plain_registry.dir}/data") as reg:
        yield reg


@pytest.fixture(scope="module")
def token_registry(plain_registry: rs.Registry, image: rs.Image,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[rs.Registry, str,
                                                                               object]]:
    root = str(tmp_path_factory.mktemp("token"))
    issuer = rs.TokenIssuer.make()
    with rs.serve(rs.TokenServer, issuer=issuer, users={USER: PASSWORD}, requests=0) as tok:
        token_host = f"127.0.0.1:{tok.port}"
        auth = rs.token_auth_config(root, issuer, f"http://{token_host}/token")
        with rs.registry(root, auth, data=f"{plain_registry.dir}/data") as reg:
            yield reg, token_host, tok


def _docker_config(tmp_path: Path, host: str, user: str, password: str) -> str:
    d = tmp_path / "docker"
    d.mkdir()
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (d / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return str(d)


@pytest.fixture
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("CORRAL_REGISTRY_AUTH", "REGISTRY_AUTH_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))


@pytest.mark.usefixtures("no_ambient_credentials")
def test_basic_auth_without_and_with_credentials(
        tmp_path: Path, basic_registry: rs.Registry, image: rs.Image,
        monkeypatch: pytest.MonkeyPatch) -> None:
    host = basic_registry.host
    ref = f"{host}/corral/private:1"
    pol = RegistryPolicy.of([], [host])
    cache = ImageCache(str(tmp_path / "cache"), min_age_s=0)
    with pytest.raises(ConfigInvalidError, match=r"asks for credentials \(Basic\) and none") as e:
        cache.pull(ref, policy=pol)
    assert e.value.field == "registry"
    monkeypatch.setenv("DOCKER_CONFIG", _docker_config(tmp_path, host, USER, "wrong"))
    with pytest.raises(ConfigInvalidError, match="refused access with the credentials from"):
        cache.pull(ref, policy=pol)
    assert cache.pulled.images() == []
    # the Docker-style config file (~/.docker/config.json, 'auths')
    (tmp_path / "ok").mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", _docker_config(tmp_path / "ok", host, USER, PASSWORD))
    creds = credentials_for(host)
    assert creds is not None and creds.username == USER
    assert cache.pull(ref, policy=pol).manifest_digest == image.digest
    # the environment
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("CORRAL_REGISTRY_AUTH",
                       json.dumps({host: {"username": USER, "password": PASSWORD}}))
    cache.pulled.remove(ref)
    p = cache.pull(ref, policy=pol)
    assert Path(cache.unpack_pulled(p).rootfs, "app/hello.txt").read_text() == "auth"


@pytest.mark.usefixtures("no_ambient_credentials")
def test_bearer_token_auth_without_and_with_credentials(
        tmp_path: Path, token_registry: tuple[rs.Registry, str, object], image: rs.Image,
        monkeypatch: pytest.MonkeyPatch) -> None:
    reg, token_host, tok = token_registry
    ref = f"{reg.host}/corral/private:1"
    pol = RegistryPolicy.of([], [reg.host, token_host])
    cache = ImageCache(str(tmp_path / "cache"), min_age_s=0)
    # anonymous: the token server hands out a token without access; the registry refuses it
    with pytest.raises(ConfigInvalidError, match="refused access without credentials"):
        cache.pull(ref, policy=pol)
    asked = tok.requests  # type: ignore[attr-defined]
    assert asked >= 1
    # the token server must be on the operator's list too
    monkeypatch.setenv("CORRAL_REGISTRY_AUTH",
                       json.dumps({reg.host: {"username": USER, "password": PASSWORD}}))
    with pytest.raises(ConfigInvalidError, match=f"token server '{token_host}' is not one"):
        cache.pull(ref, policy=RegistryPolicy.of([], [reg.host]))
    assert tok.requests == asked  # type: ignore[attr-defined]
    monkeypatch.setenv("CORRAL_REGISTRY_AUTH",
                       json.dumps({reg.host: {"username": USER, "password": "nope"}}))
    with pytest.raises(ConfigInvalidError, match=r"token server .* refused the credentials"):
        cache.pull(ref, policy=pol)
    monkeypatch.setenv("CORRAL_REGISTRY_AUTH",
                       json.dumps({reg.host: {"username": USER, "password": PASSWORD}}))
    p = cache.pull(ref, policy=pol)
    assert p.manifest_digest == image.digest
    assert Path(cache.unpack_pulled(p).rootfs, "app/hello.txt").read_text() == "auth"
