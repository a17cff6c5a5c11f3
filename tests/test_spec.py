from __future__ import annotations

import dataclasses

import pytest

from corral.core.errors import ConfigInvalidError
from corral.core.spec import (
    ExecOpts,
    InvocationMode,
    Level,
    NetworkPolicy,
    SandboxLimits,
    SandboxSpec,
    SnapshotHandle,
)


def spec(**kw: object) -> SandboxSpec:
    base: dict[str, object] = {"tenant_id": "t", "run_id": "r"}
    base.update(kw)
    return SandboxSpec(**base)  # type: ignore[arg-type]


def test_defaults_are_strict_and_no_network() -> None:
    s = spec()
    assert s.level is Level.STRICT
    assert s.network.kind == "none"
    assert s.mode is None


def test_frozen() -> None:
    s = spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.level = Level.NONE  # type: ignore[misc]


def test_strings_coerce_to_enums() -> None:
    s = spec(level="context-isolated", mode="in-context")
    assert s.level is Level.CONTEXT_ISOLATED
    assert s.mode is InvocationMode.IN_CONTEXT


@pytest.mark.parametrize("mode", ["json-stdio", "handler-image"])
def test_modes_needing_an_image_are_refused_without_one(mode: str) -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        spec(mode=mode)
    assert ei.value.field == "image"
    assert spec(mode=mode, image="img").image == "img"


@pytest.mark.parametrize(("kw", "field"), [
    ({"level": "root"}, "level"),
    ({"level": 2}, "level"),
    ({"mode": "magic"}, "mode"),
    ({"tenant_id": ""}, "tenant_id"),
    ({"run_id": 5}, "run_id"),
    ({"limits": {"mem_mb": 5}}, "limits"),
])
def test_bad_spec_values_name_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        spec(**kw)
    assert ei.value.field == field


@pytest.mark.parametrize(("kw", "field"), [
    ({"mem_mb": -1}, "limits.mem_mb"),
    ({"mem_mb": 0}, "limits.mem_mb"),
    ({"cpu_ms": 1.5}, "limits.cpu_ms"),
    ({"disk_mb": True}, "limits.disk_mb"),
    ({"max_processes": "8"}, "limits.max_processes"),
])
def test_bad_limits(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        SandboxLimits(**kw)  # type: ignore[arg-type]
    assert ei.value.field == field


def test_limits_merge_and_asked() -> None:
    lim = SandboxLimits(mem_mb=64).merged(SandboxLimits(mem_mb=512, max_processes=10))
    assert lim == SandboxLimits(mem_mb=64, max_processes=10)
    assert lim.asked() == {"mem_mb": 64, "max_processes": 10}


def test_network_policies() -> None:
    assert NetworkPolicy.none().kind == "none"
    assert NetworkPolicy.allowlist("a.example", "b.example").hosts == ("a.example", "b.example")
    assert NetworkPolicy.unrestricted().kind == "unrestricted"
    with pytest.raises(ConfigInvalidError) as ei:
        NetworkPolicy.allowlist()
    assert ei.value.field == "network.hosts"
    with pytest.raises(ConfigInvalidError) as ei:
        NetworkPolicy.allowlist("ok.example", "")
    assert ei.value.field == "network.hosts[1]"
    with pytest.raises(ConfigInvalidError):
        NetworkPolicy(kind="none", hosts=("x",))
    with pytest.raises(ConfigInvalidError):
        NetworkPolicy(kind="some")  # type: ignore[arg-type]


def test_exec_opts_validation() -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        ExecOpts(timeout_ms=0)
    assert ei.value.field == "timeout_ms"
    with pytest.raises(ConfigInvalidError):
        ExecOpts(env={"A=B": "x"})
    with pytest.raises(ConfigInvalidError):
        ExecOpts(env={"A": "x\0y"})
    with pytest.raises(ConfigInvalidError):
        ExecOpts(stdin="text")  # type: ignore[arg-type]


def test_level_rank_orders_levels() -> None:
    assert Level.NONE.rank < Level.CONTEXT_ISOLATED.rank < Level.STRICT.rank


def test_snapshot_handle() -> None:
    h = SnapshotHandle(adapter_id="linux", doc={"id": "x"})
    assert h.to_json() == {"v": 1, "adapterId": "linux", "doc": {"id": "x"}}
    with pytest.raises(ConfigInvalidError):
        SnapshotHandle(v=2, adapter_id="linux", doc={})  # type: ignore[arg-type]


def test_one_argv_rule_for_every_provider() -> None:
    """core.spec.check_argv: the rule subproc, oci, inprocess and linux all apply."""
    import inspect

    from corral.core.errors import ConfigInvalidError
    from corral.core.spec import check_argv
    assert check_argv(("/bin/echo", "", "x")) == ["/bin/echo", "", "x"]
    for bad, field in (("/bin/echo", "argv"), ([], "argv"), ([""], "argv[0]"),
                       (["/bin/echo", "a\0b"], "argv[1]"), (["/bin/echo", 3], "argv[1]")):
        with pytest.raises(ConfigInvalidError) as err:
            check_argv(bad)  # type: ignore[arg-type]
        assert err.value.field == field
    import corral.providers.inprocess._proc as inproc
    import corral.providers.linux.host.sandbox as linux
    import corral.providers.oci._provider as oci
    import corral.providers.subproc._provider as subproc
    for mod in (inproc, linux, oci, subproc):
        assert mod.check_argv is check_argv
        assert "def _check_argv" not in inspect.getsource(mod)
