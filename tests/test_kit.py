"""The conformance kit itself can fail: deliberately broken providers are caught by name."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
from collections.abc import Sequence

import pytest

from corral.core.cancel import CancelToken
from corral.core.contract import ProcessHandle, Sandbox, SandboxProvider
from corral.core.errors import (
    ConfigInvalidError,
    LevelNotSupportedError,
    ProviderError,
    SandboxTimeoutError,
)
from corral.core.files import FileInfo
from corral.core.result import ExecResult
from corral.core.spec import (
    ExecOpts,
    Level,
    NetworkPolicy,
    ProcessOpts,
    SandboxLimits,
    SandboxSpec,
)
from corral.providers.inprocess import InProcessProvider, InProcessSandbox
from corral.testing import (
    CHECKS,
    FakeProvider,
    FakeSandbox,
    KitOptions,
    ProviderCheck,
    check_provider,
    check_provider_sync,
    provider_checks,
)

UNRESTRICTED = NetworkPolicy.unrestricted()


class Wrapped(Sandbox):
    """Delegates to a real in-process sandbox; subclasses break one thing."""

    def __init__(self, inner: InProcessSandbox, spec: SandboxSpec) -> None:
        self.inner = inner
        self.id = inner.id
        self.spec = spec
        self.destroyed = False

    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> ExecResult:
        return await self.inner.exec(argv, opts)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self.inner.write_file(path, data)

    async def read_file(self, path: str) -> bytes:
        return await self.inner.read_file(path)

    async def start_process(self, argv: Sequence[str],
                            opts: ProcessOpts | None = None) -> ProcessHandle:
        return await self.inner.start_process(argv, opts)

    async def destroy(self) -> None:
        self.destroyed = True
        await self.inner.destroy()


class Broken(SandboxProvider):
    """An in-process provider whose sandboxes are ``sandbox_class``."""

    name = "broken"
    levels = frozenset({Level.NONE})
    capabilities = frozenset({"streaming"})
    sandbox_class: type[Wrapped] = Wrapped

    def __init__(self) -> None:
        self.inner = InProcessProvider()

    def inner_spec(self, spec: SandboxSpec) -> SandboxSpec:
        return spec

    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None) -> Sandbox:
        sb = await self.inner.create(self.inner_spec(spec), cancel=cancel)
        assert isinstance(sb, InProcessSandbox)
        return self.sandbox_class(sb, spec)


# -- the broken providers ------------------------------------------------------
class DropsPartialOutput(Wrapped):
    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> ExecResult:
        try:
            return await self.inner.exec(argv, opts)
        except SandboxTimeoutError as e:
            raise SandboxTimeoutError(e.message, timeout_ms=e.timeout_ms) from None


class IgnoresTimeout(Wrapped):
    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> ExecResult:
        opts = dataclasses.replace(opts, timeout_ms=None) if opts else None
        return await self.inner.exec(argv, opts)


class FollowsDotDot(Wrapped):
    """Joins paths naively: ``..``, absolute paths and symlinks all get through."""

    async def write_file(self, path: str, data: bytes | str) -> None:
        if self.destroyed:
            raise ProviderError("destroyed")
        full = os.path.join(self.inner.work_dir, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)

    async def read_file(self, path: str) -> bytes:
        if self.destroyed:
            raise ProviderError("destroyed")
        with open(os.path.join(self.inner.work_dir, path), "rb") as f:
            return f.read()


class FilesFollowLinks(Wrapped):
    """Has the file operations, joined naively: a symlink made inside leads out."""

    async def list_files(self, path: str = "") -> list[FileInfo]:
        full = os.path.join(self.inner.work_dir, path)
        out = []
        for n in sorted(os.listdir(full)):
            st = os.lstat(os.path.join(full, n))
            out.append(FileInfo(name=n, path=os.path.normpath(os.path.join(full, n)),
                                type="dir" if stat.S_ISDIR(st.st_mode) else "file",
                                size=st.st_size, mode=stat.S_IMODE(st.st_mode),
                                modified=st.st_mtime))
        return out

    async def get_info(self, path: str) -> FileInfo:
        return await self.inner.get_info(path)

    async def make_dir(self, path: str, *, parents: bool = True) -> bool:
        return await self.inner.make_dir(path, parents=parents)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self.inner.remove(path, recursive=recursive)


class FilesBroken(Broken):
    capabilities = frozenset({"streaming", "files"})


class NotIdempotentDestroy(Wrapped):
    async def destroy(self) -> None:
        if self.destroyed:
            raise ProviderError("already destroyed")
        await super().destroy()


class HasPauseWithoutCapability(Wrapped):
    async def pause(self) -> None:
        pass

    async def resume(self) -> None:
        pass


class DowngradesLevel(Broken):
    """Claims only 'none' but hands out a 'none' sandbox whatever level is asked."""

    def inner_spec(self, spec: SandboxSpec) -> SandboxSpec:
        return dataclasses.replace(spec, level=Level.NONE)


class IgnoresMemLimit(Broken):
    """Accepts mem_mb and silently drops it (refuses the other limits)."""

    def inner_spec(self, spec: SandboxSpec) -> SandboxSpec:
        return dataclasses.replace(spec, limits=SandboxLimits(
            cpu_ms=spec.limits.cpu_ms, disk_mb=spec.limits.disk_mb,
            max_processes=spec.limits.max_processes))


class OldRefusals(Broken):
    """Refuses limits and network policies with ConfigInvalidError, as the inprocess and
    subproc providers did before the contract's refusal table."""

    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None) -> Sandbox:
        try:
            return await super().create(spec, cancel=cancel)
        except LevelNotSupportedError as e:
            if e.field == "level":
                raise
            raise ConfigInvalidError(e.field, e.message) from None


