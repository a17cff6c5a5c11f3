"""The network policy is parsed once, when the plan is made (issue 25, item 2).

``build_plan`` turns ``spec.network`` into the proxy's :class:`EgressPolicy` and the plan
carries it (``SandboxPlan.egress``); a sandbox's network starts its proxy from that value
and parses nothing. What the proxy cannot read is refused at plan time, before anything
is launched (a bad secret header was refused only when the sandbox's proxy started).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_plan import plan, spec

from corral.core.errors import ConfigInvalidError
from corral.core.spec import NetworkPolicy
from corral.providers.linux.host.egress import (
    EgressPolicy,
    compile_network,
    policy as policy_module,
)
from corral.providers.linux.host.netrelay import SandboxNetwork, loopback_relays


def test_the_plan_carries_the_parsed_policy() -> None:
    net = NetworkPolicy(kind="allowlist", hosts=("api.example.com:443", "127.0.0.1:8080",
                                                 "10.0.0.0/8"),
                        secret_headers={"api.example.com": {"Authorization": "Bearer s"}})
    p = plan(spec(network=net))
    assert isinstance(p.egress, EgressPolicy)
    assert p.egress == compile_network(net)
    assert p.egress.entries == ("api.example.com:443", "127.0.0.1:8080", "10.0.0.0/8")
    assert [h.name for h in p.egress.secrets_for("api.example.com", 443)] == ["authorization"]
    assert loopback_relays(p.egress) == [("127.0.0.1", 8080)]
    assert "egress" not in p.to_wire()                  # host-side only: never sent inside
    assert plan(spec()).egress is None                  # network none: no proxy
    assert plan(spec(network=NetworkPolicy.unrestricted())).egress == \
        EgressPolicy.unrestricted()


def test_what_the_proxy_cannot_read_is_refused_at_plan_time() -> None:
    for net, field in (
            (NetworkPolicy.allowlist("example.org:99999"), "network.hosts"),
            (NetworkPolicy(kind="allowlist", hosts=("a.example",),
                           secret_headers={"a.example": {"Host": "b.example"}}),
             "network.secrets"),
            (NetworkPolicy(kind="allowlist", hosts=("a.example",),
                           secret_headers={"a.example": {"X-Key": "caf\u20ac"}}),
             "network.secrets"),
            (NetworkPolicy.allowlist("127.0.0.1:3128"), "network.hosts")):
        with pytest.raises(ConfigInvalidError) as ei:
            plan(spec(network=net))
        assert ei.value.field == field
        assert "caf\u20ac" not in str(ei.value)        # a value is never quoted back


def test_a_sandbox_network_parses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the plan's policy, the sandbox's network uses that very value; the parser is
    not called again (it would raise here). Without one (a caller other than the
    provider), it parses the spec's policy itself: the control."""
    net = NetworkPolicy.allowlist("api.example.com", "127.0.0.1:8080")
    p = plan(spec(network=net))

    async def no_socket() -> int:
        raise AssertionError("not started in this test")

    calls: list[Any] = []

    def refuse(entry: str) -> Any:
        calls.append(entry)
        raise AssertionError(f"parsed again: {entry!r}")

    monkeypatch.setattr(policy_module, "parse_entry", refuse)
    sn = SandboxNetwork(net, no_socket, egress=p.egress)
    assert sn.egress is p.egress
    assert loopback_relays(sn.egress) == [("127.0.0.1", 8080)]
    assert calls == []
    with pytest.raises(AssertionError, match="parsed again"):
        SandboxNetwork(net, no_socket)
    assert calls == ["api.example.com"]
