"""The one error codec of every wire: ``to_dict`` and ``error_from_dict``/``error_from_json``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.core.errors import (
    ERROR_CLASSES,
    MAX_ERROR_JSON,
    MAX_ERROR_TEXT,
    ConfigInvalidError,
    CorralError,
    ErrorCode,
    LevelNotSupportedError,
    LimitsExceededError,
    ProviderError,
    SandboxTimeoutError,
    UnhandledWorkerError,
    error_from_dict,
    error_from_json,
)
from corral.core.result import Outcome, RunResult


def _every_error() -> list[CorralError]:
    """One of every class, with facts that differ from the neutral values."""
    special: dict[ErrorCode, CorralError] = {
        ErrorCode.LEVEL_NOT_SUPPORTED: LevelNotSupportedError(
            "strict", ("context-isolated", "strict"), "why", missing="userns",
            field="limits.mem_mb"),
        ErrorCode.LIMITS_EXCEEDED: LimitsExceededError("memory", 64, 70, detail="oom"),
        ErrorCode.TIMEOUT: SandboxTimeoutError("late", timeout_ms=300),
        ErrorCode.UNHANDLED_WORKER: UnhandledWorkerError("died", exit_code=-9,
                                                         stderr_tail="tail"),
        ErrorCode.CONFIG_INVALID: ConfigInvalidError("argv", "empty"),
    }
    return [special.get(code) or cls(f"a {code} happened")  # type: ignore[call-arg]
            for code, cls in ERROR_CLASSES.items()]


@pytest.mark.parametrize("err", _every_error(), ids=lambda e: str(e.code))
def test_every_class_round_trips_with_its_facts(err: CorralError) -> None:
    back = error_from_json(json.dumps(err.to_dict()))
    assert type(back) is type(err)
    assert back.to_dict() == err.to_dict()
    assert str(back) == str(err) and back.message == err.message
    assert vars(back) == vars(err)


def test_a_result_rides_beside_and_feeds_a_timeouts_output() -> None:
    r = RunResult(outcome=Outcome.TIMEOUT, limit_value=300, stdout=b"part", stderr=b"e")
    err = r.error()
    assert err is not None
    back = error_from_dict(err.to_dict(), result=r)
    assert isinstance(back, SandboxTimeoutError)
    assert back.result is r and (back.stdout, back.stderr) == (b"part", b"e")
    limits = RunResult(outcome=Outcome.MEMORY_LIMIT, limit_value=64, observed=80).error()
    assert limits is not None
    again = error_from_dict(limits.to_dict(), result=limits.result)
    assert isinstance(again, LimitsExceededError) and again.to_dict() == limits.to_dict()


@pytest.mark.parametrize("doc", [
    {"code": "made-up", "message": "x"},
    {"code": "Exception", "message": "x"},
    {"code": "__class__", "message": "x"},
    {"code": 7, "message": "x"},
    {"code": None},
    {},
    {"message": "no code"},
])
def test_an_unknown_code_is_provider_error_never_another_class(doc: dict[str, Any]) -> None:
    err = error_from_dict(doc)
    assert type(err) is ProviderError
    assert "unknown error code" in err.message


@pytest.mark.parametrize("doc", [None, 3, "config-invalid", [], ["code"], b"{}"])
def test_not_an_object_is_provider_error(doc: object) -> None:
    assert type(error_from_dict(doc)) is ProviderError


@pytest.mark.parametrize("doc", [
    {"code": "limits-exceeded", "limit": "os.system", "limit_value": "64", "observed": [1]},
    {"code": "limits-exceeded", "limit": "memory", "limit_value": 10 ** 40},
    {"code": "level-not-supported", "requested": 5, "supported": "strict", "field": {}},
    {"code": "level-not-supported", "supported": [1, None, "strict"]},
    {"code": "unhandled-worker", "exit_code": "9", "stderr_tail": 7},
    {"code": "unhandled-worker", "exit_code": True},
    {"code": "config-invalid", "field": None, "reason": ["x"], "message": 3},
    {"code": "timeout", "timeout_ms": 1.5},
])
def test_wrong_typed_facts_take_neutral_values(doc: dict[str, Any]) -> None:
    err = error_from_dict(doc)
    assert type(err) is ERROR_CLASSES[ErrorCode(doc["code"])]
    json.dumps(err.to_dict())  # every fact is plain JSON again
    for key in ("limit_value", "observed", "exit_code", "timeout_ms"):
        v = getattr(err, key, 0)
        assert v is None or type(v) is int
    if isinstance(err, LimitsExceededError):
        assert err.limit in ("memory", "output") and err.limit_value < 2 ** 63
    if isinstance(err, LevelNotSupportedError):
        assert all(isinstance(s, str) for s in err.supported)


def test_huge_and_garbled_input_is_bounded() -> None:
    big = error_from_dict({"code": "config-invalid", "field": "f" * 10 ** 6,
                           "reason": "r" * 10 ** 6, "message": "m" * 10 ** 6})
    assert isinstance(big, ConfigInvalidError)
    assert len(big.field) <= MAX_ERROR_TEXT and len(big.message) <= MAX_ERROR_TEXT
    assert type(error_from_json(b"x" * (MAX_ERROR_JSON + 1))) is ProviderError
    assert type(error_from_json(b"{\"code\": ")) is ProviderError
    assert type(error_from_json(b"\xff\xfe")) is ProviderError
    assert type(error_from_json(b"[" * 100_000)) is ProviderError  # nested too deep
