"""A hostile or garbled agent reply gets a typed error on the host, never a crash or hang.

The agent runs inside the sandbox; a sandboxed program that took it over could answer
anything. Each case swaps a real strict sandbox's channel for one whose far end the
test plays (a socketpair), answers the host's next request with a bad reply, and
checks the host raises one of corral's errors (or the builtin OSError the contract
names), within a hang guard. A reply that breaks the protocol kills the sandbox (the
real agent is SIGKILLed); one that is well formed, merely an error, leaves it alive.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from corral.core.errors import ConfigInvalidError, CorralError, ProviderError
from corral.core.spec import SandboxLimits, SandboxSpec
from corral.providers.linux.host.channel import Channel


def make_spec(**limits: int) -> SandboxSpec:
    """(not conftest's: a module named conftest is another directory's when the run's
    arguments name several test directories)"""
    return SandboxSpec(tenant_id="t", run_id="r", limits=SandboxLimits(**limits))

pytestmark = pytest.mark.linux

GUARD_S = 20
Call = Callable[[Any], Awaitable[object]]


def _reply(rid: int, doc: dict[str, Any], payload: bytes = b"") -> bytes:
    head = {"id": rid, **doc}
    if payload:
        head["len"] = len(payload)
    return json.dumps(head, separators=(",", ":")).encode() + b"\n" + payload


async def _against(sb: Any, answer: Callable[[int], bytes], call: Call) -> BaseException:
    """Run ``call(sb)`` with the agent played by ``answer(request id) -> bytes``."""
    loop = asyncio.get_running_loop()
    near, far = socket.socketpair()
    far.setblocking(False)
    real = sb._chan
    chan = Channel(near, what="sandbox agent", on_event=sb._on_event,
                   on_violation=sb._on_violation, accept_fds=True)
    sb._chan = chan

    async def agent() -> None:
        data = b""
        while b"\n" not in data:
            chunk = await loop.sock_recv(far, 1 << 16)
            if not chunk:
                return
            data += chunk
        rid = json.loads(data.split(b"\n", 1)[0])["id"]
        await loop.sock_sendall(far, answer(rid))

    task = asyncio.ensure_future(agent())
    try:
        try:
            await asyncio.wait_for(call(sb), GUARD_S)
        except (CorralError, OSError) as e:
            return e
        raise AssertionError("the bad reply was taken as a good one")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        chan.close()
        far.close()
        sb._chan = real


def _read(sb: Any) -> Awaitable[object]:
    return sb.read_file("f.txt")  # type: ignore[no-any-return]


def _exec(sb: Any) -> Awaitable[object]:
    return sb.exec(["true"])  # type: ignore[no-any-return]


def _list(sb: Any) -> Awaitable[object]:
    return sb.list_files("")  # type: ignore[no-any-return]


def _stat(sb: Any) -> Awaitable[object]:
    return sb.get_info("f.txt")  # type: ignore[no-any-return]


HUGE = 1 << 40
#: (case, the call, the agent's answer, the error the host raises, whether the
#: sandbox is killed as a protocol breaker)
CASES: list[tuple[str, Call, Callable[[int], bytes], type[BaseException], bool]] = [
    ("unknown reply type", _read, lambda i: _reply(i, {"r": "surprise"}), ProviderError, True),
    ("no type at all", _read, lambda i: _reply(i, {"ok": True}), ProviderError, True),
    ("pid a string", _exec, lambda i: _reply(i, {"r": "started", "pid": "1"}),
     ProviderError, True),
    ("pid a bool", _exec, lambda i: _reply(i, {"r": "started", "pid": True}),
     ProviderError, True),
    ("pid past 64 bits", _exec, lambda i: _reply(i, {"r": "started", "pid": 1 << 80}),
     ProviderError, True),
    ("a reply of another request", _exec, lambda i: _reply(i, {"r": "made", "created": True}),
     ProviderError, True),
    ("an error that is no object", _read, lambda i: _reply(i, {"r": "failed", "error": "x"}),
     ProviderError, True),
    ("an entry of an unknown type", _stat, lambda i: _reply(
        i, {"r": "entry", "name": "f.txt", "type": "device!", "size": 1, "mode": 0,
            "mtime": 0}), ProviderError, True),
    ("a listing entry naming a path", _list, lambda i: _reply(
        i, {"r": "listing", "n": 1}, b'[["../../etc","file",1,0,0.0,null]]'),
     ProviderError, True),
    ("a listing shorter than announced", _list, lambda i: _reply(
        i, {"r": "listing", "n": 3}, b"[]"), ProviderError, True),
    ("a listing that is not JSON", _list, lambda i: _reply(
        i, {"r": "listing", "n": 1}, b"\xff\xfe"), ProviderError, True),
    ("a huge header", _read, lambda i: _reply(i, {"r": "done", "x": "a" * 100_000}),
     ProviderError, True),
    ("a huge payload announced", _read, lambda i: (
        b'{"id":%d,"r":"done","len":%d}\n' % (i, HUGE)), ProviderError, True),
    ("not JSON", _read, lambda i: b"\x00\xff{garbage\n", ProviderError, True),
    ("an unknown error code", _read, lambda i: _reply(
        i, {"r": "failed", "error": {"code": "os.system", "message": "m"}}),
     ProviderError, False),
    ("an error class name as code", _read, lambda i: _reply(
        i, {"r": "failed", "error": {"code": "SystemExit", "message": "m"}}),
     ProviderError, False),
    ("an error with wrong-typed facts", _read, lambda i: _reply(
        i, {"r": "failed", "error": {"code": "config-invalid", "field": 7,
                                     "reason": ["x"]}}), ConfigInvalidError, False),
    ("an os error of a file op", _read, lambda i: _reply(
        i, {"r": "os-failed", "errno": 2, "reason": "gone", "path": "f.txt"}),
     FileNotFoundError, False),
    ("an os error of a spawn", _exec, lambda i: _reply(
        i, {"r": "os-failed", "errno": 2, "reason": "gone"}), ProviderError, False),
]


@pytest.mark.parametrize(("name", "call", "answer", "raises", "kills"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_bad_reply_is_a_typed_error(linux: Any, name: str, call: Call,
                                      answer: Callable[[int], bytes],
                                      raises: type[BaseException], kills: bool) -> None:
    async def test(p: Any) -> None:
        sb = await p.create(make_spec())
        try:
            await sb.write_file("f.txt", b"x")
            err = await _against(sb, answer, call)
            assert type(err) is raises, f"{name}: {type(err).__name__}: {err}"
            if kills:  # the real agent was killed as a protocol breaker
                await asyncio.wait_for(asyncio.shield(sb._chan.closed), GUARD_S)
                assert not sb.alive and "protocol" in str(err)
            else:
                assert sb.alive and await sb.read_file("f.txt") == b"x"
        finally:
            await sb.destroy()

    linux(test)


def test_a_bad_exit_event_kills_the_sandbox_with_a_typed_error(linux: Any) -> None:
    async def test(p: Any) -> None:
        sb = await p.create(make_spec())
        try:
            err = await _against(sb, lambda i: (
                b'{"ev":"exit","pid":"1","code":0}\n' + _reply(i, {"r": "done"})), _read)
            assert type(err) is ProviderError
            await asyncio.wait_for(asyncio.shield(sb._chan.closed), GUARD_S)
            assert not sb.alive
            with pytest.raises(ProviderError):
                await sb.read_file("f.txt")
        finally:
            await sb.destroy()

    linux(test)
