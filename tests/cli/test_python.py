"""``corral python``: text and JSON transcripts, files and modules, exit statuses 0/1/124."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest

from corral.cli import python as verb

LEVEL = ["--level", "context-isolated"]  # the strict path is covered in tests/snippets


def corral_python(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="corral")
    verb.add_parser(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["python", *argv])
    status: int = args.handler(args)
    return status


def test_text_transcript_and_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    code = "import logging\nx = [1, 2]\nprint('hi')\nlogging.warning('w')\nlen(x)"
    assert corral_python(*LEVEL, code) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == ["hi", "[log] WARNING:root:w", "=> 2", "facts:", "  x = [1, 2]"]
    assert out[-1].endswith(" ms)")


def test_error_exit_1_with_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert corral_python(*LEVEL, "def f():\n    raise ValueError('bad')\nf()") == 1
    out = capsys.readouterr().out
    assert "error: ValueError: bad (main.py, line 2)" in out
    assert 'File "main.py", line 3, in <module>' in out


def test_rejected_exit_1_names_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert corral_python(*LEVEL, "import os") == 1
    out = capsys.readouterr().out
    assert out.strip() == ("error: ValidationError [forbidden-import]: import of 'os' is not "
                           "allowed (main.py, line 1, column 0)")


def test_timeout_exit_124_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert corral_python(*LEVEL, "--json", "--timeout", "100", "print(1)\nwhile True: pass") \
        == 124
    doc = json.loads(capsys.readouterr().out)
    assert doc["timed_out"] is True and doc["logs"] == [{"stream": "stdout", "text": "1"}]
    assert doc["errors"][0]["type"] == "TimeoutError"


def test_file_and_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main = tmp_path / "main_script.py"
    main.write_text("from . import helpers\nhelpers.VALUE * 2\n")
    helpers = tmp_path / "helpers.py"
    helpers.write_text("VALUE = 21\n")
    assert corral_python(*LEVEL, "--json", str(main), "--module", str(helpers)) == 0
    assert json.loads(capsys.readouterr().out)["result"] == "42"


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("6 * 7\n"))
    assert corral_python(*LEVEL, "-") == 0
    assert "=> 42" in capsys.readouterr().out


def test_unreadable_module_is_config_invalid(tmp_path: Path) -> None:
    from corral.core.errors import ConfigInvalidError
    with pytest.raises(ConfigInvalidError, match="--module"):
        corral_python(*LEVEL, "1", "--module", str(tmp_path / "missing.py"))


def test_cli_default_timeout_is_the_runners() -> None:
    from corral.cli import python as cli_python
    from corral.snippets.host.runner import DEFAULT_TIMEOUT_MS

    assert cli_python.DEFAULT_TIMEOUT_MS == DEFAULT_TIMEOUT_MS
