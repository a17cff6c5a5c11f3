"""A run's process must not hand a snippet a way to start a process that the run-time guard
cannot see: ``_posixsubprocess.fork_exec`` (what ``subprocess.Popen`` calls after its
audit event) raises no audit event of its own. A strict run is forked from the sandbox's
agent, which has ``subprocess``, ``asyncio`` and corral's own modules loaded; before the
snippet's first line the worker drops them from ``sys.modules``, replaces every module
attribute that held ``fork_exec``, and sets ``RLIMIT_NPROC`` to 0 (``worker._shed_runtime``).

The probe tries every path found from what a snippet holds to that function, and calls
it to start ``python -c pass``: ``sys.modules`` through an allowed module's ``sys``, the
worker's ``importlib`` through the guarded ``__import__``'s globals, the subclass walk
from ``object`` to ``subprocess.Popen`` and asyncio's transports, a function's
``__globals__`` from ``sys.stdout``'s class, a traceback's frame and ``gc``. It runs
without the validator (which refuses every one of these paths, checked here too: dunders,
``sys``, ``modules``), with every run-time layer of the worker on. The control runs the same
probe in plain Python with ``subprocess`` and ``asyncio`` imported (as the agent has
them): there each path hands out ``fork_exec`` and starts the process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from snippet_levels import LEVELS, STRICT_SKIP

from corral.core.spec import Level
from corral.snippets.host.runner import _DEFAULT, _run_in, shutdown_snippet_pool
from corral.snippets.host.transcript import Transcript
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS, validate_source
from env_toy import TOY, publish_toy, toy_pool
from strict_tier import needs_strict


@pytest.fixture(scope="module", autouse=True)
def _pool() -> Iterator[None]:
    yield
    shutdown_snippet_pool()


#: the paths, by label; each line of output is ``<label> PRIMITIVE`` (a getter handed out
#: the C fork_exec), ``<label> SPAWNED`` (a process started) or ``<label> REFUSED <why>``
PATHS = ("sys_modules_posixsubprocess", "sys_modules_subprocess", "importlib_via_import",
         "subclass_popen", "subclass_asyncio", "stdout_globals", "traceback_frame",
         "gc_objects")

PROBE = """\
import logging


def sys_modules_posixsubprocess():
    return logging.sys.modules["_posixsubprocess"].fork_exec


def sys_modules_subprocess():
    return logging.sys.modules["subprocess"]._fork_exec


def importlib_via_import():
    importlib = __builtins__["__import__"].__globals__["importlib"]
    return importlib.import_module("subprocess")._fork_exec


def subclasses(root):
    seen, todo = [], [root]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            todo.extend(type.__subclasses__(cls))
    return seen


def subclass_popen():
    for cls in subclasses(object):
        if cls.__name__ == "Popen" and cls.__module__ == "subprocess":
            return cls._execute_child.__globals__["_fork_exec"]
    raise LookupError("no subprocess.Popen")


def subclass_asyncio():
    for cls in subclasses(object):
        if cls.__name__ == "BaseSubprocessTransport":
            return cls.__init__.__globals__["subprocess"]._fork_exec
    raise LookupError("no asyncio transport")


def stdout_globals():
    g = type(logging.sys.stdout).write.__globals__
    return g["sys"].modules["subprocess"]._fork_exec


def traceback_frame():
    try:
        1 / 0
    except ZeroDivisionError as exc:
        g = exc.__traceback__.tb_frame.f_globals
    return g["logging"].sys.modules["subprocess"]._fork_exec


def gc_objects():
    gc = logging.sys.modules["gc"]
    for obj in gc.get_objects():
        if type(obj).__name__ == "builtin_function_or_method" and obj.__name__ == "fork_exec":
            return obj
    raise LookupError("no fork_exec")


def spawn(fork_exec):
    os = logging.os
    exe = os.fsencode(logging.sys.executable)
    r, w = os.pipe()
    try:
        pid = fork_exec([exe, b"-c", b"pass"], (exe,), True, (w,), None, None,
                        -1, -1, -1, -1, -1, -1, r, w, False, False, -1, None, None, None,
                        -1, None, True)
    finally:
        os.close(r)
        os.close(w)
    os.waitpid(pid, 0)
    return pid


for get in (PATHS_HERE):
    label = get.__name__
    try:
        fork_exec = get()
        if type(fork_exec).__name__ == "builtin_function_or_method":
            print(label, "PRIMITIVE")
        if spawn(fork_exec) > 0:
            print(label, "SPAWNED")
    except BaseException as exc:
        print(label, "REFUSED", type(exc).__name__, exc)
