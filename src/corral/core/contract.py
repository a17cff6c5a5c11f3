"""The provider contract: the one seam every isolation back end implements.

Semantics every provider keeps (the conformance kit in :mod:`corral.testing`
checks them):

* **Never run weaker.** ``create(spec)`` gives a sandbox at ``spec.level``
  that enforces every limit and the network policy of ``spec``, or refuses it
  with :class:`~corral.core.errors.LevelNotSupportedError` (see *Refusals*); a
  limit or policy is never ignored.
* **Roll back.** If ``create`` fails, or the ``cancel`` token fires while it
  runs, everything it built is released; a token cancel raises
  :class:`~corral.core.errors.CreateCancelledError`. An asyncio cancellation rolls
  back the same way and propagates untouched.
* **Destroy always releases.** ``destroy()`` kills every process of the
  sandbox and removes its files, mounts and cgroups, even if a graceful stop
  fails; it is idempotent. After it, every other method raises
  ``ProviderError``.
* **Files stay inside.** ``write_file`` / ``read_file`` paths are relative to
  the sandbox's work dir (absolute paths must lie under it); ``..``, absolute
  paths outside and symlinks that lead out raise ``ConfigInvalidError``.
* **Optional lifecycle** (``snapshot``, ``restore``, ``pause``, ``resume``) is
  present on a sandbox only if the provider supports it, and then its
  capability string is advertised. Detect it with ``hasattr(sb, "pause")``,
  or call :func:`snapshot` / :func:`pause` ..., which raise the matching
  not-supported error when it is absent.

* **Optional front-door features** are negotiated the same way (seed 01): the
  provider advertises a capability string and the object has the method, a
  runtime-checkable Protocol here. Front doors test ``isinstance`` on the
  Protocol (and the string), never a provider's class:

  - ``streaming-exec`` (:class:`SupportsStreamingExec`, on a sandbox):
    ``exec_streaming(argv, opts, on_output=...)`` is ``exec`` that also hands
    each chunk of output to ``on_output(fd, chunk)`` as it arrives
    (``run_strict`` streams with it; without it, a run's output comes at the end).
  - ``warm-fork`` (:class:`SupportsWarmFork` on the provider,
    :class:`SupportsForkEntry` on its sandboxes): the provider imports trusted
    modules into what its sandboxes are cloned from and registers which
    ``module:function`` entries may be forked; a sandbox then starts a forked
    process of a registered entry instead of exec'ing an interpreter. The
    caller names the entries (the snippet pool registers its worker): the
    provider knows no front door, and refuses any entry not registered and
    preloaded with ``ConfigInvalidError("entry")``.
  - ``process-count`` (:class:`SupportsProcessCount`, on a sandbox): whether the
    sandbox still serves (``alive``) and how many live processes it holds besides
    the one the provider runs in it to serve it (``process_count()``), read from
    the host; the snippet pool retires a slot in which a run left a process behind.

**Refusals.** One error per kind of refusal, the same on every provider (the
conformance kit's ``level``, ``limits``, ``network``, ``bad-input`` and
``lifecycle`` checks assert it for each):

===========  =============================  ==========================================
kind         error (code)                   it names
===========  =============================  ==========================================
level        ``LevelNotSupportedError``     ``field="level"``, ``requested``,
             (``level-not-supported``)      ``supported``, ``missing``
limit        ``LevelNotSupportedError``     ``field="limits.<name>"``, ``missing``
network      ``LevelNotSupportedError``     ``field="network"``, ``missing``
capability   ``SnapshotNotSupportedError``  the method it lacks
             ``RestoreNotSupportedError``
             ``PauseNotSupportedError``
bad input    ``ConfigInvalidError``         ``field``, ``reason``
             (``config-invalid``)
===========  =============================  ==========================================

* *level*: ``spec.level`` is not in ``provider.levels``, or a host primitive the
  level needs (a namespace, seccomp for this arch) is missing here.
* *limit*: a limit of ``spec.limits`` the provider has no mechanism for, at all
  (``subproc``: rlimits are per process) or on this host (a cgroup controller).
* *network*: a network policy it cannot enforce (``subproc`` cannot enforce
  ``none``; ``linux`` gives only ``none``).
* *capability*: an optional lifecycle method the sandbox lacks, called through
  :func:`snapshot`, :func:`restore`, :func:`pause` or :func:`resume`.
* *bad input*: a spec that is not a ``SandboxSpec``, a malformed argument, env or
  path, a path leaving the sandbox, a value outside the provider's documented
  range (``linux``: ``mem_mb`` below 16), a mode or image it does not run.

The rule behind the split: ``level-not-supported`` says "the request is well
formed, but this provider cannot give that isolation here; another provider or
host may" (exit 69, HTTP 501); ``config-invalid`` says "fix the request" (exit
64, HTTP 400). Refusals at ``create`` come before anything runs, and roll back
whatever was built.

``Sandbox`` and ``ProcessHandle`` objects are made by providers only.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol, Self, runtime_checkable

from corral.core.cancel import CancelToken
from corral.core.errors import (
    PauseNotSupportedError,
    ProviderError,
    RestoreNotSupportedError,
    SnapshotNotSupportedError,
)
from corral.core.files import FileInfo
from corral.core.result import NetworkDenial, RunResult
from corral.core.spec import (
    ExecOpts,
    Level,
    ProcessOpts,
    SandboxSpec,
    SnapshotHandle,
)

__all__ = [
    "OutputSink",
    "ProcessHandle",
    "ProcessStdin",
    "Sandbox",
    "SandboxProvider",
    "SupportsForkEntry",
    "SupportsNetworkPolicy",
    "SupportsPause",
    "SupportsPreviewUrl",
    "SupportsProcessCount",
    "SupportsRestore",
    "SupportsSnapshot",
    "SupportsStreamingExec",
    "SupportsWarmFork",
    "pause",
    "restore",
    "resume",
    "snapshot",
]


class ProcessStdin(abc.ABC):
    """The writable end of a started process's stdin."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Write all of ``data``. Raises ``ProviderError`` if the process closed it."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close stdin (EOF for the process). Idempotent."""


