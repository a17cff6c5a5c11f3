"""The image cache's size limit: least recently used entries are evicted to make
room, never one a live sandbox has mounted nor one used a moment ago."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from dispatch_support import LINUX_WHY, shared_tmp
from imagebuild import Member, oci_layout

from corral.core.errors import ConfigInvalidError, ProviderError
from corral.core.spec import InvocationMode, SandboxSpec
from corral.images.cache import (
    CACHE_LIMIT_ENV,
    DEFAULT_MAX_CACHE_BYTES,
    ImageCache,
    UnpackedImage,
    mounted_digests,
)
from strict_tier import needs_strict


def _image(root: Path, name: str) -> str:
    """An image of one 64 KiB file of its own (so every image has the same size)."""
    data = (name.encode() * (1 << 16))[: 1 << 16]
    return oci_layout(str(root / name), [[Member(f"{name}.bin", data=data)]])


def _age(u: UnpackedImage, seconds: float) -> None:
    """Pretend ``u`` was last used ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(os.path.dirname(u.rootfs), (then, then))


def _sized(root: Path, imgs: Path, entries: float) -> ImageCache:
    """A cache at ``root`` that holds ``entries`` images of :func:`_image`'s size."""
    probe = root.parent / (root.name + "-probe")
    ImageCache(str(probe)).unpack(_image(imgs, "probe"))
    one = ImageCache(str(probe)).usage()
    assert one >= 1 << 16
    return ImageCache(str(root), max_cache_bytes=int(one * entries))


def test_the_least_recently_used_entry_is_evicted(tmp_path: Path) -> None:
    cache = _sized(tmp_path / "cache", tmp_path, 2.5)
    a, b = cache.unpack(_image(tmp_path, "a")), cache.unpack(_image(tmp_path, "b"))
    _age(a, 300)
    _age(b, 200)
    c = cache.unpack(_image(tmp_path, "c"))  # three do not fit: the oldest goes
    assert cache.entries() == sorted(u.key[7:] for u in (b, c))
    assert cache.usage() <= cache.max_cache_bytes
    assert not os.path.exists(a.rootfs)
    _age(c, 100)
    assert cache.unpack(_image(tmp_path, "b")) == b  # b is used again: c is the oldest now
    _age(b, 90)
    d = cache.unpack(_image(tmp_path, "d"))
    assert cache.entries() == sorted(u.key[7:] for u in (b, d))
    assert cache.usage() <= cache.max_cache_bytes
    assert cache.unpack(_image(tmp_path, "a")) == a  # unpacked again when asked for
    assert [n for n in os.listdir(cache.root) if n.startswith((".tmp-", ".evict-"))] == []


def test_entries_in_use_a_moment_ago_are_kept_and_a_full_cache_refuses(tmp_path: Path) -> None:
    cache = _sized(tmp_path / "cache", tmp_path, 1.5)
    a = cache.unpack(_image(tmp_path, "a"))  # just used: a sandbox may be starting on it
    with pytest.raises(ProviderError, match="is full") as ei:
        cache.unpack(_image(tmp_path, "b"))
    assert "max_cache_bytes" in str(ei.value)
    assert cache.entries() == [a.key[7:]]
    assert sorted(os.listdir(cache.root)) == [".lock", ".seen", a.key[7:]]  # no temp dir
    _age(a, 120)
    b = cache.unpack(_image(tmp_path, "b"))
    assert cache.entries() == [b.key[7:]]


def test_an_image_larger_than_the_whole_cache_is_refused(tmp_path: Path) -> None:
    cache = _sized(tmp_path / "cache", tmp_path, 0.5)
    with pytest.raises(ConfigInvalidError) as ei:
        cache.unpack(_image(tmp_path, "a"))
    assert ei.value.field == "image" and "more than" in ei.value.reason
    assert cache.entries() == []


def test_the_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_LIMIT_ENV, raising=False)
    assert ImageCache("/nonexistent").max_cache_bytes == DEFAULT_MAX_CACHE_BYTES == 4 << 30
    for raw, want in (("12345", 12345), ("3M", 3 << 20), ("2GiB", 2 << 30), ("1 t", 1 << 40)):
        monkeypatch.setenv(CACHE_LIMIT_ENV, raw)
        assert ImageCache("/nonexistent").max_cache_bytes == want
    assert ImageCache("/nonexistent", max_cache_bytes=5).max_cache_bytes == 5
    for raw in ("0", "-1", "lots", "1.5G"):
        monkeypatch.setenv(CACHE_LIMIT_ENV, raw)
        with pytest.raises(ConfigInvalidError) as ei:
            ImageCache("/nonexistent")
        assert ei.value.field == CACHE_LIMIT_ENV
    with pytest.raises(ConfigInvalidError):
        ImageCache("/nonexistent", max_cache_bytes=0)


@needs_strict(LINUX_WHY)
def test_an_image_a_live_sandbox_has_mounted_is_never_evicted() -> None:
    from corral.providers.linux import LinuxProvider

    work = Path(shared_tmp("limit"))
    os.chmod(work, 0o755)  # the sandbox's user walks into the cache
    root = work / "cache"

    async def go() -> None:
        p = LinuxProvider(image_cache_dir=str(root), spares=0)
        p.images = cache = _sized(root, work, 2.5)
        try:
            img = _image(work, "a")
            a = cache.unpack(img)
            sb = await p.create(SandboxSpec(tenant_id="t", run_id="r", image=img,
                                            mode=InvocationMode.JSON_STDIO))
            try:
                assert a.key[7:] in mounted_digests()
                b = cache.unpack(_image(work, "b"))
                _age(a, 300)  # a is the oldest, but in use
                _age(b, 200)
                c = cache.unpack(_image(work, "c"))
                assert cache.entries() == sorted(u.key[7:] for u in (a, c))
                assert cache.usage() <= cache.max_cache_bytes
                assert (await sb.exec(["/usr/bin/ls", "/"])).stdout.split().count(b"a.bin") == 1
            finally:
                await sb.destroy()
            for _ in range(500):  # its processes leave the mount namespace as they die
                if a.key[7:] not in mounted_digests():
                    break
                await asyncio.sleep(0.02)
            assert a.key[7:] not in mounted_digests()
            _age(c, 100)
            d = cache.unpack(_image(work, "d"))  # a's sandbox is gone: a goes now
            assert cache.entries() == sorted(u.key[7:] for u in (c, d))
        finally:
            await p.aclose()
    asyncio.run(go())
