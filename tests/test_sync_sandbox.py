"""The synchronous sandbox (``corral.sandbox.Sandbox``, issue 27 item 4): made and driven
from sync code, commands as a shell string or argv, every outcome a result saying its
level, and nothing left behind by ``with``, Ctrl-C, garbage collection or exit."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.core.errors import ProviderError
from corral.sandbox import Sandbox, _shutdown
from strict_tier import host_can_sandbox, needs_strict

CI = "context-isolated"


@pytest.fixture(scope="module", autouse=True)
def _close_shared_providers() -> Iterator[None]:
    """The providers ``Sandbox.create`` shares are closed at the interpreter's exit; a
    strict one keeps a warm spare (a cgroup holding this process's pid) until then. Close
    them after this module, so tests that count this process's cgroups (tests/dispatch)
    do not see that spare whatever order the modules run in."""
    yield
    _shutdown()


def _gone(path: str, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


def _pid_gone(pid: int, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:  # a zombie of someone else's is gone too
            if f.read().split(") ")[-1].startswith("Z"):
                return True
        time.sleep(0.05)
    return False


def test_a_string_runs_through_the_shell_and_a_list_is_argv() -> None:
    with Sandbox.create(level=CI) as sb:
        sb.files.write("data.txt", "apple\nbanana\navocado\n")
        r = sb.commands.run("cat data.txt | grep -c '^a' && echo done > out.txt")
        assert (r.outcome, r.exit_code, r.stdout_text) == ("exit", 0, "2\n")
        assert sb.files.read("out.txt") == "done\n"
        assert sb.files.read("out.txt", format="bytes") == b"done\n"
        # a list is argv: the pipe is a plain argument, no shell sees it
        r = sb.commands.run(["echo", "a | b", "$HOME"])
        assert r.stdout_text == "a | b $HOME\n"
        # a name is found on PATH, as corral run does
        assert sb.commands.run(["ls"]).stdout_text.split() == ["data.txt", "out.txt"]
        with pytest.raises(FileNotFoundError):
            sb.files.read("missing.txt")


def test_every_outcome_is_a_result_with_its_level() -> None:
    """The one rule (docs/errors.md): a command that ran is its result, timeout
    included; ``check()`` raises the outcome's error."""
    with Sandbox.create(level=CI) as sb:
        r = sb.commands.run("echo partial; sleep 30", timeout_ms=300)
        assert r.outcome == "timeout" and r.limit_value == 300 and r.level == CI
        assert r.stdout_text == "partial\n"
        from corral.core.errors import SandboxTimeoutError
        with pytest.raises(SandboxTimeoutError):
            r.check()
        r = sb.commands.run("exit 3")
        assert (r.outcome, r.exit_code, r.level) == ("exit", 3, CI)
        assert r.to_dict()["level"] == CI


def test_a_background_command_streams_and_waits() -> None:
    seen: list[str] = []
    with Sandbox.create(level=CI) as sb:
        p = sb.commands.run("read line; echo got $line; echo oops >&2", background=True,
                            on_stdout=seen.append)
        p.send_stdin("hello\n")
        p.close_stdin()
        r = p.wait(timeout_s=30)
        assert (r.outcome, r.exit_code) == ("exit", 0)
        assert r.stdout_text == "got hello\n" and r.stderr_text == "oops\n"
        assert "".join(seen) == "got hello\n" and p.stdout == "got hello\n"
        assert r.level == CI


def test_leaving_with_destroys_and_the_object_says_so() -> None:
    with Sandbox.create(level=CI) as sb:
        work = sb.commands.run("pwd").stdout_text.strip()
        assert os.path.isdir(work)
    assert not sb.alive and _gone(work)
    with pytest.raises(ProviderError):
        sb.commands.run("true")
    sb.kill()  # idempotent


def test_garbage_collection_destroys_the_sandbox() -> None:
    sb = Sandbox.create(level=CI)
    work = sb.commands.run("pwd").stdout_text.strip()
    del sb
    gc.collect()
    assert _gone(work), f"{work} outlived its collected sandbox"


_INTERRUPTED = """
import sys, time
from corral.sandbox import Sandbox
sb = Sandbox.create(level="context-isolated")
work = sb.commands.run("pwd").stdout_text.strip()
print(work, flush=True)
sb.commands.run("echo $$ > {pidfile}; exec sleep 60", timeout_ms=120_000)
print("not interrupted", flush=True)
"""

_EXITS = """
from corral.sandbox import Sandbox
sb = Sandbox.create(level="context-isolated")
print(sb.commands.run("pwd").stdout_text.strip(), flush=True)
p = sb.commands.run("echo $$ > {pidfile}; exec sleep 60", background=True)
import os, time
while not os.path.exists("{pidfile}"):
    time.sleep(0.02)
"""


@pytest.mark.parametrize("how", ["ctrl-c", "exit"])
def test_ctrl_c_and_exit_leave_nothing(tmp_path: Path, how: str) -> None:
    """Ctrl-C in a call cancels the run and cleans up; the interpreter's exit destroys
    a sandbox still alive (with a background command in it)."""
    pidfile = tmp_path / "pid"
    script = (_INTERRUPTED if how == "ctrl-c" else _EXITS).format(pidfile=pidfile)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        work = proc.stdout.readline().strip()
        assert work.startswith("/"), proc.stderr.read() if proc.stderr else ""
        end = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < end and proc.poll() is None
            time.sleep(0.02)
        inner = int(pidfile.read_text())
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        if how == "ctrl-c":
            assert "KeyboardInterrupt" in err and "not interrupted" not in out
        else:
            assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):  # on a failure too: never left to the GC
            if pipe is not None:
                pipe.close()
    assert _pid_gone(inner), f"the command {inner} outlived its sandbox"
    assert _gone(work), f"{work} was left behind"


@needs_strict(host_can_sandbox())
def test_strict_is_the_default_and_holds() -> None:
    with Sandbox.create() as sb:
        assert sb.level == "strict"
        sb.files.write("in.txt", "x")
        r = sb.commands.run("cat in.txt; ls / | grep -c . >/dev/null; cat /etc/shadow")
        assert r.level == "strict" and r.stdout_text == "x"
        assert r.exit_code != 0  # the host's /etc/shadow is not there to read


@needs_strict(host_can_sandbox())
def test_the_readme_block_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """README's "A taste" shows the sync Sandbox: its block runs and prints what its
    comments say."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    block = next(b for b in blocks if "from corral.sandbox import Sandbox" in b)
    exec(compile(block, "README.md", "exec"), {})  # the README's own code
    out = capsys.readouterr().out.splitlines()
    assert out == ["exit strict apple", "", "done", ""]


@needs_strict(host_can_sandbox())
def test_a_command_on_a_paused_sandbox_honours_its_timeout() -> None:
    """Before: a command sent to a paused sandbox waited for the resume, whatever its
    timeout. Now it is a ``timeout`` result at its deadline, and never ran."""
    with Sandbox.create() as sb:
        sb.pause()
        r = sb.commands.run("echo ran > f", timeout_ms=300)
        assert (r.outcome, r.limit_value, r.level) == ("timeout", 300, "strict")
        sb.resume()
        r = sb.commands.run("ls f 2>&1; echo now")
        assert r.outcome == "exit" and "No such file" in r.stdout_text
