"""What a ``fork_call`` child of a strict sandbox's agent is given, call after call: the
agent sets the env and cwd before it forks (the child inherits them, it sets up nothing
itself), an entry without ``corral_raw_stdio`` still gets text wrappers on 0/1/2, and a
run's snippet builtins (prebuilt in the fork server) never carry over to the next run."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from snippet_levels import STRICT_SKIP

from corral.core.errors import ConfigInvalidError
from corral.core.spec import ProcessOpts, SandboxLimits, SandboxSpec
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet
from corral.snippets.sandbox.worker import Collector
from strict_tier import needs_strict

pytestmark = needs_strict(STRICT_SKIP)

_WORKER = "corral.snippets.sandbox.worker:main"
_PRINT = "pprint:pprint"  # a stdlib entry that writes its argument to sys.stdout
_PROBE = "import os\nenv = dict(os.environ)\ncwd = os.getcwd()\n"


def _job(source: str) -> bytes:
    options: dict[str, Any] = {"timeout_ms": 5000, "grace_ms": 500, "mem_mb": 0, "caps": {},
                               "allowed": None, "forbidden": []}
    return json.dumps({"v": 1, "kind": "invoke", "input": {
        "op": "run", "files": [["main.py", source]], "options": options}}).encode() + b"\n"


async def _facts(sb: Any, opts: ProcessOpts) -> dict[str, Any]:
    proc = await sb.start_python_fork(["--once"], opts, entry=_WORKER)
    await proc.stdin.write(_job(_PROBE))
    await proc.stdin.close()
    collector = Collector({"timeout_ms": 5000})
    async for chunk in proc.stdout:
        collector.feed(chunk)
    status = await proc.wait()
    out = collector.finish(status.exit_code or 0, False, 0.0)
    assert not out["errors"], out["errors"]
    facts: dict[str, Any] = out["facts"]
    return facts


def test_each_fork_call_gets_its_own_env_and_cwd_and_wrappers_unless_raw() -> None:
    from corral.providers.linux import LinuxProvider

    async def main() -> None:
        provider = LinuxProvider(spares=0)
        try:
            assert await provider.preload_python(
                ["corral.snippets.sandbox.worker", "pprint"],
                fork_entries=[_WORKER, _PRINT]) == []
            sb = await provider.create(SandboxSpec(tenant_id="t", run_id="r",
                                                   limits=SandboxLimits(cpu_ms=20_000)))
            await sb.write_file("sub/keep.txt", b"")
            a = await _facts(sb, ProcessOpts(stdin=True, env={"ONLY_A": "a"}))
            b = await _facts(sb, ProcessOpts(stdin=True, env={"ONLY_B": "b"}, cwd="sub"))
            a2 = await _facts(sb, ProcessOpts(stdin=True, env={"ONLY_A": "a"}))
            assert a["env"]["ONLY_A"] == "a" and "ONLY_B" not in a["env"]
            assert b["env"]["ONLY_B"] == "b" and "ONLY_A" not in b["env"]
            assert a2 == a  # the agent's own state moved on and back: the child sees the call's
            assert a["cwd"] == "/work" and b["cwd"] == "/work/sub"
            with pytest.raises(ConfigInvalidError):  # refused by the agent, no child forked
                await sb.start_python_fork(["--once"], ProcessOpts(stdin=True, cwd="nope"),
                                           entry=_WORKER)
            # an entry that is not raw-stdio writes through a fresh sys.stdout on fd 1
            proc = await sb.start_python_fork(["x", "y"], ProcessOpts(stdin=True),
                                              entry=_PRINT)
            await proc.stdin.close()
            out = b"".join([chunk async for chunk in proc.stdout])
            assert out == b"['x', 'y']\n"
            assert (await proc.wait()).exit_code == 0
            assert len(sb.host_pids()) == 1  # the agent alone
            await sb.destroy()
        finally:
            await provider.aclose()

    asyncio.run(main())


def test_a_run_cannot_leave_anything_in_the_builtins_of_the_next() -> None:
    async def main() -> None:
        async with SnippetPool(spares=0, max_workers=1) as pool:
            first = await run_snippet(
                "__builtins__['planted'] = 1\n__builtins__['len'] = None\nok = 'planted' in "
                "__builtins__", pool=pool, tenant_id="a", _unsafe_skip_validation=True)
            assert first.to_dict()["facts"]["ok"] is True, first.errors
            second = await run_snippet(
                "seen = 'planted' in __builtins__\nn = len([1, 2])", pool=pool,
                tenant_id="a", _unsafe_skip_validation=True)
            assert second.to_dict()["facts"] == {"seen": False, "n": 2}, second.errors
            third = await run_snippet("n = len([1, 2, 3])", pool=pool, tenant_id="a")
            assert third.to_dict()["facts"] == {"n": 3}, third.errors
            # all three ran in one slot (one sandbox), each in a process of its own
            assert len({sandbox for _t, _l, sandbox, _p in pool.served}) == 1

    asyncio.run(main())
