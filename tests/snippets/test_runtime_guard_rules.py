"""The run-time guard's rules, one by one (the hook called as CPython calls it, never
added to this process), and the whole worker under every CPython this machine has
(Debian's 3.11 and the pyenv builds of 3.11, 3.12 and 3.13, where present): the guard
and the dataclasses guard hold on each, and fail closed where they cannot wrap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from corral.snippets.sandbox import worker
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS
from corral.snippets.validator.policy import FORBIDDEN_NAMES

STDLIB = os.path.dirname(os.__file__)


def hook(allowed: frozenset[str] = frozenset({"json", "zoneinfo"}),
         tops: frozenset[str] = frozenset({"helpers"})) -> tuple[Any, list[str]]:
    refusals: list[str] = []
    return worker._audit_hook(allowed, tops, refusals), refusals


def refuses(h: Any, event: str, *args: Any) -> str:
    with pytest.raises(worker.GuardViolation) as info:
        h(event, args)
    assert isinstance(info.value, PermissionError)
    return str(info.value)


def test_quiet_events_pass_and_unknown_ones_are_refused() -> None:
    h, refusals = hook()
    for event in ("exec", "compile", "time.sleep", "builtins.id", "os.urandom"):
        assert h(event, ()) is None
    for event in ("os.system", "os.exec", "os.posix_spawn", "os.fork", "os.chdir",
                  "os.remove", "os.kill", "subprocess.Popen", "socket.__new__",
                  "socket.connect", "ctypes.dlopen", "code.__new__", "function.__new__",
                  "marshal.loads", "pickle.find_class", "gc.get_objects", "gc.get_referrers",
                  "sys.settrace", "sys.setprofile", "sys._current_frames", "builtins.input",
                  "cpython.run_command", "sys.addaudithook", "_thread.start_new_thread",
                  "cpython.PyInterpreterState_New", "an.event.of.a.future.python"):
        assert refuses(h, event) == f"the run-time guard refused {event}"
    assert len(refusals) == worker._MAX_REFUSALS  # reported: the first ones


@pytest.mark.parametrize(("path", "mode", "flags", "ok"), [
    (f"{STDLIB}/json/__init__.py", "r", 0, True),
    (f"{STDLIB}/json/__init__.py", None, os.O_RDONLY | os.O_CLOEXEC, True),
    ("/usr/share/zoneinfo/Europe/Paris", "rb", 0, True),
    (f"{STDLIB}/json/__init__.py", "w", 0, False),
    (f"{STDLIB}/json/__init__.py", "r+", 0, False),
    (f"{STDLIB}/json/__init__.py", "ab", 0, False),
    (f"{STDLIB}/x", None, os.O_RDONLY | os.O_CREAT, False),
    (f"{STDLIB}/x", None, os.O_WRONLY, False),
    (f"{STDLIB}/../../../etc/passwd", "r", 0, False),
    (f"{STDLIB}/./../x", "r", 0, False),
    (f"{STDLIB}//etc/passwd", "r", 0, False),
    (f"{STDLIB}-evil/x", "r", 0, False),
    ("/etc/passwd", "r", 0, False),
    ("main.py", "r", 0, False),
    (3, "r", 0, False),
    (b"/etc/passwd", "r", 0, False),
])
def test_open_reads_only_in_the_standard_library_and_tz_data(
        path: Any, mode: Any, flags: int, ok: bool) -> None:
    h, _ = hook()
    if ok:
        assert h("open", (path, mode, flags)) is None
    else:
        assert refuses(h, "open", path, mode, flags).startswith("the run-time guard refused open")


def test_pyc_files_and_pseudo_files_are_refused_unreported() -> None:
    """The import system reads (and would write) .pyc files: unmarshalling them is code
    from bytes, so they are refused and the module is compiled from its source; the parser
    looks for a SyntaxError's line in "<string>". Neither is worth a report."""
    h, refusals = hook()
    for path, mode, flags in ((f"{STDLIB}/json/__pycache__/x.cpython-311.pyc", "rb", 0),
                              (f"{STDLIB}/json/__pycache__/x.pyc.1234", None,
                               os.O_WRONLY | os.O_CREAT | os.O_EXCL),
                              ("<string>", "r", 0), ("<unknown>", "r", 0)):
        refuses(h, "open", path, mode, flags)
    refuses(h, "os.mkdir", f"{STDLIB}/json/__pycache__", 0o777, -1)
    assert refusals == []
    refuses(h, "os.mkdir", "/tmp/x", 0o777, -1)
    assert refusals == ["the run-time guard refused os.mkdir"]


