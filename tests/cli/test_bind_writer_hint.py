"""``--bind DIR:/work/p:rw`` as root, with DIR not writable by corral's bind writer
(issue 27, item 1).

As root, writes through a read-write bind land as the bind writer (uid and gid
0x70000000), never as root, so a root-owned 0755 DIR gave the command inside only
"Permission denied", and in a pipe nothing said why. Now the CLI refuses it before the
command starts (exit 64), naming the fix; after that fix the same command line works.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from strict_tier import host_can_sandbox, needs_strict

CORRAL = [sys.executable, "-c", "import sys, _corral_cli; sys.exit(_corral_cli.main())"]
BIND_WRITER = 0x70000000

pytestmark = [needs_strict(host_can_sandbox()),
              pytest.mark.skipif(os.geteuid() != 0, reason="the bind writer is root's case")]


def _write_into(d: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CORRAL, "run", "--level", "strict", "--bind", f"{d}:/work/p:rw",
                           "--", "/bin/sh", "-c", "echo built > /work/p/out.txt"],
                          capture_output=True, text=True, timeout=120)


def test_a_dir_the_bind_writer_cannot_write_is_refused_naming_the_fix(tmp_path: Path) -> None:
    d = tmp_path / "proj"
    d.mkdir(mode=0o755)
    r = _write_into(d)
    assert r.returncode == 64, r.stderr
    assert r.stderr.startswith("corral: config-invalid: --bind:"), r.stderr
    assert f"chown {BIND_WRITER}:{BIND_WRITER} {d}" in r.stderr
    assert f"chmod o+w {d}" in r.stderr
    assert "Permission denied" not in r.stderr
    assert not (d / "out.txt").exists()          # nothing ran


def test_after_the_fix_the_same_line_writes(tmp_path: Path) -> None:
    d = tmp_path / "proj"
    d.mkdir(mode=0o755)
    os.chown(d, BIND_WRITER, BIND_WRITER)
    r = _write_into(d)
    assert r.returncode == 0, r.stderr
    assert (d / "out.txt").read_text() == "built\n"
    assert (d / "out.txt").stat().st_uid == BIND_WRITER


def test_a_world_writable_dir_is_taken(tmp_path: Path) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    r = _write_into(d)
    assert r.returncode == 0, r.stderr
    assert (d / "out.txt").stat().st_uid == BIND_WRITER


def test_a_read_only_bind_is_not_checked(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir(mode=0o755)
    r = subprocess.run([*CORRAL, "run", "--level", "strict", "--bind", f"{d}:/work/p",
                        "--", "/bin/ls", "/work/p"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
