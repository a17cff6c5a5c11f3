"""The host reads a run's records (what the worker writes on its record pipe) as hostile
input (issue 10, item 3): a snippet can reach its own worker's record writer
(``logging.StreamHandler().stream.out``) without escaping anything, and a process that
escapes the validator can write raw bytes there. Every malformed record is one
UnhandledWorkerError (the worker killed, the slot replaced); nothing else comes out of the
reader, nothing recurses on the input's depth, nothing buffers past the honest bound.

On the old reader: a log record of the wrong type raised TypeError, a forged end record of
the wrong type TypeError, a deeply nested one RecursionError, and unknown kinds or invalid
UTF-8 were skipped silently."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from snippet_levels import LEVELS

from corral.core.errors import UnhandledWorkerError
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet
from corral.snippets.host.transcript import Transcript, transcript_from_wire
from corral.snippets.sandbox.worker import BadRecord, Collector

OPTIONS = {"timeout_ms": 1000}
GO = b'{"go": true}\n'
END = b'{"end": {"facts": {"a": 1}, "result": "2", "errors": [], "duration_ms": 1.5, ' \
      b'"timed_out": false, "truncated": []}}\n'


def collect(chunks: list[bytes], *, killed: bool = False) -> Transcript:
    """What the host does with a forked worker's output: the collector, then the checked
    transcript."""
    collector = Collector(OPTIONS)
    for chunk in chunks:
        collector.feed(chunk)
    return transcript_from_wire(collector.finish(0, killed, 1.0))


TYPED = (BadRecord, UnhandledWorkerError)


def test_an_honest_record_stream() -> None:
    log = b'{"log": ["stdout", "hi"], "cut": false}\n'
    t = collect([GO, log[:7], log[7:] + END])
    assert t.result == "2" and dict(t.facts) == {"a": 1} and t.logs[0].text == "hi"
    crashed = collect([GO, log])  # no end: the process died midway
    assert crashed.errors[0].type == "WorkerCrashed" and crashed.logs[0].text == "hi"


@pytest.mark.parametrize("stream", [
    pytest.param([b"[" * 100_000 + b"\n"], id="deep-json"),
    pytest.param([GO, b'{"end": {"facts": {"d": ' + b"[" * 200 + b"]" * 200 + b"}}}\n"],
                 id="deep-facts"),
    pytest.param([GO, b"x" * (8 << 20)], id="huge-line"),
    pytest.param([GO, b'{"log": ["stdout", "\xff\xfe"], "cut": false}\n'], id="invalid-utf8"),
    pytest.param([GO, b'{"hello": "host"}\n'], id="unknown-kind"),
    pytest.param([GO, b'{"log": 5, "cut": false}\n'], id="log-not-a-pair"),
    pytest.param([GO, b'{"log": [["x"], "t"], "cut": false}\n'], id="log-unhashable-stream"),
    pytest.param([GO, b'{"log": ["stdout", 5], "cut": false}\n'], id="log-text-not-str"),
    pytest.param([GO, b'{"end": 5}\n'], id="end-not-an-object"),
    pytest.param([GO, b'{"end": {"errors": 5}}\n'], id="end-errors-not-a-list"),
    pytest.param([GO, b'{"end": {"x": 1}}\n'], id="end-unknown-key"),
    pytest.param([b'{"log": ["stdout", "a"], "cut": false}\n'], id="log-before-go"),
    pytest.param([GO, END, b'{"log": ["stdout", "a"], "cut": false}\n'], id="after-end"),
    pytest.param([GO, GO], id="go-twice"),
    pytest.param([GO, b'{"log": ["stdout", "a"], "cut": false}\n' * 1001], id="too-many-logs"),
    pytest.param([GO, b'{"end": {"facts": {}'], id="cut-off"),
    pytest.param([b'{"pong": true}\n'], id="pong-without-pid"),
    pytest.param([b"null\n"], id="not-an-object"),
])
def test_forged_streams_are_one_typed_error(stream: list[bytes]) -> None:
    with pytest.raises(TYPED):
        collect(stream)


@pytest.mark.parametrize("raw", [
    {"facts": {"d": json.loads("[" * 50 + "]" * 50)}},
    {"duration_ms": 10**400},
    {"duration_ms": float("nan")},
    {"truncated": [["logs"]]},
    {"logs": [{"stream": ["x"], "text": "t"}]},
    {"facts": {1: 2}},
    {"facts": {"x": object()}},
    {"errors": [{"type": "E", "message": "m", "line": "1"}]},
    [],
])
def test_malformed_transcripts_are_unhandled_worker_errors(raw: Any) -> None:
    with pytest.raises(UnhandledWorkerError):
        transcript_from_wire(raw)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=40)
KEYS = st.sampled_from(["go", "log", "cut", "end", "pong", "pid", "refused", "facts",
                        "result", "errors", "duration_ms", "timed_out", "truncated", "logs",
                        "stream", "text", "type", "message", "line", "x"])
RECORD_JSON = st.recursive(
    JSON, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=60)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=300), max_size=8), st.booleans())
def test_arbitrary_bytes_only_raise_typed_errors(chunks: list[bytes], killed: bool) -> None:
    try:
        t = collect([GO, *chunks], killed=killed)
    except TYPED:
        return
    assert isinstance(t, Transcript)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(RECORD_JSON, max_size=6), st.booleans())
@pytest.mark.slow
def test_arbitrary_json_records_only_raise_typed_errors(records: list[Any],
                                                        killed: bool) -> None:
    lines = [json.dumps(r).encode() + b"\n" for r in records]
    try:
        t = collect([GO, *lines], killed=killed)
    except TYPED:
        return
    assert isinstance(t, Transcript)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(RECORD_JSON)
@pytest.mark.slow
def test_arbitrary_end_records_and_wire_objects_only_raise_typed_errors(value: Any) -> None:
    for attempt in (lambda: collect([GO, json.dumps({"end": value}).encode() + b"\n"]),
                    lambda: transcript_from_wire(value)):
        try:
            assert isinstance(attempt(), Transcript)
        except TYPED:
            pass


# -- end to end: a snippet writes the forged records itself ---------------------------------

_FLOOD = ('for _ in range(3):\n'
          '    out.send({"log": ["stdout", "x" * 1000000], "cut": False})\n')
_OUT = "import logging\nout = logging.StreamHandler().stream.out\n"
FORGED = [
    # before: RecursionError (the forged end outlived the flood that ended the run)
    pytest.param(_OUT + 'v = "x"\nfor _ in range(960):\n    v = [v]\n'
                 'out.send({"end": {"facts": {"deep": v}}})\n' + _FLOOD, id="deep-end"),
    # before: TypeError ('int' object is not iterable)
    pytest.param(_OUT + 'out.send({"end": {"facts": [], "errors": 5}})\n' + _FLOOD,
                 id="end-wrong-types"),
    # before: TypeError (cannot unpack non-iterable int object)
    pytest.param(_OUT + 'out.send({"log": 5})\n', id="log-wrong-type"),
    # before: skipped silently, the run reported ok
    pytest.param(_OUT + 'out.send({"hello": "host"})\n', id="unknown-kind"),
    # before: the flood ended the run as a "TimeoutError ... killed" transcript
    pytest.param(_OUT + _FLOOD, id="flood"),
]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("source", FORGED)
def test_a_snippet_forging_its_records_gets_an_unhandled_worker_error(level: str,
                                                                      source: str) -> None:
    async def main() -> None:
        async with SnippetPool(max_workers=1, spares=0) as pool:
            with pytest.raises(UnhandledWorkerError, match=r"malformed|refused"):
                await run_snippet(source, pool=pool, level=level, timeout_ms=5000)
            assert pool.statistics().replaced == 1  # the slot was discarded
            assert (await run_snippet("6 * 7", pool=pool, level=level)).result == "42"

    asyncio.run(main())


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("raw", [
    pytest.param(r"b'\xff\xfe\n'", id="invalid-utf8"),  # before: skipped, the run was ok
    pytest.param("b'{\"end\"'", id="garbage-then-end"),  # before: skipped, the run was ok
])
def test_raw_bytes_from_an_escaped_worker(level: str, raw: str) -> None:
    # The validator refuses os and sys: `_unsafe_skip_validation` stands in for an escape.
    source = f"import os, sys\nos.write(sys.stdout.out.fd, {raw})"

    async def main() -> None:
        async with SnippetPool(max_workers=1, spares=0) as pool:
            with pytest.raises(UnhandledWorkerError, match=r"malformed|refused"):
                await run_snippet(source, pool=pool, level=level,
                                  _unsafe_skip_validation=True)

    asyncio.run(main())

