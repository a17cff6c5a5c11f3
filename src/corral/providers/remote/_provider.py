"""The remote provider: the provider contract, implemented against ``corral serve``.

``RemoteProvider(url, token)`` asks the server which levels it offers and with which
capabilities (``GET /v1/info``, once, at construction), then maps every contract method
onto one HTTP call of the ``/v1`` API (httpx, HTTP/1.1 with keep-alive). The server does
the isolation; this class only relays, so a sandbox here is exactly as strong as the
server's provider for its level, and every refusal is the server's own error, rebuilt
with its class and facts (:mod:`.wire`).

Cancellation crosses the wire: cancelling an awaiting task aborts its request, and the
server cancels the run when its client goes away. A ``create`` that is cancelled (a
token or a task) destroys the sandbox by the id the client chose for it, so nothing is
left on the server even when the cancel and the server's answer cross.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import secrets
import ssl
import weakref
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from typing import Any, Final, final

from corral.core.cancel import CancelScope, CancelToken
from corral.core.contract import ProcessHandle, ProcessStdin, Sandbox, SandboxProvider
from corral.core.errors import (
    ConfigInvalidError,
    CorralError,
    CreateCancelledError,
    LevelNotSupportedError,
    ProviderError,
)
from corral.core.files import FileInfo
from corral.core.filewalk import MAX_LIST_ENTRIES
from corral.core.preview import PreviewURL
from corral.core.result import RunResult
from corral.core.spec import (
    Capability,
    ExecOpts,
    Level,
    ProcessOpts,
    SandboxSpec,
    SnapshotHandle,
)
from corral.core.tasks import TaskSet, settle as settle_tasks
from corral.providers.remote import wire

__all__ = ["RemoteProcess", "RemoteProvider", "RemoteSandbox"]

#: the capabilities a remote sandbox can relay (the others need the server's process:
#: warm-fork and process-count stay on the server, where its snippet pool uses them)
_RELAYED: Final = frozenset({
    Capability.STREAMING.value, Capability.STREAMING_EXEC.value, Capability.SNAPSHOT.value,
    Capability.RESTORE.value, Capability.PAUSE.value, Capability.STRICT.value,
    Capability.CONTEXT_ISOLATED.value, Capability.PREVIEW_URL.value,
    Capability.FILES.value})


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:  # pragma: no cover - the extra is missing
        raise ProviderError("the remote provider needs httpx: pip install corral[serve]"
                            ) from None
    return httpx


def _error_of(status: int, body: bytes) -> BaseException:
    """The error a non-2xx answer carries (corral's error, or FileNotFoundError)."""
    try:
        doc = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return ProviderError(f"corral serve answered {status}: {body[:200]!r}")
    if doc.get("code") == "not-found" and doc.get("what") == "file":
        return FileNotFoundError(2, str(doc.get("message", "no such file")))
    if doc.get("code") == "conflict" and doc.get("what") == "file":  # serve/files.py
        num = getattr(errno, str(doc.get("errno")), errno.EIO)
        return OSError(num, str(doc.get("message", "")), str(doc.get("path", "")))
    if doc.get("code") == "not-found" and doc.get("what") == "sandbox":
        return ProviderError("the sandbox is gone (destroyed, or the server restarted)")
    return wire.error_from_json(doc)


@final
class RemoteProvider(SandboxProvider):
    """A provider whose sandboxes live on a ``corral serve`` server.

    Args:
        url: the server's base URL (``http://127.0.0.1:8580``).
        token: the tenant's bearer token.
        level: offer only this level of the server's (then the capabilities are that
            level's provider's); default every level the server offers, with the
            capabilities all of them share.
        timeout_s: connect timeout, and the bound on calls that do not run code (a run's
            own deadline is its ``timeout_ms``).
        verify: TLS verification: True (the system's CAs), a CA bundle path, an
            ``ssl.SSLContext``, or False (a test server; never in production).

    Raises:
        ProviderError: the server cannot be reached or refused the token.
        LevelNotSupportedError: ``level`` is not offered by the server.
    """

    name = "remote"

    def __init__(self, url: str, token: str, *, level: Level | str | None = None,
                 timeout_s: float = 30.0, verify: bool | str | ssl.SSLContext = True) -> None:
        httpx = _httpx()
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigInvalidError("url", f"must be an http(s) URL, got {url!r}")
        if not isinstance(token, str) or not token:
            raise ConfigInvalidError("token", "must be a non-empty string")
        self.url = url.rstrip("/")
        self._headers = {"authorization": f"Bearer {token}"}
        self._timeout_s = timeout_s
        if isinstance(verify, str):
            verify = ssl.create_default_context(cafile=verify)
        self._verify = verify
        try:
            with httpx.Client(base_url=self.url, headers=self._headers, verify=verify,
                              timeout=timeout_s) as c:
                r = c.get(f"{wire.API_PREFIX}/info")
        except httpx.HTTPError as e:
            raise ProviderError(f"cannot reach corral serve at {self.url}: {e}", e) from None
        if r.status_code != 200:
            err = _error_of(r.status_code, r.content)
            raise err if isinstance(err, CorralError) else ProviderError(str(err))
        self.info: dict[str, Any] = r.json()
        offered = {Level(lv): frozenset(p["capabilities"])
                   for lv, p in self.info["providers"].items()}
        if level is not None:
            want = Level(level)
            if want not in offered:
                raise LevelNotSupportedError(want.value, tuple(lv.value for lv in offered),
                                             f"the server at {self.url} does not offer it")
            offered = {want: offered[want]}
        self.levels: frozenset[Level] = frozenset(offered)
        shared = frozenset.intersection(*offered.values()) if offered else frozenset()
        self.capabilities = frozenset(shared & _RELAYED)
        #: one AsyncClient per event loop (httpx's connections belong to the loop that
        #: opened them); weak, so a finished ``asyncio.run`` loop takes its client along
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = \
            weakref.WeakKeyDictionary()
        self._live: dict[str, RemoteSandbox] = {}
        self._closed = False
        #: per loop (as the clients): the tasks of this provider, (readers of started
        #: processes' output, destroys shielded from their caller's cancellation); aclose
        #: cancels the readers and waits for the destroys
        self._tasks: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[TaskSet, TaskSet]] = weakref.WeakKeyDictionary()

    # -- the client ------------------------------------------------------------------
    def client(self) -> Any:
        """The AsyncClient of the running loop (one per loop: httpx's pool is loop-bound)."""
        loop = asyncio.get_running_loop()
        c = self._clients.get(loop)
        if c is None or c.is_closed:
            httpx = _httpx()
            c = httpx.AsyncClient(
                base_url=self.url, headers=self._headers, verify=self._verify,
                timeout=httpx.Timeout(self._timeout_s, read=None, write=self._timeout_s),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
            self._clients[loop] = c
        return c

    def _owned(self) -> tuple[TaskSet, TaskSet]:
        loop = asyncio.get_running_loop()
        sets = self._tasks.get(loop)
        if sets is None:
            sets = self._tasks[loop] = (TaskSet(), TaskSet())
        return sets

    def _spawn_reader(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task reading a stream of the server's, ended at :meth:`aclose` at the latest."""
        return self._owned()[0].spawn(coro)

    async def _forget_shielded(self, sid: str) -> None:
        """:meth:`_forget`, finished even when the caller is cancelled (aclose waits)."""
        await asyncio.shield(self._owned()[1].spawn(self._forget(sid)))

    async def call(self, method: str, path: str, *, json_body: Any = None,
                   content: bytes | None = None, params: Mapping[str, str] | None = None,
                   ok: tuple[int, ...] = (200, 201, 204)) -> Any:
        """One request; the answer (``httpx.Response``) or the error it carries."""
        httpx = _httpx()
        try:
            r = await self.client().request(method, f"{wire.API_PREFIX}{path}", json=json_body,
                                            content=content, params=params)
        except httpx.HTTPError as e:
            raise ProviderError(f"corral serve {method} {path}: {type(e).__name__}: {e}",
                                e) from None
        if r.status_code not in ok:
            raise _error_of(r.status_code, r.content)
        return r

    # -- the contract ------------------------------------------------------------------
    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None) -> Sandbox:
        if not isinstance(spec, SandboxSpec):
            raise ConfigInvalidError("spec", f"must be a SandboxSpec, not {type(spec).__name__}")
        if self._closed:
            raise ProviderError("the remote provider is closed")
        if spec.level not in self.levels:
            raise LevelNotSupportedError(spec.level.value, tuple(lv.value for lv in self.levels),
                                         f"not offered by {self.url}")
        if cancel is not None and cancel.cancelled:
            raise CreateCancelledError(f"create cancelled: {cancel.reason}")
        sid = f"rc-{secrets.token_hex(16)}"
        body = {"spec": wire.spec_to_json(spec), "id": sid}
        done = False
        try:
            async with CancelScope(cancel) as scope:
                await self.call("POST", "/sandboxes", json_body=body)
                done = True
        except asyncio.CancelledError:
            await self._forget_shielded(sid)
            raise
        except CreateCancelledError:
            await self._forget_shielded(sid)
            raise
        if scope.cancelled or not done:
            await self._forget_shielded(sid)
            raise CreateCancelledError("create cancelled; the sandbox was destroyed")
        sb = _sandbox_class(self.capabilities)(self, sid, spec)
        self._live[sid] = sb
        return sb

    async def list_sandboxes(self) -> list[dict[str, Any]]:
        """The live sandboxes of this token's tenant on the server (``GET /v1/sandboxes``):
        each ``{id, level, created, ...}``, made by this provider or not."""
        r = await self.call("GET", "/sandboxes")
        return list(r.json()["sandboxes"])

    async def connect(self, sandbox_id: str) -> Sandbox:
        """The live sandbox ``sandbox_id`` of this tenant (made by any client, e.g. one
        that went away), driven from here as if this provider had made it; ``aclose``
        leaves it alive (it is not this provider's), ``destroy`` ends it.

        Raises:
            ProviderError: the server has no such sandbox for this tenant.
            LevelNotSupportedError: its level is not one this provider was narrowed to.
        """
        if not isinstance(sandbox_id, str) or not sandbox_id or "/" in sandbox_id:
            raise ConfigInvalidError("sandbox_id", f"not a sandbox id: {sandbox_id!r}")
        if self._closed:
            raise ProviderError("the remote provider is closed")
        doc = (await self.call("GET", f"/sandboxes/{sandbox_id}")).json()
        spec = wire.spec_from_json(doc["spec"])
        if spec.level not in self.levels:
            raise LevelNotSupportedError(spec.level.value, tuple(lv.value for lv in self.levels),
                                         f"sandbox {sandbox_id} runs at {spec.level.value}")
        caps = frozenset(self.info["providers"].get(spec.level.value, {}).get(
            "capabilities", ())) & _RELAYED
        return _sandbox_class(caps)(self, str(doc["id"]), spec)

    async def _forget(self, sid: str) -> None:
        """Destroy ``sid`` on the server, made or not (the server remembers the id, so a
        create still in flight is rolled back when it lands)."""
        with contextlib.suppress(Exception):
            await self.call("DELETE", f"/sandboxes/{sid}")

    async def aclose(self) -> None:
        """Destroy the sandboxes this provider made that are still alive, and close its
        connections."""
        self._closed = True
        live, self._live = list(self._live.values()), {}
        try:
            await asyncio.gather(*(sb.destroy() for sb in live), return_exceptions=True)
        finally:
            sets = self._tasks.pop(asyncio.get_running_loop(), None)
            if sets is not None:  # readers of sandboxes not destroyed (connected) too
                readers, destroys = sets
                await readers.aclose()
                await destroys.drain()
        c = self._clients.pop(asyncio.get_running_loop(), None)
        if c is not None:  # clients of other loops go with their loops
            with contextlib.suppress(Exception):
                await c.aclose()


class RemoteSandbox(Sandbox):
    """A sandbox on the server. Which optional methods it has follows the provider's
    capabilities (see :func:`_sandbox_class`)."""

    def __init__(self, provider: RemoteProvider, sid: str, spec: SandboxSpec) -> None:
        self._p = provider
        self.id = sid
        self.spec = spec
        self._destroyed = False
        self._procs: list[RemoteProcess] = []

    def _path(self, tail: str = "") -> str:
        if self._destroyed:
            raise ProviderError(f"sandbox {self.id} is destroyed")
        return f"/sandboxes/{self.id}{tail}"

    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> RunResult:
        r = await self._p.call("POST", self._path("/exec"), json_body={
            "argv": list(argv), "opts": wire.exec_opts_to_json(opts)})
        return _exec_result(r.json()["result"])

    async def write_file(self, path: str, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8")
        await self._p.call("PUT", self._path("/files"), content=bytes(data),
                           params={"path": path})

    async def read_file(self, path: str) -> bytes:
        r = await self._p.call("GET", self._path("/files"), params={"path": path})
        return bytes(r.content)

    # -- the file operations (capability "files"): serve's POST .../files/<op> --------
    async def _files(self, op: str, body: dict[str, Any]) -> Any:
        return await self._p.call("POST", self._path(f"/files/{op}"), json_body=body)

    async def list_tree(self, path: str, depth: int, max_entries: int
                        ) -> tuple[list[FileInfo], bool]:
        """The walk of :func:`corral.core.filewalk.list_tree`, done by the server in one
        request."""
        doc = (await self._files("list", {"path": path, "depth": depth,
                                          "max_entries": max_entries})).json()
        return [_file_info(e) for e in doc["entries"]], bool(doc["truncated"])

    async def list_files(self, path: str = "") -> list[FileInfo]:
        entries, _cut = await self.list_tree(path, 1, MAX_LIST_ENTRIES)
        return entries

    async def get_info(self, path: str) -> FileInfo:
        return _file_info((await self._files("info", {"path": path})).json())

    async def exists(self, path: str) -> bool:
        return bool((await self._files("exists", {"path": path})).json()["exists"])

    async def make_dir(self, path: str, *, parents: bool = True) -> bool:
        doc = (await self._files("mkdir", {"path": path, "parents": parents})).json()
        return bool(doc["created"])

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._files("remove", {"path": path, "recursive": recursive})

    async def start_process(self, argv: Sequence[str],
                            opts: ProcessOpts | None = None) -> ProcessHandle:
        r = await self._p.call("POST", self._path("/processes"), json_body={
            "argv": list(argv), "opts": wire.process_opts_to_json(opts)})
        proc = RemoteProcess(self._p, self._path(f"/processes/{r.json()['id']}"))
        self._procs.append(proc)
        return proc

    async def change_network(self, *, allow: Sequence[str] = (),
                             revoke: Sequence[str] = ()) -> None:
        """Allow / revoke host entries of the sandbox's egress policy for new connections
        (``PUT .../network``): the server's provider's ``allow_host`` / ``revoke_host``,
        within what the operator lets this tenant ask; 501 where it has none."""
        await self._p.call("PUT", self._path("/network"),
                           json_body={"allow": list(allow), "revoke": list(revoke)})

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._p._live.pop(self.id, None)
        await self._p.call("DELETE", f"/sandboxes/{self.id}", ok=(204, 404))
        for proc in self._procs:
            await proc.settle()


class _StreamingExec:
    async def exec_streaming(self, argv: Sequence[str], opts: ExecOpts | None = None, *,
                             on_output: Any) -> RunResult:
        """exec, with each chunk of output handed to ``on_output(fd, chunk)`` as it comes."""
        me: Any = self
        httpx = _httpx()
        body = {"argv": list(argv), "opts": wire.exec_opts_to_json(opts), "stream": True}
        try:
            async with me._p.client().stream("POST", f"{wire.API_PREFIX}{me._path('/exec')}",
                                             json=body) as resp:
                if resp.status_code != 200:
                    raise _error_of(resp.status_code, await resp.aread())
                async for line in resp.aiter_lines():
                    if not line:
                        continue
                    ev = json.loads(line)
                    if ev["event"] == "output":
                        on_output(ev["fd"], _chunk(ev))
                    elif ev["event"] == "result":
                        return _exec_result(ev["result"])
                    elif ev["event"] == "error":
                        raise _error_of(int(ev.get("status", 500)),
                                        json.dumps({"error": ev["error"]}).encode())
        except httpx.HTTPError as e:
            raise ProviderError(f"corral serve exec stream: {e}", e) from None
        raise ProviderError("corral serve ended the exec stream without a result")


class _Pause:
    async def pause(self) -> None:
        me: Any = self
        await me._p.call("POST", me._path("/pause"))

    async def resume(self) -> None:
        me: Any = self
        await me._p.call("POST", me._path("/resume"))


class _Snapshot:
    async def snapshot(self) -> SnapshotHandle:
        me: Any = self
        r = await me._p.call("POST", me._path("/snapshot"))
        return wire.handle_from_json(r.json()["handle"])


class _Restore:
    async def restore(self, handle: SnapshotHandle) -> None:
        me: Any = self
        if not isinstance(handle, SnapshotHandle):
            raise ConfigInvalidError("handle", "must be a SnapshotHandle")
        await me._p.call("POST", me._path("/restore"),
                         json_body={"handle": wire.handle_to_json(handle)})


class _Preview:
    async def expose(self, port: int) -> PreviewURL:
        """A preview URL on the *server's* loopback for ``port`` inside, with its token
        (issue 23 item 6; see docs/network.md)."""
        me: Any = self
        doc = (await me._p.call("POST", me._path("/expose"), json_body={"port": port})).json()
        return PreviewURL(str(doc["url"]), str(doc["token"]), int(doc["port"]))

    async def unexpose(self, port: int) -> None:
        me: Any = self
        await me._p.call("POST", me._path("/unexpose"), json_body={"port": port})


_CLASSES: dict[frozenset[str], type[RemoteSandbox]] = {}


def _sandbox_class(caps: frozenset[str]) -> type[RemoteSandbox]:
    """RemoteSandbox with exactly the optional methods the capabilities advertise (the
    contract: a sandbox has ``pause`` iff ``pause`` is advertised, and so on)."""
    key = caps & frozenset({"streaming-exec", "pause", "snapshot", "restore", "preview-url"})
    cls = _CLASSES.get(key)
    if cls is None:
        bases: list[type] = []
        for cap, mixin in (("streaming-exec", _StreamingExec), ("pause", _Pause),
                           ("snapshot", _Snapshot), ("restore", _Restore),
                           ("preview-url", _Preview)):
            if cap in key:
                bases.append(mixin)
        cls = type("RemoteSandbox", (*bases, RemoteSandbox), {"__module__": __name__})
        _CLASSES[key] = cls
    return cls


def _file_info(doc: Any) -> FileInfo:
    """A FileInfo from the server's entry (``FileInfo.to_dict()``)."""
    if not isinstance(doc, dict):
        raise ProviderError(f"corral serve answered a file entry that is not an object: "
                            f"{str(doc)[:80]!r}")
    if doc.get("type") not in ("file", "dir", "symlink", "other"):
        raise ProviderError(f"corral serve answered a file entry of type "
                            f"{str(doc.get('type'))[:40]!r}")
    try:
        target = doc.get("symlink_target")
        return FileInfo(name=str(doc["name"]), path=str(doc["path"]), type=doc["type"],
                        size=int(doc["size"]), mode=int(doc["mode"]),
                        modified=float(doc["modified"]),
                        symlink_target=None if target is None else str(target))
    except (KeyError, TypeError, ValueError) as e:
        raise ProviderError(f"corral serve answered a malformed file entry: {e}") from None


def _exec_result(doc: Any) -> RunResult:
    """What ``exec`` gives for the server's answer: the server answers 200 with the result
    whatever the outcome (the HTTP status says the request was served); the contract's
    ``exec`` returns it for ``exit`` and raises the outcome's error (timeout, a limit,
    spawn-error...) with the result attached, as every provider's does."""
    return wire.result_from_json(doc).check()


def _chunk(ev: Mapping[str, Any]) -> bytes:
    if "b64" in ev:
        return wire.unb64(ev["b64"], "b64")
    return str(ev.get("text", "")).encode("utf-8")


class _Queue:
    """An async iterator over chunks put by the reader; ``None`` ends it."""

    def __init__(self) -> None:
        self.q: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._ended = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self._ended:
            raise StopAsyncIteration
        item = await self.q.get()
        if item is None:
            self._ended = True
            raise StopAsyncIteration
        return item


class _Stdin(ProcessStdin):
    def __init__(self, provider: RemoteProvider, path: str) -> None:
        self._p, self._path = provider, path
        self._closed = False

    async def write(self, data: bytes) -> None:
        await self._p.call("POST", f"{self._path}/stdin", content=bytes(data))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ProviderError):
            await self._p.call("POST", f"{self._path}/stdin/close")


class RemoteProcess(ProcessHandle):
    """A process on the server: one NDJSON stream of its output, read from the start
    by a background task and split into ``stdout`` and ``stderr``; its last event is
    how it ended (``wait()``)."""

    def __init__(self, provider: RemoteProvider, path: str) -> None:
        self._p, self._path = provider, path
        self.stdin = _Stdin(provider, path)
        self._out, self._err = _Queue(), _Queue()
        self.stdout = self._out
        self.stderr = self._err
        self._result: RunResult | None = None
        self._reader = provider._spawn_reader(self._read())  # the provider's: aclose ends it

    async def _read(self) -> None:
        try:
            async with self._p.client().stream(
                    "GET", f"{wire.API_PREFIX}{self._path}/output") as resp:
                if resp.status_code != 200:
                    return
                async for line in resp.aiter_lines():
                    if not line:
                        continue
                    ev = json.loads(line)
                    if ev["event"] == "output":
                        (self._out if ev["fd"] == 1 else self._err).q.put_nowait(_chunk(ev))
                    elif ev["event"] == "exit" and ev.get("result") is not None:
                        self._result = wire.result_from_json(ev["result"])
        except Exception:
            pass
        finally:
            self._out.q.put_nowait(None)
            self._err.q.put_nowait(None)

    async def settle(self, seconds: float = 10.0) -> None:
        """Wait (bounded) for the output stream to end; past the bound its reader is
        cancelled (and awaited)."""
        try:
            await asyncio.wait([self._reader], timeout=seconds)
        finally:
            await settle_tasks([self._reader])

    async def wait(self) -> RunResult:
        try:
            await asyncio.shield(self._reader)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if self._reader.cancelled() and me is not None and not me.cancelling():
                # its reader was ended by the provider's aclose, not this caller cancelled
                raise ProviderError("the remote provider was closed") from None
            raise
        if self._result is not None:
            return self._result
        r = await self._p.call("GET", f"{self._path}/wait")
        self._result = wire.result_from_json(r.json()["result"])
        return self._result

    async def kill(self) -> None:
        with contextlib.suppress(ProviderError):
            await self._p.call("POST", f"{self._path}/kill")
