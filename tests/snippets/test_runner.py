"""run_snippet end to end: every transcript field, payloads, validation, timeouts, cancel.

Runs go through the process-wide pool (strict on the linux provider, and
context-isolated on subproc), so after the first run of a level they are warm.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from snippet_levels import LEVELS

from corral import CancelToken
from corral.core.errors import ConfigInvalidError, SandboxCancelledError
from corral.snippets.host.runner import (
    MAX_FILES,
    _timeout,
    run_snippet,
    run_snippet_sync,
    shutdown_snippet_pool,
)
from corral.snippets.host.transcript import CAPS, TRUNCATION_MARK, Transcript
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS
from corral.wire.protocol import FrameOk, OutputFrame, parse_frame


@pytest.fixture(scope="module", autouse=True)
def _pool() -> Iterator[None]:
    yield
    shutdown_snippet_pool()


def run(source: str | None = None, **kw: Any) -> Transcript:
    kw.setdefault("timeout_ms", 5000)
    return run_snippet_sync(source, **kw)


@pytest.mark.parametrize("level", LEVELS)
def test_result_is_the_last_expression_as_a_repl_shows_it(level: str) -> None:
    assert run("1+1", level=level).result == "2"
    assert run("x = 'a'\nx", level=level).result == "'a'"
    assert run("x = 1", level=level).result is None
    assert run("None", level=level).result is None
    t = run("def f():\n    return [1, 2]\nf()", level=level)
    assert t.ok and t.result == "[1, 2]" and t.duration_ms > 0


@pytest.mark.parametrize("level", LEVELS)
def test_logs_keep_order_and_tell_streams_apart(level: str) -> None:
    src = ("import logging\nprint('a')\nlogging.warning('b')\nprint('c', end='')\nprint('d')\n"
           "h = logging.StreamHandler()\nlg = logging.getLogger('x')\nlg.addHandler(h)\n"
           "lg.propagate = False\nlg.error('e')\nprint('tail', end='')")
    t = run(src, level=level)
    assert [(x.stream, x.text) for x in t.logs] == [
        ("stdout", "a"), ("log", "WARNING:root:b"), ("stdout", "cd"), ("stderr", "e"),
        ("stdout", "tail")]
    t = run("import logging\nlogging.basicConfig(level=logging.INFO, format='%(levelname)s "
            "%(message)s')\nlogging.getLogger('d').info('hi %s', 1)", level=level)
    assert [(x.stream, x.text) for x in t.logs] == [("log", "INFO hi 1")]


@pytest.mark.parametrize("level", LEVELS)
def test_facts_are_json_safe_and_taken_even_when_the_code_raises(level: str) -> None:
    src = ("import json\nfrom dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\n"
           "a = 1\nb = [1, (2, 3), {'k': {4}}]\n_private = 5\np = P(2)\nf = 1.5\n"
           "def g():\n    pass\nn = float('nan')\nraise ValueError('midway')\nc = 3")
    t = run(src, level=level)
    assert dict(t.facts) == {"P": "<class P>", "a": 1, "b": (1, (2, 3), {"k": (4,)}),
                             "p": "P(x=2)", "f": 1.5, "g": "<function g>", "n": "nan"}
    assert "json" not in t.facts and "_private" not in t.facts and "c" not in t.facts
    (err,) = t.errors
    assert (err.type, err.message, err.line, err.path) == ("ValueError", "midway", 14, "main.py")
    assert 'File "main.py", line 14' in err.traceback and t.result is None


@pytest.mark.parametrize("level", LEVELS)
def test_errors_have_sanitized_tracebacks(level: str) -> None:
    t = run("import json\n\ndef parse():\n    return json.loads('{')\nparse()", level=level)
    (err,) = t.errors
    assert err.type == "JSONDecodeError" and err.line == 4 and err.path == "main.py"
    assert 'File "main.py", line 5' in err.traceback
    assert "json/decoder.py" in err.traceback
    for leak in ("/usr/lib", sys.prefix, "/work/", "_corral_snippet_worker"):
        assert leak not in err.traceback
    t = run("raise SystemExit(3)", level=level)
    assert t.errors[0].type == "SystemExit"


@pytest.mark.parametrize("level", LEVELS)
def test_validation_errors_are_returned_without_running(level: str) -> None:
    t = run("print('ran')\nimport os\nx = eval('1')", level=level)
    assert t.rejected and t.logs == () and t.duration_ms == 0 and not t.facts
    assert [(e.type, e.code, e.line, e.column) for e in t.errors] == [
        ("ValidationError", "forbidden-import", 2, 0), ("ValidationError", "forbidden-name", 3, 4)]
    t = run("x = (", level=level)
    assert t.errors[0].code == "syntax-error"


@pytest.mark.parametrize("level", LEVELS)
def test_timeout_stops_the_run_and_keeps_earlier_logs(level: str) -> None:
    t = run("print('start')\nwhile True:\n    pass", level=level, timeout_ms=1)  # clamped to 100
    assert t.timed_out and t.errors[0].type == "TimeoutError" and "100 ms" in t.errors[0].message
    assert [x.text for x in t.logs] == ["start"]
    # A snippet that swallows the soft timeout is SIGKILLed at timeout + grace.
    t = run("x = 1\nwhile True:\n    try:\n        pass\n    except BaseException:\n"
            "        pass", level=level, timeout_ms=100)
    assert t.timed_out and t.errors[0].type == "TimeoutError"
    assert run("2*3", level=level).result == "6"


def test_timeout_is_clamped() -> None:
    assert _timeout(1) == 100 and _timeout(10**9) == 10_000 and _timeout(5000) == 5000
    with pytest.raises(ConfigInvalidError, match="timeout_ms"):
        _timeout(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("level", LEVELS)
def test_truncation_is_marked(level: str) -> None:
    t = run("for i in range(1500):\n    print(i)", level=level)
    assert len(t.logs) == CAPS["log_lines"] and "logs" in t.truncated
    t = run("print('x' * 10000)\n'y' * 10000", level=level)
    assert t.logs[0].text.endswith(TRUNCATION_MARK) and "result" in t.truncated
    t = run("d = {i: 'x' * 1000 for i in range(200)}\nbig = 'z' * 5000", level=level)
    assert "facts" in t.truncated
    t = run("raise ValueError('m' * 10000)", level=level)
    assert t.errors[0].message.endswith(TRUNCATION_MARK) and "errors" in t.truncated


def test_source_size_caps_reject_without_running() -> None:
    t = run("x = 1\n" + "#" * (300 * 1024))
    assert t.errors[0].code == "source-too-large"
    files = [{"path": "main.py", "source": "1"}] + [
        {"path": f"m{i}.py", "source": "x = 1"} for i in range(MAX_FILES)]
    t = run(files=files)
    assert t.errors[0].code == "source-too-large" and t.rejected


@pytest.mark.parametrize("level", LEVELS)
def test_multi_file_payload_with_relative_imports(level: str) -> None:
    files = [
        {"path": "main.py", "source": "from . import helpers\nimport helpers as again\n"
                                      "from pkg.sub import f\nfrom .pkg import sub\n"
                                      "print(helpers.total is again.total, sub.f is f, "
                                      "f())\nhelpers.total"},
        {"path": "helpers.py", "source": "from .util import double\ntotal = double(21)\n"},
        {"path": "util.py", "source": "def double(x):\n    return 2 * x\n"},
        {"path": "pkg/__init__.py", "source": ""},
        {"path": "pkg/sub.py", "source": "from ..util import double\n\ndef f():\n"
                                         "    return double(1)\n"},
    ]
    t = run(files=files, level=level)
    assert t.ok, t.errors
    assert [x.text for x in t.logs] == ["True True 2"] and t.result == "42"
    t = run(files={"main.py": "import helpers\nhelpers.boom()", "helpers.py":
                   "def boom():\n    raise KeyError('k')\n"}, level=level)
    assert t.errors[0].path == "helpers.py" and t.errors[0].line == 2
    assert 'File "helpers.py", line 2' in t.errors[0].traceback
    t = run(files={"main.py": "import nothere"}, level=level)
    assert t.errors[0].code == "forbidden-import"


@pytest.mark.parametrize("level", LEVELS)
def test_a_payload_module_runs_once_under_both_its_names(level: str) -> None:
    """``import helpers`` after ``from . import helpers`` is the same module, run once (it
    ran twice, the second time with the alias's spec: 3.12 warned ``__package__ !=
    __spec__.parent`` from its relative imports)."""
    files = {"main.py": "import helpers\nfrom . import helpers as again\nhelpers.one is again.one",
             "helpers.py": "from .util import one\nprint('ran', one)\n",
             "util.py": "one = 1\n"}
    t = run(files=files, level=level)
    assert t.ok, t.errors
    assert [(x.stream, x.text) for x in t.logs] == [("stdout", "ran 1")]
    assert t.result == "True"


@pytest.mark.parametrize("level", LEVELS)
def test_memory_is_capped_per_run(level: str) -> None:
    t = run("x = bytearray(2048 * 1024 * 1024)", level=level)
    assert t.errors[0].type == "MemoryError"


@pytest.mark.parametrize("level", LEVELS)
def test_random_state_is_fresh_per_run(level: str) -> None:
    src = "import random\nrandom.random()"
    assert len({run(src, level=level).result for _ in range(3)}) == 3


def test_bad_arguments() -> None:
    with pytest.raises(ConfigInvalidError, match="level"):
        run("1", level="none")
    with pytest.raises(ConfigInvalidError, match="source"):
        run("1", files={"main.py": "1"})
    with pytest.raises(ConfigInvalidError, match=r"main\.py"):
        run(files={"a.py": "1"})
    with pytest.raises(ConfigInvalidError, match="tenant_id"):
        run("1", tenant_id="")
    with pytest.raises(ConfigInvalidError, match=r"files\[0\]"):
        run(files=[{"path": "main.py", "source": 1}])  # type: ignore[dict-item]


def test_cancel_token_stops_a_sync_run() -> None:
    token = CancelToken()
    timer = threading.Timer(0.3, token.cancel)
    timer.start()
    try:
        with pytest.raises(SandboxCancelledError):
            run("while True:\n    pass", level="context-isolated", cancel=token, timeout_ms=10000)
    finally:
        timer.cancel()
    with pytest.raises(SandboxCancelledError):
        run("1", cancel=token)  # already cancelled: does not start


def test_asyncio_cancel_of_run_snippet() -> None:
    async def main() -> None:
        task = asyncio.ensure_future(run_snippet("while True:\n    pass",
                                                 level="context-isolated", timeout_ms=10000))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        t = await run_snippet("3", level="context-isolated")
        assert t.result == "3"

    asyncio.run(main())


# -- the worker on its own: the wire protocol and the run-time import guard ---------------

WORKER = Path(__file__).parents[2] / "src" / "corral" / "snippets" / "sandbox" / "worker.py"


def _talk(frames: list[dict[str, Any]]) -> list[Any]:
    lines = b"".join(json.dumps(f).encode() + b"\n" for f in frames)
    out = subprocess.run([sys.executable, "-I", "-S", str(WORKER)], input=lines,
                         capture_output=True, timeout=60, check=True)
    return [parse_frame(line) for line in out.stdout.splitlines()]


def _invoke(job: dict[str, Any]) -> dict[str, Any]:
    return {"v": 1, "kind": "invoke", "input": job, "ctx": {
        "runId": "r", "tenantId": "t", "dryRun": False, "state": {}, "nodeOutputs": {}}}


def test_worker_speaks_protocol_frames_and_guards_imports() -> None:
    opts = {"timeout_ms": 2000, "grace_ms": 200, "allowed": sorted(DEFAULT_ALLOWED_IMPORTS),
            "forbidden": ["open", "eval"], "mem_mb": 128}
    results = _talk([
        _invoke({"op": "ping"}),
        _invoke({"op": "run", "files": [["main.py", "import os"]], "options": opts}),
        _invoke({"op": "run", "files": [["main.py", "from json import decoder\n"
                                                     "from logging import handlers"]],
                 "options": opts}),
        _invoke({"op": "run", "files": [["main.py", "open"]], "options": opts}),
        _invoke({"op": "nope"}),
        {"v": 1, "kind": "invoke"},
    ])
    assert all(isinstance(r, FrameOk) for r in results)
    frames = [r.frame for r in results if isinstance(r, FrameOk)]
    assert isinstance(frames[0], OutputFrame) and frames[0].output["pong"] is True
    assert isinstance(frames[1], OutputFrame)
    assert frames[1].output["errors"][0]["type"] == "ImportError"  # the run-time guard
    assert "json.decoder" in frames[2].output["errors"][0]["message"]
    assert frames[3].output["errors"][0]["type"] == "NameError"  # builtins without open
    assert [f.kind for f in frames[4:]] == ["error", "error"]


def test_worker_crash_is_reported_in_the_transcript() -> None:
    opts = {"timeout_ms": 2000, "grace_ms": 200, "allowed": None, "forbidden": []}
    results = _talk([_invoke({"op": "run", "files": [["main.py", "import os\nprint('x')\n"
                                                                 "os._exit(9)"]],
                              "options": opts})])
    assert isinstance(results[0], FrameOk) and isinstance(results[0].frame, OutputFrame)
    out = results[0].frame.output
    assert out["errors"][0]["type"] == "WorkerCrashed" and out["errors"][0]["exit_code"] == 9
    assert out["logs"] == [{"stream": "stdout", "text": "x"}]
    assert os.path.exists(WORKER)
