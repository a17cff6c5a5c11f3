"""Hypothesis properties of wire 2's codec (corral.wire.fork): host <-> fork server, and
the zygote <-> template clone messages.

Every request and reply round-trips through wire 1's frames; the host's reading of a
reply never raises anything but its typed failure, whatever the fork server sends."""

from __future__ import annotations

import base64
import errno as errnos
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from corral.wire import fork
from corral.wire.agent import Decoder, Frame, Violation, encode

SETTINGS = settings(max_examples=200, deadline=None)

names = st.lists(st.text(max_size=12), max_size=5)
ids = st.integers(min_value=1, max_value=2**53)
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


def _one(data: bytes, nfds: int = 0) -> Frame:
    decoder = Decoder.host(lambda _h: (0, 1), accept_fds=True)
    decoder.feed(data, nfds)
    frames = decoder.frames()
    assert len(frames) == 1 and decoder.buffered == 0
    return frames[0]


@SETTINGS
@given(st.binary(max_size=200))
def test_init_round_trip(prog: bytes) -> None:
    decoder = Decoder.trusted()
    decoder.feed(fork.init_frame(prog))
    (req, _p, _k), = decoder.frames()
    assert req["op"] == "init" and "id" not in req and fork.seccomp_of(req) == prog


@SETTINGS
@given(names, names, ids)
def test_preload_round_trip(modules: list[str], entries: list[str], rid: int) -> None:
    decoder = Decoder.trusted()
    decoder.feed(encode({**fork.preload_request(modules, entries), "id": rid}))
    (req, _p, _k), = decoder.frames()
    assert (req["op"], req["modules"], req["entries"], req["id"]) == \
        ("preload", modules, entries, rid)
    assert fork.seccomp_of(req) is None
    missing = modules[:1] + entries[:1]
    h, _p, _k = _one(fork.preload_reply(rid, missing))
    assert h["id"] == rid and fork.decode_preload_reply(h, ["x"]) == missing


@SETTINGS
@given(st.dictionaries(st.text(max_size=6), json_values, max_size=4), names, ids,
       st.integers(1, 2**22), st.text(max_size=800))
def test_create_round_trip(plan: dict[str, Any], procs: list[str], rid: int, pid: int,
                           error: str) -> None:
    decoder = Decoder.trusted()
    decoder.feed(encode({**fork.create_request(plan, procs), "id": rid}))
    (req, _p, _k), = decoder.frames()
    assert (req["plan"], req["cgroup_procs"]) == (plan, procs)
    h, _p, k = _one(fork.create_ok(rid, pid), 1)
    assert k == 1 and h["id"] == rid and fork.decode_create_reply(h, k) == pid
    h, _p, k = _one(fork.create_failed(rid, error))
    with pytest.raises(fork.CreateFailed) as info:
        fork.decode_create_reply(h, k)
    assert info.value.reason == error[:fork.MAX_ERROR_CHARS]


@SETTINGS
@given(st.dictionaries(st.sampled_from(["ok", "pid", "error", "missing", "id", "nfds"]),
                       json_values, max_size=6), st.integers(0, 3))
def test_hostile_replies_raise_only_the_typed_failure(header: dict[str, Any],
                                                      nfds: int) -> None:
    try:
        pid = fork.decode_create_reply(header, nfds)
    except fork.CreateFailed as e:
        reason: str | None = e.reason
    else:
        reason = None
        assert type(pid) is int and nfds == 1 and header["ok"]
    assert reason is None or len(reason) <= fork.MAX_ERROR_CHARS
    missing = fork.decode_preload_reply(header, ["a", "b"])
    assert all(type(m) is str for m in missing)


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_reply_bytes_only_raise_violations(data: bytes) -> None:
    decoder = Decoder.host(lambda _h: (0, 1), accept_fds=True)
    try:
        decoder.feed(data)
        for h, _p, k in decoder.frames():
            try:
                fork.decode_create_reply(h, k)
            except fork.CreateFailed:
                pass
    except Violation:
        pass


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(1, 2**22),
       st.sampled_from(sorted(errnos.errorcode)))
def test_clone_messages_round_trip(uid: int, gid: int, pid: int, err: int) -> None:
    assert fork.decode_clone(fork.encode_clone(uid, gid)) == (uid, gid)
    assert fork.decode_cloned(fork.cloned(pid)) == pid
    with pytest.raises(OSError, match="clone") as info:
        fork.decode_cloned(fork.clone_failed(err))
    assert info.value.errno == err


def test_init_is_the_old_bytes_compacted() -> None:
    """The init frame is what the host sent before (now compact, like every frame)."""
    frame = fork.init_frame(b"\x01\x02")
    assert frame == b'{"op":"init","seccomp":"%s"}\n' % base64.b64encode(b"\x01\x02")