def test_listing_directories() -> None:
    h, _ = hook()
    assert h("os.listdir", (STDLIB,)) is None and h("os.scandir", (f"{STDLIB}/json",)) is None
    for path in ("/", ".", f"{STDLIB}/..", f"{STDLIB}/../..", "/etc", None, 3):
        refuses(h, "os.listdir", path)


def test_imports_follow_the_allowlist() -> None:
    h, _ = hook(frozenset({"json", "xml.*", "urllib.parse"}))
    for name in ("json", "json.decoder", "xml.dom.minidom", "urllib.parse", "helpers",
                 "helpers.sub", "__payload__", "__payload__.helpers", "_strptime",
                 "encodings.idna"):
        assert h("import", (name, None, [], [], [])) is None, name
    for name in ("subprocess", "socket", "ctypes", "_posixsubprocess", "urllib.request",
                 "urllib", "jsonx", "os", "multiprocessing", "_xxsubinterpreters"):
        assert refuses(h, "import", name, None, [], [], []) == \
            f"the run-time guard refused import of module {name!r}"


def test_network_events_only_for_a_run_allowed_a_network_client() -> None:
    plain, _ = hook()
    net, _ = hook(DEFAULT_ALLOWED_IMPORTS | {"urllib.request"})
    for event in ("socket.__new__", "socket.connect", "socket.getaddrinfo",
                  "http.client.connect", "urllib.Request"):
        refuses(plain, event)
        assert net(event, ()) is None


def test_frames_are_refused_code_is_not_and_function_code_cannot_be_swapped() -> None:
    h, refusals = hook()
    tb = sys.exc_info()[2]
    try:
        raise ValueError
    except ValueError as exc:
        tb = exc.__traceback__
    for name in ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_unknown"):
        assert name in refuses(h, "object.__getattr__", tb, name)
    for name in ("__code__", "__defaults__", "__kwdefaults__", "f_code", "gi_code"):
        assert h("object.__getattr__", (hook, name)) is None
    for name in ("__code__", "__defaults__", "__kwdefaults__"):
        refuses(h, "object.__setattr__", hook, name, None)
        refuses(h, "object.__delattr__", hook, name)
    assert h("object.__setattr__", (hook, "__doc__", "x")) is None
    # sys._getframe: refused as a ValueError too (the standard library's callers catch
    # it and go on without a frame), and not reported (they call it on their own)
    before = list(refusals)
    with pytest.raises(ValueError, match=r"refused sys\._getframe"):
        h("sys._getframe", (sys._getframe(0),))
    assert refusals == before


def test_the_worker_walks_tracebacks_through_the_guard() -> None:
    """``corral.tb_entries``: the hook reads the frames of a traceback for the worker and
    hands back names and lines only; the frames are readable during that walk only."""
    h, _ = hook()
    try:
        int("x")
    except ValueError as exc:
        tb = exc.__traceback__
    out: list[tuple[str, int, str]] = []
    assert h("corral.tb_entries", (tb, out)) is None
    assert [name for _, _, name in out] == [
        "test_the_worker_walks_tracebacks_through_the_guard"]
    assert out[0][0] == __file__
    refuses(h, "object.__getattr__", tb, "tb_frame")  # the walk is over
    refuses(h, "corral.tb_entries", "not a traceback", out)
    refuses(h, "corral.tb_entries", tb, ())  # a tuple cannot take the entries


def test_the_memory_reserve_is_the_one_rlimit_a_run_may_set() -> None:
    import resource
    h, _ = hook()
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    assert h("resource.setrlimit", (resource.RLIMIT_AS, (hard, hard))) is None
    refuses(h, "resource.setrlimit", resource.RLIMIT_NPROC, (1, 1))
    refuses(h, "resource.setrlimit", resource.RLIMIT_AS, (hard - 1, hard))
    refuses(h, "resource.prlimit", 1, resource.RLIMIT_AS, (hard, hard))


