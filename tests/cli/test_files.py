"""``corral run``: files in (``--copy``), files out (``--output``), a ``--cwd`` that
is created, ``--here``, and ``--bind`` (issue 16). Before, none of these options
existed, ``--cwd sub`` at strict failed on the empty /work and ``--cwd rel`` at
context-isolated blamed the command."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from corral.cli import main
from strict_tier import needs_strict, unavailable

PY = os.path.realpath(sys.executable)  # the strict sandbox binds the real prefix
JOB = "print(open('data.txt').read().upper()); open('result.txt', 'w').write('done')"


def _strict_or_skip(status: int, err: str) -> None:
    if status == 69 and "level-not-supported" in err:
        unavailable(err)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "job.py").write_text(JOB)
    (tmp_path / "in" / "payload.txt").write_text("hello")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("level", ["context-isolated", "strict"])
def test_copy_in_and_output_back(level: str, workdir: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["run", "--level", level, "--json", "--copy", "in/job.py",
                   "--copy", "in/payload.txt:data.txt", "--output", "result.txt",
                   "--output", "result.txt:out/second.txt", "--output", "never.txt",
                   "--", PY, "-I", "-S", "job.py"])
    out, err = capsys.readouterr()
    _strict_or_skip(status, err)
    assert status == 0, err
    doc = json.loads(out)
    assert doc["stdout"] == "HELLO\n"
    assert (workdir / "result.txt").read_text() == "done"
    assert (workdir / "out" / "second.txt").read_text() == "done"
    assert doc["files_out"][2] == {"path": "never.txt", "saved_to": None}
    assert "--output never.txt: the run left no such file" in err


@needs_strict("")
def test_strict_cwd_is_created_and_copies_land_in_it(workdir: Path,
                                                    capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    status = main(["run", "--level", "strict", "--cwd", "a/b", "--copy", "in/job.py",
                   "--copy", "in/payload.txt:data.txt", "--output", "result.txt:r.txt",
                   "--", "/bin/sh", "-c", f"pwd && {PY} -I -S job.py"])
    out, err = capsys.readouterr()
    _strict_or_skip(status, err)
    assert status == 0, err
    assert out == "/work/a/b\nHELLO\n"
    assert (workdir / "r.txt").read_text() == "done"
    assert main(["run", "--level", "strict", "--json", "--cwd", "c", "--", "/bin/pwd"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["stdout"], doc["cwd"]) == ("/work/c\n", "/work/c")


@needs_strict("")
def test_strict_runs_a_copied_script_by_relative_path(workdir: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    (workdir / "in" / "s.sh").write_text("#!/bin/sh\necho from-script\n")
    (workdir / "in" / "s.sh").chmod(0o755)
    status = main(["run", "--level", "strict", "--copy", "in/s.sh", "--", "/bin/sh", "./s.sh"])
    out, err = capfd.readouterr()
    _strict_or_skip(status, err)
    assert (status, out) == (0, "from-script\n"), err


def test_context_isolated_cwd_is_created_and_said(workdir: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--level", "context-isolated", "--cwd", "rel/dir", "--", "/bin/pwd"]) == 0
    out, err = capfd.readouterr()
    assert out == f"{workdir}/rel/dir\n"
    assert "created --cwd" in err and (workdir / "rel" / "dir").is_dir()


def test_here_runs_in_the_current_directory(workdir: Path,
                                            capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--level", "context-isolated", "--here", "--", "/bin/sh", "-c",
                 "pwd; ls in"]) == 0
    assert capfd.readouterr().out == f"{workdir}\njob.py\npayload.txt\n"


@pytest.mark.parametrize(("argv", "status", "words"), [
    (["--level", "strict", "--here"], 64, "--here"),
    (["--here", "--cwd", "x"], 64, "--here"),
    (["--copy", "in/job.py:../escape.py"], 64, "'..'"),
    (["--copy", "in/job.py:/abs.py"], 64, "relative"),
    (["--output", "/etc/passwd"], 64, "relative"),
    (["--level", "context-isolated", "--bind", "/usr"], 64, "strict"),
    (["--level", "strict", "--bind", "/usr:elsewhere"], 64, "absolute"),
    (["--level", "strict", "--bind", "/usr:/etc:rw"], 64, "binds"),
])
def test_refused_file_options(argv: list[str], status: int, words: str, workdir: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *argv, "--", "/bin/true"]) == status
    assert words in capsys.readouterr().err


@needs_strict("")
def test_strict_bind_shows_a_host_dir_read_only(workdir: Path,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    d = str(workdir / "in")
    status = main(["run", "--level", "strict", "--bind", f"{d}:ro", "--", "/bin/sh", "-c",
                   f"cat {d}/payload.txt; echo x > {d}/new 2>/dev/null || echo refused"])
    out, err = capfd.readouterr()
    _strict_or_skip(status, err)
    assert (status, out) == (0, "hellorefused\n"), err
    assert not (workdir / "in" / "new").exists()


@pytest.mark.parametrize("level", ["context-isolated", "strict"])
def test_output_comes_back_after_a_timeout(level: str, workdir: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["run", "--level", level, "--json", "--timeout", "1s", "--grace-ms", "100",
                   "--output", "partial.txt", "--", "/bin/sh", "-c",
                   "echo so-far > partial.txt; exec sleep 30"])
    out, err = capsys.readouterr()
    _strict_or_skip(status, err)
    assert status == 124, err
    assert json.loads(out)["outcome"] == "timeout"
    assert (workdir / "partial.txt").read_text() == "so-far\n"
