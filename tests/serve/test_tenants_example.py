"""examples/serve.toml: a config a newcomer can start from loads, has two tenants, and
sets every bound of each (nothing left to a built-in default)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from corral.serve.config import load_config
from corral.serve.tenancy import LIMIT_NAMES

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "serve.toml"


def test_the_example_config_loads_with_every_bound_set() -> None:
    cfg = load_config(str(EXAMPLE))
    assert [t.name for t in cfg.tenants] == ["app", "public"]
    raw = tomllib.loads(EXAMPLE.read_text())
    for t in raw["tenants"]:
        for cap in ("max_sandboxes", "max_runs", "max_memory_mb", "max_processes", "levels"):
            assert cap in t, (t["name"], cap)
        assert set(t["network"]) == {"kinds", "hosts", "private"}
        for name in LIMIT_NAMES:
            assert set(t["limits"][name]) == {"default", "max"}, (t["name"], name)
        for name in ("idle_timeout_s", "max_lifetime_s"):
            assert set(t["lifetime"][name]) == {"default", "max"}, (t["name"], name)
    for t in cfg.tenants:
        p = t.policy
        assert {lv.value for lv in p.levels} == {"strict"} and p.not_boundaries == ()
        assert "unrestricted" not in p.network.kinds
        assert all(b.default is not None and b.maximum is not None
                   for b in p.limits.values())
    public = cfg.tenants[1].policy
    assert public.network.private == () and public.limits["mem_mb"].maximum == 256
    # nobody can log in with it as shipped: the digests are of random bytes
    assert not any(t.matches("") or t.matches("change-me") for t in cfg.tenants)
