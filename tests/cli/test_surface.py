"""The ``corral`` command's surface (issue 16): durations, the clamped snippet
timeout said out loud, the overflow message on its own line, lossless ``--json``
output, ``corral python`` refusing a missing file, the network refusal's message,
``--version`` and the package metadata. Each test fails on the code before."""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tomllib
from pathlib import Path

import pytest

from corral.cli import _common, main
from corral.core.result import Outcome, RunResult

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "ms"), [
    ("500", 500), ("500ms", 500), ("5s", 5000), ("1.5s", 1500), ("2m", 120_000),
    ("1h", 3_600_000), (" 7 s ", 7000),
])
def test_durations(text: str, ms: int) -> None:
    assert _common.duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "5x", "s", "-1s", "1.5", "5 sec"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _common.duration_ms(text)


def test_run_takes_durations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", "--timeout", "300ms", "--grace-ms", "0.1s", "--",
                 PY, "-c", "import time; time.sleep(30)"]) == 124
    assert json.loads(capsys.readouterr().out)["limit_value"] == 300
    assert main(["run", "--json", "--cpu-ms", "1s", "--timeout", "1m", "--",
                 PY, "-I", "-S", "-c", "while True: pass"]) == 137
    doc = json.loads(capsys.readouterr().out)
    assert (doc["outcome"], doc["limit_value"]) == ("cpu-limit", 1000)


def test_python_says_it_clamped_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["python", "--level", "context-isolated", "--timeout", "20s", "-c", "1"]) == 0
    err = capsys.readouterr().err
    assert "--timeout 20000 ms" in err and "clamped to 10000 ms" in err
    assert main(["python", "--level", "context-isolated", "--json", "--timeout", "20000",
                 "-c", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["timeout_ms"] == {"asked": 20000, "used": 10000}
    assert "clamped" in doc["notes"][0]
    assert main(["python", "--level", "context-isolated", "--timeout", "2s", "-c", "1"]) == 0
    assert capsys.readouterr().err == ""


def test_python_timeout_range_matches_the_runner() -> None:
    from corral.cli import python as verb
    from corral.snippets.host import runner

    assert (verb.MIN_TIMEOUT_MS, verb.MAX_TIMEOUT_MS) == (runner.MIN_TIMEOUT_MS,
                                                          runner.MAX_TIMEOUT_MS)


@pytest.mark.parametrize("name", ["nosuch.py", "dir/nosuch.py", "NOSUCH.PY"])
def test_python_missing_file_is_an_error_not_code(name: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["python", "--level", "context-isolated", name]) == 64
    out, err = capsys.readouterr()
    assert "no such file" in err and "NameError" not in out


def test_python_code_from_c_file_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    lv = ["python", "--level", "context-isolated"]
    assert main([*lv, "-c", "6 * 7"]) == 0
    assert "=> 42" in capsys.readouterr().out
    f = tmp_path / "job.py"
    f.write_text("2 + 3")
    assert main([*lv, str(f)]) == 0
    assert "=> 5" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO("1 + 1"))
    assert main([*lv, "-"]) == 0
    assert "=> 2" in capsys.readouterr().out
    assert main([*lv, "sum(range(4))"]) == 0  # a bare argument that is code still runs
    assert "=> 6" in capsys.readouterr().out
    assert main([*lv, "-c", "1", str(f)]) == 64
    assert main([*lv]) == 64


def test_overflow_message_starts_on_its_own_line(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--max-stdout", "5", "--", "/bin/echo", "helloworld"]) == 137
    out, err = capfd.readouterr()
    assert out == "hello"
    assert err.startswith("\ncorral: overflow-stdout:")
    assert main(["run", "--timeout", "300", "--", "/bin/sh", "-c",
                 "echo line; exec sleep 5"]) == 124
    out, err = capfd.readouterr()
    assert out == "line\n" and err.startswith("corral: timeout:")  # no blank line needed


def test_to_dict_is_lossless() -> None:
    text = RunResult(stdout="héllo\n".encode(), stderr=b"").to_dict()
    assert (text["stdout"], text["stdout_encoding"]) == ("héllo\n", "utf-8")
    assert "stdout_b64" not in text and text["stderr_encoding"] == "utf-8"
    raw = b"\xff\xfe\x00A"
    doc = RunResult(outcome=Outcome.EXIT, exit_code=0, stdout=raw, stderr=raw).to_dict()
    for name in ("stdout", "stderr"):
        assert doc[name] is None and doc[f"{name}_encoding"] == "base64"
        assert base64.b64decode(doc[f"{name}_b64"]) == raw
    assert json.loads(json.dumps(doc)) == doc


def test_run_json_gives_non_utf8_bytes_back(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", "--", "/usr/bin/printf", "\\377A"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert base64.b64decode(doc["stdout_b64"]) == b"\xffA"
    assert "\ufffd" not in json.dumps(doc)


def test_network_refusal_names_the_cause() -> None:
    # issue 13: strict enforces allowlist/unrestricted now; what it refuses is an entry
    # its egress proxy cannot read, naming the field
    from corral.core.errors import ConfigInvalidError
    from corral.core.spec import Level, NetworkPolicy, SandboxSpec
    from corral.providers.linux.host.netrelay import check_entries
    from corral.providers.linux.policy.plan import _check_level_and_network

    _check_level_and_network(SandboxSpec(level=Level.STRICT,
                                         network=NetworkPolicy.unrestricted()))
    with pytest.raises(ConfigInvalidError) as info:
        check_entries(NetworkPolicy.allowlist("a.example:0"))
    assert info.value.field == "network.hosts"
    assert "a.example:0" in str(info.value)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from corral import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"corral {__version__}\n"


def test_package_metadata() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert meta["authors"] == [{"name": "corral developers"}]
    assert any(c.startswith("Programming Language :: Python :: 3.11")
               for c in meta["classifiers"])


@pytest.mark.slow
def test_wheel_holds_the_license(tmp_path: Path) -> None:
    import subprocess
    import zipfile

    proc = subprocess.run([PY, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
                           str(ROOT)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "setuptools" in proc.stderr and "Could not" in proc.stderr:
        pytest.skip(f"no setuptools>=77 to build with: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("corral-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA")))
    assert b"License-Expression: Apache-2.0" in meta and b"Author: corral developers" in meta
