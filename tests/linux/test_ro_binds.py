"""LinuxProvider(ro_binds=...): more host paths, visible read-only in every sandbox."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.errors import ConfigInvalidError
from corral.spec import SandboxSpec

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
