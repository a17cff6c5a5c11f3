"""Pulling from a real registry on loopback (Debian's docker-registry, started by the test
run): by tag and by digest, image indexes, shared layers, wrong digests refused, a
registry outside the operator's list refused before any connection, an interrupted
blob never used and resumed, the cache's size bound with pulled images."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import regsupport as rs

from corral.core.errors import ConfigInvalidError, ProviderError
from corral.images.cache import ImageCache
from corral.images.reference import RegistryPolicy, parse_reference

OTHER_ARCH = "s390x" if rs.ARCH != "s390x" else "amd64"


@dataclass
class Pushed:
    reg: rs.Registry
    one: rs.Image
    two: rs.Image
    host_img: rs.Image
    other_img: rs.Image
    index: bytes
    big: rs.Image


@pytest.fixture(scope="module")
def pushed(plain_registry: rs.Registry) -> Pushed:
    reg = plain_registry
    one = rs.busybox_image({"app/hello.txt": "one"})
    two = rs.busybox_image({"app/hello.txt": "two"})  # shares busybox's layer with one
    host_img = rs.image([rs.layer({"platform": rs.ARCH})])
    other_img = rs.image([rs.layer({"platform": OTHER_ARCH})])
    big = rs.image([rs.layer({"big": os.urandom(3 << 20)})])
    reg.push("corral/busybox", "1", one)
    reg.push("corral/busybox", "2", two)
    reg.push("corral/big", "1", big)
    reg.push("corral/multi", "host", host_img)
    reg.push("corral/multi", "other", other_img)
    index = rs.index_of([(other_img, OTHER_ARCH), (host_img, rs.ARCH)])
    reg.put_manifest("corral/multi", "1", index, rs.OCI_INDEX)
    return Pushed(reg, one, two, host_img, other_img, index, big)


def _cache(tmp_path: Path, **kw: int) -> ImageCache:
    return ImageCache(str(tmp_path / "cache"), min_age_s=0, **kw)


def _policy(*hosts: str) -> RegistryPolicy:
    return RegistryPolicy.of([], list(hosts))


def _files(cache: ImageCache, *names: str) -> set[str]:
    d = os.path.join(cache.root, "oci", *names)
    return set(os.listdir(d)) if os.path.isdir(d) else set()


def test_pull_by_tag_and_by_digest(tmp_path: Path, pushed: Pushed) -> None:
    host = pushed.reg.host
    cache = _cache(tmp_path)
    p = cache.pull(f"{host}/corral/busybox:1", policy=_policy(host))
    assert p.reference == f"{host}/corral/busybox:1"
    assert p.manifest_digest == pushed.one.digest and p.index_digest is None
    u = cache.unpack_pulled(p)
    assert Path(u.rootfs, "app/hello.txt").read_text() == "one"
    assert u.config.entrypoint == ("/bin/sh",) and u.config.working_dir == "/app"
    by_digest = cache.pull(f"{host}/corral/busybox@{pushed.two.digest}", policy=_policy(host))
    assert by_digest.manifest_digest == pushed.two.digest
    assert Path(cache.unpack_pulled(by_digest).rootfs, "app/hello.txt").read_text() == "two"
    assert {i.reference for i in cache.pulled.images()} == {
        f"{host}/corral/busybox:1", f"{host}/corral/busybox@{pushed.two.digest}"}
    # the layout is an ordinary OCI layout: index.json names each image
    assert cache.unpack(f"{p.layout}:{p.ref_name}").rootfs == u.rootfs


def test_layers_are_fetched_once_and_shared(tmp_path: Path, pushed: Pushed) -> None:
    cache = _cache(tmp_path)
    with rs.proxy(pushed.reg.host) as px:
        host = f"127.0.0.1:{px.port}"
        cache.pull(f"{host}/corral/busybox:1", policy=_policy(host))
        cache.pull(f"{host}/corral/busybox:2", policy=_policy(host))
        cache.pull(f"{host}/corral/busybox:1", policy=_policy(host))  # again: no blob
    blobs = [path for path, _ in px.seen if "/blobs/" in path]
    shared = rs.sha(pushed.one.layers[0])
    assert shared == rs.sha(pushed.two.layers[0])
    assert sum(shared in b for b in blobs) == 1
    # two configs, two top layers, one shared base layer
    assert len(blobs) == 5, blobs
    wanted = {d[7:] for img in (pushed.one, pushed.two) for d in img.blobs} | {
        pushed.one.digest[7:], pushed.two.digest[7:]}
    assert _files(cache, "blobs", "sha256") == wanted


def test_an_index_resolves_to_this_hosts_platform(tmp_path: Path, pushed: Pushed) -> None:
    host = pushed.reg.host
    cache = _cache(tmp_path)
    p = cache.pull(f"{host}/corral/multi:1", policy=_policy(host))
    assert p.manifest_digest == pushed.host_img.digest
    assert p.index_digest == rs.sha(pushed.index)
    assert Path(cache.unpack_pulled(p).rootfs, "platform").read_text() == rs.ARCH
    assert rs.sha(pushed.other_img.layers[0])[7:] not in _files(cache, "blobs", "sha256")
    by_index = cache.pull(f"{host}/corral/multi@{rs.sha(pushed.index)}", policy=_policy(host))
    assert by_index.manifest_digest == pushed.host_img.digest


def test_an_index_without_this_platform_is_refused(tmp_path: Path, pushed: Pushed) -> None:
    host = pushed.reg.host
    pushed.reg.put_manifest("corral/multi", "foreign",
                            rs.index_of([(pushed.other_img, OTHER_ARCH)]), rs.OCI_INDEX)
    cache = _cache(tmp_path)
    with pytest.raises(ConfigInvalidError,
                       match=f"no image for linux/{rs.ARCH} .it has: linux/{OTHER_ARCH}."):
        cache.pull(f"{host}/corral/multi:foreign", policy=_policy(host))
    assert _files(cache, "blobs", "sha256") == set()


def test_wrong_digests_are_refused(tmp_path: Path, pushed: Pushed) -> None:
    host = pushed.reg.host
    cache = _cache(tmp_path)
    absent = "sha256:" + "0" * 64
    with pytest.raises(ConfigInvalidError, match="has no manifest"):
        cache.pull(f"{host}/corral/busybox@{absent}", policy=_policy(host))
    # a registry (here a proxy in front of it) that serves bytes other than the digest's
    with rs.proxy(pushed.reg.host, mode="flip") as px:
        bad = f"127.0.0.1:{px.port}"
        with pytest.raises(ConfigInvalidError, match="does not match its digest: refused"):
            cache.pull(f"{bad}/corral/busybox:1", policy=_policy(bad))
    assert cache.pulled.images() == []
    assert _files(cache, "blobs", "sha256") == set()  # nothing of it kept
    assert _files(cache, ".partial") == set()
    # a manifest whose bytes are not the digest asked for, or not the one the registry names
    with rs.proxy(pushed.reg.host, mode="manifest") as px:
        bad = f"127.0.0.1:{px.port}"
        with pytest.raises(ConfigInvalidError, match=r"with bytes of digest .*: refused"):
            cache.pull(f"{bad}/corral/busybox@{pushed.one.digest}", policy=_policy(bad))
        with pytest.raises(ConfigInvalidError, match=r"not the .* it claims: refused"):
            cache.pull(f"{bad}/corral/busybox:1", policy=_policy(bad))
    assert cache.pulled.images() == []
    with pytest.raises(ConfigInvalidError, match="the digest must be sha256"):
        cache.pull(f"{host}/corral/busybox@sha256:abc", policy=_policy(host))


class _Listener:
    """A loopback socket that counts the connections made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[_Listener]:
    lst = _Listener()
    try:
        yield lst
    finally:
        lst.close()


