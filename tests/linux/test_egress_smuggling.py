"""Request smuggling shapes against the egress proxy's HTTP/1.1 parsing (issue 25).

The proxy parses request heads with h11 behind strict framing checks
(``egress/http.py``): each shape below is one where a lenient parser (h11 included,
for some) and an upstream can disagree on where a request ends or what it says. Each
is refused by the parser, and end to end: as a plain proxy request and inside an
intercepted tunnel (a host with secrets, where one client connection carries many
requests over the proxy's own upstream connection), where the origin sees nothing of
it, not even the request before it on the same connection is followed by anything
the proxy did not check. The control rows show the same requests written cleanly go
through.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings, strategies as st
from test_egress import http_connect, run

from corral.providers.linux.host.egress import EgressDenied, parse_http_head
from corral.providers.linux.host.egress.http import inner_request
from corral.providers.linux.host.egress.policy import SecretHeader, Target

pytest.importorskip("cryptography")  # the intercepted rows need the secrets extra
from test_egress_secrets import quirky_origin, secret_proxy

H = b"Host: api.example.test\r\n"

#: (name, the head's header lines after the request line POST / HTTP/1.1, the denial kind)
SHAPES: list[tuple[str, bytes, str]] = [
    ("CL+TE", b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", "bad-request"),
    ("TE+CL", b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", "bad-request"),
    ("duplicate Content-Length, same value", b"Content-Length: 4\r\nContent-Length: 4\r\n",
     "bad-request"),
    ("duplicate Content-Length, two values", b"Content-Length: 4\r\nContent-Length: 40\r\n",
     "bad-request"),
    ("Content-Length list", b"Content-Length: 4, 4\r\n", "bad-request"),
    ("Content-Length with a sign", b"Content-Length: +4\r\n", "bad-request"),
    ("Content-Length in hex", b"Content-Length: 0x4\r\n", "bad-request"),
    ("Content-Length superscript", "Content-Length: 4\u00b2\r\n".encode("latin-1"),
     "bad-request"),
    ("obs-fold", b"X-Note: a\r\n folded\r\nContent-Length: 4\r\n", "bad-request"),
    ("obs-fold of Transfer-Encoding", b"Transfer-Encoding:\r\n chunked\r\n", "bad-request"),
    ("obs-fold with a tab", b"X-Note: a\r\n\tfolded\r\n", "bad-request"),
    ("bare LF between headers", b"X-Note: a\nContent-Length: 4\r\n", "bad-request"),
    ("bare CR in a value", b"X-Note: a\rContent-Length: 4\r\n", "bad-request"),
    ("space before the colon", b"Content-Length : 4\r\n", "bad-request"),
    ("space before the colon of TE", b"Transfer-Encoding : chunked\r\n", "bad-request"),
    ("TE twice", b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
     "unsupported"),
    ("TE chunked, chunked", b"Transfer-Encoding: chunked, chunked\r\n", "unsupported"),
    ("TE xchunked", b"Transfer-Encoding: xchunked\r\n", "unsupported"),
    ("TE gzip, chunked", b"Transfer-Encoding: gzip, chunked\r\n", "unsupported"),
    ("TE with a vertical tab", b"Transfer-Encoding: \x0bchunked\r\n", "bad-request"),
    ("TE with NBSP", "Transfer-Encoding: chunked\u00a0\r\n".encode("latin-1"),
     "unsupported"),
    ("NUL in a value", b"X-Note: a\x00b\r\n", "bad-request"),
    ("two Host headers", b"Host: other.test\r\n", "bad-request"),
]
#: shapes of the request line (the whole head), with the denial kind
LINES: list[tuple[str, bytes, str]] = [
    ("HTTP/2.0 in the request line", b"POST / HTTP/2.0\r\n" + H, "bad-request"),
    ("lower-case version", b"POST / http/1.1\r\n" + H, "bad-request"),
    ("HTTP/0.9 (no version)", b"GET /\r\n", "bad-request"),
    ("two spaces", b"GET  / HTTP/1.1\r\n" + H, "bad-request"),
    ("a tab for a space", b"GET\t/ HTTP/1.1\r\n" + H, "bad-request"),
    ("bare LF line ends", b"GET / HTTP/1.1\n" + H, "bad-request"),
    ("a blank line first", b"\r\nGET / HTTP/1.1\r\n" + H, "bad-request"),
    ("TE in HTTP/1.0", b"POST / HTTP/1.0\r\n" + H + b"Transfer-Encoding: chunked\r\n",
     "bad-request"),
    ("first header folded", b"GET / HTTP/1.1\r\n " + H, "bad-request"),
]
#: the same requests written cleanly: parsed, with these (name, value) headers
CLEAN: list[tuple[bytes, tuple[tuple[str, str], ...]]] = [
    (b"Content-Length: 4\r\n", (("host", "api.example.test"), ("content-length", "4"))),
    (b"Transfer-Encoding: chunked\r\n",
     (("host", "api.example.test"), ("transfer-encoding", "chunked"))),
    (b"X-Note: a b\r\n", (("host", "api.example.test"), ("x-note", "a b"))),
]


def _post(lines: bytes) -> bytes:
    return b"POST / HTTP/1.1\r\n" + H + lines + b"\r\n"


@pytest.mark.parametrize(("lines", "kind"), [(s[1], s[2]) for s in SHAPES],
                         ids=[s[0] for s in SHAPES])
def test_smuggling_header_shapes_are_refused(lines: bytes, kind: str) -> None:
    with pytest.raises(EgressDenied) as e:
        parse_http_head(_post(lines))
    assert e.value.kind == kind


@pytest.mark.parametrize(("head", "kind"), [(s[1], s[2]) for s in LINES],
                         ids=[s[0] for s in LINES])
def test_smuggling_request_line_shapes_are_refused(head: bytes, kind: str) -> None:
    with pytest.raises(EgressDenied) as e:
        parse_http_head(head + b"\r\n")
    assert e.value.kind == kind


@pytest.mark.parametrize(("lines", "headers"), CLEAN)
def test_the_same_requests_written_cleanly_parse(
        lines: bytes, headers: tuple[tuple[str, str], ...]) -> None:
    head = parse_http_head(_post(lines))
    assert (head.method, head.target, head.version) == ("POST", "/", "HTTP/1.1")
    assert head.headers == headers


def test_a_proxy_request_may_leave_host_out() -> None:
    """HTTP/1.1 makes Host mandatory and h11 enforces it; proxy clients leave it out of
    CONNECT and of absolute-form requests, and the proxy takes the target's authority
    then (RFC 9112 3.2.2): no Host comes back, none is invented in the result."""
    head = parse_http_head(b"CONNECT api.example.test:443 HTTP/1.1\r\n\r\n")
    assert (head.method, head.target, head.headers) == ("CONNECT", "api.example.test:443", ())
    head = parse_http_head(b"GET http://api.example.test/x HTTP/1.1\r\nAccept: */*\r\n\r\n")
    assert head.headers == (("accept", "*/*"),)


def test_underscore_and_connection_tricks_are_refused_inside_an_interception() -> None:
    """Names an upstream may read as framing headers (CGI-style ``_`` for ``-``), and a
    ``Connection`` header listing a framing header (a hop that honours it drops the
    header, and the body becomes the next request): refused for a host with secrets."""
    target = Target("api.example.test", 80, ("127.0.0.1",), "api.example.test",
                    (SecretHeader("authorization", "s"),))
    for lines in (b"Content_Length: 4\r\n", b"Transfer_Encoding: chunked\r\n",
                  b"Connection: content-length\r\nContent-Length: 4\r\n",
                  b"Connection: authorization\r\n"):
        with pytest.raises(EgressDenied):
            inner_request(parse_http_head(_post(lines)), target, False)
    out, body = inner_request(parse_http_head(_post(b"Content-Length: 4\r\n")), target, False)
    assert body == 4 and out.endswith(b"\r\nauthorization: s\r\n\r\n")


_PIECES = st.sampled_from([
    b"Content-Length: 4", b"Content-Length: 0", b"Content-Length:4", b"Content-Length: 4 ",
    b"content-length: 4", b"Transfer-Encoding: chunked", b"transfer-encoding: Chunked",
    b"Transfer-Encoding: identity", b"X: a", b"X: a\x80", b"X:", b" X: folded",
    b"\tfolded", b"Host: api.example.test", b"Host: other.test", b"Connection: close",
    b"X: a\nContent-Length: 4", b"X: a\rb", b"Expect: 100-continue", b"Upgrade: h2c"])


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([b"POST / HTTP/1.1", b"GET /a?b HTTP/1.0",
                        b"POST http://api.example.test/ HTTP/1.1"]),
       st.lists(_PIECES, max_size=6))
def test_an_accepted_head_is_unambiguous_and_survives_its_own_rewrite(
        line: bytes, pieces: list[bytes]) -> None:
    """Whatever head the parser accepts has one framing (never Content-Length with
    Transfer-Encoding, never two Content-Lengths, no folded or bare-LF line), and the head
    the proxy writes from it parses back to the same value: what goes upstream is
    exactly what was checked."""
    data = b"\r\n".join([line, *pieces]) + b"\r\n\r\n"
    try:
        head = parse_http_head(data)
    except EgressDenied:
        return
    names = [k for k, _v in head.headers]
    assert names.count("content-length") <= 1
    assert not ("content-length" in names and "transfer-encoding" in names)
    assert all("\n" not in v and "\r" not in v for _k, v in head.headers)
    rewritten = "\r\n".join([f"{head.method} {head.target} {head.version}",
                             *(f"{k}: {v}" for k, v in head.headers)]) + "\r\n\r\n"
    assert parse_http_head(rewritten.encode("latin-1")) == head


@pytest.mark.parametrize(("lines", "kind"), [(s[1], s[2]) for s in SHAPES],
                         ids=[s[0] for s in SHAPES])
def test_smuggling_shapes_never_reach_the_origin(lines: bytes, kind: str) -> None:
    """End to end, inside an intercepted tunnel (keep-alive to the proxy's own upstream
    connection): a clean request, then the shape with a body that is itself a request.
    The clean one is answered; the shape gets the proxy's 400/501 and the connection
    closes; the origin saw the clean request only. As a plain proxy request, the shape
    is refused before any upstream connection."""
    async def t() -> None:
        async with quirky_origin() as (port, heads), secret_proxy(None) as (p, path):
            host = f"Host: api.example.test:{port}\r\n".encode()
            hidden = b"GET /smuggled HTTP/1.1\r\n" + host + b"\r\n"
            _h, r, w = await http_connect(path, f"api.example.test:{port}")
            w.write(b"GET /first HTTP/1.1\r\n" + host + b"\r\n")
            assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            assert await r.readexactly(10) == b"0123456789"
            w.write(b"POST /second HTTP/1.1\r\n" + host + lines + b"\r\n4\r\n" + hidden)
            reply = await r.read()
            w.close()
            status = b"501" if kind == "unsupported" else b"400"
            assert reply.startswith(b"HTTP/1.1 " + status), reply[:80]
            # plain proxy request: refused before any upstream connection
            r, w = await asyncio.open_unix_connection(path)
            w.write(f"POST http://api.example.test:{port}/third HTTP/1.1\r\n".encode() + host
                    + lines + b"\r\n" + hidden)
            reply = await r.read()
            w.close()
            assert reply.startswith(b"HTTP/1.1 " + status), reply[:80]
            assert [h.split(b" ")[1] for h in heads] == [b"/first"]
            assert [d.kind for d in p.denials()] == [kind, kind]
    run(t)


def test_clean_requests_pass_end_to_end() -> None:
    """The control: the same connection shapes, written cleanly, reach the origin."""
    async def t() -> None:
        async with quirky_origin() as (port, heads), secret_proxy(None) as (p, path):
            host = f"Host: api.example.test:{port}\r\n".encode()
            _h, r, w = await http_connect(path, f"api.example.test:{port}")
            w.write(b"POST /first HTTP/1.1\r\n" + host + b"Content-Length: 4\r\n\r\nbody"
                    b"GET /second HTTP/1.1\r\n" + host + b"X-Note: a b\r\n\r\n")
            for _ in range(2):
                assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
                assert await r.readexactly(10) == b"0123456789"
            w.close()
            r, w = await asyncio.open_unix_connection(path)
            w.write(f"POST http://api.example.test:{port}/eof HTTP/1.1\r\n".encode() + host
                    + b"Content-Length: 4\r\n\r\nbody")
            assert await r.read() == b"HTTP/1.1 200 OK\r\n\r\nuntil close body"
            w.close()
            assert [h.split(b" ")[1] for h in heads] == [b"/first", b"/second", b"/eof"]
            assert p.denials() == ()
    run(t)
