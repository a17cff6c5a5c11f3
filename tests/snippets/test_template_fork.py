"""Strict snippet slots fork one worker per job from the sandbox's agent (no execve, no
long-lived template): the worker is set up like a spawned command, keeps the sandbox's
containment, holds no descriptor, env or import path of the agent's, and never imports
code planted by sandboxed code in the writable area (/work, /tmp), nor does the agent."""

from __future__ import annotations

import asyncio
import os
import sysconfig
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from snippet_levels import STRICT_SKIP

import corral
from corral.core.errors import ConfigInvalidError
from corral.core.spec import ExecOpts, ProcessOpts, SandboxLimits, SandboxSpec
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet
from strict_tier import needs_strict

pytestmark = needs_strict(STRICT_SKIP)

_PKG = os.path.dirname(os.path.abspath(str(corral.__file__)))
_ROOT = os.path.dirname(_PKG)
_HOST_CANARY = "CORRAL_TEMPLATE_TEST_SECRET"
_WORKER = "corral.snippets.sandbox.worker:main"


#: where the interpreter's own modules live (/usr/ for Debian's, a pyenv prefix for pyenv's)
_STDLIB = ("/usr/", *{os.path.realpath(sysconfig.get_paths()[k]) + "/"
                      for k in ("stdlib", "platstdlib")})


def _pool_test(test: Callable[[SnippetPool], Awaitable[None]]) -> None:
    async def main() -> None:
        async with SnippetPool(spares=0, max_workers=2) as pool:
            await test(pool)
    asyncio.run(main())


def _slot(pool: SnippetPool, tenant: str) -> Any:
    return next(s for (_lv, t), q in pool._idle.items() if t == tenant for s in q)


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def test_a_warm_slot_is_its_agent_alone() -> None:
    async def check(pool: SnippetPool) -> None:
        await pool.prewarm(tenant_id="a")
        slot = _slot(pool, "a")
        assert len(slot.sandbox.host_pids()) == 1  # no template: the agent only
        assert slot.server_pid == 1
        t = await run_snippet("1+1", pool=pool, tenant_id="a")
        assert t.result == "2"
        await asyncio.sleep(0.05)
        assert len(slot.sandbox.host_pids()) == 1  # the run's process is gone

    _pool_test(check)


def test_the_per_job_worker_is_a_contained_fork_of_the_agent() -> None:
    async def check(pool: SnippetPool) -> None:
        await pool.prewarm(tenant_id="a")
        slot = _slot(pool, "a")
        (agent,) = slot.sandbox.host_pids()
        # a worker waiting for its job (stdin still open), as the pool starts one
        proc = await slot.sandbox.start_python_fork(["--once"], ProcessOpts(stdin=True, env={}),
                                                    entry=_WORKER)
        try:
            _agent, worker = slot.sandbox.host_pids()
            with open(f"/proc/{agent}/cmdline", "rb") as f1, \
                    open(f"/proc/{worker}/cmdline", "rb") as f2:
                assert f1.read() == f2.read()  # forked, not exec'd

            def set_up() -> bool:  # the child sets itself up after the agent replied
                fds = sorted(int(fd) for fd in os.listdir(f"/proc/{worker}/fd"))
                return os.getsid(worker) == worker and fds == [0, 1, 2]

            for _ in range(500):
                if set_up():
                    break
                await asyncio.sleep(0.01)
            assert os.getsid(worker) == worker and os.getpgid(worker) == worker
            st = _status(worker)
            assert st["NoNewPrivs"].strip() == "1" and st["Seccomp"].strip() == "2"
            assert int(st["CapEff"], 16) == 0 and int(st["CapBnd"], 16) == 0
            assert int(st["PPid"]) == agent or st["PPid"].strip() == "0"
            fds = sorted(int(fd) for fd in os.listdir(f"/proc/{worker}/fd"))
            assert fds == [0, 1, 2]
            with open(f"/proc/{worker}/environ", "rb") as f:
                assert _HOST_CANARY.encode() not in f.read()
            await proc.stdin.write(b'{"v":1,"kind":"invoke","input":{"op":"ping"}}\n')
            await proc.stdin.close()
            assert b'"pong": true' in await anext(proc.stdout)
            assert (await proc.wait()).exit_code == 0
        finally:
            await proc.kill()

    os.environ[_HOST_CANARY] = "host-only"
    try:
        _pool_test(check)
    finally:
        del os.environ[_HOST_CANARY]


