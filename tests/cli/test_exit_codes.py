"""The ``corral`` command's one exit-status table (docs/cli.md), row by row, for
every verb. Before issue 16 argparse's errors exited 2 and a command not on
PATH exited 64."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from corral.cli import _common, main
from corral.core.errors import LevelNotSupportedError

PY = sys.executable
DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


@pytest.mark.parametrize("argv", [
    ["run", "--timeout", "soon", "--", "/bin/true"],
    ["run", "--level", "bogus", "--", "/bin/true"],
    ["run", "--no-such-option", "--", "/bin/true"],
    ["run", "--max-stdout", "many", "--", "/bin/true"],
    ["python", "--level", "bogus", "-c", "1"],
    ["python", "--timeout", "x", "-c", "1"],
    ["doctor", "--bogus"],
    ["bogus-verb"],
    [],
])
def test_argparse_usage_errors_exit_64(argv: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == _common.EXIT_USAGE == 64
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["run", "--env", "NOEQUALS", "--", "/bin/true"],
    ["run", "--copy", "/nonexistent/file", "--", "/bin/true"],
    ["python", "--level", "context-isolated", "nosuch.py"],
])
def test_config_invalid_exits_64(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 64
    assert "config-invalid" in capsys.readouterr().err


def test_unavailable_exits_69(monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    from corral.cli import run as verb

    def unavailable(args: object) -> list[object]:
        raise LevelNotSupportedError("strict", (), "not here", missing="a primitive")

    assert LevelNotSupportedError.exit_status == _common.EXIT_UNAVAILABLE == 69
    monkeypatch.setattr(verb, "_binds", unavailable)
    assert main(["run", "--level", "strict", "--bind", "/usr", "--", "/bin/true"]) == 69
    assert "level-not-supported" in capsys.readouterr().err


def test_internal_error_exits_70(monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from corral.cli import run as verb
    from corral.core.errors import ProviderError

    def broken(*a: object, **k: object) -> None:
        raise ProviderError("the provider broke")

    monkeypatch.setattr(verb, "run_bounded", broken)
    assert main(["run", "--level", "context-isolated", "--", "/bin/true"]
                ) == _common.EXIT_INTERNAL == 70
    assert "provider-error" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "status"), [
    (["run", "--timeout", "300ms", "--grace-ms", "100", "--", PY, "-c",
      "import time; time.sleep(30)"], _common.EXIT_TIMEOUT),
    (["run", "--", "/etc/passwd"], _common.EXIT_CANNOT_EXECUTE),
    (["run", "--", "/"], _common.EXIT_CANNOT_EXECUTE),
    (["run", "--", "no-such-command-xyz"], _common.EXIT_NOT_FOUND),
    (["run", "--", "/nonexistent/cmd"], _common.EXIT_NOT_FOUND),
    (["run", "--max-stdout", "10", "--", PY, "-c", "print('x'*100)"], _common.EXIT_LIMIT),
    (["run", "--", PY, "-c", "raise SystemExit(3)"], 3),
    (["run", "--", PY, "-c", "import os; os.kill(os.getpid(), 15)"], 128 + 15),
])
def test_run_rows(argv: list[str], status: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == status
    capsys.readouterr()
    assert main([argv[0], "--json", *argv[1:]]) == status
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_status"] == status


def test_python_rows(capsys: pytest.CaptureFixture[str]) -> None:
    lv = ["--level", "context-isolated"]
    assert main(["python", *lv, "-c", "1 + 1"]) == 0
    assert main(["python", *lv, "-c", "raise ValueError('x')"]) == 1
    assert main(["python", *lv, "--timeout", "200ms", "-c", "while True: pass"]) == 124


def test_cancelled_exits_130(capsys: pytest.CaptureFixture[str]) -> None:
    def interrupt() -> None:
        deadline = time.monotonic() + 20
        while signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt)
    t.start()
    try:
        status = main(["run", "--", PY, "-c", "import time; time.sleep(30)"])
    finally:
        t.join()
    assert status == _common.EXIT_CANCELLED == 130


def test_help_and_version_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    from corral import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"corral {__version__}\n"
    assert main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    for n in (64, 69, 70, 124, 126, 127, 130, 137):
        assert str(n) in text


def test_the_table_is_documented_in_one_place() -> None:
    text = DOC.read_text()
    rows = dict(re.findall(r"^\| (\d+) \| `(EXIT_\w+)`", text, re.M))
    constants = {str(v): k for k, v in vars(_common).items() if k.startswith("EXIT_")}
    assert rows == constants
