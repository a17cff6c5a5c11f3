"""A tenant of corral serve / corral mcp uses only the environments the operator lists."""

from __future__ import annotations

import pytest

from corral.core.errors import ConfigInvalidError
from corral.core.spec import SandboxSpec
from corral.providers.remote import wire
from corral.serve.models import Spec
from corral.serve.tenancy import admit_spec, parse_policy


def test_only_listed_environments_are_admitted() -> None:
    policy = parse_policy({"environments": ["sci"]}, name="alice", server_levels=["strict"])
    assert policy.environments == {"sci"}
    assert admit_spec(policy, SandboxSpec(environment="sci")).environment == "sci"
    with pytest.raises(ConfigInvalidError) as e:
        admit_spec(policy, SandboxSpec(environment="other"))
    assert e.value.field == "environment"
    none = parse_policy({}, name="bob", server_levels=["strict"])
    with pytest.raises(ConfigInvalidError):
        admit_spec(none, SandboxSpec(environment="sci"))
    assert admit_spec(none, SandboxSpec()).environment is None
    with pytest.raises(ConfigInvalidError):
        parse_policy({"environments": "sci"}, name="c", server_levels=["strict"])


def test_the_environment_travels_over_the_http_api() -> None:
    spec = SandboxSpec(environment="sci")
    assert wire.spec_from_json(wire.spec_to_json(spec)).environment == "sci"
    assert "environment" not in wire.spec_to_json(SandboxSpec())
    assert Spec(environment="sci").to_core("t").environment == "sci"


def test_other_providers_refuse_an_environment() -> None:
    import asyncio

    from corral.providers.subproc import SubprocProvider

    async def go() -> None:
        async with SubprocProvider() as p:
            with pytest.raises(ConfigInvalidError) as e:
                await p.create(SandboxSpec(level="context-isolated", environment="sci"))
            assert e.value.field == "environment"

    asyncio.run(go())