""".replace("PATHS_HERE", ", ".join(PATHS))


def _unvalidated(level: str) -> Transcript:
    return _DEFAULT.submit(lambda pool: _run_in(
        pool, [("main.py", PROBE)], tenant_id="spawn-reach", level=Level(level),
        timeout_ms=10_000, allowed=DEFAULT_ALLOWED_IMPORTS, guard=True)).result()


def _outcomes(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        label, _, rest = line.partition(" ")
        if label in PATHS:
            out.setdefault(label, []).append(rest.partition(" ")[0])
    return out


def test_control_every_path_reaches_fork_exec_in_plain_python() -> None:
    """The control: the agent's modules loaded, no worker: each path hands out the C
    ``fork_exec`` and starts a process with it."""
    done = subprocess.run([sys.executable, "-I", "-c", "import asyncio, subprocess, gc\n"
                           + PROBE], capture_output=True, text=True, timeout=60, check=False)
    outcomes = _outcomes(done.stdout)
    assert done.returncode == 0, done.stderr
    # two paths start from the worker's own objects (its __import__, its stdout class):
    # plain Python has C ones there (no __globals__)
    reached = {label for label, got in outcomes.items() if got == ["PRIMITIVE", "SPAWNED"]}
    assert reached == set(PATHS) - {"importlib_via_import", "stdout_globals"}, done.stdout


def test_the_validator_refuses_every_path() -> None:
    codes = {v.code.value for v in validate_source(PROBE)}
    assert "dunder-attribute" in codes or "forbidden-name" in codes, codes
    assert "forbidden-attribute" in codes, codes


@pytest.mark.parametrize("level", LEVELS)
def test_a_run_reaches_no_process_primitive(level: str) -> None:
    t = _unvalidated(level)
    text = "\n".join(line.text for line in t.logs)
    outcomes = _outcomes(text)
    assert set(outcomes) == set(PATHS), (text, t.errors)
    for label, got in outcomes.items():
        assert got[0] == "REFUSED", (label, text)
        assert "PRIMITIVE" not in got and "SPAWNED" not in got, (label, text)


@needs_strict(STRICT_SKIP)
def test_a_strict_run_sheds_the_agents_modules() -> None:
    """What the worker and the agent loaded for themselves is gone from ``sys.modules``
    (the allowlist's modules and what they use stay), and ``fork_exec``'s holders hold
    the refusing stand-in (``subprocess`` itself is only reachable through an object)."""
    source = """\
import logging
mods = logging.sys.modules
print(" ".join(sorted(mods)))
for cls in type.__subclasses__(object):
    if cls.__name__ == "Popen" and cls.__module__ == "subprocess":
        print("STANDIN", cls._execute_child.__globals__["_fork_exec"].__name__)
"""
    t = _DEFAULT.submit(lambda pool: _run_in(
        pool, [("main.py", source)], tenant_id="spawn-reach", level=Level.STRICT,
        timeout_ms=10_000, allowed=DEFAULT_ALLOWED_IMPORTS, guard=True)).result()
    lines = [line.text for line in t.logs]
    assert lines, t.errors
    loaded = set(lines[0].split())
    for gone in ("asyncio", "subprocess", "_posixsubprocess", "_asyncio", "socket", "select",
                 "signal", "gc", "resource", "corral.snippets.sandbox.worker"):
        assert gone not in loaded, gone
    assert not {m for m in loaded if m.startswith(("corral.", "asyncio."))}, loaded
    assert {"logging", "json", "re", "dataclasses", "zoneinfo"} <= loaded
    assert lines[1:] in ([], ["STANDIN _refused_fork_exec"]), lines


@needs_strict(STRICT_SKIP)
def test_a_network_run_keeps_the_network_modules() -> None:
    """A run whose allowlist names a network client keeps socket and what socket's own
    methods import lazily (``selectors``: ``socket.sendfile``); the rest is shed."""
    source = """\
import logging
import socket
mods = logging.sys.modules
print(sorted(n for n in ("socket", "_socket", "select", "selectors", "ssl", "subprocess",
                         "asyncio") if n in mods))
"""
    t = _DEFAULT.submit(lambda pool: _run_in(
        pool, [("main.py", source)], tenant_id="spawn-reach", level=Level.STRICT,
        timeout_ms=10_000, allowed=DEFAULT_ALLOWED_IMPORTS | {"socket"}, guard=True)).result()
    assert [line.text for line in t.logs] == [
        "['_socket', 'select', 'selectors', 'socket', 'ssl']"], (t.logs, t.errors)


def test_control_an_environment_package_keeps_the_spawn_modules(tmp_path: Path) -> None:
    """The control for the environment pool: plain Python with the toy environment's
    package loaded (it imports ``subprocess`` and ``asyncio``, as a real package keeps
    what it imported) and ``gc``: each path hands out ``fork_exec`` and starts a process."""
    env = publish_toy(tmp_path / "envs")
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys\nsys.path.append({str(env.site)!r})\n"
         f"import {TOY}, gc\n" + PROBE],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    reached = {label for label, got in _outcomes(done.stdout).items()
               if got == ["PRIMITIVE", "SPAWNED"]}
    assert reached == set(PATHS) - {"importlib_via_import", "stdout_globals"}, done.stdout


@needs_strict(STRICT_SKIP)
def test_an_environment_pool_run_reaches_no_process_primitive(tmp_path: Path) -> None:
    """The same probe in a run of an environment's warm pool: its template preloaded the
    package (so ``subprocess`` and ``asyncio`` stay loaded: an environment's modules are
    not shed) and the run is its spare, forked ahead of the job and prefaulted. Every
    path is refused all the same: ``fork_exec``'s holders hold the stand-in and
    ``RLIMIT_NPROC`` is 0."""
    async def main() -> Transcript:
        async with toy_pool(tmp_path / "envs") as pool:
            await _run_in(pool, [("main.py", "1")], tenant_id="spawn-reach",
                          level=Level.STRICT, timeout_ms=10_000,
                          allowed=DEFAULT_ALLOWED_IMPORTS | {TOY}, guard=True)
            return await _run_in(  # the second run: a spare forked ahead of it
                pool, [("main.py", f"import {TOY}\nprint('loaded', {TOY}.ANSWER)\n" + PROBE)],
                tenant_id="spawn-reach", level=Level.STRICT, timeout_ms=10_000,
                allowed=DEFAULT_ALLOWED_IMPORTS | {TOY}, guard=True)

    t = asyncio.run(main())
    text = "\n".join(line.text for line in t.logs)
    assert "loaded 42" in text, (text, t.errors)
    outcomes = _outcomes(text)
    assert set(outcomes) == set(PATHS), (text, t.errors)
    for label, got in outcomes.items():
        assert got[0] == "REFUSED", (label, text)
        assert "PRIMITIVE" not in got and "SPAWNED" not in got, (label, text)
