"""The preview URL's token check (``netrelay._admit``) without a sandbox: what a
connection sends first decides whether anything goes on, and what goes on has the
token removed (issue 23 item 6)."""

from __future__ import annotations

import asyncio

import pytest

from corral.providers.linux.host import netrelay

TOKEN = "t0ken-" + "A" * 40


async def _gate(sent: bytes, *, close: bool = True) -> tuple[bytes | None, bytes]:
    """(what _admit returned, what the client got back) for a client sending ``sent``."""
    got: list[bytes | None] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            got.append(await netrelay._admit(r, w, TOKEN))
        finally:
            w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(sent)
        await w.drain()
        if close:
            w.write_eof()
        answer = await asyncio.wait_for(r.read(), 15)
        w.close()
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.01)
        return got[0], answer
    finally:
        srv.close()
        await srv.wait_closed()


H = f"X-Corral-Preview-Token: {TOKEN}\r\n"


@pytest.mark.parametrize(("sent", "forwarded"), [
    (f"GET / HTTP/1.1\r\nHost: x\r\n{H}\r\nbody".encode(),
     b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"),
    (f"GET / HTTP/1.1\r\n{H}Host: x\r\n\r\n".encode(), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    (f"GET / HTTP/1.1\r\nx-corral-preview-token:{TOKEN}  \r\n\r\n".encode(),
     b"GET / HTTP/1.1\r\n\r\n"),
    (f"CORRAL-PREVIEW-TOKEN {TOKEN}\r\nSSH-2.0-x\r\n".encode(), b"SSH-2.0-x\r\n"),
    (f"COPY / HTTP/1.1\r\n{H}\r\n".encode(), b"COPY / HTTP/1.1\r\n\r\n"),
])
def test_the_token_admits_and_is_removed(sent: bytes, forwarded: bytes) -> None:
    got, answer = asyncio.run(_gate(sent))
    assert got == forwarded and answer == b""


@pytest.mark.parametrize("sent", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    f"GET / HTTP/1.1\r\nX-Corral-Preview-Token: {TOKEN[:-1]}\r\n\r\n".encode(),
    f"GET / HTTP/1.1\r\nX-Corral-Preview-Token: {TOKEN}x\r\n\r\n".encode(),
    f"GET / HTTP/1.1\r\n{H}{H}\r\n".encode(),
    f"GET / HTTP/1.1\r\nX-Other: {H.strip()}\r\n\r\n".encode(),
    f"GET / HTTP/1.1\r\nX_Corral_Preview_Token: {TOKEN}\r\n\r\n".encode(),
    f"GET /?X-Corral-Preview-Token: {TOKEN}\r\n HTTP/1.1\r\n\r\n".encode(),
    b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 20000 + b"\r\n\r\n",
])
def test_without_the_token_403_and_nothing_goes_on(sent: bytes) -> None:
    got, answer = asyncio.run(_gate(sent))
    assert got is None and answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), answer


@pytest.mark.parametrize("sent", [
    b"CORRAL-PREVIEW-TOKEN wrong\r\nSSH-2.0-x\r\n",
    f"CORRAL-PREVIEW-TOKEN {TOKEN} \r\n".encode(),
    f"CORRAL-PREVIEW-TOKEN {TOKEN}".encode(),  # no line end before EOF
    b"",
])
def test_a_wrong_preamble_is_closed_without_an_answer(sent: bytes) -> None:
    got, answer = asyncio.run(_gate(sent))
    assert got is None and answer == b""
