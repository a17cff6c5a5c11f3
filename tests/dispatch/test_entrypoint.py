"""The handler-base entrypoint as a process: frames in, one frame out, clean stdout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import corral
from corral.handler import entrypoint_script

INVOKE = ('{"v":1,"kind":"invoke","input":2,"ctx":{"runId":"r","tenantId":"t",'
          '"dryRun":false,"state":{},"nodeOutputs":{}}}\n')
SRC = '''
import os, subprocess, sys
def handler(payload, ctx):
    print("print")
    os.write(1, b"raw fd 1\\n")
    subprocess.run([sys.executable, "-c", "print('child')"], check=True)
    return payload + 1
'''


def _run(argv: list[str], stdin: str, cwd: Path, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-I", *argv], input=stdin.encode(), cwd=cwd,
                          capture_output=True, timeout=30, env=env, check=False)


def test_only_frames_reach_stdout(tmp_path: Path) -> None:
    (tmp_path / "h.py").write_text(SRC)
    r = _run(["-m", "corral.handler", "h.py:handler"], INVOKE, tmp_path)
    assert r.returncode == 0
    assert r.stdout == b'{"v":1,"kind":"output","output":3}\n'
    assert r.stderr.split() == [b"print", b"raw", b"fd", b"1", b"child"]


def test_the_handler_named_by_env_and_a_dotted_module(tmp_path: Path) -> None:
    (tmp_path / "mymod.py").write_text(SRC)
    env = {**os.environ, "CORRAL_HANDLER": "mymod:handler"}
    r = _run([entrypoint_script()], INVOKE, tmp_path, env)
    assert (r.returncode, json.loads(r.stdout)) == (0, {"v": 1, "kind": "output", "output": 3})


def test_a_copied_script_finds_corral_through_corral_pythonpath(tmp_path: Path) -> None:
    base = tmp_path / "corral" / "handler-base"
    base.mkdir(parents=True)
    shutil.copy(entrypoint_script(), base / "entrypoint.py")
    (tmp_path / "h.py").write_text(SRC)
    root = os.path.dirname(os.path.dirname(os.path.abspath(corral.__file__)))
    env = {"CORRAL_PYTHONPATH": root, "PATH": os.environ.get("PATH", "")}
    r = subprocess.run([sys.executable, "-I", "-S", str(base / "entrypoint.py"), "h.py"],
                       input=INVOKE.encode(), cwd=tmp_path, capture_output=True, timeout=30,
                       env=env, check=False)
    assert json.loads(r.stdout)["output"] == 3, r.stderr


def test_bad_stdin_is_a_config_invalid_error_frame(tmp_path: Path) -> None:
    (tmp_path / "h.py").write_text(SRC)
    for stdin, why in (("", "before an invoke frame"), ("nope\n", "not-json"),
                       ('{"v":1,"kind":"output","output":1}\n', "host-bound only")):
        r = _run(["-m", "corral.handler", "h.py"], stdin, tmp_path)
        frame = json.loads(r.stdout)
        assert r.returncode == 1 and frame["error"]["code"] == "config-invalid"
        assert why in frame["error"]["message"]


def test_suspend_exits_42(tmp_path: Path) -> None:
    (tmp_path / "h.py").write_text("def handler(p, ctx):\n    return ctx.wait_token('t')\n")
    r = _run(["-m", "corral.handler", "h.py"], INVOKE, tmp_path)
    assert (r.returncode, r.stdout) == (42, b'{"v":1,"kind":"suspend","tokenId":"t"}\n')
    resumed = '{"v":1,"kind":"resume","tokenId":"t","value":"ok"}\n' + INVOKE
    r = _run(["-m", "corral.handler", "h.py"], resumed, tmp_path)
    assert (r.returncode, json.loads(r.stdout)["output"]) == (0, "ok")
