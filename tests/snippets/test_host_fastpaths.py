"""The host side's per-run shortcuts (issue 14, the load goal) keep every check they
replace: the validator's verdict cached per payload (bounded, per tenant) is the verdict
of a fresh validation, and the one-read process count of a strict sandbox (``pids.current``)
still sees a process a run left behind."""

from __future__ import annotations

import asyncio

import pytest
from snippet_levels import STRICT_SKIP

from corral.core.spec import SandboxLimits, SandboxSpec
from corral.snippets.host import runner
from corral.snippets.host.runner import _ValidationCache, run_snippet
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS, validate_files
from strict_tier import needs_strict

ALLOWED = DEFAULT_ALLOWED_IMPORTS


def test_a_cached_verdict_is_the_validators() -> None:
    cache = _ValidationCache()
    for src in ("1 + 1", "import os\nos.system('x')", "def f(:\n", "().__class__"):
        payload = [("main.py", src)]
        fresh = validate_files(payload, allowed_imports=ALLOWED)
        assert cache.violations(payload, ALLOWED, "t") == fresh
        assert cache.violations(payload, ALLOWED, "t") == fresh  # the cached one


def test_the_verdict_depends_on_the_allowed_imports() -> None:
    cache = _ValidationCache()
    payload = [("main.py", "import json\njson.dumps(1)")]
    assert cache.violations(payload, frozenset({"json"}), "t") == ()
    refused = cache.violations(payload, frozenset(), "t")
    assert refused and refused[0].code == "forbidden-import"


def test_the_cache_is_bounded_and_per_tenant() -> None:
    cache = _ValidationCache(max_entries=4, max_chars=100, max_entry_chars=40)
    for i in range(10):
        cache.violations([("main.py", f"x = {i}")], ALLOWED, "t")
    assert len(cache._lru) == 4 and cache._chars <= 100
    cache.violations([("main.py", "x = 9")], ALLOWED, "other")  # not the first tenant's entry
    assert ("other", ALLOWED, (("main.py", "x = 9"),)) in cache._lru
    big = [("main.py", "x = 1" + " " * 100)]  # past max_entry_chars: validated, never held
    assert cache.violations(big, ALLOWED, "t") == ()
    assert all(key[2] != tuple(big) for key in cache._lru)
    cache2 = _ValidationCache(max_entries=100, max_chars=50, max_entry_chars=40)
    for i in range(10):
        cache2.violations([("main.py", f"y = {i} # {'.' * 20}")], ALLOWED, "t")
    assert cache2._chars <= 50


def test_run_snippet_refuses_a_cached_hostile_payload_every_time() -> None:
    async def main() -> None:
        src = "import subprocess\nsubprocess.run(['id'])"
        for _ in range(3):  # refused before any pool is asked (none is made here)
            t = await run_snippet(src, tenant_id="fastpath-test")
            assert t.rejected and t.errors[0].code == "forbidden-import"

    runner._VALIDATED.clear()
    asyncio.run(main())


@needs_strict(STRICT_SKIP)
def test_process_count_sees_a_detached_process_and_then_none() -> None:
    from corral.providers.linux import LinuxProvider

    async def main() -> None:
        provider = LinuxProvider()
        try:
            sb = await provider.create(SandboxSpec(
                tenant_id="t", run_id="fastpath", limits=SandboxLimits(max_processes=64)))
            try:
                assert sb.process_count() == 0
                r = await sb.exec(["sh", "-c",
                                   "setsid sleep 60 >/dev/null 2>&1 </dev/null & echo $!"])
                assert r.exit_code == 0
                # the one read says more than the agent is there: the full count names it
                assert sb.process_count() == 1
                # the shell's kill: a root without procps has no kill binary
                k = await sb.exec(["sh", "-c", f"kill -9 {int(r.stdout.decode())}"])
                assert k.exit_code == 0, k.stderr
                for _ in range(1000):  # up to 10 s: pid 1 reaps it (a loaded host is slow)
                    if sb.process_count() == 0:
                        break
                    await asyncio.sleep(0.01)
                assert sb.process_count() == 0
            finally:
                await sb.destroy()
        finally:
            await provider.aclose()

    asyncio.run(main())


def test_the_job_frame_is_the_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    from corral.core.errors import ConfigInvalidError
    from corral.core.spec import SandboxInvocationContext
    from corral.snippets.host import pool
    from corral.wire.protocol import InvokeFrame, encode_frame, parse_frame

    fixed = uuid.UUID("0123456789abcdef0123456789abcdef")
    monkeypatch.setattr(pool.uuid, "uuid4", lambda: fixed)
    for files in ([("main.py", "x = 1\nx")], [("main.py", "print('é \\u2028 \"q\"')"),
                                               ("helpers.py", "")]):
        job = runner._job(files, 5000, ALLOWED, 256, True)
        ctx = SandboxInvocationContext(run_id="snippet-0123456789ab", tenant_id="t")
        assert pool._frame(job, "t") == encode_frame(InvokeFrame(input=dict(job), ctx=ctx))
        assert parse_frame(pool._frame(job, "t")).kind == "ok"
    bad = runner._job([("main.py", "'\ud800'")], 5000, ALLOWED, 256, True)
    with pytest.raises(ConfigInvalidError):
        pool._frame(bad, "t")
