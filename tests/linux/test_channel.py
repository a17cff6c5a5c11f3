"""The host channel: nothing inside a sandbox reaches it, and it survives a hostile far end.

Two halves. From inside a real sandbox: a command (and a forked snippet-style
process) holds no descriptor above 2, so it cannot write to, or read from,
the agent's socket to the host (on the old code fd 4 was that socket: one
write froze the host's event loop, wedged the channel or grew host memory
without bound; a read showed the host's requests to the agent).

Then the host side alone, with the test playing a hostile agent on a
socketpair: every malformed or oversized frame, stray descriptor and silence
closes the channel at once with a typed error, and never spins, waits
forever or buffers without bound. An alarm turns a host-side hang (the old
code's busy loop on a negative ``len``) into a failure instead of a stuck run.
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from corral.core.errors import ProviderError
from corral.core.spec import SandboxLimits, SandboxSpec
from corral.providers.linux.host.channel import MAX_HEADER, Channel

PY = sys.executable


def make_spec() -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r", limits=SandboxLimits())

_FDS = ("import os\n"
        "out = []\n"
        "for name in sorted(os.listdir('/proc/self/fd'), key=int):\n"
        "    try:\n"
        "        out.append((int(name), os.readlink('/proc/self/fd/' + name)))\n"
        "    except OSError:\n"
        "        pass\n"
        "print(out)\n")


@pytest.mark.linux
def test_command_holds_no_descriptor_above_2(linux: Any) -> None:
    """Control: on the host, a child started the same way (posix_spawn with an
    inheritable socket) does see it; inside, only 0/1/2 (and the listing's own)."""
    a, b = socket.socketpair()
    os.set_inheritable(b.fileno(), True)
    try:
        code = f"import os; os.fstat({b.fileno()}); os.write({b.fileno()}, b'x')"
        pid = os.posix_spawn(PY, [PY, "-I", "-S", "-c", code], {})
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert a.recv(1) == b"x"
    finally:
        a.close()
        b.close()

    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec([PY, "-I", "-S", "-c", _FDS])
            assert r.exit_code == 0, r
            fds = dict(eval(r.stdout_text.strip()))  # [(fd, target), ...]
            # the listing's own directory fd is the only one above 2, and it is a dir
            above = {fd: t for fd, t in fds.items() if fd > 2}
            assert len(above) <= 1 and all("socket" not in t for t in above.values()), fds
            # a write to where the socket was does not reach the host
            r = await sb.exec([PY, "-I", "-S", "-c",
                               "import os\nfor fd in range(3, 64):\n"
                               "    try:\n        os.write(fd, b'{\"ev\":\"x\",\"len\":-21}\\n')\n"
                               "        print('wrote', fd)\n    except OSError:\n        pass\n"])
            assert r.exit_code == 0 and "wrote" not in r.stdout_text, r
            r = await sb.exec(["sh", "-c", "echo still-served"])
            assert r.stdout_text.strip() == "still-served"

    linux(test)


# -- the host side against a hostile far end ------------------------------------------
@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail (instead of hanging the run) if the host side spins or waits past 20 s."""
    def boom(*_: object) -> None:
        raise TimeoutError("the host side hung")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


Hostile = Callable[[Channel, socket.socket], Awaitable[None]]


def _with_channel(test: Hostile, **kwargs: Any) -> None:
    async def main() -> None:
        host, far = socket.socketpair()
        chan = Channel(host, what="test agent", **kwargs)
        try:
            await test(chan, far)
        finally:
            chan.close()
            far.close()
    asyncio.run(main())


async def _request_fails(chan: Channel, match: str, **kwargs: Any) -> ProviderError:
    with pytest.raises(ProviderError, match=match) as info:
        await asyncio.wait_for(chan.request({"op": "ping"}, **kwargs), 10)
    assert chan.is_closed
    return info.value


async def _answer(far: socket.socket, data: bytes) -> None:
    """Read the request line, then send ``data`` (the hostile reply)."""
    loop = asyncio.get_running_loop()
    far.setblocking(False)
    await loop.sock_recv(far, 65536)
    await loop.sock_sendall(far, data)


@pytest.mark.parametrize(("reply", "match"), [
    (b'{"ev":"x","len":-21}\n', "bad len"),          # old code: a busy loop, host frozen
    (b'{"id":1,"len":"9"}\n', "bad len"),
    (b"not json at all\n", "not JSON"),              # old code: wedged on every later read
    (b"[1,2,3]\n", "not a JSON object"),
    (b'{"id":1,"len":1073741824}\n', "at most 0"),    # old code: buffered all that came
    (b'{"id":99,"ok":true}\n', "reply to no request"),
    (b'{"id":1,"nfds":1}\n', "descriptors"),
    (b'{"ev":"exit","pid":1}\n{"ev":"exit"}\n' + b"[" * 60000 + b"\n", "not JSON"),
])
def test_malformed_frames_close_the_channel(alarm: None, reply: bytes, match: str) -> None:
    async def test(chan: Channel, far: socket.socket) -> None:
        feeder = asyncio.ensure_future(_answer(far, reply))
        await _request_fails(chan, match)
        await feeder
        assert chan.violation
    _with_channel(test)


def test_header_without_newline_is_capped(alarm: None) -> None:
    async def test(chan: Channel, far: socket.socket) -> None:
        feeder = asyncio.ensure_future(_answer(far, b"x" * (MAX_HEADER + 10)))
        await _request_fails(chan, "header line longer")
        await feeder
    _with_channel(test)


def test_huge_payload_beyond_the_allowance_is_refused_before_it_is_buffered(alarm: None) -> None:
    """The reply announces more than the request allows: refused at the header,
    while the far end is still sending; the host never holds the stream."""
    async def test(chan: Channel, far: socket.socket) -> None:
        async def stream() -> None:
            await _answer(far, b'{"id":1,"ok":true,"len":104857600}\n')
            try:
                for _ in range(1600):  # up to 100 MiB, stops once the host closes
                    await asyncio.get_running_loop().sock_sendall(far, b"\0" * 65536)
            except OSError:
                pass
        feeder = asyncio.ensure_future(stream())
        await _request_fails(chan, "at most 4096", max_reply=4096)
        await asyncio.wait_for(feeder, 10)
    _with_channel(test)


def test_payload_within_the_allowance_arrives(alarm: None) -> None:
    async def test(chan: Channel, far: socket.socket) -> None:
        feeder = asyncio.ensure_future(_answer(far, b'{"id":1,"ok":true,"len":5}\nhello'))
        h, p, fds = await asyncio.wait_for(chan.request({"op": "read"}, max_reply=5), 10)
        assert (h["ok"], p, fds) == (True, b"hello", [])
        await feeder
        assert not chan.is_closed
    _with_channel(test)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_descriptors_from_an_agent_are_closed(alarm: None) -> None:
    """An agent never sends descriptors; any that come are closed, not kept (old
    code: kept forever, 4400 of them starved another tenant's launch)."""
    before = _open_fds()

    async def test(chan: Channel, far: socket.socket) -> None:
        r, w = os.pipe()
        try:
            far.sendmsg([b'{"ev":"exit","pid":5,"code":0}\n'],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                          array.array("i", [r, w] * 4).tobytes())])
        finally:
            os.close(r)
            os.close(w)
        await _request_fails(chan, "descriptor")
    _with_channel(test)
    assert _open_fds() == before


