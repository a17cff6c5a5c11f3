"""Hostile layers against the bounded unpacker: header bombs, deep trees, a layer
that never ends and a child that dies are refused with the cap named, the host
process stays small, and no child or temp dir is left behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from dispatch_support import LINUX_WHY
from imagebuild import Member, deep_layer, header_bomb, oci_layout, oci_layout_blobs

from corral.core.errors import ConfigInvalidError
from corral.core.spec import InvocationMode, SandboxSpec
from corral.images.cache import ImageCache
from strict_tier import needs_strict

# Unpacks in a separate host process, which reports what it raised and its own peak
# RSS (VmHWM) before and after; RLIMIT_AS 4 GiB and the caller's timeout keep code
# without a bounded child from swamping or hanging the suite.
HOST = r'''
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from corral.images.cache import ImageCache

def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) >> 10 for l in f if l.startswith("VmHWM:"))

image, root, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cache = ImageCache(root, **kw)
before, t = hwm(), time.monotonic()
try:
    out = {"ok": cache.unpack(image).key}
except BaseException as e:
    out = {"error": type(e).__name__, "field": getattr(e, "field", None), "text": str(e)}
out.update(secs=time.monotonic() - t, hwm_before=before, hwm_after=hwm())
print(json.dumps(out))
'''


def _unpack_in_host(image: str, root: str, timeout: float = 120, **kw: Any) -> dict[str, Any]:
    try:
        proc = subprocess.run([sys.executable, "-c", HOST, image, root, json.dumps(kw)],
                              capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"unpacking {image!r} did not finish within {timeout} s")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _children_naming(text: str) -> list[int]:
    """Pids of live processes whose command line mentions ``text``."""
    pids = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(pid))
        except (OSError, ValueError):
            pass
    return pids


def _assert_left_nothing(root: Path, marker: str) -> None:
    names = os.listdir(root) if root.exists() else []
    assert [n for n in names if n != ".lock"] == [], names  # no entry, no .tmp- dir
    assert _children_naming(marker) == []


@pytest.mark.parametrize("kind", ["pax", "longname"])
@pytest.mark.slow
def test_a_header_bomb_is_refused_by_the_capped_child(tmp_path: Path, kind: str) -> None:
    # ~600 KiB of gzip whose first header announces a 600 MiB record of zeros: the
    # host's tarfile read it whole (1.8 GiB RSS); with default caps the child hits
    # its 512 MiB address space and the host never holds it.
    img = oci_layout_blobs(str(tmp_path / "img"), [header_bomb(kind, 600)])
    assert os.path.getsize(next((tmp_path / "img" / "blobs" / "sha256").iterdir())) < 1 << 20
    out = _unpack_in_host(img, str(tmp_path / "cache"))
    assert (out.get("error"), out.get("field")) == ("ConfigInvalidError", "image"), out
    assert "memory cap" in out["text"]
    assert out["hwm_after"] - out["hwm_before"] < 200, out  # MiB: the host read none of it
    _assert_left_nothing(tmp_path / "cache", str(tmp_path))


@pytest.mark.slow
def test_a_deep_tree_hits_the_cpu_cap(tmp_path: Path) -> None:
    # 20 000 files 200 directories down: every member walks the chain again (old
    # code spent ~4.5 s of host CPU on this 280 KiB layer)
    img = oci_layout_blobs(str(tmp_path / "img"), [deep_layer(200, 20_000)])
    out = _unpack_in_host(img, str(tmp_path / "cache"), max_cpu_s=1)
    assert (out.get("error"), out.get("field")) == ("ConfigInvalidError", "image"), out
    assert "CPU cap" in out["text"]
    _assert_left_nothing(tmp_path / "cache", str(tmp_path))


def _fifo_image(tmp_path: Path) -> tuple[str, Path]:
    """An image whose one layer blob is a fifo: opening it blocks until a writer comes."""
    img = oci_layout(str(tmp_path / "img"), [[Member("a", data=b"a")]], gzip_layers=False)
    blobs = tmp_path / "img" / "blobs" / "sha256"
    layer = next(p for p in blobs.iterdir() if p.read_bytes()[:1] == b"a")
    layer.unlink()
    os.mkfifo(layer)
    return img, layer


@pytest.mark.slow
def test_a_layer_that_never_ends_hits_the_wall_clock_cap(tmp_path: Path) -> None:
    img, _ = _fifo_image(tmp_path)  # old code: the host blocks in open() forever
    out = _unpack_in_host(img, str(tmp_path / "cache"), timeout=60, max_wall_s=2)
    assert (out.get("error"), out.get("field")) == ("ConfigInvalidError", "image"), out
    assert "wall-clock cap" in out["text"]
    _assert_left_nothing(tmp_path / "cache", str(tmp_path))


def _our_child(marker: str, deadline: float = 20.0) -> int:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for pid in _children_naming(marker):
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    return pid
        time.sleep(0.02)
    pytest.fail("no unpacking child appeared")


def _confined(pid: int) -> bool:
    """The child set its limits (and, before them, its parent-death signal)."""
    try:
        return _limits(pid)["Max cpu time"] != "unlimited"
    except OSError:
        return False


def _limits(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/limits") as f:
        rows = f.read().splitlines()[1:]
    return {r[:26].strip(): r[26:47].strip() for r in rows}


def test_the_child_is_the_real_interpreter_capped_and_a_crash_is_typed(tmp_path: Path) -> None:
    img, _ = _fifo_image(tmp_path)
    cache = ImageCache(str(tmp_path / "cache"), max_memory=300 << 20, max_cpu_s=7,
                       max_wall_s=60, max_bytes=5 << 20)
    got: list[BaseException] = []

    def unpack() -> None:
        try:
            cache.unpack(img)
        except BaseException as e:
            got.append(e)
    t = threading.Thread(target=unpack)
    t.start()
    try:
        pid = _our_child(str(tmp_path))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        assert argv[0].decode() == os.path.realpath(sys.executable)
        assert argv[1:3] == [b"-I", b"-S"]
        for _ in range(200):  # it lowers its limits itself, before it opens the image
            lim = _limits(pid)
            if lim["Max cpu time"] == "7":
                break
            time.sleep(0.02)
        assert lim["Max address space"] == str(300 << 20)
        assert lim["Max cpu time"] == "7"
        assert lim["Max file size"] == str((5 << 20) + (1 << 20))
        assert lim["Max core file size"] == "0"
        os.kill(pid, signal.SIGKILL)  # the child this test's unpack started
    finally:
        t.join(30)
    assert not t.is_alive()
    assert isinstance(got[0], ConfigInvalidError) and got[0].field == "image"
    assert "signal 9" in str(got[0])
    _assert_left_nothing(tmp_path / "cache", str(tmp_path))
    assert not os.path.exists(f"/proc/{pid}")  # reaped


def test_ordinary_images_still_unpack_and_a_hit_needs_no_child(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    img = oci_layout(str(tmp_path / "img"), [[Member("a", data=b"A")], [Member("b")]])
    cache = ImageCache(str(tmp_path / "cache"))
    u = cache.unpack(img)
    assert Path(u.rootfs, "a").read_bytes() == b"A"
    assert sorted(os.listdir(tmp_path / "cache")) == [".lock", ".seen", u.key[7:]]
    assert sorted(os.listdir(Path(u.rootfs).parent)) == ["rootfs", "size"]
    from corral.images import cache as images

    def no_child(*a: Any, **kw: Any) -> Any:
        raise AssertionError("a child was started for an unchanged image")
    monkeypatch.setattr(images, "unpack_bounded", no_child)
    assert cache.unpack(img) == u  # the same files as last time: straight from the cache
    assert ImageCache(str(tmp_path / "cache")).unpack(img) == u  # another process's too
    Path(img, "index.json").write_text(Path(img, "index.json").read_text())  # rewritten
    with pytest.raises(AssertionError, match="a child was started"):
        cache.unpack(img)
    monkeypatch.undo()
    shutil.rmtree(u.rootfs)  # gone from the cache: unpacked again
    assert cache.unpack(img) == u and Path(u.rootfs, "a").read_bytes() == b"A"


@needs_strict(LINUX_WHY)
@pytest.mark.slow
def test_a_cancelled_create_leaves_no_child_and_no_temp_dir(tmp_path: Path) -> None:
    from corral.providers.linux import LinuxProvider

    img, _ = _fifo_image(tmp_path)
    root = tmp_path / "cache"

    async def go() -> None:
        p = LinuxProvider(image_cache_dir=str(root), spares=0)
        p.images = ImageCache(str(root), max_wall_s=3)
        try:
            task = asyncio.ensure_future(p.create(SandboxSpec(
                tenant_id="t", run_id="r", image=img, mode=InvocationMode.JSON_STDIO)))
            await asyncio.to_thread(_our_child, str(tmp_path))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await p.aclose()
    asyncio.run(go())  # returns once the unpacking thread has: its child died at the cap
    _assert_left_nothing(root, str(tmp_path))


def test_a_killed_host_takes_its_child_along_and_its_temp_dir_is_reaped(
        tmp_path: Path) -> None:
    img, _ = _fifo_image(tmp_path)
    root = tmp_path / "cache"
    host = subprocess.Popen([sys.executable, "-c", HOST, img, str(root), '{"max_wall_s": 60}'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 20
        while not (child := [p for p in _children_naming(str(tmp_path))
                             if p != host.pid and _confined(p)]):
            assert time.monotonic() < end, "no unpacking child appeared"
            time.sleep(0.02)
    finally:
        host.kill()  # the process this test started, mid-unpack
        host.wait()
    end = time.monotonic() + 10
    try:
        while _children_naming(str(tmp_path)):  # PR_SET_PDEATHSIG: the child goes with it
            assert time.monotonic() < end, f"the unpacking child {child} outlived its host"
            time.sleep(0.02)
    finally:
        for pid in _children_naming(str(tmp_path)):  # only on failure: what this test left
            os.kill(pid, signal.SIGKILL)
    assert [n for n in os.listdir(root) if n.startswith(".tmp-")] != []
    ImageCache(str(root)).unpack(oci_layout(str(tmp_path / "ok"), [[Member("a")]]))
    assert [n for n in os.listdir(root) if n.startswith(".tmp-")] == []
