"""Hypothesis properties of wire 1's codec (corral.wire.agent): host <-> sandbox agent.

Round trips for every valid frame, the same frames whatever the chunking (down to every
byte boundary), and against hostile input: arbitrary bytes, mutated frames and chunked
feeding raise nothing but :class:`Violation`, and the host's decoder never holds more
than its caps allow."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from corral.wire.agent import (
    MAX_HEADER,
    MAX_QUEUED_FDS,
    Decoder,
    Frame,
    Violation,
    encode,
    parse_header,
)

SETTINGS = settings(max_examples=200, deadline=None)

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
values: st.SearchStrategy[Any] = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
#: headers as the ends write them (``len`` is the encoder's, ``nfds`` the caller's)
headers = st.dictionaries(st.text(max_size=10).filter(lambda k: k not in ("len", "nfds")),
                          values, max_size=6)
payloads = st.binary(max_size=300)
frames = st.tuples(headers, payloads, st.integers(min_value=0, max_value=3))


def _allow_all(_h: Any) -> tuple[int, int]:
    return 1 << 20, MAX_QUEUED_FDS


def _encode(header: dict[str, Any], payload: bytes, nfds: int) -> bytes:
    return encode({**header, "nfds": nfds} if nfds else header, payload)


def _decode_all(chunks: list[bytes], decoder: Decoder, nfds: int = 0) -> list[Frame]:
    out: list[Frame] = []
    for i, chunk in enumerate(chunks):
        decoder.feed(chunk, nfds if i == 0 else 0)
        out.extend(decoder.frames())
    return out


def _expected(h: dict[str, Any], p: bytes, k: int) -> tuple[Any, bytes, int]:
    want = dict(h)
    if p:
        want["len"] = len(p)
    if k:
        want["nfds"] = k
    return json.loads(json.dumps(want)), p, k


@SETTINGS
@given(st.lists(frames, max_size=5))
def test_round_trip(batch: list[tuple[dict[str, Any], bytes, int]]) -> None:
    data = b"".join(_encode(*f) for f in batch)
    total_fds = sum(k for _h, _p, k in batch)
    for decoder in (Decoder.trusted(), Decoder.host(_allow_all, accept_fds=True)):
        if total_fds > MAX_QUEUED_FDS and decoder.max_fds is not None:
            continue
        got = _decode_all([data], decoder, total_fds)
        assert [(f.header, f.payload, f.nfds) for f in got] == [_expected(*f) for f in batch]
        assert decoder.buffered == 0 and decoder.fds_waiting == 0


@SETTINGS
@given(st.lists(frames, min_size=1, max_size=3))
def test_split_at_every_byte_boundary_gives_the_same_frames(
        batch: list[tuple[dict[str, Any], bytes, int]]) -> None:
    data = b"".join(_encode(*f) for f in batch)
    total_fds = sum(k for _h, _p, k in batch)
    whole = _decode_all([data], Decoder.trusted(), total_fds)
    for cut in range(len(data) + 1):
        assert _decode_all([data[:cut], data[cut:]], Decoder.trusted(), total_fds) == whole
    assert _decode_all([data[i:i + 1] for i in range(len(data))], Decoder.trusted(),
                       total_fds) == whole


@SETTINGS
@given(st.lists(st.binary(max_size=200), max_size=8), st.integers(0, 3), st.booleans())
def test_arbitrary_bytes_only_raise_violations(chunks: list[bytes], nfds: int,
                                               accept: bool) -> None:
    decoder = Decoder.host(accept_fds=accept)

    def run() -> None:
        for i, chunk in enumerate(chunks):
            decoder.feed(chunk, nfds if i == 0 else 0)
            for frame in decoder.frames():
                assert type(frame.header) is dict and frame.payload == b""  # no allowance
            assert decoder.buffered <= MAX_HEADER
    _only_violations(run)


@SETTINGS
@given(st.lists(frames, min_size=1, max_size=3), st.data())
def test_mutated_frames_only_raise_violations(batch: list[tuple[dict[str, Any], bytes, int]],
                                              data: st.DataObject) -> None:
    raw = bytearray(b"".join(_encode(*f) for f in batch))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        at = data.draw(st.integers(0, len(raw)))
        if op == "flip" and at < len(raw):
            raw[at] = data.draw(st.integers(0, 255))
        elif op == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif at < len(raw):
            del raw[at]
    cap = data.draw(st.integers(0, 64))
    decoder = Decoder.host(lambda _h: (cap, 1), accept_fds=True)
    step = data.draw(st.integers(1, 16))

    def run() -> None:
        for i in range(0, len(raw), step):
            decoder.feed(bytes(raw[i:i + step]), 1 if i == 0 else 0)
            for frame in decoder.frames():
                assert len(frame.payload) <= cap and frame.nfds <= 1
            # never more than a header line or an allowed payload (plus the last chunk)
            assert decoder.buffered <= max(MAX_HEADER, cap) + step
    _only_violations(run)


@SETTINGS
@given(st.integers(min_value=1, max_value=4 * MAX_HEADER), st.integers(1, 1 << 16))
def test_a_header_line_past_the_cap_is_refused_before_it_is_parsed(size: int,
                                                                  step: int) -> None:
    decoder = Decoder.host()
    line = b"x" * size

    def run() -> None:
        for i in range(0, size, step):
            decoder.feed(line[i:i + step])
            assert decoder.next_frame() is None
            assert decoder.buffered <= MAX_HEADER + step
    error = _only_violations(run)
    assert (error is not None) == (size > MAX_HEADER)
    assert error is None or "header line longer" in error.reason


def _only_violations(run: Callable[[], None]) -> Violation | None:
    """Run ``run``; the Violation it raised (with a reason), or None. Anything else fails."""
    try:
        run()
    except Violation as e:
        error = e
    else:
        return None
    assert error.reason
    return error


@pytest.mark.parametrize(("data", "reason"), [
    (b'{"ev":"x","len":-21}\n', "bad len"),
    (b'{"id":1,"len":"9"}\n', "bad len"),
    (b'{"id":1,"nfds":true}\n', "bad len"),
    (b"not json at all\n", "not JSON"),
    (b"\xff\xfe\n", "not JSON"),
    (b"[1,2,3]\n", "not a JSON object"),
    (b"[" * 60000 + b"\n", "not JSON"),
    (b'{"id":1,"len":1073741824}\n', "at most 0"),
    (b'{"id":1,"nfds":1}\n', "at most 0"),
])
def test_each_violation_names_its_reason(data: bytes, reason: str) -> None:
    decoder = Decoder.host()
    decoder.feed(data)
    with pytest.raises(Violation, match=reason):
        decoder.next_frame()


def test_descriptor_rules() -> None:
    with pytest.raises(Violation, match="may send none"):
        Decoder.host().feed(b"", 1)
    with pytest.raises(Violation, match="more descriptors"):
        Decoder.host(accept_fds=True).feed(b"", MAX_QUEUED_FDS + 1)
    with pytest.raises(Violation, match="more descriptors"):
        Decoder.host(accept_fds=True).feed(b"", 1, fds_truncated=True)
    decoder = Decoder.host(lambda _h: (0, 2), accept_fds=True)
    decoder.feed(b'{"id":1,"nfds":2}\n', 1)
    with pytest.raises(Violation, match="claims 2 descriptors, 1 came"):
        decoder.next_frame()


def test_the_allowance_is_asked_per_frame_as_frames_are_taken() -> None:
    """A reply's allowance is the caller's state after every earlier frame was handled."""
    allowed: dict[Any, int] = {1: 3}
    decoder = Decoder.host(lambda h: (allowed.pop(h.get("id"), 0), 0))
    decoder.feed(b'{"id":1,"len":3}\nabc{"id":1,"len":3}\nabc')
    assert decoder.next_frame() == Frame({"id": 1, "len": 3}, b"abc", 0)
    with pytest.raises(Violation, match="at most 0"):
        decoder.next_frame()


def test_parse_header() -> None:
    assert parse_header(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}
    with pytest.raises(Violation):
        parse_header(b' {"a":1}x')
