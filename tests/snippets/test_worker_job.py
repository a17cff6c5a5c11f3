"""The worker's reading of an invoke frame (``_job_of``: json's C scanner called straight)
accepts what json.loads accepts of a frame and refuses the rest with ValueError."""

from __future__ import annotations

import json

import pytest

from corral.snippets.sandbox.worker import _job_of, prepare_builtins


def test_a_frame_reads_as_json_loads_reads_it() -> None:
    frame = {"v": 1, "kind": "invoke", "ctx": {"run_id": "r"},
             "input": {"op": "run", "files": [["main.py", "print('é\\u2603')\n1"]],
                       "options": {"timeout_ms": 1000, "caps": {"items": 5}, "allowed": None,
                                   "x": [1.5, -2, True, False, None, "\U0001f600"]}}}
    for data in (json.dumps(frame).encode(), json.dumps(frame, ensure_ascii=False).encode(),
                 b" \r\n\t" + json.dumps(frame, indent=2).encode() + b"\n\n"):
        assert _job_of(data) == json.loads(data)["input"]


@pytest.mark.parametrize("data", [
    b"", b"\n", b"nope", b'{"v": 1, "kind": "invoke", "input": {}} x',
    b'{"v": 1, "kind": "invoke", "input": {}}{}', b"[1]", b'"s"',
    b'{"v": 2, "kind": "invoke", "input": {}}', b'{"v": 1, "kind": "invoke", "input": []}',
    b'{"v": 1, "kind": "invoke", "input": {', b"\xff\xfe{}", b'{"v": 1,}',
])
def test_anything_else_is_a_value_error(data: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        _job_of(data)


def test_prepared_builtins_keep_forbidden_names_out() -> None:
    import builtins

    from corral.snippets.sandbox import worker
    prepare_builtins(frozenset({"open"}))
    safe = worker._SAFE_BUILTINS.pop(frozenset({"open"}))
    assert "open" not in safe and safe["len"] is builtins.len
    assert safe["__build_class__"] is builtins.__build_class__
