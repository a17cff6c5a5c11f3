"""Environments built on a base image (issue 29: "from a requirements list, and
optionally a base image"): ``build_environment(..., image=REF)`` runs the install in a
strict sandbox whose root is the image, with the image's own python3 and pip; the key
holds the image's content digest and its interpreter as read inside it; a sandbox whose
root is that image gets the environment, any other root is refused typed.

The image is the suite's cached Debian bookworm python3-numpy root (marker
``image_build``: tests/linux/imageroot_support.py debootstraps it once, about a minute
cold), one cached gzip layer, plus a layer with pip (the test venv's own, pure Python)
and a marker file, pushed to the loopback registry this module starts and pulled by
the provider. The package index is a loopback HTTPS index of tiny local wheels (no
PyPI): the build sandbox's network lists only its name and port.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import regsupport as rs

from corral.core.errors import ConfigInvalidError, ProviderError
from corral.core.spec import SandboxSpec
from corral.envs import BuildOptions, EnvStore, build_environment, stats
from corral.envs.store import ENV_MOUNT
from strict_tier import host_can_sandbox, needs_strict, unavailable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linux"))

import imageroot_support as irs
from netservers import MapResolver, build_wheel, http_server, make_ca

pytestmark = [pytest.mark.linux, pytest.mark.image_build, needs_strict(host_can_sandbox())]

#: a file only the test image has: a command that sees it runs in the image's root
MARKER = "etc/corral-env-image"


@pytest.fixture(scope="module")
def python_base() -> tuple[bytes, str]:
    """The Debian python3-numpy root (no pip) as one layer."""
    try:
        root = irs.python_numpy_rootfs()
    except RuntimeError as e:
        unavailable(f"the python3-numpy test image could not be built: {e}")
    if root is None:
        unavailable("the python3-numpy test image needs root and debootstrap")
    path, diff_id = irs.rootfs_layer(root)
    with open(path, "rb") as f:
        return f.read(), diff_id


@pytest.fixture(scope="module")
def pip_layer() -> tuple[bytes, str]:
    """pip (this venv's, pure Python) at the image's dist-packages, plus the marker."""
    spec = importlib.util.find_spec("pip")
    assert spec is not None and spec.submodule_search_locations
    src = spec.submodule_search_locations[0]
    files: dict[str, bytes | str] = {MARKER: "the corral env test image\n"}
    for top, dirs, names in os.walk(src):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for n in names:
            if n.endswith(".pyc"):
                continue
            with open(os.path.join(top, n), "rb") as f:
                rel = os.path.relpath(os.path.join(top, n), os.path.dirname(src))
                files[f"usr/lib/python3/dist-packages/{rel}"] = f.read()
    return rs.layer(files)


@pytest.fixture(scope="module")
def xdg() -> Iterator[Path]:
    """XDG_CACHE_HOME for the module: its corral/images is the image cache the library
    and ``corral run --image`` share (a dir the sandbox's own uid can walk to)."""
    d = Path(tempfile.mkdtemp(prefix="corral-env-image-", dir="/var/tmp"))
    (d / "corral" / "images").mkdir(parents=True)
    for p in (d, d / "corral", d / "corral" / "images"):
        os.chmod(p, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def reg(plain_registry: rs.Registry, monkeypatch: pytest.MonkeyPatch) -> rs.Registry:
    monkeypatch.setenv("CORRAL_REGISTRIES", f"http://{plain_registry.host}")
    return plain_registry


def _push(reg: rs.Registry, name: str, layers: list[tuple[bytes, str]]) -> str:
    img = rs.image(layers, {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]})
    reg.push(name, "1", img)
    return f"{reg.host}/{name}:1"


def _index(port_wheels: list[tuple[str, bytes]]) -> dict[str, bytes]:
    import hashlib
    links = "".join(f'<a href="/files/{fn}#sha256={hashlib.sha256(b).hexdigest()}">{fn}</a>'
                    for fn, b in port_wheels)
    files = {"/simple/": b'<a href="/simple/corraltoy/">corraltoy</a>',
             "/simple/corraltoy/": f"<html><body>{links}</body></html>".encode()}
    for fn, b in port_wheels:
        files[f"/files/{fn}"] = b
    return files


def _opts(port: int, ca_pem: bytes) -> BuildOptions:
    return BuildOptions(index_url=f"https://pypi.test:{port}/simple/",
                        index_hosts=(f"pypi.test:{port}", f"127.0.0.1/32:{port}"),
                        cert_pem=ca_pem, timeout_s=180)


class Refusing:
    """A provider whose ``create`` fails: proof that a cache hit used no sandbox."""

    name = "refusing"

    async def create(self, spec: Any, **_k: Any) -> Any:
        raise AssertionError("a cache hit must not create a sandbox")


def _with_provider(test: Callable[[Any], Any], cache: Path, store: Path) -> None:
    from corral.providers.linux import LinuxProvider

    async def go() -> None:
        p = LinuxProvider(spares=0, image_cache_dir=str(cache), env_store_dir=str(store),
                          egress_resolver=MapResolver({"pypi.test": ["127.0.0.1"]}))
        try:
            await test(p)
        finally:
            await p.aclose()
    asyncio.run(go())


def _untouched(store: EnvStore, before: list[str]) -> None:
    """The store as it was: the same environments, no build dir left."""
    assert [e.digest for e in store.all()] == before
    assert not (store.root / "tmp").exists() or list((store.root / "tmp").iterdir()) == []


@pytest.fixture
def ca() -> Iterator[Any]:
    root = Path(tempfile.mkdtemp(prefix=f"corral-test-ca-{os.getpid()}-"))
    try:
        yield make_ca("pypi.test", within=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_an_environment_built_on_an_image_runs_with_the_images_python(
        reg: rs.Registry, python_base: tuple[bytes, str], pip_layer: tuple[bytes, str],
        xdg: Path, ca: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    image = _push(reg, "envs/python", [python_base, pip_layer])
    other = _push(reg, "envs/python-b", [python_base, pip_layer,
                                         rs.layer({"etc/another": "b\n"})])
    cache = xdg / "corral" / "images"
    store = EnvStore(tmp_path / "envs")
    toy = build_wheel("corraltoy", "1.0", "ANSWER = 1\n")
    with http_server(_index([toy]), ca.server_context()) as index:
        async def test(p: Any) -> None:
            from corral.images import resolve
            from corral.images.cache import ImageCache
            key = resolve(image, cache=ImageCache(str(cache))).key
            opts = _opts(index.port, ca.ca_pem)
            before = stats["sandbox_builds"]
            env = await build_environment("toy", ["corraltoy==1.0"], options=opts,
                                          store=store, provider=p, image=image,
                                          image_cache_dir=str(cache))
            assert stats["sandbox_builds"] == before + 1
            assert env.image == key and env.meta["inputs"]["image"] == key
            assert key.startswith("sha256:") and key not in image  # content, not the tag
            facts = store.image_facts(key)
            assert facts is not None and facts["python"] == "/usr/bin/python3"
            assert env.modules == {"corraltoy"}
            # used in the image: bound read-only at ENV_MOUNT, on the image python's path
            code = ("import corraltoy, json, os, sys, numpy; print(json.dumps("
                    "[corraltoy.ANSWER, corraltoy.__file__, sys.version, sys.executable, "
                    f"list(sys.version_info[:3]), os.path.exists('/{MARKER}')]))")
            async with await p.create(SandboxSpec(image=image, environment="toy")) as sb:
                r = await sb.exec(["/usr/bin/python3", "-c", code])
                assert r.exit_code == 0, r.stderr_text
                answer, file, version, exe, info, marked = json.loads(r.stdout_text)
                r2 = await sb.exec(["/usr/bin/python3", "-c",
                                    f"open('{ENV_MOUNT}/x', 'w')"])
                assert "Read-only file system" in r2.stderr_text
            assert (answer, file, exe, marked) == (
                1, f"{ENV_MOUNT}/corraltoy/__init__.py", "/usr/bin/python3", True)
            # the key's interpreter is the one that runs in the image (read inside it)
            assert version == facts["version_text"]
            assert info == env.meta["inputs"]["interpreter"]["version"]
            assert env.meta["inputs"]["interpreter"]["soabi"] == facts["soabi"]
            # the same inputs: a hit, no sandbox (the provider refuses), no request
            seen = len(index.requests)
            again = await build_environment("toy-again", ["corraltoy==1.0"], options=opts,
                                            store=store, provider=Refusing(), image=image,
                                            image_cache_dir=str(cache))
            assert again.digest == env.digest and len(index.requests) == seen
            assert stats["sandbox_builds"] == before + 1
            # another image (one more layer: another content digest): another key
            on_b = await build_environment("toy-b", ["corraltoy==1.0"], options=opts,
                                           store=store, provider=p, image=other,
                                           image_cache_dir=str(cache))
            assert on_b.digest != env.digest and on_b.image not in (None, key)
            assert stats["sandbox_builds"] == before + 2
            # ... and the environment of one image is refused on the other, typed
            with pytest.raises(ConfigInvalidError, match="another image") as e:
                await p.create(SandboxSpec(image=other, environment="toy"))
            assert e.value.field == "environment"
            # ... and on the host's root (its interpreter is not the image's)
            with pytest.raises(ConfigInvalidError, match="runs the host's") as e:
                await p.create(SandboxSpec(environment="toy"))
            assert e.value.field == "environment"

        _with_provider(test, cache, store.root)

    # the CLI: corral run --image REF --environment NAME -- python3 -c 'import ...'
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg), "CORRAL_ENV_DIR": str(store.root)}
    r = subprocess.run([sys.executable, "-m", "corral", "run", "--image", image,
                        "--environment", "toy", "--", "python3", "-c",
                        "import corraltoy, sys; print(corraltoy.ANSWER, sys.executable)"],
                       capture_output=True, text=True, timeout=300, env=env, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "/usr/bin/python3"]
    r = subprocess.run([sys.executable, "-m", "corral", "run", "--image", other,
                        "--environment", "toy", "--", "python3", "-c", "pass"],
                       capture_output=True, text=True, timeout=300, env=env, check=False)
    assert r.returncode != 0 and "another image" in r.stderr, r.stderr


def test_an_image_without_python_or_pip_is_refused_typed_and_the_store_unchanged(
        reg: rs.Registry, python_base: tuple[bytes, str], pip_layer: tuple[bytes, str],
        xdg: Path, ca: Any, tmp_path: Path) -> None:
    no_python = f"{reg.host}/envs/busybox:1"
    reg.push("envs/busybox", "1", rs.busybox_image())
    no_pip = _push(reg, "envs/python-no-pip", [python_base])
    with_pip = _push(reg, "envs/python", [python_base, pip_layer])
    cache = xdg / "corral" / "images"
    store = EnvStore(tmp_path / "envs")
    with http_server(_index([build_wheel("corraltoy", "1.0", "A = 1\n")]),
                     ca.server_context()) as index:
        async def test(p: Any) -> None:
            opts = _opts(index.port, ca.ca_pem)
            kw: dict[str, Any] = {"options": opts, "store": store, "provider": p,
                                  "image_cache_dir": str(cache)}
            # (without a provider: the build's own, on the same image cache)
            own = {k: v for k, v in kw.items() if k != "provider"}
            with pytest.raises(ConfigInvalidError, match="no python3") as e:
                await build_environment("x", ["corraltoy"], image=no_python, **own)
            assert e.value.field == "image"
            with pytest.raises(ConfigInvalidError, match="has no pip") as e:
                await build_environment("x", ["corraltoy"], image=no_pip, **own)
            assert e.value.field == "image" and "Python 3." in str(e.value)
            _untouched(store, [])
            # a build that fails in the image (no such project on the index): typed, and
            # the store keeps what it had
            ok = await build_environment("ok", ["corraltoy"], image=with_pip, **kw)
            with pytest.raises(ProviderError, match="pip exited"):
                await build_environment("bad", ["no-such-project"], image=with_pip, **kw)
            _untouched(store, [ok.digest])
            assert set(store.names()) == {"ok"}
            # a rootfs dir has no content digest: refused before any sandbox
            with pytest.raises(ConfigInvalidError, match="content digest"):
                await build_environment("x", ["corraltoy"], image=str(tmp_path), **kw)

        _with_provider(test, cache, store.root)
