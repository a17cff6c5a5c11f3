from __future__ import annotations

import pytest

from corral.core import errors
from corral.core.errors import (
    ERROR_CLASSES,
    ConfigInvalidError,
    CorralError,
    ErrorCode,
    LevelNotSupportedError,
    LimitsExceededError,
    ProviderError,
    SandboxTimeoutError,
    error_from_code,
)

SEED_CODES = {
    "level-not-supported", "limits-exceeded", "timeout", "cancelled", "create-cancelled",
    "unhandled-worker", "config-invalid", "orphaned", "snapshot-not-supported",
    "restore-not-supported", "pause-not-supported", "invalid-snapshot-handle", "provider-error",
    "session-ended",  # issue 30: a session (corral.sessions) that runs no more cells
}


def _all_error_classes() -> list[type[CorralError]]:
    return [obj for obj in vars(errors).values()
            if isinstance(obj, type) and issubclass(obj, CorralError) and obj is not CorralError]


def test_codes_are_exactly_the_seeds() -> None:
    assert {c.value for c in ErrorCode} == SEED_CODES


def test_set_is_closed_every_code_one_class_and_back() -> None:
    classes = _all_error_classes()
    # every class has a code, and no two classes share one
    assert sorted(c.code for c in classes) == sorted(ErrorCode)
    # the table maps each code to the class that carries it, and back
    assert set(ERROR_CLASSES) == set(ErrorCode)
    for code, cls in ERROR_CLASSES.items():
        assert cls.code is code
    assert set(ERROR_CLASSES.values()) == set(classes)


@pytest.mark.parametrize("code", list(ErrorCode))
def test_error_from_code_round_trip(code: ErrorCode) -> None:
    err = error_from_code(code.value, "boom")
    assert type(err) is ERROR_CLASSES[code]
    assert err.code is code
    assert err.to_dict()["code"] == code.value


def test_unknown_code_is_provider_error_not_a_new_class() -> None:
    err = error_from_code("made-up", "x")
    assert type(err) is ProviderError
    assert "made-up" in err.message


def test_every_class_has_statuses_and_ends_in_error() -> None:
    for cls in _all_error_classes():
        assert cls.__name__.endswith("Error")
        assert 1 <= cls.exit_status <= 255
        assert 400 <= cls.http_status <= 599


def test_limits_exceeded_names_the_limit_and_figures() -> None:
    err = LimitsExceededError("memory", 64, 70)
    assert err.limit == "memory"
    assert err.to_dict() == {
        "code": "limits-exceeded", "message": str(err), "limit": "memory",
        "limit_value": 64, "observed": 70, "unit": "MiB", "detail": "",
    }
    assert "memory" in str(err) and "64" in str(err)


def test_standard_bases() -> None:
    assert issubclass(ConfigInvalidError, ValueError)
    assert issubclass(SandboxTimeoutError, TimeoutError)
    err = ConfigInvalidError("limits.mem_mb", "must be >= 1")
    assert err.field == "limits.mem_mb"
    assert str(err) == "limits.mem_mb: must be >= 1"


def test_level_not_supported_names_missing_primitive() -> None:
    err = LevelNotSupportedError("strict", {"none"}, missing="user namespaces")
    assert "user namespaces" in str(err)
    assert err.supported == ("none",)


def test_provider_error_chains_cause() -> None:
    cause = OSError(5, "EIO")
    err = ProviderError("failed", cause)
    assert err.__cause__ is cause