class IgnoresNetworkNone(Broken):
    """Accepts network 'none' and runs with the host's network."""

    def inner_spec(self, spec: SandboxSpec) -> SandboxSpec:
        return dataclasses.replace(spec, network=UNRESTRICTED)


class RefusesLevelsVaguely(Broken):
    """Refuses other levels without saying which it supports."""

    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None) -> Sandbox:
        if spec.level is not Level.NONE:
            raise LevelNotSupportedError(spec.level.value)
        return await super().create(spec, cancel=cancel)


class AnyCwd(Wrapped):
    """Drops a cwd it should refuse, and runs in the work dir."""

    async def exec(self, argv: Sequence[str], opts: ExecOpts | None = None) -> ExecResult:
        opts = dataclasses.replace(opts, cwd=None) if opts else None
        return await self.inner.exec(argv, opts)


class IgnoresCancelToken(Broken):
    async def create(self, spec: SandboxSpec, *, cancel: CancelToken | None = None) -> Sandbox:
        return await super().create(spec)


def broken(sandbox_class: type[Wrapped], base: type[Broken] = Broken) -> Broken:
    return type(f"Broken{sandbox_class.__name__}", (base,),
                {"sandbox_class": sandbox_class})()


def failures(provider: SandboxProvider, options: KitOptions | None = None, *,
             only: set[str] | None = None) -> str:
    with pytest.raises(AssertionError) as ei:
        asyncio.run(check_provider(provider, options or KitOptions(network=UNRESTRICTED),
                                   only=only))
    return str(ei.value)


@pytest.mark.parametrize(("provider", "check", "says"), [
    (broken(DropsPartialOutput), "timeout", "partial stdout missing"),
    (broken(FollowsDotDot), "path-escape", "through a symlink made in the sandbox: was allowed"),
    (DowngradesLevel(), "level", "must never be downgraded"),
    (IgnoresMemLimit(), "limits", "mem_mb=64: accepted, and the bounded memory bomb ran"),
    (broken(NotIdempotentDestroy), "destroy", "second destroy()"),
    (broken(HasPauseWithoutCapability), "lifecycle", "sandbox has pause(): True"),
    (IgnoresCancelToken(), "cancel", "already cancelled token returned a sandbox"),
    (OldRefusals(), "limits", "mem_mb=64: refusing limits.mem_mb: expected "
     "LevelNotSupportedError(field='limits.mem_mb') (the contract's refusal table), got "
     "ConfigInvalidError"),
    (OldRefusals(), "network", "network 'none': refusing network: expected "
     "LevelNotSupportedError(field='network')"),
    (IgnoresNetworkNone(), "network", "network 'none': accepted, but a command reached a "
     "listener on the host's 127.0.0.1"),
    (RefusesLevelsVaguely(), "level", "LevelNotSupportedError.supported is (), not the "
     "provider's levels ('none',)"),
    (broken(AnyCwd), "bad-input", "exec(cwd='../..'): was allowed (expected ConfigInvalidError)"),
    (broken(FilesFollowLinks, FilesBroken), "file-ops",
     "list_files('hostdir') (a symlink made inside): was allowed"),
    (broken(Wrapped, FilesBroken), "file-ops", "has no file operations"),
], ids=["timeout", "path-escape", "level", "limits", "destroy", "lifecycle", "cancel",
        "limits-config-invalid", "network-config-invalid", "network-ignored",
        "level-supported", "bad-input-cwd", "files-follow-links", "files-claimed-not-there"])
def test_kit_names_the_failing_check(provider: SandboxProvider, check: str, says: str) -> None:
    msg = failures(provider, only={check})
    assert check in CHECKS
    assert f"[{check}] " in msg
    assert says in msg, msg
    assert "failed 1 conformance check(s)" in msg


@pytest.mark.slow
def test_kit_runs_on_after_a_failure_and_lists_every_failure() -> None:
    msg = failures(broken(FollowsDotDot))
    lines = [ln.strip() for ln in msg.splitlines()[1:]]
    # it also opens a path with a NUL (ValueError, not ConfigInvalidError)
    assert [ln.split("]")[0] + "]" for ln in lines] == ["[path-escape]", "[bad-input]"], msg
    msg = failures(broken(DropsPartialOutput), only={"timeout", "path-escape", "exec"})
    assert "[timeout]" in msg and "[path-escape]" not in msg and "[exec]" not in msg