def test_a_dataclasses_that_cannot_be_guarded_is_refused() -> None:
    """Fail closed: neither 3.11/3.12's ``_create_fn`` nor 3.13's ``_FuncBuilder``."""
    fake = types.ModuleType("dataclasses")
    fake._process_class = fake.dataclass = fake.make_dataclass = print  # type: ignore[attr-defined]
    worker._guard_dataclasses(fake)
    for name in ("_process_class", "dataclass", "make_dataclass"):
        with pytest.raises(TypeError, match="could not be guarded"):
            getattr(fake, name)(object)


# -- the whole worker under each CPython of this machine ------------------------------------

def _interpreters() -> list[Any]:
    found = []
    home = Path.home() / ".pyenv" / "versions"
    for label, pattern in (("debian-3.11", "/usr/bin/python3.11"), ("pyenv-3.11", "3.11.*"),
                           ("pyenv-3.12", "3.12.*"), ("pyenv-3.13", "3.13.*")):
        paths = [Path(pattern)] if pattern.startswith("/") else sorted(home.glob(pattern))
        path = next((p if p.is_file() else p / "bin" / "python3" for p in paths
                     if (p if p.is_file() else p / "bin" / "python3").exists()), None)
        found.append(pytest.param(str(path), id=label) if path else pytest.param(
            "", id=label, marks=pytest.mark.skip(reason=f"no {pattern} on this machine")))
    return found


WORKER = Path(worker.__file__)
INJECTION = """\
import dataclasses

Bad = type("Bad", (), {"__annotations__": {"a=print('INJECTED') or 1": int}})
try:
    dataclasses.dataclass(Bad)
except TypeError as e:
    print("refused:", "field names must be identifiers" in str(e))
"""
ATTACK = """\
import json
real = json.loads.__globals__["__builtins__"]
os = real["__import__"]("os")
for step in (lambda: real["open"]("/etc/passwd"), lambda: os.listdir("/"),
             lambda: real["__import__"]("subprocess")):
    try:
        print("GOT", step())
    except PermissionError as e:
        print(type(e).__name__)
"""
COMMON = """\
import collections, dataclasses, enum, logging, zoneinfo
P = collections.namedtuple("P", "a")
@dataclasses.dataclass(frozen=True, order=True)
class D:
    a: int = 1
E = enum.Enum("E", "x")
print(P(1), D() < D(2), E.x, zoneinfo.ZoneInfo("UTC"))
"""


def run_in_template(python: str, source: str) -> dict[str, Any]:
    """One run through the worker as a template of that interpreter (``-I -S``)."""
    job = {"op": "run", "files": [["main.py", source]], "options": {
        "timeout_ms": 5000, "grace_ms": 500, "mem_mb": 256,
        "allowed": sorted(DEFAULT_ALLOWED_IMPORTS),
        "forbidden": sorted(FORBIDDEN_NAMES - {"__build_class__"})}}
    frame = json.dumps({"v": 1, "kind": "invoke", "input": job}) + "\n"
    done = subprocess.run([python, "-I", "-S", str(WORKER), "--preload",
                           ",".join(sorted(DEFAULT_ALLOWED_IMPORTS))],
                          input=frame, capture_output=True, text=True, timeout=60, check=True)
    output: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])["output"]
    return output


@pytest.mark.parametrize("python", _interpreters())
def test_the_guards_hold_on_every_python_here(python: str) -> None:
    out = run_in_template(python, INJECTION)
    texts = [line["text"] for line in out["logs"]]
    assert texts == ["refused: True"], out
    out = run_in_template(python, ATTACK)
    assert [line["text"] for line in out["logs"]] == ["GuardViolation"] * 3, out
    assert [e["message"].split(" (")[0] for e in out["errors"]] == [
        "the run-time guard refused open of '/etc/passwd'",
        "the run-time guard refused os.listdir of '/'",
        "the run-time guard refused import of module 'subprocess'"]
    out = run_in_template(python, COMMON)
    assert [line["text"] for line in out["logs"]] == ["P(a=1) True E.x UTC"], out
    assert out["errors"] == [] and set(out["facts"]) == {"P", "D", "E"}
