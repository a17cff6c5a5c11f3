"""The HTTP API's JSON shapes (corral.providers.remote.wire): every value the server sends
comes back as the same value, every error as the same class with the same facts."""

from __future__ import annotations

import json

import pytest

from corral.core.errors import (
    ERROR_CLASSES,
    ConfigInvalidError,
    CorralError,
    LevelNotSupportedError,
    LimitsExceededError,
    ProviderError,
    SandboxTimeoutError,
    UnhandledWorkerError,
)
from corral.core.result import NetworkDenial, Outcome, RunResult
from corral.core.spec import (
    ExecOpts,
    NetworkPolicy,
    ProcessOpts,
    ResourceUsage,
    SandboxLimits,
    SandboxSpec,
    SnapshotHandle,
)
from corral.providers.remote import wire


def _through_json(doc: object) -> object:
    return json.loads(json.dumps(doc))


def test_results_round_trip() -> None:
    r = RunResult(outcome=Outcome.MEMORY_LIMIT, exit_code=-9, stdout=b"ok\xff\x00",
                  stderr="é".encode(), stdout_truncated=True, duration_ms=1.5,
                  usage=ResourceUsage(cpu_ms=3, wall_ms=4, peak_mem_mb=5), limit_value=64,
                  observed=70, detail="oom", spawn_errno=None, strays_killed=2,
                  denials=(NetworkDenial(host="h", port=1, kind="not-allowed", reason="r"),))
    assert wire.result_from_json(_through_json(wire.result_to_json(r))) == r


def test_specs_and_options_round_trip() -> None:
    spec = SandboxSpec(tenant_id="t", run_id="r", level="context-isolated",
                       limits=SandboxLimits(mem_mb=64, cpu_ms=100),
                       network=NetworkPolicy.allowlist("example.org"))
    assert wire.spec_from_json(_through_json(wire.spec_to_json(spec))) == spec
    assert wire.spec_from_json(wire.spec_to_json(spec), tenant_id="x").tenant_id == "x"
    opts = ExecOpts(timeout_ms=5, env={"A": "b"}, cwd="d", stdin=b"\x00\xff",
                    max_stdout_bytes=9)
    assert wire.exec_opts_from_json(_through_json(wire.exec_opts_to_json(opts))) == opts
    popts = ProcessOpts(stdin=False, env={"A": "b"}, cwd="c", timeout_ms=7)
    assert wire.process_opts_from_json(wire.process_opts_to_json(popts)) == popts
    h = SnapshotHandle(adapter_id="linux", doc={"id": "x", "size": 3})
    assert wire.handle_from_json(_through_json(wire.handle_to_json(h))) == h


@pytest.mark.parametrize("doc", [
    {"spec": 1}, {"limits": {"mem_mb": 0}}, {"limits": {"bogus": 1}}, {"level": "weak"},
    {"network": {"kind": "allowlist"}}, {"extra": 1},
])
def test_bad_specs_are_config_invalid(doc: dict[str, object]) -> None:
    with pytest.raises(ConfigInvalidError):
        wire.spec_from_json(doc.get("spec", doc))


def _errors() -> list[CorralError]:
    timeout = SandboxTimeoutError("t", timeout_ms=300, stdout=b"partial", stderr=b"e")
    timeout.result = RunResult(outcome=Outcome.TIMEOUT, stdout=b"partial", stderr=b"e",
                               limit_value=300)
    return [
        LevelNotSupportedError("strict", ("none",), "why", missing="userns",
                               field="limits.mem_mb"),
        LimitsExceededError("memory", 64, 70, detail="oom"),
        timeout,
        UnhandledWorkerError("died", exit_code=-9, stderr_tail="tail"),
        ConfigInvalidError("argv", "empty"),
        *(cls("m") for code, cls in ERROR_CLASSES.items() if cls not in (
            LevelNotSupportedError, LimitsExceededError, SandboxTimeoutError,
            UnhandledWorkerError, ConfigInvalidError, ProviderError)),
        ProviderError("boom"),
    ]


@pytest.mark.parametrize("err", _errors(), ids=lambda e: str(e.code))
def test_errors_round_trip_with_their_facts(err: CorralError) -> None:
    back = wire.error_from_json(_through_json(wire.error_to_json(err)))
    assert type(back) is type(err)
    assert back.to_dict() == err.to_dict()
    assert str(back) == str(err)
    if err.result is not None:
        assert back.result == err.result
    if isinstance(err, SandboxTimeoutError):
        assert isinstance(back, SandboxTimeoutError) and back.stdout == b"partial"


def test_unknown_and_api_codes_become_provider_errors() -> None:
    assert type(wire.error_from_json({"code": "new-code", "message": "m"})) is ProviderError
    assert type(wire.error_from_json({"code": "unavailable", "message": "m"})) is ProviderError