def test_a_registry_outside_the_operators_list_is_refused_before_connecting(
        tmp_path: Path, pushed: Pushed, listener: _Listener,
        monkeypatch: pytest.MonkeyPatch) -> None:
    port = listener.sock.getsockname()[1]
    cache = _cache(tmp_path)
    # control: an allowed host gets connected to
    with pytest.raises(ProviderError):
        cache.pull(f"127.0.0.1:{port}/corral/busybox:1", policy=_policy(f"127.0.0.1:{port}"))
    assert listener.accepted >= 1
    before = listener.accepted
    with pytest.raises(ConfigInvalidError, match="not one the operator allows") as err:
        cache.pull(f"127.0.0.1:{port}/corral/busybox:1", policy=_policy(pushed.reg.host))
    assert err.value.field == "registry"
    # the operator's list from the environment; none at all allows nothing
    monkeypatch.setenv("CORRAL_REGISTRIES", f"registry.example, http://{pushed.reg.host}")
    with pytest.raises(ConfigInvalidError, match="not one the operator allows"):
        cache.pull(f"127.0.0.1:{port}/corral/busybox:1")
    monkeypatch.setenv("CORRAL_REGISTRIES", "")
    with pytest.raises(ConfigInvalidError, match=r"allowed: none"):
        cache.pull("busybox")
    assert listener.accepted == before
    assert cache.pulled.images() == []
    monkeypatch.setenv("CORRAL_REGISTRIES", f"http://{pushed.reg.host}")
    assert cache.pull(f"{pushed.reg.host}/corral/busybox:1").manifest_digest == pushed.one.digest


