"""The strict sandbox, not the validator, is the boundary: every rejected corpus case, run
UNVALIDATED (no validator, no import guard, full builtins) in a strict pool, leaves the host
untouched: a host canary stays unread, no host file appears, no loopback connection arrives."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import socket
from pathlib import Path

import pytest
from snippet_levels import STRICT_SKIP

from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet
from corral.snippets.host.transcript import Transcript
from strict_tier import needs_strict

pytestmark = needs_strict(STRICT_SKIP)

REJECTED = sorted((Path(__file__).parent / "corpus" / "rejected").glob("*.py"))
ABS_PATH = re.compile(r"""["'](/[^"'\s]+)["']""")


def _escape_attempt(canary: Path, port: int, drop: Path) -> str:
    return f"""
import os, socket
found = []
try:
    found.append(open({str(canary)!r}).read())
except OSError as e:
    found.append("read: " + type(e).__name__)
try:
    with open({str(drop)!r}, "w") as fh:
        fh.write("escaped")
    found.append("wrote")
except OSError as e:
    found.append("write: " + type(e).__name__)
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=0.5).close()
    found.append("connected")
except OSError as e:
    found.append("connect: " + type(e).__name__)
found.append(sorted(os.listdir("/"))[:40])
found
"""


def _text(t: Transcript) -> str:
    return repr(t.to_dict())


def test_rejected_corpus_is_harmless_unvalidated_in_strict(tmp_path: Path) -> None:
    secret = secrets.token_hex(16)
    canary = tmp_path / "canary.txt"
    canary.write_text(secret)
    drop = tmp_path / "escaped.txt"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    named = {p for f in REJECTED for p in ABS_PATH.findall(f.read_text(encoding="utf-8"))}
    absent_before = {p for p in named if not os.path.lexists(p)}

    async def main() -> list[Transcript]:
        async with SnippetPool(max_workers=2, spares=0, mem_mb=128) as pool:
            jobs = [run_snippet(_escape_attempt(canary, port, drop), pool=pool,
                                tenant_id="corpus", timeout_ms=3000,
                                _unsafe_skip_validation=True)]
            jobs += [run_snippet(f.read_text(encoding="utf-8"), pool=pool, tenant_id="corpus",
                                 timeout_ms=2000, _unsafe_skip_validation=True)
                     for f in REJECTED]
            return list(await asyncio.gather(*jobs))

    try:
        results = asyncio.run(main())
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
    escape, corpus = results[0], results[1:]
    assert escape.ok, escape.errors
    found = escape.result or ""
    assert secret not in found and "read: FileNotFoundError" in found
    assert "write: " in found and "connect: " in found and "connected" not in found
    assert not drop.exists()
    assert len(corpus) == len(REJECTED) >= 40
    for path, t in zip(REJECTED, corpus, strict=True):
        assert secret not in _text(t), path.name
    created = {p for p in absent_before if os.path.lexists(p)}
    assert not created, f"files appeared on the host: {created}"
    assert canary.read_text() == secret


def test_unvalidated_code_cannot_see_other_runs_files() -> None:
    """Runs of one tenant share a sandbox but never a process; a file one run leaves in the
    sandbox's /tmp is the tenant's own, and another tenant never sees it."""

    async def main() -> tuple[Transcript, Transcript]:
        async with SnippetPool(max_workers=2, spares=0) as pool:
            write = ("import os\nf = open('/tmp/mark.txt', 'w')\nf.write('a')\n"
                     "print(os.path.exists('/tmp/mark.txt'))\nf.close()")
            a = await run_snippet(write, pool=pool, level="strict", tenant_id="a",
                                  _unsafe_skip_validation=True)
            b = await run_snippet("import os\nos.path.exists('/tmp/mark.txt')", pool=pool,
                                  level="strict", tenant_id="b", _unsafe_skip_validation=True)
            return a, b

    a, b = asyncio.run(main())
    assert [x.text for x in a.logs] == ["True"]  # created, but RLIMIT_FSIZE 0 refuses a byte
    assert a.errors[0].type == "OSError" and "File too large" in a.errors[0].message
    assert b.result == "False"
