"""The environment store without a sandbox: keys, names, publish, locks, eviction."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import sysconfig
import time
from pathlib import Path

import pytest

from corral.core.errors import ConfigInvalidError
from corral.envs import BuildOptions, Environment, EnvStore
from corral.envs.build import BaseImage, build_inputs, top_level_modules
from corral.envs.store import ENV_MOUNT, check_root, digest_of, normalize_requirements


def _fake(store: EnvStore, digest: str, *, size: int = 10, modules: tuple[str, ...] = ("m",)
          ) -> Environment:
    temp = store.new_temp()
    site = temp / "site"
    site.mkdir()
    (site / "m.py").write_text("X = 1\n")
    (temp / "meta.json").write_text(json.dumps(
        {"digest": digest, "modules": list(modules), "size_bytes": size,
         "requirements": ["m==1"]}))
    with store.lock(digest):
        return store.publish(temp, digest)


def test_requirements_normalize_and_refuse_options() -> None:
    assert normalize_requirements("pandas  ==2.2 # pinned\n\n# c\nnumpy\nnumpy\n") == (
        "numpy", "pandas ==2.2")
    with pytest.raises(ConfigInvalidError):
        normalize_requirements(["--index-url http://x/"])
    with pytest.raises(ConfigInvalidError):
        normalize_requirements("# nothing\n")


def test_digest_follows_every_input() -> None:
    base = build_inputs(["numpy"], BuildOptions())
    same = build_inputs("numpy\n# again\n", BuildOptions())
    assert digest_of(base) == digest_of(same)
    for other in (build_inputs(["numpy==2.0"], BuildOptions()),
                  build_inputs(["numpy"], BuildOptions(index_url="https://i.test/simple/")),
                  build_inputs(["numpy"], BuildOptions(allow_source=True))):
        assert digest_of(other) != digest_of(base)
    assert base["interpreter"]["soabi"]  # the interpreter's ABI is in the key
    assert BuildOptions().hosts() == ("pypi.org:443", "files.pythonhosted.org:443")
    assert BuildOptions(index_url="https://i.test:8443/simple/").hosts() == ("i.test:8443",)


def _base(key: str, version: tuple[int, int, int] = (3, 12, 8)) -> BaseImage:
    return BaseImage(ref="registry.test/py:3", key=key, python="/usr/local/bin/python3",
                     interpreter={"implementation": "cpython", "version": list(version),
                                  "soabi": f"cpython-3{version[1]}-x86_64-linux-gnu",
                                  "abiflags": ""},
                     machine="x86_64", libc=("glibc", "2.36"))


def test_a_base_image_is_in_the_key_by_content_and_interpreter() -> None:
    host = build_inputs(["numpy"], BuildOptions())
    assert host["image"] is None  # a host build's inputs (and digests) are as before
    a = build_inputs(["numpy"], BuildOptions(), image=_base("sha256:" + "a" * 64))
    assert a["image"] == "sha256:" + "a" * 64
    assert a["interpreter"]["version"] == [3, 12, 8]  # the image's, not the host's
    assert a["platform"]["libc"] == ["glibc", "2.36"]
    digests = {digest_of(x) for x in (
        host, a, build_inputs(["numpy"], BuildOptions(), image=_base("sha256:" + "b" * 64)),
        build_inputs(["numpy"], BuildOptions(),
                     image=_base("sha256:" + "a" * 64, (3, 12, 9))))}
    assert len(digests) == 4
    assert digest_of(a) == digest_of(
        build_inputs(["numpy"], BuildOptions(), image=_base("sha256:" + "a" * 64)))


def test_check_root_names_what_the_environment_was_built_for(tmp_path: Path) -> None:
    def env(image: str | None) -> Environment:
        return Environment(name="e", digest="c" * 64, path=tmp_path,
                           meta={"inputs": {"image": image}})
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    check_root(env(None), None)
    check_root(env(a), a)
    for built, root, why in ((None, a, "built for the host's interpreter"),
                             (a, None, "runs the host's"), (a, b, "another image")):
        with pytest.raises(ConfigInvalidError, match=why) as e:
            check_root(env(built), root)
        assert e.value.field == "environment"
    assert env(a).image == a and env(None).image is None
    assert Environment(name="", digest="c" * 64, path=tmp_path).image is None


def test_a_host_environment_built_by_another_interpreter_is_refused(tmp_path: Path) -> None:
    """A store is shared by every corral on the host and a name points at its last build:
    one built by a 3.12 corral, used from this interpreter, is refused saying so (it
    failed inside as an ImportError of numpy's compiled part)."""
    here = sysconfig.get_config_var("SOABI")

    def env(soabi: str) -> Environment:
        return Environment(name="sci", digest="c" * 64, path=tmp_path, meta={
            "inputs": {"image": None, "interpreter": {"soabi": soabi}}})
    check_root(env(here), None)  # built by this interpreter
    other = "cpython-39-x86_64-linux-gnu"
    with pytest.raises(ConfigInvalidError, match="built for another interpreter") as e:
        check_root(env(other), None)
    assert other in e.value.message and here in e.value.message


def test_image_facts_are_kept_by_key(tmp_path: Path) -> None:
    store = EnvStore(tmp_path / "envs")
    key = "sha256:" + "d" * 64
    assert store.image_facts(key) is None
    store.set_image_facts(key, {"python": "/usr/bin/python3"})
    assert store.image_facts(key) == {"python": "/usr/bin/python3", "image": key}
    assert store.image_facts("sha256:" + "e" * 64) is None
    assert store.image_facts("dir:/x") is None


def test_publish_is_read_only_and_named(tmp_path: Path) -> None:
    store = EnvStore(tmp_path / "envs")
    d = "a" * 64
    env = _fake(store, d)
    assert env.digest == d and env.modules == {"m"}
    assert stat.S_IMODE(os.stat(env.site).st_mode) == 0o555
    assert stat.S_IMODE(os.stat(env.site / "m.py").st_mode) == 0o444
    store.set_name("toy", d)
    got = store.get("toy")
    assert got.digest == d and got.name == "toy"
    assert store.get(d).digest == d and store.get(f"sha256:{d}").digest == d
    assert got.sandbox_binds() == [(str(env.site), ENV_MOUNT)]
    assert got.sandbox_env()["PYTHONPATH"] == ENV_MOUNT
    with pytest.raises(ConfigInvalidError) as e:
        store.get("nope")
    assert e.value.field == "environment"
    with pytest.raises(ConfigInvalidError):
        store.get("../etc")
    assert store.remove("toy") == [d]
    assert not store.object_dir(d).exists()
    with pytest.raises(ConfigInvalidError):
        store.get(d)


def test_lru_eviction_keeps_the_store_in_bounds(tmp_path: Path) -> None:
    store = EnvStore(tmp_path / "envs", max_bytes=25)
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    for d in (a, b):
        _fake(store, d, size=10)
        store.set_name(d[:3], d)
    os.utime(store.root / "used" / a, (time.time() - 100, time.time() - 100))
    store.get(b)  # b used now, a long ago
    _fake(store, c, size=10)
    assert store.evict(keep=[c]) == [a]
    assert {e.digest for e in store.all()} == {b, c}
    assert "aaa" not in store.names()


def _hold(root: str, digest: str, q: object) -> None:
    store = EnvStore(root)
    with store.lock(digest):
        q.put("held")  # type: ignore[attr-defined]
        time.sleep(1.0)
        q.put("released")  # type: ignore[attr-defined]


def test_the_build_lock_excludes_another_process(tmp_path: Path) -> None:
    store = EnvStore(tmp_path / "envs")
    d = "d" * 64
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_hold, args=(str(store.root), d, q))
    p.start()
    try:
        assert q.get(timeout=30) == "held"
        with store.lock(d):
            # we got it only after the other process let go
            assert q.get(timeout=30) == "released"
    finally:
        p.join(30)
        q.close()
        q.join_thread()
    assert p.exitcode == 0


def test_a_temp_dir_that_fails_leaves_nothing(tmp_path: Path) -> None:
    store = EnvStore(tmp_path / "envs")
    temp = store.new_temp()
    (temp / "site").mkdir()
    from corral.envs.store import remove_tree
    os.chmod(temp / "site", 0o555)
    remove_tree(temp)
    assert list((store.root / "tmp").iterdir()) == []


def test_top_level_modules_from_a_tree(tmp_path: Path) -> None:
    site = tmp_path / "site"
    for d in ("numpy", "pandas", "numpy.libs", "bin", "__pycache__", "mpl_toolkits",
              "pandas-2.2.dist-info", "six-1.0.dist-info"):
        (site / d).mkdir(parents=True)
    (site / "six.py").write_text("")
    (site / "_cffi.cpython-311-x86_64-linux-gnu.so").write_text("")
    (site / "six-1.0.dist-info" / "top_level.txt").write_text("six\nmissing\n")
    assert top_level_modules(site) == {"numpy", "pandas", "mpl_toolkits", "six", "_cffi"}
