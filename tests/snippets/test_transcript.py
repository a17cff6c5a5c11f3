"""Transcript values and the host's checked, capped reading of the worker's dict (pure)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from corral.core.errors import UnhandledWorkerError
from corral.core.spec import Level
from corral.snippets.host.transcript import (
    CAPS,
    TRUNCATION_MARK,
    LogLine,
    SnippetError,
    Transcript,
    thaw,
    transcript_from_wire,
    transcript_rejected,
)
from corral.snippets.validator import validate_source


def wire(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"logs": [{"stream": "stdout", "text": "hi"}], "facts": {"a": 1},
                            "result": "2", "errors": [], "duration_ms": 1.5,
                            "timed_out": False, "truncated": []}
    return base | over


def test_reads_every_field() -> None:
    t = transcript_from_wire(wire(errors=[{"type": "ValueError", "message": "m", "line": 3,
                                           "path": "main.py", "traceback": "tb"}]))
    assert t.logs == (LogLine(stream="stdout", text="hi"),)
    assert dict(t.facts) == {"a": 1}
    assert t.result == "2"
    assert t.errors == (SnippetError(type="ValueError", message="m", line=3, path="main.py",
                                     traceback="tb"),)
    assert t.duration_ms == 1.5 and t.timed_out is False and t.truncated == frozenset()
    assert not t.ok and not t.rejected


def test_is_frozen_and_facts_read_only() -> None:
    t = transcript_from_wire(wire(facts={"d": {"k": [1, {"x": 2}]}}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.result = "3"  # type: ignore[misc]
    with pytest.raises(TypeError):
        t.facts["d"]["k"] = 1  # type: ignore[index]
    assert t.facts["d"]["k"] == (1, {"x": 2})
    assert thaw(t.facts) == {"d": {"k": [1, {"x": 2}]}}


def test_to_dict_is_json_round_trip() -> None:
    t = transcript_from_wire(wire(truncated=["logs"]))
    doc = json.loads(json.dumps(t.to_dict()))
    assert doc["logs"] == [{"stream": "stdout", "text": "hi"}]
    assert doc["facts"] == {"a": 1} and doc["result"] == "2"
    assert doc["truncated"] == ["logs"] and doc["timed_out"] is False
    assert set(doc) == {"logs", "facts", "result", "errors", "duration_ms", "timed_out",
                        "truncated", "level", "limits"}
    assert doc["level"] is None  # the wire does not say; the host sets the level it ran at
    assert doc["limits"] == {}  # nor how the run was held: the host's pool says (issue 26)
    ran = transcript_from_wire(wire(), level=Level.STRICT)
    assert ran.level == Level.STRICT and ran.to_dict()["level"] == "strict"


def test_caps_log_lines_and_bytes_again_on_the_host() -> None:
    many = [{"stream": "log", "text": str(i)} for i in range(CAPS["log_lines"] + 5)]
    t = transcript_from_wire(wire(logs=many))
    assert len(t.logs) == CAPS["log_lines"] and "logs" in t.truncated
    long = [{"stream": "stderr", "text": "x" * (CAPS["line_chars"] * 2)}]
    t = transcript_from_wire(wire(logs=long))
    assert len(t.logs[0].text) == CAPS["line_chars"] and t.logs[0].text.endswith(TRUNCATION_MARK)
    big = [{"stream": "stdout", "text": "y" * 4000} for _ in range(40)]
    t = transcript_from_wire(wire(logs=big))
    assert sum(len(x.text) for x in t.logs) <= CAPS["log_bytes"] and "logs" in t.truncated


def test_caps_facts_result_and_errors() -> None:
    facts = {f"n{i}": "v" * 1000 for i in range(200)}
    t = transcript_from_wire(wire(facts=facts))
    assert "facts" in t.truncated and len(json.dumps(thaw(t.facts))) <= CAPS["facts_bytes"]
    t = transcript_from_wire(wire(result="r" * (CAPS["result_chars"] + 10)))
    assert t.result is not None and len(t.result) == CAPS["result_chars"]
    assert "result" in t.truncated
    err = {"type": "E", "message": "m" * 10_000, "traceback": "line\n" * 10_000}
    t = transcript_from_wire(wire(errors=[err] * (CAPS["errors"] + 3)))
    assert len(t.errors) == CAPS["errors"] and "errors" in t.truncated
    assert len(t.errors[0].message) == CAPS["message_chars"]
    assert t.errors[0].traceback.startswith(TRUNCATION_MARK)  # the tail is kept
    assert len(t.errors[0].traceback) == CAPS["traceback_chars"]


def test_worker_truncation_markers_are_kept() -> None:
    t = transcript_from_wire(wire(truncated=["logs", "facts", "bogus"]))
    assert t.truncated == frozenset({"logs", "facts"})


def test_sanitizes_paths_in_messages_and_tracebacks() -> None:
    err = {"type": "OSError", "message": "no such file: /work/secret/x.txt",
           "traceback": 'File "/home/alice/app.py", line 1\nFile "/work/run/main.py", line 2'}
    t = transcript_from_wire(wire(errors=[err]), sandbox_paths=("/work",))
    assert "/work" not in t.errors[0].message and "<sandbox>" in t.errors[0].message
    assert "alice" not in t.errors[0].traceback and "/work" not in t.errors[0].traceback


@pytest.mark.parametrize("bad", [
    [], "x", {"logs": "no"}, {"logs": [{"stream": "evil", "text": "x"}]},
    {"logs": [{"stream": "stdout", "text": 1}]}, {"facts": []}, {"facts": {"x": float("nan")}},
    {"result": 1}, {"errors": [{"type": "E"}]}, {"errors": [{"type": "E", "message": "m",
                                                             "line": "3"}]},
    {"duration_ms": "1"}, {"duration_ms": float("inf")}, {"timed_out": "yes"},
    {"truncated": "logs"},
])
def test_malformed_worker_output_is_an_unhandled_worker_error(bad: Any) -> None:
    with pytest.raises(UnhandledWorkerError, match="malformed transcript"):
        transcript_from_wire(bad)


def test_rejected_transcript_holds_one_validation_error_per_violation() -> None:
    violations = validate_source("import os\nx = eval('1')\n")
    t = transcript_rejected(violations)
    assert t.rejected and not t.ok and t.duration_ms == 0 and t.logs == ()
    assert [(e.type, e.code, e.line, e.column, e.path) for e in t.errors] == [
        ("ValidationError", "forbidden-import", 1, 0, "main.py"),
        ("ValidationError", "forbidden-name", 2, 4, "main.py"),
    ]
    many = validate_source("\n".join(f"import os{i}" for i in range(40)))
    t = transcript_rejected(many)
    assert len(t.errors) == CAPS["errors"] and "errors" in t.truncated


def test_ok_property() -> None:
    assert Transcript().ok
    assert not Transcript(timed_out=True).ok