def test_a_pull_cut_off_midblob_leaves_nothing_used_and_resumes(
        tmp_path: Path, pushed: Pushed) -> None:
    cache = _cache(tmp_path)
    layer = pushed.big.layers[0]
    digest = rs.sha(layer)
    with rs.proxy(pushed.reg.host, mode="cut", cut_at=len(layer) // 2) as px:
        host = f"127.0.0.1:{px.port}"
        ref = f"{host}/corral/big:1"
        with pytest.raises(ProviderError, match=r"broke off|ended after"):
            cache.pull(ref, policy=_policy(host))
        assert cache.pulled.images() == []  # not named: nothing can use it
        assert digest[7:] not in _files(cache, "blobs", "sha256")
        part = Path(cache.root, "oci", ".partial", digest[7:])
        kept = part.stat().st_size
        assert 0 < kept < len(layer)
        with pytest.raises(ConfigInvalidError, match="no manifest named"):
            cache.unpack(os.path.join(cache.root, "oci"), ref=ref)
        # the retry resumes from the partial file and completes
        px.mode, px.seen[:] = "pass", []
        p = cache.pull(ref, policy=_policy(host))
    ranges = [r for path, r in px.seen if digest in path]
    assert ranges == [f"bytes={kept}-"]  # resumed where it broke off
    assert not part.exists()
    assert Path(cache.unpack_pulled(p).rootfs, "big").stat().st_size == 3 << 20


def test_a_partial_download_with_wrong_bytes_is_discarded(tmp_path: Path,
                                                           pushed: Pushed) -> None:
    host = pushed.reg.host
    cache = _cache(tmp_path)
    layer = pushed.big.layers[0]
    digest = rs.sha(layer)
    partial = Path(cache.root, "oci", ".partial")
    partial.mkdir(parents=True)
    (partial / digest[7:]).write_bytes(b"\0" * 1000)  # not the blob's first bytes
    with pytest.raises(ConfigInvalidError, match="does not match its digest"):
        cache.pull(f"{host}/corral/big:1", policy=_policy(host))
    assert not (partial / digest[7:]).exists()
    assert digest[7:] not in _files(cache, "blobs", "sha256")
    p = cache.pull(f"{host}/corral/big:1", policy=_policy(host))  # from scratch
    assert p.layers[0].digest == digest


def test_the_size_bound_counts_and_evicts_pulled_images(tmp_path: Path,
                                                       pushed: Pushed) -> None:
    host = pushed.reg.host
    # busybox (1 MiB of blobs, 2 MiB unpacked) and big (3 MiB each) do not fit together
    limit = 15 << 19
    cache = _cache(tmp_path, max_cache_bytes=limit)
    small = cache.pull(f"{host}/corral/busybox:1", policy=_policy(host))
    cache.unpack_pulled(small)
    os.utime(cache.pulled._used_file(small.ref_name), (1, 1))  # the oldest use
    big = cache.pull(f"{host}/corral/big:1", policy=_policy(host))
    cache.unpack_pulled(big)
    assert cache.usage() <= limit
    names = {i.reference for i in cache.pulled.images()}
    assert big.reference in names
    assert small.reference not in names  # evicted, least recently used
    assert small.layers[0].hex not in _files(cache, "blobs", "sha256")
    assert cache.entries() == [big.config_digest[7:]]  # busybox's tree went too
    # what is left is counted: blobs + unpacked trees
    assert cache.usage() >= big.size


def test_remove_deletes_only_unshared_blobs(tmp_path: Path, pushed: Pushed) -> None:
    host = pushed.reg.host
    cache = _cache(tmp_path)
    one = cache.pull(f"{host}/corral/busybox:1", policy=_policy(host))
    two = cache.pull(f"{host}/corral/busybox:2", policy=_policy(host))
    cache.pulled.remove(f"{host}/corral/busybox:1")
    blobs = _files(cache, "blobs", "sha256")
    assert one.layers[0].hex in blobs  # shared with two
    assert one.layers[1].hex not in blobs and one.config_digest[7:] not in blobs
    assert two.manifest_digest[7:] in blobs
    with pytest.raises(ConfigInvalidError, match="no pulled image"):
        cache.pulled.remove(f"{host}/corral/busybox:1")


def test_references_parse_like_docker() -> None:
    r = parse_reference("busybox")
    assert (r.registry, r.repository, r.tag, r.api_host) == (
        "docker.io", "library/busybox", "latest", "registry-1.docker.io")
    r = parse_reference("localhost:5000/a/b@sha256:" + "a" * 64)
    assert (r.registry, r.repository, r.tag, r.digest) == (
        "localhost:5000", "a/b", None, "sha256:" + "a" * 64)
    assert str(parse_reference("ghcr.io/x/y:1.2")) == "ghcr.io/x/y:1.2"
    for bad in ("", "UPPER/case", "a//b", "x:bad tag", "a@sha512:00"):
        with pytest.raises(ConfigInvalidError):
            parse_reference(bad)


def test_two_concurrent_pulls_of_one_image_share_the_downloads(tmp_path: Path,
                                                               pushed: Pushed) -> None:
    cache = _cache(tmp_path)
    errors: list[BaseException] = []
    with rs.proxy(pushed.reg.host) as px:
        host = f"127.0.0.1:{px.port}"

        def pull() -> None:
            try:
                cache.pull(f"{host}/corral/big:1", policy=_policy(host))
            except BaseException as e:
                errors.append(e)
        threads = [threading.Thread(target=pull) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errors == []
    layer = rs.sha(pushed.big.layers[0])
    assert sum(layer in path for path, _ in px.seen) == 1  # one download, three pulls
    assert _files(cache, ".partial") == set()
    assert [i.reference for i in cache.pulled.images()] == [f"{host}/corral/big:1"]


def test_a_registry_that_trickles_is_stopped_at_max_time(tmp_path: Path,
                                                         pushed: Pushed) -> None:
    """3 MiB at 64 KiB per 50 ms takes about 2.4 s; the pull may take 0.5 s."""
    cache = _cache(tmp_path)
    with rs.proxy(pushed.reg.host, mode="slow") as px:
        host = f"127.0.0.1:{px.port}"
        with pytest.raises(ProviderError, match=r"longer than max_time_s=0.5 s"):
            cache.pull(f"{host}/corral/big:1", policy=_policy(host), max_time_s=0.5)
    assert cache.pulled.images() == []
    layer = rs.sha(pushed.big.layers[0])[7:]
    assert layer not in _files(cache, "blobs", "sha256")


def test_redirects_go_only_to_allowed_hosts(tmp_path: Path, pushed: Pushed) -> None:
    cache = _cache(tmp_path)
    with rs.proxy(pushed.reg.host, mode="redirect") as px:
        host = f"127.0.0.1:{px.port}"
        with pytest.raises(ConfigInvalidError,
                           match=f"redirect target '{pushed.reg.host}' is not one"):
            cache.pull(f"{host}/corral/busybox:1", policy=_policy(host))
        assert cache.pulled.images() == []
        p = cache.pull(f"{host}/corral/busybox:1", policy=_policy(host, pushed.reg.host))
    assert p.manifest_digest == pushed.one.digest


def test_docker_schema2_manifests_and_lists(tmp_path: Path, pushed: Pushed) -> None:
    """Docker's media types (schema 2 manifest, manifest list) pull like OCI's."""
    reg, host = pushed.reg, pushed.reg.host
    img = rs.busybox_image({"app/hello.txt": "docker"})
    doc = json.loads(img.manifest)
    doc["mediaType"] = "application/vnd.docker.distribution.manifest.v2+json"
    doc["config"]["mediaType"] = "application/vnd.docker.container.image.v1+json"
    for layer in doc["layers"]:
        layer["mediaType"] = "application/vnd.docker.image.rootfs.diff.tar.gzip"
    img.manifest = json.dumps(doc).encode()
    with httpx.Client(base_url=reg.url, timeout=30, trust_env=False) as c:
        for digest, data in img.blobs.items():
            reg._blob(c, "corral/docker", digest, data)
    reg.put_manifest("corral/docker", "1", img.manifest, doc["mediaType"])
    listing = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
        "manifests": [{"mediaType": doc["mediaType"], "digest": img.digest,
                       "size": len(img.manifest),
                       "platform": {"architecture": rs.ARCH, "os": "linux"}}]}).encode()
    reg.put_manifest("corral/docker", "list", listing,
                     "application/vnd.docker.distribution.manifest.list.v2+json")
    cache = _cache(tmp_path)
    for tag in ("1", "list"):
        p = cache.pull(f"{host}/corral/docker:{tag}", policy=_policy(host))
        assert p.manifest_digest == img.digest
        assert Path(cache.unpack_pulled(p).rootfs, "app/hello.txt").read_text() == "docker"


def test_an_image_larger_than_one_image_may_be_is_refused_before_evicting(
        tmp_path: Path, pushed: Pushed) -> None:
    host = pushed.reg.host
    cache = _cache(tmp_path, max_bytes=2 << 20)
    small = cache.pull(f"{host}/corral/busybox:1", policy=_policy(host))
    with pytest.raises(ConfigInvalidError, match="more than one image may take"):
        cache.pull(f"{host}/corral/big:1", policy=_policy(host))
    assert [i.reference for i in cache.pulled.images()] == [small.reference]
