"""The image as the sandbox's root at strict (issue 28, item 2): ``SandboxSpec(image=...)``
without a handler mode, and ``corral run --image``.

The plan half is pure. The strict half runs a busybox-static image (built per test as an
OCI layout, tests/linux/imageroot_support.py): the command sees the image's files and
none of the host's (a control run on the host shows them there), the root is read-only,
/work and /tmp are writable, the image's Env and WorkingDir apply, a User that does not
map is refused, and the agent loads no module from files there. The image's own
python with a package the host lacks, the probe suite and the conformance kit are in
test_image_root_python.py (the one slow, cached image build).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from imageroot_support import busybox_layout

import corral
from corral.core.errors import ConfigInvalidError, SandboxTimeoutError
from corral.core.spec import SandboxSpec
from corral.providers.linux.policy.plan import (
    ENV_BASE,
    HostLayout,
    ImageRoot,
    LinuxOptions,
    build_plan,
)
from strict_tier import host_can_sandbox, needs_strict

linux = needs_strict(host_can_sandbox())

HOST = HostLayout(euid=0, egid=0, system_dirs=("/usr", "/lib64"),
                  system_links=(("/bin", "usr/bin"),), etc_files=("/etc/ld.so.cache",),
                  prefixes=("/opt/venv",), package_root="/srv/src")


def _spec(**kw: Any) -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r", image="img", **kw)


# ---------------------------------------------------------------- the plan (pure)


def test_an_image_root_plan_shows_no_host_dir() -> None:
    plan = build_plan(_spec(), options=LinuxOptions(), host=HOST,
                      image_root=ImageRoot(rootfs="/cache/x/rootfs", env={"PATH": "/bin"},
                                           has_passwd=True))
    first = plan.mounts[0]
    assert (first.kind, first.source, first.target, first.data) == (
        "rootfs", "/cache/x/rootfs", "/", b"etc")
    host_paths = {"/usr", "/lib64", "/etc/ld.so.cache", "/opt/venv", "/srv/src"}
    assert not {m.source for m in plan.mounts if m.kind == "bind"} & host_paths
    assert not [m for m in plan.mounts if m.kind == "symlink" and m.target == "/bin"]
    written = {m.target for m in plan.mounts if m.kind == "file"}
    assert written == {"/etc/group", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}
    assert plan.env_base == {**ENV_BASE, "PATH": "/bin"}
    assert plan.image_root and plan.cwd == "/work"
    wire = plan.to_wire()
    assert wire["image_root"] is True and wire["cwd"] == "/work"


def test_the_default_plan_is_unchanged_on_the_wire() -> None:
    plan = build_plan(SandboxSpec(tenant_id="t", run_id="r"), options=LinuxOptions(), host=HOST)
    assert not plan.image_root and plan.cwd == "/work"
    assert "image_root" not in plan.to_wire() and "cwd" not in plan.to_wire()
    assert plan.mounts[0].kind == "bind" and plan.mounts[0].source == "/usr"


@pytest.mark.parametrize("user", ["", "0", "root", "0:0", "root:root"])
def test_a_root_user_maps(user: str) -> None:
    build_plan(_spec(), options=LinuxOptions(), host=HOST,
               image_root=ImageRoot(rootfs="/r", user=user))


@pytest.mark.parametrize("user", ["1000", "nobody", "0:1000", "app:app"])
def test_an_unresolved_user_is_refused(user: str) -> None:
    # the provider resolves User against the image's files (uid/gid); unresolved: None
    with pytest.raises(ConfigInvalidError, match="does not map") as ei:
        build_plan(_spec(), options=LinuxOptions(), host=HOST,
                   image_root=ImageRoot(rootfs="/r", user=user))
    assert ei.value.field == "image"


@pytest.mark.parametrize(("uid", "gid"), [(1000, 1000), (7, 0), (0, 50)])
def test_a_resolved_user_is_the_one_id_inside(uid: int, gid: int) -> None:
    plan = build_plan(_spec(), options=LinuxOptions(), host=HOST,
                      image_root=ImageRoot(rootfs="/r", user="app", uid=uid, gid=gid))
    assert plan.uid_map == (uid, -1, 1) and plan.gid_map == (gid, -1, 1)
    assert plan.to_wire()["uid_map"] == [uid, -1, 1]


@pytest.mark.parametrize(("uid", "gid"), [(65534, 0), (0, 65534), (2**31, 0), (-1, 0)])
def test_a_user_outside_the_mappable_ids_is_refused(uid: int, gid: int) -> None:
    with pytest.raises(ConfigInvalidError, match="does not map"):
        build_plan(_spec(), options=LinuxOptions(), host=HOST,
                   image_root=ImageRoot(rootfs="/r", user="x", uid=uid, gid=gid))


def test_a_bind_that_would_hide_an_image_dir_is_refused() -> None:
    from corral.providers.linux.policy.plan import Bind
    image = ImageRoot(rootfs="/r", top_level=frozenset({"usr", "bin", "etc", "opt"}))
    for dst in ("/usr/local/x", "/opt"):
        with pytest.raises(ConfigInvalidError, match="would hide the image's") as ei:
            build_plan(_spec(), options=LinuxOptions(binds=(Bind("/srv/data", dst),)),
                       host=HOST, image_root=image)
        assert ei.value.field == "binds"
    for dst in ("/work/data", "/tmp/data", "/data"):
        plan = build_plan(_spec(), options=LinuxOptions(binds=(Bind("/srv/data", dst),)),
                          host=HOST, image_root=image)
        assert [m.target for m in plan.mounts if m.source == "/srv/data"] == [dst]


def test_working_dir() -> None:
    def plan(wd: str, has: bool = False) -> Any:
        return build_plan(_spec(), options=LinuxOptions(), host=HOST,
                          image_root=ImageRoot(rootfs="/r", working_dir=wd,
                                               has_working_dir=has))
    assert plan("/app", has=True).cwd == "/app"
    made = plan("/work/src")
    assert made.cwd == "/work/src"
    assert [m.target for m in made.mounts if m.kind == "dir"][-1] == "/work/src"
    assert plan("/tmp/x").cwd == "/tmp/x"
    for bad, why in (("/app", "not a directory of the image"), ("app", "absolute"),
                     ("/a/../b", "absolute"), ("/proc/1", "sandbox's own"),
                     ("/dev", "sandbox's own")):
        with pytest.raises(ConfigInvalidError, match=why):
            plan(bad)


def test_an_image_root_needs_the_unpacked_image() -> None:
    with pytest.raises(ConfigInvalidError, match="ImageRoot"):
        build_plan(_spec(), options=LinuxOptions(), host=HOST, rootfs="/cache/x/rootfs")
    with pytest.raises(ConfigInvalidError, match="ImageRoot"):  # a handler mode: not a root
        build_plan(_spec(mode="json-stdio"), options=LinuxOptions(), host=HOST,
                   image_root=ImageRoot(rootfs="/r"))


# ---------------------------------------------------------------- the agent's imports


def test_sealed_file_imports_load_only_builtin_and_frozen_modules(tmp_path: Path) -> None:
    # what pid 1 does before it serves an image root: a module file on sys.path (as an
    # image's /usr/lib/python3.X would be at the host interpreter's own path) is never run
    (tmp_path / "planted.py").write_text("import os; os.write(1, b'RAN')\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from corral.providers.linux.init import pid1\n"
            "import planted\n"  # control: loads before the seal
            "del sys.modules['planted']\n"
            "pid1.seal_file_imports()\n"
            "import time  # built-in (in every build; _socket is a file in pyenv's)\n"
            "for name in ('planted', 'json.tool', 'xml.dom.minidom'):\n"
            "    try:\n"
            "        __import__(name)\n"
            "        print('loaded', name)\n"
            "    except ImportError:\n"
            "        print('refused', name)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.startswith("RAN")
    assert out[3:].split("\n")[:3] == ["refused planted", "refused json.tool",
                                       "refused xml.dom.minidom"]


# ---------------------------------------------------------------- strict, busybox image


@pytest.fixture
def images() -> Iterator[Path]:
    """A dir the sandbox's own uid can walk to (pytest's tmp_path is 0700), for the
    layout and the unpacked image cache; removed afterwards."""
    d = tempfile.mkdtemp(prefix="corral-imageroot-", dir="/var/tmp")
    os.chmod(d, 0o755)
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _run(coro_fn: Any, cache: Path, **kw: Any) -> Any:
    from corral.providers.linux import LinuxProvider

    async def go() -> Any:
        p = LinuxProvider(image_cache_dir=str(cache), spares=0, **kw)
        try:
            return await coro_fn(p)
        finally:
            await p.aclose()
    return asyncio.run(go())


SHELL_VIEW = ("cat /etc/image-marker /app/hello.txt; ls /; cat /etc/hostname; pwd; "
              "echo FOO=$FOO; echo PATH=$PATH; id -u; "
              "echo w > /work/w && echo work-ok; echo t > /tmp/t && echo tmp-ok; "
              "touch /app/x 2>/dev/null || echo app-ro; mkdir /new 2>/dev/null || echo root-ro; "
              "touch /etc/x 2>/dev/null || echo etc-ro; "
              "for p in {paths}; do test -e $p && echo SEEN $p; done; true")


@linux
def test_the_command_sees_the_image_and_no_host_file(images: Path) -> None:
    layout = busybox_layout(str(images / "layout"), {
        "Env": ["PATH=/bin", "FOO=from-image"], "WorkingDir": "/app"})
    # host paths a default sandbox shows (control: they exist here)
    host_paths = [os.path.realpath(sys.executable), "/usr/bin/env",
                  os.path.dirname(os.path.dirname(os.path.realpath(str(corral.__file__)))),
                  "/etc/ld.so.cache"]
    host_paths = [p for p in host_paths if os.path.exists(p)]
    assert host_paths

    async def go(p: Any) -> tuple[Any, bytes]:
        sb = await p.create(SandboxSpec(tenant_id="t", image=layout))
        try:
            r = await sb.exec(["sh", "-c", SHELL_VIEW.format(paths=" ".join(host_paths))])
            await sb.write_file("in.txt", b"from the host")
            return r, await sb.read_file("in.txt")
        finally:
            await sb.destroy()
    r, back = _run(go, images / "cache")
    out = r.stdout.decode()
    assert r.exit_code == 0, r.stderr
    lines = out.splitlines()
    assert lines[:2] == ["from the image", "hello from /app"]
    assert {"app", "bin", "etc", "proc", "dev", "tmp", "work"} <= set(lines[2:12])
    assert "usr" not in lines[2:12]  # the image has none; the host's is not there
    assert "sandbox" in lines and "/app" in lines  # our hostname; WorkingDir is the cwd
    assert "FOO=from-image" in lines and "PATH=/bin" in lines and "0" in lines
    for word in ("work-ok", "tmp-ok", "app-ro", "root-ro", "etc-ro"):
        assert word in lines, (word, out)
    assert "SEEN" not in out, out
    assert back == b"from the host"


@linux
@pytest.mark.parametrize("user", ["app", "1000:nogroup", "root:nogroup", "65534", "4294967295"])
def test_a_user_the_sandbox_cannot_map_is_refused_at_create(images: Path, user: str) -> None:
    # names the image's passwd/group do not have; the kernel's overflow id; past 2^31
    layout = busybox_layout(str(images / "layout"), {"User": user})

    async def go(p: Any) -> None:
        with pytest.raises(ConfigInvalidError, match="does not map") as ei:
            await p.create(SandboxSpec(tenant_id="t", image=layout))
        assert ei.value.field == "image"
    _run(go, images / "cache")


ID_VIEW = ("id -u; id -g; stat -c %u /work; echo w > /work/w && echo work-ok; "
           "echo t > /tmp/t && echo tmp-ok; touch /app/x 2>/dev/null || echo app-ro")


@linux
@pytest.mark.parametrize(("user", "ids"), [
    ("1000", ("1000", "0")),            # a bare uid: group 0 unless passwd has it
    ("app", ("1001", "1002")),          # a name: its passwd entry
    ("app:staff", ("1001", "50")),      # a name and a group of the image's /etc/group
    ("1234:4321", ("1234", "4321")),
    ("root", ("0", "0")),
])
def test_the_images_user_is_the_commands_uid(images: Path, user: str,
                                             ids: tuple[str, str]) -> None:
    passwd = (b"root:x:0:0:root:/root:/bin/sh\napp:x:1001:1002::/work:/bin/sh\n"
              b"nobody:x:65534:65534::/:/bin/false\n")
    layout = busybox_layout(str(images / "layout"), {"User": user}, extra={
        "etc/passwd": passwd, "etc/group": b"root:x:0:\nstaff:x:50:\napp:x:1002:\n"})
    # the control: a default sandbox's commands run as uid 0 inside
    plain = busybox_layout(str(images / "plain"))

    async def go(p: Any) -> tuple[Any, Any]:
        out = []
        for lay in (layout, plain):
            sb = await p.create(SandboxSpec(tenant_id="t", image=lay))
            try:
                out.append(await sb.exec(["sh", "-c", ID_VIEW]))
                await sb.write_file("f", b"x")  # the agent writes as that user too
            finally:
                await sb.destroy()
        return out[0], out[1]
    r, control = _run(go, images / "cache")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == [*ids, ids[0], "work-ok", "tmp-ok", "app-ro"]
    assert control.stdout.decode().split()[:2] == ["0", "0"]


@linux
def test_the_agent_serves_an_image_root_fully(images: Path) -> None:
    # what the agent does beyond a spawn (files, a snapshot and restore, a kill, a
    # timeout) works with no host interpreter file in the view
    layout = busybox_layout(str(images / "layout"), {"Env": ["PATH=/bin"]})

    async def go(p: Any) -> list[Any]:
        from corral.core.spec import ExecOpts
        sb = await p.create(SandboxSpec(tenant_id="t", image=layout))
        try:
            await sb.write_file("a/b.txt", b"one")
            snap = await sb.snapshot()
            await sb.write_file("a/b.txt", b"two")
            await sb.restore(snap)
            with pytest.raises(SandboxTimeoutError):
                await sb.exec(["sleep", "30"], ExecOpts(timeout_ms=300))
            after = await sb.exec(["cat", "/work/a/b.txt"])
            missing = await sb.exec(["no-such-command"])
            return [after.stdout, missing.exit_code, missing.stderr]
        finally:
            await sb.destroy()
    after, code, err = _run(go, images / "cache")
    assert after == b"one" and code == 127 and b"not found" in err


@linux
def test_corral_run_image(images: Path) -> None:
    layout = busybox_layout(str(images / "layout"), {"Env": ["PATH=/bin", "FOO=img"]})
    env = {**os.environ, "XDG_CACHE_HOME": str(images / "xdg")}
    cmd = [sys.executable, "-m", "corral", "run", "--json", "--image", layout, "--",
           "sh", "-c", "echo $FOO; cat /etc/image-marker; test -e /usr || echo no-usr"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    doc = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert doc["stdout"].splitlines() == ["img", "from the image", "no-usr"]
    bad = subprocess.run([*cmd[:4], "--level", "context-isolated", *cmd[4:]],
                         capture_output=True, text=True, timeout=120, env=env, check=False)
    assert bad.returncode == 64 and "--image" in bad.stderr


#: the console script's code with argv passed (tests/cli/test_oneshot.py's ENTRY), saying
#: whether the library path (asyncio) was loaded
ENTRY = ("import sys, _corral_cli; code = _corral_cli.main(sys.argv[1:]); "
         "sys.stderr.write('corral-test: asyncio %s\\n' % ('asyncio' in sys.modules)); "
         "sys.exit(code)")


@linux
def test_corral_run_image_takes_the_one_shot_path(images: Path) -> None:
    layout = busybox_layout(str(images / "layout"), {
        "Env": ["PATH=/bin", "FOO=img"], "WorkingDir": "/app", "User": "1000"})
    env = {**os.environ, "XDG_CACHE_HOME": str(images / "xdg"), "CORRAL_CLI_TRACE": "1"}
    argv = [sys.executable, "-c", ENTRY, "run", "--image", layout, "--", "sh", "-c",
            "pwd; id -u; echo $FOO; cat /etc/image-marker; test -e /usr || echo no-usr"]
    for _ in range(2):  # the first unpacks the image, the second finds it in the cache
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                              stdin=subprocess.DEVNULL, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["/app", "1000", "img", "from the image", "no-usr"]
        assert "corral: trace: one-shot path" in done.stderr, done.stderr
        assert "corral-test: asyncio False" in done.stderr
    # a bare name not on the image's PATH: not found, as on the library path
    done = subprocess.run([*argv[:7], "--", "python3", "-c", "1"], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 127, done.stderr
    # a User that does not map: the one-shot path leaves it to the library path's refusal
    bad = busybox_layout(str(images / "bad"), {"User": "ghost"})
    done = subprocess.run([*argv[:5], bad, "--", "true"], capture_output=True, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 64 and "does not map" in done.stderr, done.stderr
    assert "one-shot path" not in done.stderr


@linux
def test_a_fork_of_the_agent_never_imports_the_images_files(images: Path) -> None:
    # the image holds a module at the host interpreter's own stdlib path, which is on
    # the agent's sys.path: a lazy import in pid 1 (or a fork of it) would run it
    stdlib = os.path.dirname(os.__file__)
    planted = {f"{stdlib.lstrip('/')}/corral_planted.py":
               b"import os\nos.write(1, b'PLANTED RAN\\n')\n"}
    layout = busybox_layout(str(images / "layout"), {"Env": ["PATH=/bin"]}, extra=planted)
    stmt = "import corral_planted"

    async def go(p: Any) -> tuple[bytes, bytes, int | None, bytes]:
        from corral.core.spec import ProcessOpts
        assert await p.preload_python(["timeit", "getopt"], fork_entries=["timeit:main"]) == []
        sb = await p.create(SandboxSpec(tenant_id="t", image=layout))
        try:
            there = await sb.exec(["cat", f"{stdlib}/corral_planted.py"])
            outs = []
            for s in ("pass", stmt):  # control: the entry runs; then the planted import
                proc = await sb.start_python_fork(["-n", "1", "-r", "1", s],
                                                  ProcessOpts(stdin=False), entry="timeit:main")
                out = b"".join([c async for c in proc.stdout])
                err = b"".join([c async for c in proc.stderr])
                outs.append((out, err, (await proc.wait()).exit_code))
            return there.stdout, outs[0][0], outs[1][2], outs[1][0] + outs[1][1]
        finally:
            await sb.destroy()
    there, control, code, refused = _run(go, images / "cache")
    assert b"PLANTED RAN" in there  # the file is in the image, at that path
    assert b"1 loop" in control  # the fork entry itself runs
    assert b"PLANTED RAN" not in refused, (code, refused)
    assert b"No module named 'corral_planted'" in refused, refused
    # control on the host: on a path, that file is imported and runs
    root = images / "cache"
    rootfs = next(str(d / "rootfs") for d in root.iterdir() if (d / "rootfs").is_dir())
    host = subprocess.run([sys.executable, "-I", "-c",
                           f"import sys; sys.path.insert(0, {rootfs + stdlib!r}); {stmt}"],
                          capture_output=True, timeout=60, check=True)
    assert b"PLANTED RAN" in host.stdout


def fake_env(store: Path, name: str, image: str | None) -> Any:
    """An environment in the store at ``store`` as a build leaves it (a file under
    ``site/``, its meta naming the base image ``image``), without building one."""
    from corral.envs.store import EnvStore, digest_of
    st = EnvStore(store)
    inputs = {"v": 1, "fake": name, "image": image}
    digest = digest_of(inputs)
    temp = st.new_temp()
    (temp / "site").mkdir(mode=0o755)
    (temp / "site" / "marker.txt").write_text(f"env {name}\n")
    (temp / "meta.json").write_text(json.dumps({"digest": digest, "inputs": inputs,
                                                "modules": [], "size_bytes": 1}))
    env = st.publish(temp, digest)
    st.set_name(name, digest)
    return env


def test_the_plan_spreads_the_environments_mount() -> None:
    from corral.envs.store import ENV_MOUNT
    from corral.providers.linux.policy import plan
    assert plan._ENV_MOUNT == ENV_MOUNT  # the plan's copy (it loads no envs code)


def _image_key(layout: str, cache: Path) -> str:
    from corral.images import resolve
    from corral.images.cache import ImageCache
    return resolve(layout, cache=ImageCache(str(cache))).key


@linux
def test_an_environment_is_shown_only_to_the_root_it_was_built_for(images: Path) -> None:
    # an environment's packages are built for one interpreter: the host's, or a base
    # image's (by its content key); any other root is refused at create, typed, saying
    # why, never shown a tree it cannot load. The image it was built on gets it bound
    # read-only at the same path, on the PYTHONPATH.
    # (the image has an /opt of its own: its entries stay, the packages go beside them)
    layout = busybox_layout(str(images / "layout"), {"Env": ["PATH=/bin"]},
                            extra={"opt/tool/readme": b"the image's own /opt\n"})
    other = busybox_layout(str(images / "other"), {"Env": ["PATH=/bin", "B=2"]})
    store = images / "envs"
    key, key_b = _image_key(layout, images / "cache"), _image_key(other, images / "cache")
    assert key.startswith("sha256:") and key != key_b
    fake_env(store, "host-env", None)
    fake_env(store, "on-a", key)

    async def go(p: Any) -> None:
        for image, env, why in ((layout, "host-env", "host's interpreter"),
                                (other, "on-a", "another image"),
                                (None, "on-a", "runs the host's")):
            with pytest.raises(ConfigInvalidError, match=why) as ei:
                await p.create(SandboxSpec(tenant_id="t", image=image, environment=env))
            assert ei.value.field == "environment"
        async with await p.create(SandboxSpec(tenant_id="t", image=layout,
                                              environment="on-a")) as sb:
            r = await sb.exec(["/bin/sh", "-c", "cat /opt/corral/env/marker.txt; "
                               "echo PYTHONPATH=$PYTHONPATH; cat /etc/image-marker; "
                               "cat /opt/tool/readme; touch /opt/corral/env/x || echo ro"])
        assert r.stdout_text.splitlines()[:4] == [
            "env on-a", "PYTHONPATH=/opt/corral/env", "from the image",
            "the image's own /opt"], r.stderr_text
        assert r.stdout_text.splitlines()[-1] == "ro"

    _run(go, images / "cache", env_store_dir=str(store))