def test_silence_hits_the_request_deadline(alarm: None) -> None:
    """A far end that never answers: the request ends at its deadline (old code: no
    deadline, ``invoke(timeout_ms=4000)`` never returned)."""
    async def test(chan: Channel, far: socket.socket) -> None:
        await _request_fails(chan, "no answer", timeout=0.3)
        assert "no answer to 'ping'" in chan.violation
    _with_channel(test)


def test_a_violation_reaches_its_owner_and_a_bad_event_is_one(alarm: None) -> None:
    seen: list[str] = []

    def on_event(h: dict[str, Any]) -> None:
        int(h["pid"])  # a handler that chokes on a malformed event

    async def test(chan: Channel, far: socket.socket) -> None:
        far.sendall(b'{"ev":"exit","pid":"x"}\n')
        await asyncio.wait_for(chan.closed, 10)
        assert seen and "ValueError" in seen[0]
    _with_channel(test, on_event=on_event, on_violation=seen.append)


def test_well_formed_traffic_still_flows(alarm: None) -> None:
    events: list[dict[str, Any]] = []

    async def test(chan: Channel, far: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        far.setblocking(False)
        await loop.sock_sendall(far, b'{"ready":true}\n')
        assert (await chan.hello) == {"ready": True}
        req = asyncio.ensure_future(chan.request({"op": "ping"}))
        line = await loop.sock_recv(far, 4096)
        rid = json.loads(line)["id"]
        # a reply split across writes, with an event in between
        await loop.sock_sendall(far, b'{"ev":"exit","pid":3}\n{"id":%d,' % rid)
        await asyncio.sleep(0.01)
        await loop.sock_sendall(far, b'"ok":true}\n')
        h, _p, _f = await asyncio.wait_for(req, 10)
        assert h["ok"] is True and events == [{"ev": "exit", "pid": 3}]
    _with_channel(test, on_event=events.append)


def test_a_late_reply_to_a_cancelled_request_is_dropped_quietly(alarm: None) -> None:
    """A caller that gives up (cancelled) leaves its request's id behind: the agent's
    late reply to it, payload and all, is discarded, not a violation that kills the
    sandbox; a reply to an id never sent still is one."""
    async def test(chan: Channel, far: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        far.setblocking(False)
        req = asyncio.ensure_future(chan.request({"op": "read"}, max_reply=5))
        rid = json.loads(await loop.sock_recv(far, 4096))["id"]
        req.cancel()
        with pytest.raises(asyncio.CancelledError):
            await req
        await loop.sock_sendall(far, b'{"id":%d,"ok":true,"len":5}\nhello' % rid)
        nxt = asyncio.ensure_future(chan.request({"op": "ping"}))
        rid2 = json.loads(await loop.sock_recv(far, 4096))["id"]
        await loop.sock_sendall(far, b'{"id":%d,"ok":true}\n' % rid2)
        h, _p, _f = await asyncio.wait_for(nxt, 10)
        assert h["ok"] is True and not chan.is_closed and not chan.violation
        # the cancelled id is spent: a second reply to it is a violation
        await loop.sock_sendall(far, b'{"id":%d,"ok":true}\n' % rid)
        await asyncio.wait_for(chan.closed, 10)
        assert "reply to no request" in chan.violation
    _with_channel(test)


def test_only_the_last_cancelled_ids_are_remembered(alarm: None) -> None:
    """The set of cancelled ids is bounded (CANCELLED_IDS): a reply to an older one is
    a violation again."""
    from corral.providers.linux.host.channel import CANCELLED_IDS

    async def test(chan: Channel, far: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        far.setblocking(False)
        for _ in range(CANCELLED_IDS + 1):
            req = asyncio.ensure_future(chan.request({"op": "ping"}))
            await asyncio.sleep(0)
            req.cancel()
            with pytest.raises(asyncio.CancelledError):
                await req
        await loop.sock_sendall(far, b'{"id":%d,"ok":true}\n' % (CANCELLED_IDS + 1))
        await loop.sock_sendall(far, b'{"id":1,"ok":true}\n')
        await asyncio.wait_for(chan.closed, 10)
        assert "reply to no request (id '1')" in chan.violation
    _with_channel(test)
