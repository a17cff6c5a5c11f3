"""``spec.image`` per provider: a copied directory of handler files (inprocess, subproc)
or a read-only root filesystem under the host's interpreter (linux)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from dispatch_support import LINUX_WHY, entrypoint_member, shared_cache, shared_tmp
from imagebuild import Member, oci_layout

from cgroup_view import mine
from corral.core.errors import ConfigInvalidError
from corral.core.spec import HandlerRef, InvocationMode, Level, NetworkPolicy, SandboxSpec
from corral.dispatch import HandlerOutput, invoke
from corral.providers.inprocess import InProcessProvider
from corral.providers.linux.policy.plan import HostLayout, LinuxOptions, build_plan
from corral.providers.subproc import SubprocProvider
from strict_tier import needs_strict

LEVELS = {"inprocess": Level.NONE, "subproc": Level.CONTEXT_ISOLATED}


def _provider(name: str, temp: Path, **kw: Any) -> Any:
    cls = InProcessProvider if name == "inprocess" else SubprocProvider
    return cls(temp_dir=str(temp), **kw)


def _spec(name: str, **kw: Any) -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r", level=LEVELS[name],
                       network=NetworkPolicy.unrestricted(), **kw)


def _handler_dir(root: Path) -> Path:
    img = root / "img"
    (img / "pkg" / "deep").mkdir(parents=True)
    (img / "h.py").write_text("def handler(p, ctx):\n    return open('pkg/deep/d.txt').read()\n")
    (img / "pkg" / "deep" / "d.txt").write_text("data")
    (img / "suid").write_text("x")
    os.chmod(img / "suid", 0o4755)
    (root / "secret").write_text("outside")
    os.symlink(str(root / "secret"), img / "link")
    os.mkfifo(img / "fifo")
    return img


@pytest.mark.parametrize("name", sorted(LEVELS))
def test_an_image_dir_is_copied_into_the_work_dir(name: str, tmp_path: Path) -> None:
    img = _handler_dir(tmp_path)
    temp = tmp_path / "sandboxes"
    temp.mkdir()

    async def go() -> None:
        sb = await _provider(name, temp).create(_spec(name, mode="json-stdio", image=str(img)))
        try:
            work = Path(sb.work_dir)
            assert sorted(os.listdir(work)) == ["h.py", "link", "pkg", "suid"]  # no fifo
            assert await sb.read_file("pkg/deep/d.txt") == b"data"
            assert os.readlink(work / "link") == str(tmp_path / "secret")  # copied, not followed
            with pytest.raises(ConfigInvalidError):
                await sb.read_file("link")  # the file API still refuses to follow it
            assert stat.S_IMODE(os.stat(work / "suid").st_mode) == 0o755
            ref = HandlerRef(artifact_id="a", version="1", module_path="h.py")
            assert await _invoke_in(sb, ref) == HandlerOutput(value="data")
        finally:
            await sb.destroy()
        assert os.listdir(temp) == []
        assert (img / "h.py").exists()  # the source is untouched

    asyncio.run(go())


async def _invoke_in(sb: Any, ref: HandlerRef) -> Any:
    from corral.dispatch import invoke_in
    return await invoke_in(sb, ref, None, timeout_ms=20_000)


@pytest.mark.parametrize("name", sorted(LEVELS))
def test_image_refusals_leave_nothing(name: str, tmp_path: Path) -> None:
    img = _handler_dir(tmp_path)
    temp = tmp_path / "sandboxes"
    temp.mkdir()
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"mode": "handler-image", "image": str(img)}, "mode", "no root filesystem"),
        ({"mode": "json-stdio", "image": str(img / "h.py")}, "image", "existing local directory"),
        ({"mode": "json-stdio", "image": str(tmp_path / "missing")}, "image", "directory"),
        ({"image": str(img)}, "image", "only with mode 'json-stdio'"),
    ]
    for kw, fld, text in cases:
        with pytest.raises(ConfigInvalidError, match=text) as ei:
            asyncio.run(_provider(name, temp).create(_spec(name, **kw)))
        assert ei.value.field == fld
    with pytest.raises(ConfigInvalidError, match="more than 3 bytes") as ei:
        asyncio.run(_provider(name, temp, max_image_bytes=3).create(
            _spec(name, mode="json-stdio", image=str(img))))
    assert ei.value.field == "image"
    assert os.listdir(temp) == []


def test_inprocess_in_context_takes_no_image(tmp_path: Path) -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        asyncio.run(InProcessProvider().create(_spec(
            "inprocess", mode="in-context", image=str(tmp_path))))
    assert ei.value.field == "image"


# ---------------------------------------------------------------- linux

HOST = HostLayout(euid=1000, egid=1000, prefixes=("/opt/venv",), package_root="/srv/src")


def test_the_plan_binds_the_rootfs_first_and_takes_the_image_env() -> None:
    spec = SandboxSpec(tenant_id="t", run_id="r", mode="json-stdio", image="img")
    plan = build_plan(spec, options=LinuxOptions(), host=HOST, rootfs="/cache/x/rootfs",
                      image_env={"CORRAL_HANDLER": "app.h", "PATH": "/app/bin"})
    assert (plan.mounts[0].kind, plan.mounts[0].source) == ("rootfs", "/cache/x/rootfs")
    assert "/srv/src" in [m.target for m in plan.mounts if m.kind == "bind"]  # corral too
    assert plan.env_base["CORRAL_HANDLER"] == "app.h" and plan.env_base["PATH"] == "/app/bin"
    with pytest.raises(ConfigInvalidError, match="unpacked rootfs"):
        build_plan(spec, options=LinuxOptions(), host=HOST)
    with pytest.raises(ConfigInvalidError, match="ImageRoot"):  # no mode: the image's root
        build_plan(SandboxSpec(tenant_id="t", run_id="r", image="img"),
                   options=LinuxOptions(), host=HOST, rootfs="/cache/x/rootfs")


linux = needs_strict(LINUX_WHY)

APP = b'''
import os
def handler(payload, ctx):
    try:
        open("/app/new", "w")
        wrote = "yes"
    except OSError as e:
        wrote = e.strerror
    open("/work/ok", "w").write("fine")
    return {"app": sorted(os.listdir("/app")), "root_write": wrote, "cwd": os.getcwd(),
            "env": os.environ.get("GREETING"), "usr": os.path.isdir("/usr/bin")}
'''
_WANT = {"app": ["h.py"], "root_write": "Read-only file system", "cwd": "/work",
         "env": "hi", "usr": True}


def _run_linux(image: str, ref: HandlerRef, **kw: Any) -> Any:
    from corral.providers.linux import LinuxProvider

    async def go() -> Any:
        p = LinuxProvider(image_cache_dir=shared_cache())
        try:
            # json-stdio: the image's files over the host's system dirs, its entrypoint
            # run by the host's interpreter (mode handler-image runs the image's own
            # userland: tests/linux/test_handler_image.py)
            spec = SandboxSpec(tenant_id="t", run_id="r", mode=InvocationMode.JSON_STDIO,
                               image=image)
            entry = dataclasses.replace(ref, entrypoint_path="/corral/handler-base/entrypoint.py")
            return await invoke(p, spec, entry, None, timeout_ms=20_000, **kw)
        finally:
            spares = await p.wait_spares()  # also finishes removing destroyed ones
            live = len(mine()) - spares  # this process's sandbox cgroups less idle spares
            await p.aclose()
            assert live == 0
    return asyncio.run(go())


@linux
def test_an_images_entrypoint_runs_its_files_and_env_read_only() -> None:
    img = oci_layout(os.path.join(shared_tmp("app"), "img"), [
        [Member("corral/", "dir"), Member("corral/handler-base/", "dir"), entrypoint_member()],
        [Member("app/", "dir"), Member("app/h.py", data=APP)]],
        config={"Env": ["CORRAL_HANDLER=/app/h.py:handler", "GREETING=hi"]})
    ref = HandlerRef(artifact_id="a", version="1", module_path="/app/h.py")
    assert _run_linux(img, ref) == HandlerOutput(value=_WANT)


@linux
def test_a_rootfs_directory_is_an_image_too() -> None:
    root = Path(shared_tmp("rootfs"))
    (root / "corral" / "handler-base").mkdir(parents=True)
    (root / "corral" / "handler-base" / "entrypoint.py").write_bytes(entrypoint_member().data)
    (root / "app").mkdir()
    (root / "app" / "h.py").write_bytes(APP)
    for d in (root, root / "corral", root / "corral" / "handler-base", root / "app"):
        os.chmod(d, 0o755)
    ref = HandlerRef(artifact_id="a", version="1", module_path="/app/h.py")
    out = _run_linux(str(root), ref, files={"x": "1"})
    assert out == HandlerOutput(value={**_WANT, "env": None})
    assert sorted(os.listdir(root / "app")) == ["h.py"]


@linux
def test_a_hostile_image_is_refused_before_any_sandbox() -> None:
    img = oci_layout(os.path.join(shared_tmp("evil"), "img"),
                     [[Member("../escape", data=b"x")]])
    ref = HandlerRef(artifact_id="a", version="1", module_path="h.py")
    before = sorted(os.listdir(shared_cache())) if os.path.isdir(shared_cache()) else []
    with pytest.raises(ConfigInvalidError) as ei:
        _run_linux(img, ref)
    assert ei.value.field == "image"
    after = sorted(os.listdir(shared_cache()))
    assert after == before  # no entry, no temp dir


@linux
@pytest.mark.skipif(os.geteuid() != 0, reason="only root's sandboxes run as another uid")
def test_an_image_the_sandbox_user_cannot_reach_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "rootfs" / "app").mkdir(parents=True)  # pytest's tmp dirs are 0700
    ref = HandlerRef(artifact_id="a", version="1", module_path="h.py")
    with pytest.raises(ConfigInvalidError, match="cannot reach") as ei:
        _run_linux(str(tmp_path / "rootfs"), ref)
    assert ei.value.field == "image"


@linux
def test_an_image_with_a_mode_that_takes_none_is_refused() -> None:
    # (without a mode an image is the sandbox's root: tests/linux/test_image_root.py)
    from corral.providers.linux import LinuxProvider

    async def go() -> None:
        p = LinuxProvider(image_cache_dir=shared_cache())
        try:
            with pytest.raises(ConfigInvalidError, match="image") as ei:
                await p.create(SandboxSpec(tenant_id="t", run_id="r", image=shared_cache(),
                                           mode="in-context"))
            assert ei.value.field == "image"
        finally:
            await p.aclose()
    asyncio.run(go())
