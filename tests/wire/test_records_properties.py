"""Hypothesis properties of wire 3's codec (corral.wire.records): snippet worker records.

Every valid record stream round-trips (encoded by the writer's codec, decoded by the
reader's), whatever the chunking, split at every byte boundary; arbitrary bytes and
mutated streams raise nothing but :class:`BadRecord`, and the decoder never holds more
than its size limit."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from corral.snippets.sandbox.worker import CAPS
from corral.wire import records
from corral.wire.records import BadRecord, Decoder, End, Go, Log, Pong, Record, Refused

SETTINGS = settings(max_examples=200, deadline=None)


def _decoder(**caps: int) -> Decoder:
    return Decoder(log_lines=caps.get("log_lines", CAPS["log_lines"]),
                   log_bytes=caps.get("log_bytes", CAPS["log_bytes"]),
                   facts_bytes=caps.get("facts_bytes", CAPS["facts_bytes"]))


leaves = (st.none() | st.booleans() | st.integers(-(2**63), 2**63)
          | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
facts_values: st.SearchStrategy[Any] = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
ends = st.fixed_dictionaries({}, optional={
    "facts": st.dictionaries(st.text(max_size=8), facts_values, max_size=4),
    "result": st.none() | st.text(max_size=30),
    "errors": st.lists(st.dictionaries(st.text(max_size=6), st.text(max_size=10), max_size=3),
                       max_size=2),
    "duration_ms": st.integers(0, 10**6) | st.floats(0, 1e6),
    "timed_out": st.booleans(),
    "truncated": st.lists(st.text(max_size=8), max_size=3)})
logs = st.builds(Log, st.sampled_from(records.LOG_STREAMS),
                 st.text(max_size=40).map(lambda t: t.replace("\n", " ")), st.booleans())
runs: st.SearchStrategy[list[Record]] = st.one_of(
    st.builds(lambda ls, end: [Go(), *ls, *([] if end is None else [End(end)])],
              st.lists(logs, max_size=6), st.none() | ends),
    st.integers(1, 2**22).map(lambda pid: [Pong(pid)]),
    st.text(max_size=600).map(lambda t: [Refused(t)]),
)


def _want(rec: Record) -> Record:
    """What the reader gives for what the writer wrote (JSON's view of the values)."""
    if isinstance(rec, End):
        return End(json.loads(json.dumps(rec.fields)))
    if isinstance(rec, Refused):
        return Refused(rec.text[:records.REFUSED_CHARS])
    return rec


def _feed(decoder: Decoder, chunks: list[bytes]) -> list[Record]:
    out: list[Record] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    return out


@SETTINGS
@given(runs)
def test_round_trip(stream: list[Record]) -> None:
    data = b"".join(records.encode(r) for r in stream)
    decoder = _decoder()
    assert _feed(decoder, [data]) == [_want(r) for r in stream]
    assert not decoder.cut_off()


@SETTINGS
@given(runs)
def test_split_at_every_byte_boundary_gives_the_same_records(stream: list[Record]) -> None:
    data = b"".join(records.encode(r) for r in stream)
    whole = _feed(_decoder(), [data])
    for cut in range(0, len(data) + 1, max(1, len(data) // 64)):
        assert _feed(_decoder(), [data[:cut], data[cut:]]) == whole
    assert _feed(_decoder(), [data[i:i + 1] for i in range(len(data))]) == whole


@SETTINGS
@given(st.lists(st.binary(max_size=300), max_size=8))
def test_arbitrary_bytes_only_raise_bad_record(chunks: list[bytes]) -> None:
    decoder = _decoder(log_lines=3, log_bytes=10, facts_bytes=10)

    def run() -> None:
        for chunk in chunks:
            decoder.feed(chunk)
            assert decoder.buffered <= decoder.limit
    _only_bad_records(run)


def _only_bad_records(run: Callable[[], None]) -> None:
    """Run ``run``: it returns, or raises BadRecord with a reason; anything else fails."""
    try:
        run()
    except BadRecord as e:
        error = str(e)
    else:
        return
    assert error


@SETTINGS
@given(runs, st.data())
def test_mutated_streams_only_raise_bad_record(stream: list[Record],
                                               data: st.DataObject) -> None:
    raw = bytearray(b"".join(records.encode(r) for r in stream))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw)))
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "flip" and at < len(raw):
            raw[at] = data.draw(st.integers(0, 255))
        elif op == "insert":
            raw[at:at] = data.draw(st.sampled_from(
                [b"\n", b"{", b"[", b'"', b"\xff", b'{"go":true}\n', b'{"end":{}}\n']))
        elif at < len(raw):
            del raw[at]
    step = data.draw(st.integers(1, 64))
    decoder = _decoder()

    def run() -> None:
        for i in range(0, len(raw), step):
            for rec in decoder.feed(bytes(raw[i:i + step])):
                assert isinstance(rec, Go | Log | End | Pong | Refused)
            assert decoder.buffered <= decoder.limit
    _only_bad_records(run)


@SETTINGS
@given(st.integers(1, 1 << 16))
def test_the_size_limit_is_checked_before_buffering(step: int) -> None:
    decoder = _decoder(log_lines=1, log_bytes=1, facts_bytes=1)
    blob = b"x" * (decoder.limit + step)

    def run() -> None:
        for i in range(0, len(blob), step):
            decoder.feed(blob[i:i + step])
            assert decoder.buffered <= decoder.limit
    with pytest.raises(BadRecord, match="more than"):
        run()


@pytest.mark.parametrize(("stream", "reason"), [
    (b"[" * 100_000 + b"\n", "not a JSON line"),
    (b'{"a":' * 17 + b"1" + b"}" * 17 + b"\n", "a few levels"),
    (b'{"go":true}\n{"go":true}\n', "unexpected"),
    (b'{"log":["stdout","x"],"cut":false}\n', "unexpected"),
    (b'{"go":true}\n{"log":["bogus","x"],"cut":false}\n', "malformed log"),
    (b'{"go":true}\n{"end":{"result":1}}\n', "malformed end record \\(result\\)"),
    (b'{"go":true}\n{"end":{}}\n{"go":true}\n', "after the last"),
    (b'{"pong":true,"pid":"1"}\n', "unexpected"),
    (b"\xff\n", "not a JSON line"),
])
def test_each_bad_record_names_its_reason(stream: bytes, reason: str) -> None:
    with pytest.raises(BadRecord, match=reason):
        _decoder().feed(stream)


def test_the_log_count_is_capped() -> None:
    decoder = _decoder(log_lines=2)
    decoder.feed(records.encode(Go()) + records.encode(Log("log", "a", False)) * 2)
    with pytest.raises(BadRecord, match="more log records"):
        decoder.feed(records.encode(Log("log", "a", False)))