@pytest.mark.slow
def test_kit_catches_an_ignored_timeout() -> None:
    msg = failures(broken(IgnoresTimeout), only={"timeout"})
    assert "[timeout] exec with timeout_ms=300" in msg
    assert "did not finish within" in msg


def test_supports_limits_turns_refusal_into_failure() -> None:
    msg = failures(InProcessProvider(), KitOptions(network=UNRESTRICTED,
                                                   supports_limits={"cpu_ms"}), only={"limits"})
    assert "[limits] cpu_ms=200: refused" in msg and "mem_mb" not in msg


def test_leak_check_failures_are_reported() -> None:
    async def leaky() -> None:
        raise AssertionError("3 cgroups left")

    msg = failures(InProcessProvider(), KitOptions(network=UNRESTRICTED, leak_check=leaky),
                   only={"cancel"})
    assert "[cancel] leak_check after cancelled creates: 3 cgroups left" in msg
    assert "[leaks] leak_check after the last check: 3 cgroups left" in msg


def test_network_default_is_none_and_refusal_is_reported() -> None:
    with pytest.raises(AssertionError) as ei:
        check_provider_sync(InProcessProvider(), only={"exec"})
    assert "LevelNotSupportedError" in str(ei.value) and "network" in str(ei.value)


def test_provider_checks_are_the_checks_by_name_and_run_alone() -> None:
    checks = provider_checks()
    assert tuple(c.name for c in checks) == CHECKS
    assert all(isinstance(c, ProviderCheck) and c.doc for c in checks)
    by_name = {c.name: c for c in checks}
    asyncio.run(by_name["files"](InProcessProvider(), KitOptions(network=UNRESTRICTED)))
    with pytest.raises(AssertionError, match=r"failed 1 conformance check.*\n  \[path-escape\] "):
        asyncio.run(by_name["path-escape"](broken(FollowsDotDot),
                                           KitOptions(network=UNRESTRICTED)))
    with pytest.raises(ValueError, match="runs commands"):
        asyncio.run(by_name["exec"](FakeProvider(), KitOptions(processes=False)))
    assert "exec" not in {c.name for c in provider_checks(processes=False)}


def test_kit_options_are_one_checked_value() -> None:
    opts = KitOptions(level="strict", supports_limits=["mem_mb"])
    assert opts.level is Level.STRICT and opts.supports_limits == frozenset({"mem_mb"})
    with pytest.raises(ValueError, match="not limit fields"):
        KitOptions(supports_limits={"memory"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.processes = False  # type: ignore[misc]


def test_unknown_check_name() -> None:
    with pytest.raises(ValueError, match="unknown check 'nope'"):
        check_provider_sync(InProcessProvider(), only={"nope"})


def test_sync_wrapper_passes() -> None:
    check_provider_sync(InProcessProvider(), KitOptions(network=UNRESTRICTED),
                        only={"exec", "files"})


# -- FakeProvider: a test double that passes the kit's non-process checks -------
def test_fake_provider_passes_the_kit_without_processes() -> None:
    check_provider_sync(FakeProvider(), KitOptions(processes=False))


def test_fake_provider_with_unenforced_limits_does_not_pass() -> None:
    msg = failures(FakeProvider(accept_limits=True), KitOptions(processes=False),
                   only={"limits"})
    assert "[limits] mem_mb=64: accepted, but processes=False cannot check it" in msg


def test_fake_provider_answers_from_its_handler() -> None:
    def handler(argv: Sequence[str], opts: ExecOpts) -> ExecResult:
        if argv[0] == "boom":
            raise SandboxTimeoutError("simulated", timeout_ms=5)
        return ExecResult(stdout=(opts.stdin or b"").upper(), stderr=b"", exit_code=len(argv))

    async def go() -> None:
        provider = FakeProvider(handler, levels=["strict"])
        with pytest.raises(LevelNotSupportedError):
            await provider.create(SandboxSpec(tenant_id="t", run_id="r", level="none"))
        async with await provider.create(SandboxSpec(tenant_id="t", run_id="r")) as sb:
            assert isinstance(sb, FakeSandbox)
            r = await sb.exec(["a", "b"], ExecOpts(stdin=b"hi"))
            assert (r.stdout, r.exit_code) == (b"HI", 2)
            with pytest.raises(SandboxTimeoutError):
                await sb.exec(["boom"])
            p = await sb.start_process(["cat"])
            await p.stdin.write(b"abc")
            await p.stdin.close()
            assert [c async for c in p.stdout] == [b"ABC"]
            assert (await p.wait()).exit_code == 1
            await sb.write_file("/work/d/f.txt", "x")
            assert sb.files == {"d/f.txt": b"x"}
            assert await sb.read_file("d/f.txt") == b"x"
            for bad in ("d", "d/f.txt/g", "../x", "/etc/passwd"):
                with pytest.raises(ConfigInvalidError):
                    await sb.write_file(bad, b"y")
            with pytest.raises(FileNotFoundError):
                await sb.read_file("nope")
            assert [c[0] for c in sb.calls] == [("a", "b"), ("boom",), ("cat",)]
        assert provider.sandboxes == [sb]
        with pytest.raises(ProviderError):
            await sb.exec(["a"])

    asyncio.run(go())
