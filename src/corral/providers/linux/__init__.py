"""The strict Linux provider (namespaces + seccomp + cgroups + rlimits). Work in progress."""

from __future__ import annotations

__all__: list[str] = []
