"""LinuxProvider(ro_binds=...): more host paths, visible read-only in every sandbox."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import ConfigInvalidError
from corral.core.spec import SandboxSpec

pytestmark = pytest.mark.linux


def make_spec() -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r")


def _tree(base: str) -> Iterator[Path]:
    """A dir under ``base`` whose parent only root can walk (like a 0700 home)."""
    outer = Path(tempfile.mkdtemp(prefix="corral-ro-", dir=base))
    try:
        os.chmod(outer, 0o700)
        inner = outer / "prefix"
        (inner / "lib").mkdir(parents=True)
        (inner / "lib" / "data.txt").write_text("from the host\n")
        for d in (inner, inner / "lib"):
            os.chmod(d, 0o755)
        os.chmod(inner / "lib" / "data.txt", 0o644)
        yield inner
    finally:
        shutil.rmtree(outer, ignore_errors=True)


@pytest.fixture(params=["/tmp", "/var/tmp"])
def host_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    if not os.path.isdir(request.param):
        pytest.skip(f"no {request.param} on this host")
    yield from _tree(request.param)


def test_a_bound_dir_is_readable_and_read_only(linux: Any, host_dir: Path) -> None:
    path = str(host_dir)

    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["cat", f"{path}/lib/data.txt"])
            assert (r.exit_code, r.stdout_text) == (0, "from the host\n"), r
            w = await sb.exec(["sh", "-c", f"echo x > {path}/lib/new.txt; "
                               f"echo y >> {path}/lib/data.txt"])
            assert w.exit_code != 0
            assert "Read-only file system" in w.stderr_text, w
            m = await sb.exec(["sh", "-c", f"grep ' {path} ' /proc/self/mountinfo"])
            assert m.exit_code == 0 and " ro," in m.stdout_text, m
        assert not (host_dir / "lib" / "new.txt").exists()
        assert (host_dir / "lib" / "data.txt").read_text() == "from the host\n"

    linux(test, spares=0, ro_binds=(path,))


def test_without_ro_binds_the_dir_is_not_there(linux: Any, host_dir: Path) -> None:
    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["cat", f"{host_dir}/lib/data.txt"])
            assert r.exit_code != 0

    linux(test, spares=0)


@pytest.mark.parametrize("bad", [
    "relative/path", "/", "/proc/self", "/work", "/tmp", "/etc", "/dev/shm",
    "/no/such/corral/dir", 42,
])
def test_a_bad_path_is_refused_naming_the_field(linux: Any, bad: object) -> None:
    from corral.providers.linux import LinuxProvider
    with pytest.raises(ConfigInvalidError) as info:
        LinuxProvider(spares=0, ro_binds=(bad,))  # type: ignore[arg-type]
    assert info.value.field == "ro_binds"


def test_one_string_is_not_a_list_of_paths(linux: Any) -> None:
    from corral.providers.linux import LinuxProvider
    with pytest.raises(ConfigInvalidError, match="ro_binds"):
        LinuxProvider(spares=0, ro_binds="/opt")


# -- unix sockets under a bind: connect() ignores a read-only mount ------------

@pytest.fixture
def socket_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A world-searchable dir whose subdir holds a listening, world-writable unix
    socket (like /run holding docker.sock); yields (dir, socket path)."""
    import socket

    from netservers import threaded_accept

    root = tmp_path / "run"
    (root / "svc").mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    for d in (root, root / "svc"):
        os.chmod(d, 0o755)
    path = root / "svc" / "api.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    os.chmod(path, 0o777)
    srv.listen()

    def answer(conn: socket.socket) -> None:
        with conn:
            conn.sendall(b"host-service")

    with threaded_accept(srv, answer):
        yield root, path


CONNECT = ("import socket, sys\n"
           "s = socket.socket(socket.AF_UNIX)\n"
           "s.connect(sys.argv[1])\n"
           "print(s.recv(100).decode())\n")


def test_a_bind_holding_a_unix_socket_is_refused(linux: Any,
                                                 socket_dir: tuple[Path, Path]) -> None:
    import socket
    import sys

    from corral.providers.linux import LinuxProvider

    root, path = socket_dir
    # control: the socket answers on the host
    c = socket.socket(socket.AF_UNIX)
    c.connect(str(path))
    assert c.recv(100) == b"host-service"
    c.close()

    refused: ConfigInvalidError | None = None
    try:
        provider = LinuxProvider(spares=0, ro_binds=(str(root),))
    except ConfigInvalidError as e:
        refused = e
    else:
        # without the check: a sandbox reaches the host service through the bind
        async def test() -> str:
            try:
                async with await provider.create(make_spec()) as sb:
                    r = await sb.exec([os.path.realpath(sys.executable), "-I", "-S", "-c",
                                       CONNECT, str(path)])
                    return f"exit {r.exit_code}: {r.stdout_text!r} {r.stderr_text[-300:]!r}"
            finally:
                await provider.aclose()
        import asyncio
        pytest.fail(f"ro_binds holding {path} was accepted; the sandbox's connect: "
                    f"{asyncio.run(test())}")
    assert refused is not None and refused.field == "ro_binds"
    assert str(path) in refused.message and "unix socket" in refused.message, refused.message


def test_a_socket_given_itself_or_through_a_symlink_is_refused(
        linux: Any, socket_dir: tuple[Path, Path], tmp_path: Path) -> None:
    from corral.providers.linux import LinuxProvider

    root, path = socket_dir
    link = tmp_path / "run-link"
    link.symlink_to(root)  # the bind follows the top-level link, so the check does
    for bad in (str(path), str(link), str(root / "svc")):
        with pytest.raises(ConfigInvalidError, match="unix socket") as info:
            LinuxProvider(spares=0, ro_binds=(bad,))
        assert info.value.field == "ro_binds"


def test_a_link_inside_a_bind_is_not_followed(linux: Any, socket_dir: tuple[Path, Path],
                                              host_dir: Path) -> None:
    """A symlink in the tree resolves inside the sandbox's own view, where the host
    socket is not: it is no reason to refuse the bind."""
    _root, path = socket_dir
    (host_dir / "lib" / "to-sock").symlink_to(path)

    async def test(p: Any) -> None:
        async with await p.create(make_spec()) as sb:
            r = await sb.exec(["sh", "-c", f"test -e {host_dir}/lib/to-sock"])
            assert r.exit_code != 0, r  # dangling inside

    linux(test, spares=0, ro_binds=(str(host_dir),))


def test_a_tree_too_big_to_check_is_refused(linux: Any, host_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.providers.linux import LinuxProvider
    from corral.providers.linux.host import bind_scan as _bind_scan

    for i in range(20):
        (host_dir / "lib" / f"f{i}").write_text("x")
    monkeypatch.setattr(_bind_scan, "SCAN_LIMIT", 10)
    with pytest.raises(ConfigInvalidError, match="more than 10 entries") as info:
        LinuxProvider(spares=0, ro_binds=(str(host_dir),))
    assert info.value.field == "ro_binds"
    monkeypatch.setattr(_bind_scan, "SCAN_LIMIT", 100)
    LinuxProvider(spares=0, ro_binds=(str(host_dir),))  # within the cap: fine
