"""Wire 1's messages (corral.wire.agentmsg): every type round-trips through its codec,
and whatever a header holds, the host's decoders raise nothing but BadMessage."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from corral.core.errors import ConfigInvalidError, error_from_dict
from corral.wire import agentmsg as m
from corral.wire.agent import encode, parse_header

REQUESTS: list[m.Request] = [
    m.Spawn(["/bin/true", "a b"], {"PATH": "/bin"}, "sub", 5),
    m.Spawn(["ls"], {}),
    m.ForkCall("mod:fn", ["x"], {"A": "1"}, "", None),
    m.Kill(12, 9), m.Write("a/b.txt"), m.Read("a"), m.ListDir(""), m.Remove("d", True),
    m.MakeDir("x/y", False), m.Stat("s"), m.Snapshot(), m.Restore(), m.Ping(),
    m.SocketReq(6),
]
REPLIES: list[m.Reply] = [
    m.Done(), m.Started(7), m.StartFailed(2, "command not found: x"),
    m.EntryInfo("f", "file", 3, 0o644, 1.5, None), m.EntryInfo("l", "symlink", 4, 0o777, 2, "/x"),
    m.Listing(2), m.Made(True),
    m.Failed(ConfigInvalidError("path", "bad").to_dict()), m.OsFailed(2, "No such file", "p"),
]


def _over_the_wire(h: dict[str, Any]) -> dict[str, Any]:
    line = encode({"id": 3, **h}).rstrip(b"\n")
    return parse_header(line)


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_request_round_trips(req: m.Request) -> None:
    assert m.decode_request(_over_the_wire(m.encode_request(req))) == req


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: type(r).__name__)
def test_every_reply_round_trips(reply: m.Reply) -> None:
    assert m.decode_reply(_over_the_wire(m.encode_reply(reply)), (type(reply),)) == reply


def test_exit_event_and_listing_round_trip() -> None:
    ev = m.Exit(5, -9, 12, 3000, 1 << 40)
    assert m.decode_event(_over_the_wire(m.encode_event(ev))) == ev
    assert m.decode_event({"ev": "future-kind"}) is None
    entries = [m.EntryInfo("a", "dir", 0, 0o755, 1.0, None),
               m.EntryInfo("b", "symlink", 1, 0o777, 2.0, "a")]
    assert m.decode_listing(m.encode_listing(entries), 2) == entries


def test_an_error_reply_goes_through_the_one_error_codec() -> None:
    reply = m.decode_reply(_over_the_wire(m.encode_reply(
        m.Failed(ConfigInvalidError("argv", "empty").to_dict()))), (m.Started,))
    assert isinstance(reply, m.Failed)
    err = error_from_dict(reply.error)
    assert isinstance(err, ConfigInvalidError) and (err.field, err.reason) == ("argv", "empty")


@pytest.mark.parametrize(("h", "expect"), [
    ({"r": "started", "pid": "7"}, m.Started),          # a string for an int
    ({"r": "started", "pid": True}, m.Started),         # a bool is no int
    ({"r": "started", "pid": 1 << 70}, m.Started),      # out of range
    ({"r": "started"}, m.Started),                      # missing
    ({"r": "done"}, m.Started),                         # not what the request expects
    ({"r": "surprise"}, m.Done),                        # unknown type
    ({"r": 1}, m.Done),
    ({}, m.Done),
    ({"r": "failed", "error": "boom"}, m.Done),         # an error that is no object
    ({"r": "os-failed", "errno": "2", "reason": "x"}, m.Done),
    ({"r": "entry", "name": "x" * (m.MAX_TEXT + 1), "type": "file", "size": 1, "mode": 0,
      "mtime": 0}, m.EntryInfo),                        # text past the cap
    ({"r": "made", "created": 1}, m.Made),
])
def test_malformed_replies_are_bad_messages(h: dict[str, Any], expect: type) -> None:
    with pytest.raises(m.BadMessage):
        m.decode_reply(h, (expect,))


@pytest.mark.parametrize("payload", [b"{", b"{}", b"[[1,2]]", b'[["a","file",1,1,1.0,null]]',
                                     b'[["a","file","1",1,1.0]]', b"[" * 5000])
def test_malformed_listings_are_bad_messages(payload: bytes) -> None:
    with pytest.raises(m.BadMessage):
        m.decode_listing(payload, 2)


scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
           | st.floats() | st.text(max_size=12))
values: st.SearchStrategy[Any] = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
tags = st.sampled_from(["done", "started", "start-failed", "entry", "listing", "made",
                        "failed", "os-failed", "x"])
fields = st.sampled_from(["pid", "errno", "reason", "name", "type", "size", "mode", "mtime",
                          "target", "n", "created", "exists", "error", "path", "code"])


@settings(max_examples=400, deadline=None)
@given(tag=tags, body=st.dictionaries(fields, values, max_size=6),
       expect=st.sampled_from([m.Done, m.Started, m.StartFailed, m.EntryInfo, m.Listing,
                               m.Made]))
def test_any_header_decodes_or_is_a_bad_message(tag: str, body: dict[str, Any],
                                                expect: type) -> None:
    h = {**body, "r": tag}
    try:
        reply = m.decode_reply(h, (expect,))
    except m.BadMessage:
        return
    assert type(reply) in (expect, m.Failed, m.OsFailed)
    json.dumps(m.encode_reply(reply))  # a decoded reply is plain data again


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=200) | values.map(lambda v: json.dumps(v).encode()),
       count=st.integers(min_value=0, max_value=5))
def test_any_listing_decodes_or_is_a_bad_message(payload: bytes, count: int) -> None:
    try:
        entries = m.decode_listing(payload, count)
    except m.BadMessage:
        return
    assert len(entries) == count and all(type(e) is m.EntryInfo for e in entries)
