"""Hypothesis properties of the wire protocol: round trips, chunking, no raising, bounded buffer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from corral.core.spec import ResumeInfo, SandboxInvocationContext
from corral.wire.protocol import (
    EXCERPT_BYTES,
    ErrorBody,
    ErrorFrame,
    FrameDecoder,
    FrameErr,
    FrameOk,
    InvokeFrame,
    OutputFrame,
    ParseResult,
    ProtocolErrorKind,
    ResumeFrame,
    SuspendFrame,
    WireFrame,
    encode_frame,
    parse_frame,
)

SETTINGS = settings(max_examples=200, deadline=None)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
tokens = st.text(min_size=1, max_size=16)

contexts = st.builds(
    SandboxInvocationContext,
    run_id=tokens,
    tenant_id=tokens,
    node_id=st.none() | tokens,
    dry_run=st.booleans(),
    state=json_objects,
    node_outputs=json_objects,
    resume=st.none() | st.builds(ResumeInfo, token_id=tokens, value=json_values),
)
frames: st.SearchStrategy[WireFrame] = st.one_of(
    st.builds(InvokeFrame, input=json_values, ctx=contexts),
    st.builds(ResumeFrame, token_id=tokens, value=json_values),
    st.builds(OutputFrame, output=json_values),
    st.builds(
        ErrorFrame,
        error=st.builds(
            ErrorBody,
            code=st.text(max_size=10),
            message=st.text(),
            details=st.none() | json_objects,
        ),
    ),
    st.builds(SuspendFrame, token_id=tokens),
)


@SETTINGS
@given(frames)
@pytest.mark.slow
def test_encode_parse_round_trip(frame: WireFrame) -> None:
    wire = encode_frame(frame)
    assert wire.endswith(b"\n")
    assert wire.count(b"\n") == 1
    assert wire.startswith(b'{"v":1,"kind":"' + frame.kind.encode() + b'"')
    assert parse_frame(wire) == FrameOk(frame=frame)
    assert FrameDecoder().feed(wire) == [FrameOk(frame=frame)]


# A stream line: a valid frame, junk without newlines, a blank line, or a long line.
lines = st.one_of(
    frames.map(lambda f: encode_frame(f)[:-1]),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from([b"", b"\r", b"[]", b'{"v":1,"kind":"nope"}', "é€😀".encode()]),
    st.integers(min_value=50, max_value=400).map(lambda n: b"x" * n),
)


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[bytes], int]:
    parts = draw(st.lists(st.tuples(lines, st.sampled_from([b"\n", b"\r\n"])), max_size=8))
    data = b"".join(line + end for line, end in parts)
    if draw(st.booleans()):
        data += draw(lines)  # an unterminated last line
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    cap = draw(st.sampled_from([1, 3, 17, 64, 199, 200, 300, 10_000]))
    return data, chunks, cap


def feed_all(chunks: list[bytes], cap: int) -> list[ParseResult]:
    dec = FrameDecoder(max_line_bytes=cap)
    out: list[ParseResult] = []
    for chunk in chunks:
        out += dec.feed(chunk)
        assert dec.buffered_bytes <= cap
    out += dec.close()
    assert dec.buffered_bytes == 0
    return out


def oracle(data: bytes, cap: int) -> list[ParseResult]:
    """The decoder's contract, line by line with parse_frame."""
    return [
        parse_frame(line, max_line_bytes=cap)
        for line in data.split(b"\n")
        if line not in (b"", b"\r")
    ]


@SETTINGS
@given(streams())
@pytest.mark.slow
def test_chunking_does_not_change_results(stream: tuple[bytes, list[bytes], int]) -> None:
    data, chunks, cap = stream
    whole = feed_all([data], cap)
    assert feed_all(chunks, cap) == whole
    assert feed_all([bytes([b]) for b in data], cap) == whole
    assert whole == oracle(data, cap)


@SETTINGS
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=6), st.integers(1, 64))
def test_random_bytes_never_raise(data: bytes, cuts: list[int], cap: int) -> None:
    res = parse_frame(data)
    assert isinstance(res, FrameOk | FrameErr)
    assert isinstance(parse_frame(data.decode("latin-1")), FrameOk | FrameErr)
    edges = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *edges], [*edges, len(data)], strict=True)]
    out = feed_all(chunks, cap)
    for r in out:
        if isinstance(r, FrameErr):
            assert len(r.error.excerpt) <= EXCERPT_BYTES
            assert isinstance(r.error.kind, ProtocolErrorKind)
    assert out == feed_all([data], cap)


@SETTINGS
@given(st.text(max_size=200))
def test_random_text_never_raises(text: str) -> None:
    assert isinstance(parse_frame(text), FrameOk | FrameErr)


@SETTINGS
@given(st.integers(1, 100), st.integers(101, 3000), st.integers(1, 97))
def test_buffer_never_exceeds_cap(cap: int, size: int, step: int) -> None:
    line = bytes(range(97, 123)) * (size // 26 + 1)
    dec = FrameDecoder(max_line_bytes=cap)
    seen: list[ParseResult] = []
    for i in range(0, size, step):
        seen += dec.feed(line[i : min(i + step, size)])
        assert dec.buffered_bytes <= cap
    seen += dec.feed(b"\n") + dec.close()
    assert len(seen) == 1  # size > cap: exactly one error, nothing for the newline
    assert isinstance(seen[0], FrameErr)
    assert seen[0].error.kind is ProtocolErrorKind.LINE_TOO_LONG
    assert seen[0].error.excerpt == line[: min(cap + 1, EXCERPT_BYTES)]
