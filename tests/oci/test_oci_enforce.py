"""What the oci provider enforces, probed from inside a container next to a control run
on the host; image roots; refusals; clean-up after a crash."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

from corral.core.errors import ConfigInvalidError, LevelNotSupportedError
from corral.core.spec import InvocationMode, NetworkPolicy, SandboxLimits, SandboxSpec

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dispatch"))
from imagebuild import Member, oci_layout

PY = "/usr/bin/python3"

# Each probe prints one word per attempt: what happened.
_PROBE = r"""
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, rc):
    e = ctypes.get_errno()
    print(name, "ok" if rc == 0 else errno.errorcode.get(e, str(e)))
attempt("unshare-user", libc.unshare(0x10000000))
attempt("unshare-net", libc.unshare(0x40000000))
attempt("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
attempt("setuid0", libc.setuid(0))
lines = open("/proc/self/status").read().splitlines()
status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
print("capeff", status["CapEff"].strip())
print("nonewprivs", status["NoNewPrivs"].strip())
print("seccomp", status["Seccomp"].strip())
print("uid", os.getuid())
print("ifaces", ",".join(sorted(n for _, n in socket.if_nameindex())))
try:
    open("/usr/corral-probe", "w")
    print("write-usr ok")
except OSError as e:
    print("write-usr", errno.errorcode[e.errno])
"""


def _parse(out: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in out.strip().splitlines())


def test_probes_refused_inside_allowed_outside(make_oci: Callable[..., Any]) -> None:
    host = subprocess.run([PY, "-I", "-S", "-c", _PROBE], capture_output=True, text=True,
                          check=True, timeout=30)
    control = _parse(host.stdout)
    # the control run (root on the host) can do what the sandbox must not
    assert control["unshare-user"] == "ok" and control["unshare-net"] == "ok", control
    assert control["capeff"] != "0000000000000000", control

    async def go() -> dict[str, str]:
        p = make_oci("crun")
        try:
            async with await p.create(SandboxSpec()) as sb:
                r = await sb.exec([PY, "-I", "-S", "-c", _PROBE])
                assert r.exit_code == 0, r
                return _parse(r.stdout_text)
        finally:
            await p.aclose()

    inside = asyncio.run(go())
    assert inside["unshare-user"] == "EPERM", inside
    assert inside["unshare-net"] == "EPERM", inside
    assert inside["mount"] == "EPERM", inside
    assert inside["setuid0"] == "EPERM", inside
    assert inside["capeff"] == "0000000000000000", inside
    assert inside["nonewprivs"] == "1", inside
    assert inside["seccomp"] == "2", inside
    assert inside["uid"] != "0", inside
    assert inside["ifaces"] == "lo", inside
    assert inside["write-usr"] in ("EROFS", "EACCES"), inside


def _busybox_image(root: str, handler: bytes | None = None) -> str:
    bb = shutil.which("busybox")
    if bb is None or b"statically linked" not in subprocess.run(
            ["file", "-L", bb], capture_output=True, check=False).stdout:
        pytest.skip("needs busybox-static for an image with its own userland")
    with open(bb, "rb") as f:
        data = f.read()
    members = [Member("bin", "dir", mode=0o755), Member("bin/busybox", data=data, mode=0o755),
               Member("etc", "dir", mode=0o755),
               Member("etc/corral-marker", data=b"from the image\n")]
    for applet in ("sh", "cat", "id", "ls", "echo", "test"):
        members.append(Member(f"bin/{applet}", "symlink", link="busybox"))
    config: dict[str, Any] = {"Env": ["PATH=/bin", "IMAGE_VAR=set"], "WorkingDir": "/work"}
    if handler is not None:  # a handler image: its entrypoint a shell script
        members += [Member("app", "dir", mode=0o755), Member("app/h.sh", data=handler)]
        config.update(Entrypoint=["/bin/sh"], Cmd=["/app/h.sh"])
    return oci_layout(root, [members], config=config)


def test_image_is_the_root(make_oci: Callable[..., Any]) -> None:
    """A command sees the image's own files and programs, not the host's."""
    tmp = tempfile.mkdtemp(prefix="corral-oci-img-")
    try:
        image = _busybox_image(os.path.join(tmp, "layout"))

        async def go() -> str:
            p = make_oci("crun", image_cache_dir=os.path.join(tmp, "cache"))
            try:
                spec = SandboxSpec(image=image, mode=InvocationMode.HANDLER_IMAGE)
                async with await p.create(spec) as sb:
                    await sb.write_file("in.txt", "given")
                    r = await sb.exec(["sh", "-c", "cat /etc/corral-marker; echo $IMAGE_VAR; "
                                       "test -e /usr/bin/python3 && echo host-python; "
                                       "cat in.txt; echo; id -u"])
                    assert r.exit_code == 0, r
                    return r.stdout_text
            finally:
                await p.aclose()
                assert not p.leaks()

        out = asyncio.run(go()).splitlines()
        assert out[0] == "from the image" and out[1] == "set", out
        assert "host-python" not in out, out
        assert out[2] == "given" and out[3] != "0", out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_refusals_are_typed(make_oci: Callable[..., Any]) -> None:
    async def go() -> None:
        p = make_oci("crun")
        try:
            for policy in (NetworkPolicy.allowlist("example.invalid"),
                           NetworkPolicy.unrestricted()):
                with pytest.raises(LevelNotSupportedError) as ei:
                    await p.create(SandboxSpec(network=policy))
                assert ei.value.field == "network" and ei.value.missing
            with pytest.raises(ConfigInvalidError):
                await p.create(SandboxSpec(limits=SandboxLimits(mem_mb=8)))
            with pytest.raises(ConfigInvalidError):
                await p.create(SandboxSpec(image="/nonexistent/corral-image"))
            assert not p.leaks()
        finally:
            await p.aclose()

    asyncio.run(go())


def test_runsc_is_a_typed_refusal(tmp_path: Any) -> None:
    """runsc absent: refused naming it; present (a stand-in binary here): refused naming
    what the provider cannot do with it yet, never run weaker."""
    from corral.providers.oci import OciProvider
    if shutil.which("runsc") is None:
        with pytest.raises(LevelNotSupportedError) as ei:
            OciProvider("runsc")
        assert "runsc is not installed" in ei.value.missing
    fake = tmp_path / "runsc"
    fake.write_text("#!/bin/sh\necho 'runsc version 0.0~stand-in'\n")
    fake.chmod(0o755)
    with pytest.raises(LevelNotSupportedError) as ei:
        OciProvider("runsc", runtime_path=str(fake))
    assert "128+N" in ei.value.missing and "stand-in" in ei.value.missing
    with pytest.raises(ConfigInvalidError):
        OciProvider("docker")


def test_crash_of_the_container_leaves_nothing(make_oci: Callable[..., Any]) -> None:
    """The container's init killed from outside (a crash): exec fails typed, destroy
    still removes the container, bundle and cgroups."""
    async def go() -> None:
        p = make_oci("crun")
        try:
            sb = await p.create(SandboxSpec(limits=SandboxLimits(max_processes=16)))
            proc = await sb.start_process([PY, "-c", "import time; time.sleep(60)"])
            with open(os.path.join(sb.bundle, "init.pid")) as f:
                pid = int(f.read())
            os.kill(pid, signal.SIGKILL)
            st = await asyncio.wait_for(proc.wait(), 20)
            assert st.exit_code != 0
            assert not sb.alive
            await sb.destroy()
            assert not p.leaks(), p.leaks()
        finally:
            await p.aclose()

    asyncio.run(go())


def test_aclose_destroys_live_sandboxes(make_oci: Callable[..., Any]) -> None:
    async def go() -> None:
        p = make_oci("crun")
        sbs = [await p.create(SandboxSpec()) for _ in range(2)]
        procs = [await sb.start_process([PY, "-c", "import time; time.sleep(60)"])
                 for sb in sbs]
        state = p.state_dir
        await p.aclose()
        for proc in procs:
            st = await asyncio.wait_for(proc.wait(), 20)
            assert st.exit_code != 0
        assert not os.path.exists(state)
        assert not p.leaks()

    asyncio.run(go())


def test_output_cap_and_timeout_leave_it_usable(make_oci: Callable[..., Any]) -> None:
    """Output past the cap and a timeout end the command (typed), the sandbox serves on,
    and a process that left the command's group lives only until destroy."""
    from corral.core.errors import LimitsExceededError, SandboxTimeoutError
    from corral.core.spec import ExecOpts

    async def go() -> None:
        p = make_oci("crun")
        try:
            sb = await p.create(SandboxSpec())
            with pytest.raises(LimitsExceededError) as ei:
                await sb.exec([PY, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"],
                              ExecOpts(max_stdout_bytes=1000))
            assert ei.value.limit == "output"
            assert ei.value.result is not None and len(ei.value.result.stdout) == 1000
            # each command says when its child is in place; the timeout must strike after
            # that (checked: its output), else the count below proves nothing (the tree)
            # or fails (the daemon: killed with the group before it left it; once seen on
            # a loaded host with a 500 ms timeout)
            tree = ("import os, time\n"
                    "if os.fork() == 0:\n    time.sleep(60); os._exit(0)\n"
                    "print('forked', flush=True)\ntime.sleep(60)\n")
            with pytest.raises(SandboxTimeoutError) as te:
                await sb.exec([PY, "-c", tree], ExecOpts(timeout_ms=3000))
            assert te.value.stdout == b"forked\n", te.value.stdout
            assert sb.process_count() == 0  # the child in the command's group died too
            daemon = ("import os, time\n"
                      "r, w = os.pipe()\n"
                      "if os.fork() == 0:\n"
                      "    os.setsid(); os.write(w, b'x'); time.sleep(60); os._exit(0)\n"
                      "os.read(r, 1)\nprint('detached', flush=True)\ntime.sleep(60)\n")
            with pytest.raises(SandboxTimeoutError) as te:
                await sb.exec([PY, "-c", daemon], ExecOpts(timeout_ms=3000))
            assert te.value.stdout == b"detached\n", te.value.stdout
            assert sb.process_count() >= 1  # the setsid'd child, adopted by the init
            r = await sb.exec([PY, "-c", "print('alive')"])
            assert r.stdout == b"alive\n"
            await sb.destroy()
            assert not p.leaks(), p.leaks()
        finally:
            await p.aclose()

    asyncio.run(go())


def test_registry_name_and_levels() -> None:
    import corral
    from corral.providers.oci import OciProvider
    try:
        p = corral.provider("oci", runtime="crun", level="strict")
    except LevelNotSupportedError as e:
        pytest.skip(f"oci/crun unusable here: {e.missing}")
    assert isinstance(p, OciProvider) and p.name == "oci/crun"
    asyncio.run(p.aclose())
    with pytest.raises(LevelNotSupportedError):
        corral.provider("oci", runtime="crun", level="context-isolated")


_CRASHER = r"""
import asyncio, json, os, sys, time
from corral.providers.oci import OciProvider
from corral.core.spec import SandboxSpec
async def main():
    p = OciProvider("crun")
    sb = await p.create(SandboxSpec())
    proc = await sb.start_process(["/usr/bin/python3", "-c", "import time; time.sleep(120)"])
    with open(os.path.join(sb.bundle, "init.pid")) as f:
        init = int(f.read())
    print(json.dumps({"tag": p._tag, "state": p.state_dir, "init": init,
                      "cg": sb.counters.dirs}), flush=True)
    time.sleep(120)
asyncio.run(main())
"""


def test_provider_process_killed_leaves_nothing(make_oci: Callable[..., Any]) -> None:
    """The process holding the provider is SIGKILLed with a container running: its
    guardian deletes the container, its cgroups and the state dir."""
    import json
    import time
    make_oci("crun")  # skip where crun cannot run
    child = subprocess.Popen([sys.executable, "-c", _CRASHER], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        facts = json.loads(child.stdout.readline())
        assert os.path.isdir(facts["state"]) and all(os.path.isdir(d) for d in facts["cg"])
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = [d for d in facts["cg"] if os.path.exists(d)]
        if not left and not os.path.exists(facts["state"]):
            break
        time.sleep(0.1)
    assert not [d for d in facts["cg"] if os.path.exists(d)], "cgroups left"
    assert not os.path.exists(facts["state"]), "state dir left"
    try:
        with open(f"/proc/{facts['init']}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        cmdline = b""
    assert b"init" not in cmdline, "the container's init still runs"


def test_cpu_ms_holds_for_the_whole_sandbox(make_oci: Callable[..., Any]) -> None:
    """``cpu_ms`` is the sandbox's total: a spinner that left the command's group (so no
    exec is running) is killed at the cap too, and later commands are refused."""
    from corral.core.errors import LimitsExceededError

    spinner = ("import os, time\n"
               "if os.fork() == 0:\n    os.setsid()\n    while True: pass\n"
               "print('started')\n")

    async def go() -> None:
        p = make_oci("crun")
        try:
            sb = await p.create(SandboxSpec(limits=SandboxLimits(cpu_ms=300)))
            r = await sb.exec([PY, "-c", spinner])
            assert r.stdout == b"started\n"
            for _ in range(200):  # the detached spinner burns the budget, then dies
                if sb.process_count() == 0 and sb._cpu_spent:
                    break
                await asyncio.sleep(0.05)
            assert sb._cpu_spent and sb.process_count() == 0
            with pytest.raises(LimitsExceededError) as ei:
                await sb.exec([PY, "-c", "print('more')"])
            assert ei.value.limit == "cpu"
            proc = await sb.start_process([PY, "-c", "import time; time.sleep(30)"])
            st = await asyncio.wait_for(proc.wait(), 20)
            assert st.exit_code != 0
            await sb.destroy()
            assert not p.leaks()
        finally:
            await p.aclose()

    asyncio.run(go())


def test_streaming_exec_and_destroy_while_paused(make_oci: Callable[..., Any]) -> None:
    from corral.core.contract import SupportsPause, SupportsStreamingExec

    async def go() -> None:
        p = make_oci("crun")
        try:
            sb = await p.create(SandboxSpec())
            assert isinstance(sb, SupportsStreamingExec) and "streaming-exec" in p.capabilities
            got: list[tuple[int, bytes]] = []
            r = await sb.exec_streaming(
                [PY, "-c", "import sys; print('a', flush=True); sys.stderr.write('b')"],
                on_output=lambda fd, chunk: got.append((fd, chunk)))
            assert r.stdout == b"a\n" and r.stderr == b"b"
            assert b"".join(c for fd, c in got if fd == 1) == b"a\n"
            assert b"".join(c for fd, c in got if fd == 2) == b"b"
            if "pause" in p.capabilities:
                assert isinstance(sb, SupportsPause)
                proc = await sb.start_process([PY, "-c", "import time; time.sleep(60)"])
                await sb.pause()
                await sb.destroy()  # frozen processes must still die
                st = await asyncio.wait_for(proc.wait(), 20)
                assert st.exit_code != 0
            else:
                await sb.destroy()
            assert not p.leaks(), p.leaks()
        finally:
            await p.aclose()

    asyncio.run(go())


def test_handler_image_runs_the_images_entrypoint(make_oci: Callable[..., Any]) -> None:
    """Mode handler-image through ``invoke``: the image's own Entrypoint + Cmd (busybox
    sh, no Python inside) answers the invoke frame (tests/linux/test_handler_image.py
    for the linux provider)."""
    from corral.core.spec import HandlerRef
    from corral.dispatch import HandlerOutput, invoke
    tmp = tempfile.mkdtemp(prefix="corral-oci-handler-")
    try:
        script = (b"read -r line\nprintf '{\"v\":1,\"kind\":\"output\",\"output\":"
                  b"{\"frame\":%s,\"uid\":\"%s\"}}\\n' \"$line\" \"$(id -u)\"\n")
        image = _busybox_image(os.path.join(tmp, "layout"), script)

        async def go() -> Any:
            p = make_oci("crun", image_cache_dir=os.path.join(tmp, "cache"))
            try:
                spec = SandboxSpec(tenant_id="acme", run_id="r1", image=image,
                                   mode=InvocationMode.HANDLER_IMAGE)
                return await invoke(p, spec, HandlerRef(artifact_id="a", version="1"),
                                    {"x": 1}, timeout_ms=60_000)
            finally:
                await p.aclose()
                assert not p.leaks()

        out = asyncio.run(go())
        assert isinstance(out, HandlerOutput), out
        assert out.value["frame"]["input"] == {"x": 1}
        assert out.value["frame"]["ctx"]["runId"] == "r1" and out.value["uid"] != "0"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
