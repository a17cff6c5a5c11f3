"""run_strict and ``corral run --level strict``: one bounded run in a fresh strict sandbox."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from corral import CancelToken
from corral.cli import main
from corral.core.errors import ConfigInvalidError
from corral.run.bounded import Outcome
from corral.run.strict import run_strict


@pytest.fixture(autouse=True)
def _sandbox_available(linux: object) -> None:
    """The linux fixture (tests/linux/conftest.py) skips where the host cannot sandbox."""
PY = os.path.realpath(sys.executable)


def py(code: str, **kw: object):  # type: ignore[no-untyped-def]
    kw.setdefault("timeout_ms", 10_000)
    return run_strict(PY, ["-I", "-S", "-c", code], **kw)


def test_exit_code_output_and_boundary() -> None:
    r = py("import os,socket,sys; print(socket.gethostname(), os.path.exists('/etc/shadow'));"
           " sys.stderr.write('e'); sys.exit(3)")
    assert r.outcome is Outcome.EXIT
    assert r.exit_code == 3
    assert r.stdout_text == "sandbox False\n"
    assert r.stderr_text == "e"


def test_stdin_and_env_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_SECRET", "s3cret")
    r = py("import os,sys; print(sys.stdin.read(), os.environ.get('HOST_SECRET'),"
           " os.environ['MINE'])", stdin="hello", env={"MINE": "yes"})
    assert r.stdout_text == "hello None yes\n"


def test_timeout_keeps_partial_output() -> None:
    r = py("import time; print('before', flush=True); time.sleep(30)", timeout_ms=500)
    assert r.outcome is Outcome.TIMEOUT
    assert r.stdout_text == "before\n"
    assert r.limit_value == 500


def test_stdout_cap_exact_to_the_byte() -> None:
    r = py("import sys; sys.stdout.write('x' * 100_000); sys.stdout.flush()",
           max_stdout_bytes=10_000)
    assert r.outcome is Outcome.OVERFLOW_STDOUT
    assert len(r.stdout) == 10_000
    assert r.stdout_truncated


def test_memory_limit_of_the_whole_tree() -> None:
    from corral.core.spec import SandboxLimits
    # bounded: at most 512 MiB in 4 MiB steps against a 64 MiB cap
    r = py("b=[]\nfor _ in range(128): b.append(bytearray(4 << 20))",
           limits=SandboxLimits(mem_mb=64))
    assert r.outcome is Outcome.MEMORY_LIMIT
    assert r.limit_value == 64


def test_cancel_token_from_another_thread() -> None:
    tok = CancelToken()
    t = threading.Timer(0.5, tok.cancel)
    t.start()
    try:
        r = py("import time; time.sleep(30)", cancel=tok)
    finally:
        t.cancel()
    assert r.outcome is Outcome.CANCELLED


def test_relative_command_refused() -> None:
    with pytest.raises(ConfigInvalidError):
        run_strict("python3", timeout_ms=1000)


def test_cli_strict_json(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["run", "--level", "strict", "--json", "--mem-mb", "64", "--",
                   PY, "-I", "-S", "-c", "import os; print(os.getuid(), os.getpid())"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0
    assert out["outcome"] == "exit"
    # root of its own user namespace; pid 3 of its own pid ns (1 is the agent, 2 was the
    # launcher's helper that built the file system view and exited)
    assert out["stdout"] == "0 3\n"


def test_cli_strict_exit_status_per_outcome(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--level", "strict", "--timeout", "300", "--",
                 PY, "-I", "-S", "-c", "import time; time.sleep(30)"]) == 124
    assert main(["run", "--level", "strict", "--", PY, "-I", "-S", "-c",
                 "raise SystemExit(7)"]) == 7
    capsys.readouterr()


def test_command_missing_inside_exits_127_with_the_reason() -> None:
    seen: list[bytes] = []
    r = run_strict("/opt/not/in/the/sandbox", timeout_ms=5_000, on_stderr=seen.append)
    assert r.outcome is Outcome.EXIT
    assert r.exit_code == 127
    assert b"No such file" in r.stderr
    assert b"".join(seen) == r.stderr  # streamed too, as a live run shows it


def test_cli_ro_bind_shows_a_host_dir_read_only(capsys: pytest.CaptureFixture[str]) -> None:
    import tempfile

    d = tempfile.mkdtemp(prefix="corral-robind-")
    try:
        os.chmod(d, 0o755)
        with open(os.path.join(d, "f"), "w") as f:
            f.write("hello")
        code = (f"import os; print(open({d!r} + '/f').read());"
                f" print(os.access({d!r}, os.W_OK))")
        assert main(["run", "--level", "strict", "--json", "--ro-bind", d, "--",
                     PY, "-I", "-S", "-c", code]) == 0
        assert json.loads(capsys.readouterr().out)["stdout"] == "hello\nFalse\n"
    finally:
        import shutil
        shutil.rmtree(d)


def test_output_streams_before_the_command_ends() -> None:
    """on_stdout sees the first chunk while the command still runs: it cancels the run,
    which would otherwise only end at its timeout."""
    token = CancelToken()
    chunks: list[bytes] = []

    def first(chunk: bytes) -> None:
        chunks.append(chunk)
        token.cancel("got the first chunk")

    r = py("import sys, time; print('first', flush=True); time.sleep(60)",
           timeout_ms=60_000, cancel=token, on_stdout=first)
    assert r.outcome is Outcome.CANCELLED
    assert b"".join(chunks) == b"first\n"
    assert r.stdout_text == "first\n"


def test_a_passed_provider_is_used_through_the_contract(linux: object) -> None:
    from corral.providers.linux import LinuxProvider

    async def main() -> None:
        async with LinuxProvider(spares=0) as provider:
            from corral.run.strict import run_strict_async
            r = await run_strict_async(PY, ["-I", "-S", "-c", "print(6*7)"], timeout_ms=10_000,
                                       provider=provider)
            assert r.outcome is Outcome.EXIT and r.stdout_text == "42\n"

    import asyncio
    asyncio.run(main())