def test_what_a_run_sees_of_its_process() -> None:
    src = """
import os, sys
fds = []
for f in os.listdir('/proc/self/fd'):
    try:
        fds.append(os.readlink('/proc/self/fd/' + f))
    except OSError:
        pass  # listdir's own descriptor
path = list(sys.path)
env = dict(os.environ)
corral_paths = [list(getattr(m, '__path__', [])) for n, m in list(sys.modules.items())
                if n == 'corral' or n.startswith('corral.')]
cwd = os.getcwd()
"""

    async def check(pool: SnippetPool) -> None:
        t = await run_snippet(src, pool=pool, tenant_id="a", _unsafe_skip_validation=True)
        assert not t.errors, t.errors
        facts = t.to_dict()["facts"]
        assert not any(link.startswith("socket:") for link in facts["fds"]), facts["fds"]
        assert len(facts["fds"]) == 4, facts["fds"]  # 0/1/2 on /dev/null, the result pipe
        assert facts["path"], facts["path"]
        for p in facts["path"]:
            assert not p.startswith(("/work", "/tmp")) and p not in (_ROOT, _PKG, ""), p
        assert facts["env"] == {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work",
                                "TMPDIR": "/tmp"}
        assert all(paths == [] for paths in facts["corral_paths"]), facts["corral_paths"]
        assert facts["cwd"] == "/work"

    _pool_test(check)


def _plant_script(root: str) -> str:
    """Shell lines that plant a module named like stdlib and corral ones in every place
    an import could look for it inside the sandbox; each one, if imported, says so."""
    dirs = ["/work", "/tmp", f"/work{_ROOT}", f"/tmp{_ROOT}", "/work/src", "/tmp/src"]
    if root.startswith(("/work/", "/tmp/")):
        dirs.append(root)
    lines = []
    for d in dirs:
        pkg = f"{d}/corral/snippets"
        lines.append(f"mkdir -p {pkg} {d}/corral/providers/linux")
        for mod in ("colorsys", "gzip", "bz2", "lzma", "this_is_planted"):
            lines.append(f"echo 'PLANTED = True' > {d}/{mod}.py")
        for sub in (pkg, f"{d}/corral/providers/linux"):
            lines.append(f"echo 'PLANTED = True' > {sub}/planted_mod.py")
        lines.append(f"echo 'PLANTED = True' > {d}/corral/__init__.py")
    return "\n".join(lines)


