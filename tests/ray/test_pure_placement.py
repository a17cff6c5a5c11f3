"""Placement (pure): a node that cannot give strict, or cannot enforce a limit the spec
sets, or lacks the memory, never gets the sandbox; tenants spread; a warm spare wins ties;
errors for a spec nobody can take are the contract's refusals. And the error wire."""

from __future__ import annotations

import pytest

from corral.core.errors import (
    ConfigInvalidError,
    LevelNotSupportedError,
    LimitsExceededError,
    ProviderError,
    SandboxTimeoutError,
)
from corral.core.result import Outcome, RunResult
from corral.core.spec import SandboxLimits, SandboxSpec
from corral.providers.ray import _wire
from corral.providers.ray.placement import NodeView, no_candidate, rank, reserve_mb

ALL = frozenset({"mem_mb", "cpu_ms", "disk_mb", "max_processes"})


def node(nid: str, **kw: object) -> NodeView:
    base: dict[str, object] = {"node_id": nid, "address": f"10.0.0.{nid[-1]}",
                               "levels": frozenset({"strict"}), "limits": ALL,
                               "default_mem_mb": 512, "free_mem_mb": 8192.0}
    base.update(kw)
    return NodeView(**base)  # type: ignore[arg-type]


def test_a_node_without_strict_never_gets_a_strict_sandbox() -> None:
    weak = node("n1", levels=frozenset(), why_not="no user namespaces", spares=3)
    strong = node("n2", live=50)
    for _ in range(3):
        assert [n.node_id for n in rank([weak, strong], SandboxSpec())] == ["n2"]
    err = no_candidate([weak], SandboxSpec())
    assert isinstance(err, LevelNotSupportedError) and err.field == "level"
    assert "no user namespaces" in str(err)


def test_limits_and_memory_are_honoured() -> None:
    no_cg = node("n1", limits=frozenset({"disk_mb"}))
    full = node("n2", free_mem_mb=100.0)
    roomy = node("n3")
    spec = SandboxSpec(limits=SandboxLimits(mem_mb=256))
    assert [n.node_id for n in rank([no_cg, full, roomy], spec)] == ["n3"]
    assert reserve_mb(spec, roomy) == 256
    assert reserve_mb(SandboxSpec(), roomy) == 512          # the node's default limit
    err = no_candidate([no_cg], spec)
    assert isinstance(err, LevelNotSupportedError) and err.field == "limits.mem_mb"
    assert isinstance(no_candidate([full], spec), ProviderError)


def test_tenants_spread_then_spares_then_load() -> None:
    a = node("n1", tenants={"t": 2}, spares=1)
    b = node("n2", tenants={"t": 1}, live=9)
    c = node("n3", tenants={"u": 5}, live=5)
    spec = SandboxSpec(tenant_id="t")
    assert [n.node_id for n in rank([a, b, c], spec)] == ["n3", "n2", "n1"]
    d = node("n4", spares=1, live=20)
    e = node("n5", live=0)
    assert [n.node_id for n in rank([e, d], spec)] == ["n4", "n5"]   # a warm spare first
    assert [n.node_id for n in rank([node("n6", live=3), node("n7", live=1)], spec)
            ] == ["n7", "n6"]
    # what this driver placed since the last report counts too
    assert [n.node_id for n in rank([node("n8"), node("n9")], spec,
                                    extra_tenant={"n8": 1})] == ["n9", "n8"]


@pytest.mark.parametrize("e", [
    LevelNotSupportedError("strict", ("strict",), "d", missing="memory", field="limits.mem_mb"),
    ConfigInvalidError("path", "leaves the sandbox"),
    LimitsExceededError("memory", 64, 70, detail="oom"),
    SandboxTimeoutError("late", timeout_ms=300, stdout=b"o", stderr=b"e"),
])
def test_errors_keep_class_and_facts(e: Exception) -> None:
    back = _wire.decode_error(_wire.encode_error(e, where="node x"))
    assert type(back) is type(e)
    assert str(back) == str(e)
    assert back.to_dict() == e.to_dict()  # type: ignore[attr-defined]


def test_error_result_and_builtins() -> None:
    r = RunResult(outcome=Outcome.TIMEOUT, limit_value=300, stdout=b"partial")
    e = r.error()
    assert e is not None
    back = _wire.decode_error(_wire.encode_error(e, where="node x"))
    assert isinstance(back, SandboxTimeoutError) and back.result == r
    fnf = _wire.decode_error(_wire.encode_error(FileNotFoundError(2, "No such file", "a"),
                                                where="n"))
    assert isinstance(fnf, FileNotFoundError) and fnf.filename == "a"
    other = _wire.decode_error(_wire.encode_error(KeyError("k"), where="node x"))
    assert isinstance(other, ProviderError) and "node x" in str(other)
    with pytest.raises(LimitsExceededError):
        _wire.unwrap(_wire.err(LimitsExceededError("cpu", 5), where="n"))
    assert _wire.unwrap(_wire.ok(3)) == 3
