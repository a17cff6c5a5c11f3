"""The in-process provider: level ``none``, trusted code only (see docs/providers/inprocess.md)."""

from __future__ import annotations

from corral.providers.inprocess._provider import InProcessProvider, InProcessSandbox

__all__ = ["PROVIDER_CLASS", "InProcessProvider", "InProcessSandbox"]

#: what the provider registry (:mod:`corral.providers`) instantiates
PROVIDER_CLASS = InProcessProvider