def test_modules_planted_in_the_writable_area_are_never_imported() -> None:
    probe = """
import importlib
found = {}
for name in ('colorsys', 'gzip', 'bz2', 'lzma', 'this_is_planted',
             'corral.snippets.planted_mod', 'corral.providers.linux.planted_mod'):
    try:
        mod = importlib.import_module(name)
        found[name] = [getattr(mod, 'PLANTED', False), str(getattr(mod, '__file__', ''))]
    except ImportError as e:
        found[name] = ['ImportError', type(e).__name__]
"""

    async def check(pool: SnippetPool) -> None:
        await pool.prewarm(tenant_id="a")
        slot = _slot(pool, "a")
        res = await slot.sandbox.exec(["/bin/sh", "-c", _plant_script(_ROOT)],
                                      ExecOpts(timeout_ms=10_000))
        assert res.exit_code == 0, res.stderr
        # the agent serves file, snapshot and restore requests after the planting
        await slot.sandbox.write_file("x.txt", b"x")
        assert await slot.sandbox.read_file("x.txt") == b"x"
        handle = await slot.sandbox.snapshot()
        await slot.sandbox.restore(handle)
        res = await slot.sandbox.exec(["/bin/sh", "-c", _plant_script(_ROOT)],
                                      ExecOpts(timeout_ms=10_000))
        assert res.exit_code == 0, res.stderr
        # a run (a fresh fork of the agent) imports every planted name
        t = await run_snippet(probe, pool=pool, tenant_id="a", _unsafe_skip_validation=True)
        assert not t.errors, t.errors
        found = t.to_dict()["facts"]["found"]
        for name, (planted, where) in found.items():
            assert planted is not True, (name, where)
            if planted is False:
                assert where.startswith(_STDLIB), (name, where)
        assert found["this_is_planted"][0] == "ImportError"
        assert found["corral.snippets.planted_mod"][0] == "ImportError"
        assert found["corral.providers.linux.planted_mod"][0] == "ImportError"
        # and the validated path: an allowlisted, planted name still loads the stdlib one
        t = await run_snippet("import colorsys\ncolorsys.rgb_to_hsv(1.0, 0.0, 0.0)",
                              pool=pool, tenant_id="a")
        assert t.result == "(0.0, 1.0, 1.0)", t

    _pool_test(check)


def test_start_python_fork_refuses_unknown_or_unloaded_entries() -> None:
    from corral.providers.linux import LinuxProvider

    async def main() -> None:
        provider = LinuxProvider(spares=0)
        try:
            sb = await provider.create(SandboxSpec(tenant_id="t", run_id="r",
                                                   limits=SandboxLimits(cpu_ms=5000)))
            with pytest.raises(ConfigInvalidError) as e1:
                await sb.start_python_fork([], entry="os:system")
            assert e1.value.field == "entry"
            with pytest.raises(ConfigInvalidError) as e2:  # not preloaded in this sandbox
                await sb.start_python_fork([], entry=_WORKER)
            assert e2.value.field == "entry"
            await sb.destroy()
            assert sb.host_pids() == []
            # preloaded but not registered as a fork entry: still refused
            assert await provider.preload_python(["corral.snippets.sandbox.worker"]) == []
            sb = await provider.create(SandboxSpec(tenant_id="t", run_id="r1",
                                                   limits=SandboxLimits(cpu_ms=5000)))
            with pytest.raises(ConfigInvalidError) as e3:
                await sb.start_python_fork([], entry=_WORKER)
            assert e3.value.field == "entry"
            await sb.destroy()
            # an entry whose module is not loaded is refused at registration
            assert await provider.preload_python(
                [], fork_entries=["colorsys:rgb_to_hsv"]) == ["colorsys:rgb_to_hsv"]
            assert await provider.preload_python(["corral.snippets.sandbox.worker"],
                                                 fork_entries=[_WORKER]) == []
            sb = await provider.create(SandboxSpec(tenant_id="t", run_id="r2",
                                                   limits=SandboxLimits(cpu_ms=5000)))
            proc = await sb.start_python_fork(["--once"], ProcessOpts(stdin=True), entry=_WORKER)
            _agent, worker = sb.host_pids()
            with open(f"/proc/{worker}/limits", encoding="ascii") as f:
                cpu = next(line for line in f if line.startswith("Max cpu time"))
            assert cpu.split()[3] == "6", cpu  # cpu_ms 5000 -> 6 s, as for a command
            await proc.stdin.write(b'{"v":1,"kind":"invoke","input":{"op":"nope"}}\n')
            await proc.stdin.close()
            assert b'"refused"' in await anext(proc.stdout)  # an unknown op is refused
            status = await proc.wait()
            assert status.exit_code == 0
            await sb.destroy()
        finally:
            await provider.aclose()

    asyncio.run(main())