class ProcessHandle(abc.ABC):
    """A process started in a sandbox, with streamed output.

    ``stdout`` / ``stderr`` yield chunks as they arrive and end at EOF; read
    both (or neither) to avoid the process blocking on a full pipe.
    """

    stdin: ProcessStdin
    stdout: AsyncIterator[bytes]
    stderr: AsyncIterator[bytes]

    @abc.abstractmethod
    async def wait(self) -> RunResult:
        """Wait for the process to end and return how it ended (outcome ``exit``,
        ``timeout`` when ``ProcessOpts.timeout_ms`` passed and it was killed, or the
        limit outcome (``memory-limit``, ...) when a provider that enforces that limit
        saw it end the process: returned, not raised, as this is a result)."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """Kill the process (and what it started). Idempotent."""


class Sandbox(abc.ABC):
    """One live sandbox. Built by a provider's ``create``."""

    #: a provider-unique id, stable for the sandbox's life
    id: str
    spec: SandboxSpec

    @abc.abstractmethod
    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> RunResult:
        """Run ``argv`` to completion and return how it ended: a :class:`RunResult`
        with outcome ``exit`` (its ``exit_code`` is the command's answer, negative
        when a signal killed it).

        Any other outcome raises the contract's error for it, built by
        :meth:`RunResult.error`: ``err.result`` is the same value (output so far,
        usage, the limit and what was observed).

        Raises:
            SandboxTimeoutError: ``opts.timeout_ms`` passed; the command was killed.
            LimitsExceededError: the command hit a sandbox limit, or wrote more
                than the output cap (``opts.max_stdout_bytes`` narrows it).
            ConfigInvalidError: bad argv or options.
        """

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace the file at ``path`` (parents are created)."""

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Return the whole content of the file at ``path``.

        Raises:
            FileNotFoundError: no such file (the builtin, as ``open`` raises).
            ConfigInvalidError: the path leaves the sandbox or is not a
                regular file.
        """

    @abc.abstractmethod
    async def start_process(self, argv: Sequence[str],
                            opts: ProcessOpts | None = None) -> ProcessHandle:
        """Start ``argv`` and return a handle streaming its output."""

    # -- file operations (the ``files`` capability; E2B's ``sandbox.files``) -------------
    # Paths as for read_file: relative to the work dir, or absolute under it; "" / "."
    # name the work dir itself where a method allows it. No path leaves the sandbox's
    # files: ``..``, an absolute path elsewhere, and a symlink before the last component
    # are ConfigInvalidError; a symlink as the last component is the link itself (never
    # followed). What the file system answers is the builtin OSError subclass, as ``os``
    # raises it. A sandbox without the capability raises ProviderError.

    async def list_files(self, path: str = "") -> list[FileInfo]:
        """The entries of the directory at ``path`` (default: the work dir), sorted by
        name, one level deep (E2B: ``files.list``).

        Raises:
            FileNotFoundError: nothing is at ``path``.
            NotADirectoryError: ``path`` is not a directory.
            ConfigInvalidError: the path leaves the sandbox or is a symlink.
        """
        raise self._no_files("list_files")

    async def get_info(self, path: str) -> FileInfo:
        """What is at ``path`` (E2B: ``files.get_info``); FileNotFoundError if nothing."""
        raise self._no_files("get_info")

    async def exists(self, path: str) -> bool:
        """Whether anything (a symlink too, dangling or not) is at ``path``
        (E2B: ``files.exists``)."""
        try:
            await self.get_info(path)
        except FileNotFoundError:
            return False
        return True

    async def make_dir(self, path: str, *, parents: bool = True) -> bool:
        """Make the directory ``path`` (``parents``: the missing ones above it too);
        True if it was made, False if a directory was there (E2B: ``files.make_dir``).

        Raises:
            FileExistsError: something other than a directory is at ``path``.
            FileNotFoundError: a parent is missing and ``parents`` is false.
        """
        raise self._no_files("make_dir")

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove the file, symlink or directory at ``path`` (E2B: ``files.remove``,
        which is recursive; here a directory that is not empty needs ``recursive``).
        Never the work dir itself.

        Raises:
            FileNotFoundError: nothing is at ``path``.
            OSError: (``errno.ENOTEMPTY``) a directory not empty, without ``recursive``.
        """
        raise self._no_files("remove")

    def _no_files(self, what: str) -> ProviderError:
        return ProviderError(f"{what}: {type(self).__name__} has no file operations "
                             "(capability 'files')")

    @abc.abstractmethod
    async def destroy(self) -> None:
        """Release everything. Idempotent; never raises for a second call."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()


