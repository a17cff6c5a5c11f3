"""The tenant ceiling on its own (``corral.serve.tenancy``): parsing a tenant table and
admitting what a tenant asks for. No server here: the server tests are
test_tenants_{levels,network,limits,lifetime}.py."""

from __future__ import annotations

from typing import Any

import pytest

from corral.core.errors import ConfigInvalidError, LevelNotSupportedError, LimitsExceededError
from corral.core.spec import ExecOpts, NetworkPolicy, ProcessOpts, SandboxLimits, SandboxSpec
from corral.serve.tenancy import (
    Bound,
    admit_exec,
    admit_lifetime,
    admit_process,
    admit_spec,
    admit_timeout,
    check_network,
    parse_policy,
)

LEVELS = ("strict", "context-isolated", "none")


def policy(doc: dict[str, Any] | None = None, levels: tuple[str, ...] = LEVELS) -> Any:
    return parse_policy(doc or {}, name="t", server_levels=levels)


def test_without_levels_a_tenant_gets_only_the_boundary_levels() -> None:
    p = policy()
    assert {lv.value for lv in p.levels} == {"strict"}
    assert p.not_boundaries == ()
    for lv in ("context-isolated", "none"):
        with pytest.raises(LevelNotSupportedError) as ei:
            admit_spec(p, SandboxSpec(level=lv))
        assert ei.value.field == "level" and ei.value.supported == ("strict",)


def test_a_level_that_is_not_a_boundary_is_offered_only_when_named() -> None:
    p = policy({"levels": ["strict", "context-isolated"]})
    assert p.not_boundaries == ("context-isolated",)
    assert admit_spec(p, SandboxSpec(level="context-isolated",
                                     network=NetworkPolicy.unrestricted())).level.value \
        == "context-isolated"
    with pytest.raises(ConfigInvalidError, match="not in the server"):
        policy({"levels": ["none"]}, levels=("strict",))
    with pytest.raises(ConfigInvalidError, match="no level"):  # a server without strict
        policy({}, levels=("context-isolated",))


@pytest.mark.parametrize("entry", [
    "127.0.0.0/8", "127.0.0.1", "127.0.0.1:8580", "[::1]:80", "::1", "169.254.169.254",
    "10.0.0.0/8", "192.168.1.1", "100.100.100.200", "fd00:ec2::254", "0.0.0.0/0",
    "::ffff:127.0.0.1", "[64:ff9b::7f00:1]:80", "0.0.0.0", "224.0.0.1",
])
def test_non_public_destinations_are_refused_unless_listed(entry: str) -> None:
    p = policy()  # the defaults: every kind, every public destination, no private one
    for net in (NetworkPolicy.allowlist(entry), NetworkPolicy.unrestricted(entry)):
        with pytest.raises(ConfigInvalidError) as ei:
            admit_spec(p, SandboxSpec(network=net))
        assert ei.value.field == "network.hosts[0]"


def test_listed_private_ranges_open_only_what_they_list() -> None:
    p = policy({"network": {"private": ["127.0.0.1/32:8080", "10.1.0.0/16"]}})
    ok = ("127.0.0.1:8080", "10.1.2.3", "10.1.2.0/24:5432")
    for e in ok:
        check_network(p, "strict", NetworkPolicy.allowlist(e))
    for e in ("127.0.0.1", "127.0.0.1:8081", "127.0.0.0/8:8080", "10.0.0.0/8", "10.2.0.1"):
        with pytest.raises(ConfigInvalidError):
            check_network(p, "strict", NetworkPolicy.allowlist(e))


def test_the_kinds_and_public_destinations_are_bounded() -> None:
    p = policy({"network": {"kinds": ["none", "allowlist"],
                            "hosts": ["*.pypi.org:443", "api.example.com", "8.8.8.0/24"]}})
    for e in ("files.pypi.org:443", "*.files.pypi.org:443", "api.example.com",
              "api.example.com:443", "API.Example.Com.", "8.8.8.8", "8.8.8.0/25:53"):
        check_network(p, "strict", NetworkPolicy.allowlist(e))
    for e in ("files.pypi.org", "pypi.org:443", "*.org", "example.com", "8.8.0.0/16",
              "evil.com"):
        with pytest.raises(ConfigInvalidError, match="not among"):
            check_network(p, "strict", NetworkPolicy.allowlist(e))
    with pytest.raises(ConfigInvalidError) as ei:
        check_network(p, "strict", NetworkPolicy.unrestricted())
    assert ei.value.field == "network.kind"
    # a secret header's entry is a destination too
    with pytest.raises(ConfigInvalidError, match="secret_headers"):
        check_network(p, "strict", NetworkPolicy(
            kind="allowlist", hosts=("api.example.com",),
            secret_headers={"evil.com": {"x-key": "v"}}))


def test_the_servers_own_address_needs_a_listing() -> None:
    p = policy()
    mine = {"203.0.113.7", "8.8.4.4"}
    with pytest.raises(ConfigInvalidError, match="server's host"):
        check_network(p, "strict", NetworkPolicy.allowlist("8.8.4.4:22"),
                      host_address=mine.__contains__)
    check_network(p, "strict", NetworkPolicy.allowlist("8.8.8.8"), host_address=mine.__contains__)


