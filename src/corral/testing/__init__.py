"""Testing aids: the provider conformance kit and a scripted fake provider.

* :func:`check_provider` (and :func:`check_provider_sync`) runs the contract's
  checks against any :class:`~corral.core.contract.SandboxProvider`; every corral
  provider passes it, and you can run it against your own adapter.
* :class:`FakeProvider` is a test double, not a sandbox: exec answers come
  from a handler you write, files live in memory. Use it to test code that
  drives a provider without running anything.
"""

from __future__ import annotations

from corral.testing._fake import FakeHandler, FakeProvider, FakeSandbox
from corral.testing._kit import CHECKS, check_provider, check_provider_sync

__all__ = ["CHECKS", "FakeHandler", "FakeProvider", "FakeSandbox", "check_provider",
           "check_provider_sync"]
