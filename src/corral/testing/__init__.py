"""Testing aids: the provider conformance kit and a scripted fake provider.

* :func:`check_provider` (and :func:`check_provider_sync`) runs the contract's
  checks against any :class:`~corral.core.contract.SandboxProvider`, configured
  by one :class:`KitOptions` value; every corral provider passes it, and you can
  run it against your own adapter.
* :func:`provider_checks` lists the checks as named :class:`ProviderCheck`
  values, each awaitable on its own: parametrize a test over them to get one
  test per check per provider (corral's own ``tests/test_conformance.py`` does).
* :class:`FakeProvider` is a test double, not a sandbox: exec answers come
  from a handler you write, files live in memory. Use it to test code that
  drives a provider without running anything.
"""

from __future__ import annotations

from corral.testing._driver import (
    CHECKS,
    ProviderCheck,
    check_provider,
    check_provider_sync,
    provider_checks,
)
from corral.testing._fake import FakeHandler, FakeProvider, FakeSandbox
from corral.testing._kit import KitOptions

__all__ = ["CHECKS", "FakeHandler", "FakeProvider", "FakeSandbox", "KitOptions",
           "ProviderCheck", "check_provider", "check_provider_sync", "provider_checks"]