def test_the_ceiling_config_is_checked() -> None:
    for doc, match in (
        ({"network": {"kinds": ["unrestricted"], "hosts": ["api.example.com"]}}, "needs hosts"),
        ({"network": {"hosts": ["127.0.0.1"]}}, "not public"),
        ({"network": {"private": ["internal.example"]}}, "not a name"),
        ({"network": {"kinds": ["everything"]}}, "unknown kind"),
        ({"network": {"extra": 1}}, "unknown key"),
        ({"limits": {"mem_mb": {"default": 512, "max": 256}}}, "above its max"),
        ({"limits": {"mem_mb": {"dflt": 512}}}, "unknown key"),
        ({"limits": {"gpu": 1}}, "unknown key"),
        ({"limits": {"mem_mb": 0}}, ">= 1"),
        ({"lifetime": {"idle_timeout_s": {"default": 10, "max": 5}}}, "above its max"),
    ):
        with pytest.raises(ConfigInvalidError, match=match):
            policy(doc)


def test_limits_get_the_default_and_are_refused_above_the_max() -> None:
    p = policy({"limits": {"max_processes": {"default": 32, "max": 64}, "mem_mb": 300,
                           "cpu_ms": {"max": 5000}}})
    got = admit_spec(p, SandboxSpec()).limits
    assert got == SandboxLimits(mem_mb=300, cpu_ms=None, disk_mb=256, max_processes=32)
    assert admit_spec(p, SandboxSpec(limits=SandboxLimits(max_processes=64))).limits \
        .max_processes == 64
    for asked, kind, mx in ((SandboxLimits(max_processes=1_000_000), "processes", 64),
                            (SandboxLimits(mem_mb=301), "memory", 300),
                            (SandboxLimits(cpu_ms=5001), "cpu", 5000)):
        with pytest.raises(LimitsExceededError) as ei:
            admit_spec(p, SandboxSpec(limits=asked))
        assert (ei.value.limit, ei.value.limit_value) == (kind, mx)
        assert getattr(ei.value, "cap", "").startswith("limits.")
    # at a level that is not a boundary nothing is applied (its provider enforces none),
    # but the maxima still hold
    q = policy({"levels": ["context-isolated"], "limits": {"mem_mb": {"max": 100}}})
    assert admit_spec(q, SandboxSpec(level="context-isolated",
                                     network=NetworkPolicy.unrestricted())).limits \
        == SandboxLimits()
    with pytest.raises(LimitsExceededError):
        admit_spec(q, SandboxSpec(level="context-isolated", limits=SandboxLimits(mem_mb=200)))


def test_wall_clock_and_output_bounds() -> None:
    p = policy({"limits": {"timeout_ms": {"default": 1000, "max": 5000},
                           "output_bytes": {"default": 4096, "max": 65536}}})
    o = admit_exec(p, ExecOpts())
    assert (o.timeout_ms, o.max_stdout_bytes, o.max_stderr_bytes) == (1000, 4096, 4096)
    assert admit_exec(p, ExecOpts(timeout_ms=5000)).timeout_ms == 5000
    with pytest.raises(ConfigInvalidError) as ei:
        admit_exec(p, ExecOpts(timeout_ms=5001))
    assert ei.value.field == "timeout_ms"
    with pytest.raises(LimitsExceededError) as el:
        admit_exec(p, ExecOpts(max_stdout_bytes=65537))
    assert el.value.limit == "output"
    for bad in (0, -1, "5", 1.5, True):  # raw from a request body: typed, never a crash
        with pytest.raises(ConfigInvalidError):
            admit_timeout(p, bad)  # type: ignore[arg-type]
    assert admit_timeout(p, None) == 1000
    assert admit_process(p, ProcessOpts()).timeout_ms is None
    with pytest.raises(ConfigInvalidError):
        admit_process(p, ProcessOpts(timeout_ms=6000))


def test_lifetimes() -> None:
    p = policy({"lifetime": {"idle_timeout_s": {"default": 60, "max": 600},
                             "max_lifetime_s": {"default": 3600, "max": 7200}}})
    life = admit_lifetime(p)
    assert (life.idle_timeout_s, life.max_lifetime_s) == (60, 3600)
    assert life.ends_at(created=1000, last_used=1000) == 1060
    assert life.ends_at(created=1000, last_used=4590) == 4600
    assert admit_lifetime(p, 1.5, 2).idle_timeout_s == 1.5
    for idle, life_s in ((601, None), (None, 7201), (0, None), (-1, None), ("5", None),
                         (True, None), (float("nan"), None), (None, float("inf"))):
        with pytest.raises(ConfigInvalidError):
            admit_lifetime(p, idle, life_s)


def test_bound_without_maximum() -> None:
    assert Bound(None, None).admit("cpu_ms", 10**9) == 10**9
    assert Bound(None, None).admit("cpu_ms", None) is None


def test_a_memory_default_must_fit_the_tenants_cap() -> None:
    from corral.serve.config import config_from_dict
    t = {"name": "a", "token": "x" * 20, "max_memory_mb": 200}
    for doc in ({"tenants": [t]},  # the default default: default_sandbox_mem_mb, 256
                {"tenants": [{**t, "limits": {"mem_mb": {"default": 300}}}]}):
        with pytest.raises(ConfigInvalidError, match="no sandbox would fit"):
            config_from_dict(doc)
    cfg = config_from_dict({"server": {"default_sandbox_mem_mb": 128}, "tenants": [t]})
    assert cfg.tenants[0].policy.limits["mem_mb"] == Bound(128, 4096)


def test_a_bound_given_half_meets_the_built_in_one() -> None:
    p = policy({"limits": {"mem_mb": {"max": 100}, "disk_mb": {"default": 10_000}}})
    assert p.limits["mem_mb"] == Bound(100, 100)      # the default lowered to the max
    assert p.limits["disk_mb"] == Bound(10_000, 10_000)  # the max raised to the default
    big = parse_policy({}, name="t", server_levels=("strict",), default_mem_mb=8192)
    assert big.limits["mem_mb"] == Bound(8192, 8192)
