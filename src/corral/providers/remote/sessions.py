"""Sessions of a ``corral serve`` server, from the remote provider's client
(docs/sessions.md): ``/v1/sessions`` and its cells, streamed.

    async with corral.provider("remote", url=URL, token=TOKEN) as p:
        async with await RemoteSession.create(p, limits=SandboxLimits(mem_mb=512)) as s:
            await s.write_file("data.csv", data)
            r = await s.run("import csv; rows = list(csv.reader(open('data.csv')))")

``run`` has the library's shape and errors: a :class:`~corral.sessions.CellResult`, the
callbacks as events arrive, and the error that ended a session (``LimitsExceededError``
for memory, ``SessionEndedError`` ...) raised as the server sent it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from corral.core.errors import ProviderError, SessionEndedError
from corral.core.spec import NetworkPolicy, SandboxLimits
from corral.providers.remote import wire
from corral.providers.remote._provider import RemoteProvider, _error_of, _httpx
from corral.sessions.result import CellResult, DisplayItem, cell_from_json

__all__ = ["RemoteSession"]

#: the longest NDJSON line read from the server (a display bundle with a 4 MiB PNG fits)
_MAX_LINE = 16 * 1024 * 1024


class RemoteSession:
    """A session living on a server; made by :meth:`create`."""

    def __init__(self, provider: RemoteProvider, doc: dict[str, Any]) -> None:
        self._p = provider
        self.id = str(doc["id"])
        self.python = str(doc.get("python", ""))
        self.closed = False

    @classmethod
    async def create(cls, provider: RemoteProvider, *, limits: SandboxLimits | None = None,
                     network: NetworkPolicy | None = None, environment: str | None = None,
                     cell_timeout_s: float | None = None, idle_timeout_s: float | None = None,
                     max_lifetime_s: float | None = None) -> RemoteSession:
        body: dict[str, Any] = {}
        if limits is not None:
            body["limits"] = limits.asked()
        if network is not None:
            body["network"] = {"kind": network.kind, "hosts": list(network.hosts)}
        for k, v in (("environment", environment), ("cell_timeout_s", cell_timeout_s),
                     ("idle_timeout_s", idle_timeout_s), ("max_lifetime_s", max_lifetime_s)):
            if v is not None:
                body[k] = v
        r = await provider.call("POST", "/sessions", json_body=body, ok=(201,))
        return cls(provider, r.json())

    async def __aenter__(self) -> RemoteSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _path(self, tail: str = "") -> str:
        return f"/sessions/{self.id}{tail}"

    def _gone(self, err: BaseException) -> BaseException:
        if isinstance(err, ProviderError) and ("is gone" in str(err)
                                               or "no such session" in str(err)):
            return SessionEndedError("the session is gone on the server (closed, ended by "
                                     "a limit or its lifetime)", reason="closed")
        return err

    async def run(self, code: str, *, timeout_s: float | None = None,
                  on_stdout: Callable[[str], object] | None = None,
                  on_stderr: Callable[[str], object] | None = None,
                  on_display: Callable[[DisplayItem], object] | None = None) -> CellResult:
        """Run a cell on the server, streamed; see :meth:`AsyncSession.run`."""
        httpx = _httpx()
        body: dict[str, Any] = {"code": code, "stream": True}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        try:
            async with self._p.client().stream(
                    "POST", f"{wire.API_PREFIX}{self._path('/cells')}", json=body) as resp:
                if resp.status_code != 200:
                    raise self._gone(_error_of(resp.status_code, await resp.aread()))
                async for line in resp.aiter_lines():
                    if not line:
                        continue
                    if len(line) > _MAX_LINE:
                        raise ProviderError("corral serve sent a line past the cap")
                    ev = json.loads(line)
                    kind = ev.get("event") if isinstance(ev, dict) else None
                    if kind == "stdout" and on_stdout is not None:
                        on_stdout(str(ev.get("text", "")))
                    elif kind == "stderr" and on_stderr is not None:
                        on_stderr(str(ev.get("text", "")))
                    elif kind in ("display", "result") and on_display is not None \
                            and isinstance(ev.get("data"), dict):
                        on_display(DisplayItem("result" if kind == "result" else "display",
                                               ev["data"]))
                    elif kind == "cell":
                        return cell_from_json(ev.get("cell"))
                    elif kind == "error":
                        raise _error_of(int(ev.get("status", 500)),
                                        json.dumps({"error": ev.get("error")}).encode())
        except httpx.HTTPError as e:
            raise ProviderError(f"corral serve cell stream: {e}", e) from None
        raise ProviderError("corral serve ended the cell stream without a result")

    async def write_file(self, path: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        try:
            await self._p.call("PUT", self._path("/files"), content=raw, params={"path": path},
                               ok=(204,))
        except ProviderError as e:
            raise self._gone(e) from None

    async def read_file(self, path: str) -> bytes:
        try:
            r = await self._p.call("GET", self._path("/files"), params={"path": path},
                                   ok=(200,))
        except ProviderError as e:
            raise self._gone(e) from None
        data: bytes = r.content
        return data

    async def close(self) -> None:
        """Close the session on the server (idempotent; a session already gone is fine)."""
        if self.closed:
            return
        self.closed = True
        try:
            await self._p.call("DELETE", self._path(), ok=(204, 404))
        except ProviderError:
            pass