@runtime_checkable
class SupportsSnapshot(Protocol):
    async def snapshot(self) -> SnapshotHandle: ...


@runtime_checkable
class SupportsRestore(Protocol):
    async def restore(self, handle: SnapshotHandle) -> None: ...


@runtime_checkable
class SupportsPause(Protocol):
    async def pause(self) -> None: ...

    async def resume(self) -> None: ...


#: ``on_output(fd, chunk)``: fd 1 is stdout, 2 stderr
OutputSink = Callable[[int, bytes], object]


@runtime_checkable
class SupportsStreamingExec(Protocol):
    """A sandbox of a provider advertising ``streaming-exec``."""

    async def exec_streaming(self, argv: Sequence[str], opts: ExecOpts | None = None, *,
                             on_output: OutputSink) -> RunResult:
        """``exec``, with each chunk of output also given to ``on_output`` as it arrives
        (before the command ends); same result and errors as ``exec``."""
        ...


@runtime_checkable
class SupportsWarmFork(Protocol):
    """The provider side of ``warm-fork``."""

    async def preload_python(self, modules: Sequence[str], *,
                             fork_entries: Sequence[str] = ()) -> list[str]:
        """Import ``modules`` (trusted code, loaded outside any sandbox) into what
        sandboxes created from now on are cloned from, and register ``fork_entries``
        (``module:function``, each module preloaded) as entries their sandboxes may fork.
        Returns the modules and entries that could not be loaded (not registered)."""
        ...


