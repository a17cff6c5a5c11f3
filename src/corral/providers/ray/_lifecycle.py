"""RaySandbox classes with exactly the optional lifecycle methods a provider advertises
(the contract: ``snapshot`` / ``restore`` / ``pause`` are present on a sandbox only when
the capability is advertised, and ``hasattr`` is how callers detect them)."""

from __future__ import annotations

from typing import Any

from corral.core.spec import SnapshotHandle

__all__ = ["make"]


async def _snapshot(self: Any) -> SnapshotHandle:
    h: SnapshotHandle = await self._lifecycle("snapshot")
    return h


async def _restore(self: Any, handle: SnapshotHandle) -> None:
    await self._lifecycle("restore", handle)


async def _pause(self: Any) -> None:
    await self._lifecycle("pause")


async def _resume(self: Any) -> None:
    await self._lifecycle("resume")


def make(base: type[Any], snapshot: bool, restore: bool, pause: bool) -> Any:
    """A subclass of ``base`` with the named methods."""
    ns: dict[str, Any] = {"__slots__": ()} if hasattr(base, "__slots__") else {}
    if snapshot:
        ns["snapshot"] = _snapshot
    if restore:
        ns["restore"] = _restore
    if pause:
        ns["pause"], ns["resume"] = _pause, _resume
    name = base.__name__ + "".join(n.title() for n, on in
                                   (("snap", snapshot), ("restore", restore), ("pause", pause))
                                   if on)
    return type(name, (base,), {**ns, "__module__": base.__module__,
                                "__qualname__": name})
