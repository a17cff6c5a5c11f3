"""``corral.images.resolve`` (a path or a reference -> a root filesystem) and the operator's
registry list from a TOML file."""

from __future__ import annotations

from pathlib import Path

import pytest
import regsupport as rs

import corral.images
from corral.core.errors import ConfigInvalidError
from corral.images.cache import ImageCache
from corral.images.reference import RegistryPolicy


def test_resolve_pulls_when_missing_and_reads_local_paths(
        tmp_path: Path, plain_registry: rs.Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    host = plain_registry.host
    img = rs.busybox_image({"app/hello.txt": "resolve"})
    plain_registry.push("corral/resolve", "1", img)
    monkeypatch.setenv("CORRAL_REGISTRIES", f"http://{host}")
    cache = ImageCache(str(tmp_path / "cache"), min_age_s=0)
    ref = f"{host}/corral/resolve:1"
    with pytest.raises(ConfigInvalidError, match="is not pulled"):
        corral.images.resolve(ref, cache=cache, pull_policy="never")
    u = corral.images.resolve(ref, cache=cache)
    assert Path(u.rootfs, "app/hello.txt").read_text() == "resolve"
    # the tag moves: "missing" keeps what is pulled, "always" follows it
    plain_registry.push("corral/resolve", "1", rs.busybox_image({"app/hello.txt": "moved"}))
    assert corral.images.resolve(ref, cache=cache).rootfs == u.rootfs
    moved = corral.images.resolve(ref, cache=cache, pull_policy="always")
    assert Path(moved.rootfs, "app/hello.txt").read_text() == "moved"
    # a local layout, by tag
    layout = rs.write_layout(str(tmp_path / "layout"), {"a": img})
    assert corral.images.resolve(f"{layout}:a", cache=cache).key == u.key
    with pytest.raises(ConfigInvalidError, match="neither a local image"):
        corral.images.resolve("./no/such/Path", cache=cache)


def test_policy_from_a_toml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "registries.toml"
    f.write_text('allow = ["ghcr.io", "*.example.com"]\ninsecure = ["127.0.0.1:5055"]\n')
    monkeypatch.delenv("CORRAL_REGISTRIES", raising=False)
    monkeypatch.setenv("CORRAL_REGISTRIES_FILE", str(f))
    pol = RegistryPolicy.load()
    assert pol.allows("ghcr.io") and pol.allows("r.example.com:443")
    assert pol.allows("127.0.0.1:5055") and pol.scheme("127.0.0.1:5055") == "http"
    assert pol.scheme("ghcr.io") == "https"
    assert not pol.allows("example.com") and not pol.allows("docker.io")
    f.write_text('allow = "ghcr.io"\n')
    with pytest.raises(ConfigInvalidError, match="must be a list"):
        RegistryPolicy.load()
    f.write_text('allowed = []\n')
    with pytest.raises(ConfigInvalidError, match="unknown keys"):
        RegistryPolicy.load()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    monkeypatch.delenv("CORRAL_REGISTRIES_FILE")
    if not Path("/etc/corral/registries.toml").exists():
        assert RegistryPolicy.load() == RegistryPolicy()  # nothing allowed