@runtime_checkable
class SupportsForkEntry(Protocol):
    """The sandbox side of ``warm-fork``."""

    async def start_python_fork(self, args: Sequence[str] = (),
                                opts: ProcessOpts | None = None, *,
                                entry: str) -> ProcessHandle:
        """Start a process that is a fork of the sandbox calling ``entry(args)``, set up
        and contained as a started command is. Raises ``ConfigInvalidError("entry")``
        for an entry not registered and preloaded before this sandbox was created."""
        ...


@runtime_checkable
class SupportsProcessCount(Protocol):
    """The sandbox side of ``process-count``: what runs in the sandbox, seen from the host."""

    @property
    def alive(self) -> bool:
        """Whether the sandbox still serves: not destroyed, and the process the provider
        runs in it to serve it (linux: its agent) has not exited."""
        ...

    def process_count(self) -> int:
        """How many live processes the sandbox holds now besides that serving process
        (0 once it no longer serves); cheap enough to call after every job."""
        ...


@runtime_checkable
class SupportsPreviewUrl(Protocol):
    """The sandbox side of ``preview-url``: a URL the host can open that reaches a TCP
    port inside the sandbox, until ``unexpose`` or destroy. A URL anyone else on the
    host could open carries a token (a :class:`~corral.core.preview.PreviewURL`, still
    a ``str``) that a connection must present first."""

    async def expose(self, port: int) -> str: ...

    async def unexpose(self, port: int) -> None: ...


@runtime_checkable
class SupportsNetworkPolicy(Protocol):
    """The sandbox side of ``network-allowlist``: the policy changed for new connections
    (``ConfigInvalidError`` for a bad entry or a sandbox with network ``none``), and the
    refusals so far (each ``exec``'s own are in ``RunResult.denials``)."""

    def allow_host(self, entry: str) -> None: ...

    def revoke_host(self, entry: str) -> None: ...

    def network_denials(self) -> tuple[NetworkDenial, ...]: ...


class SandboxProvider(abc.ABC):
    """Creates sandboxes of the levels it supports."""

    #: short registry name ("inprocess", "subproc", "linux", ...)
    name: str
    #: the levels this provider can give on this host
    levels: frozenset[Level]
    #: capability strings (see :class:`corral.core.spec.Capability`)
    capabilities: frozenset[str]

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None) -> Sandbox:
        """Build a sandbox for ``spec``.

        Raises:
            LevelNotSupportedError: ``spec.level`` is not one of ``levels``, a host
                primitive it needs is missing, or a limit or the network policy
                cannot be enforced; ``field`` says which part of the spec and
                ``missing`` what is absent (see *Refusals* above).
            ConfigInvalidError: ``spec`` is not a ``SandboxSpec``, a value is out of
                the provider's range, or it does not run the spec's mode or image.
            CreateCancelledError: ``cancel`` fired; everything was rolled back.
        """

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release provider-wide resources (warm pools, helper processes)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def snapshot(sandbox: Sandbox) -> SnapshotHandle:
    """``sandbox.snapshot()``, or :class:`SnapshotNotSupportedError` if it has none."""
    if not isinstance(sandbox, SupportsSnapshot):
        raise SnapshotNotSupportedError(f"{type(sandbox).__name__} cannot take snapshots")
    return await sandbox.snapshot()


async def restore(sandbox: Sandbox, handle: SnapshotHandle) -> None:
    """``sandbox.restore(handle)``, or :class:`RestoreNotSupportedError`."""
    if not isinstance(sandbox, SupportsRestore):
        raise RestoreNotSupportedError(f"{type(sandbox).__name__} cannot restore snapshots")
    await sandbox.restore(handle)


async def pause(sandbox: Sandbox) -> None:
    """``sandbox.pause()``, or :class:`PauseNotSupportedError`."""
    if not isinstance(sandbox, SupportsPause):
        raise PauseNotSupportedError(f"{type(sandbox).__name__} cannot be paused")
    await sandbox.pause()


async def resume(sandbox: Sandbox) -> None:
    """``sandbox.resume()``, or :class:`PauseNotSupportedError`."""
    if not isinstance(sandbox, SupportsPause):
        raise PauseNotSupportedError(f"{type(sandbox).__name__} cannot be resumed")
    await sandbox.resume()
