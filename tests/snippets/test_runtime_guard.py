"""The worker's run-time guard (issue 24, item 1): an audit hook (PEP 578) in every run's
process refuses what snippets never need, whether or not the validator saw the trick.

Every attack here runs WITHOUT the validator (``_run_in``: the host's private path that
skips it; only tests call it), with the rest of the worker as a tenant's run has it, at
``strict`` and at ``context-isolated``. Each is one of the three families of validator
bypasses found so far, carried to a forbidden end: open a file, list ``/``, run ``id``,
get a frame. On the old worker (no audit hook) each printed ``GOT``: the control runs the
same source in plain Python, where it does. The run-time guard refuses each end and the
transcript says which event it refused (``GuardViolation``), also when the snippet
catches the exception and goes on.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from snippet_levels import LEVELS

from corral.core.spec import Level
from corral.snippets.host.runner import _DEFAULT, _run_in, shutdown_snippet_pool
from corral.snippets.host.transcript import Transcript
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS


@pytest.fixture(scope="module", autouse=True)
def _pool() -> Iterator[None]:
    yield
    shutdown_snippet_pool()


def unvalidated(source: str, level: str) -> Transcript:
    """The run without the validator, every run-time layer of the worker on."""
    return _DEFAULT.submit(lambda pool: _run_in(
        pool, [("main.py", source)], tenant_id="runtime-guard", level=Level(level),
        timeout_ms=5000, allowed=DEFAULT_ALLOWED_IMPORTS, guard=True)).result()


def plain_python(source: str) -> str:
    """The control: the same source in plain Python, outside corral."""
    done = subprocess.run([sys.executable, "-I", "-c", source], capture_output=True,
                          text=True, timeout=60, check=False)
    return done.stdout + done.stderr


def printed(t: Transcript) -> str:
    return "\n".join(line.text for line in t.logs)


def refused(t: Transcript) -> list[str]:
    return [e.message for e in t.errors if e.type == "GuardViolation"]


# (a) issue 10's bypass: abc.ABC's __subclasshook__ makes `logging` match a class whose
# __match_args__ names `os`; the positional sub-pattern reads logging.os
MATCH_ABC = """\
import abc
import logging


class Any(abc.ABC):
    __match_args__ = ("os",)

    @classmethod
    def __subclasshook__(cls, other):
        return True


match logging:
    case Any(found):
        pass
"""

# (b) issue 24: dataclasses.replace reads getattr(obj, field.name) for a field named in a
# class body, and a typing._GenericAlias subclass (class keyword _root=True) relays that
# read to the object it wraps: logging.os again
DATACLASS_RELAY = """\
import dataclasses
import logging
import typing

got = {}


@dataclasses.dataclass(init=False, repr=False, eq=False)
class Relay(typing._GenericAlias, _root=True):
    os: object

    def __init__(self, *args, **fields):
        if fields:
            got.update(fields)
        else:
            super().__init__(*args, name="Relay")


dataclasses.replace(Relay(logging, ()))
found = got["os"]
"""

# (b') the typing relay alone: any non-dunder read goes on to the wrapped module
GENERIC_ALIAS_RELAY = """\
import logging
import typing


class Relay(typing._GenericAlias, _root=True):
    pass


found = Relay(logging, (), name="Relay").sys
"""

# (c) issue 24: a match keyword class pattern is an attribute read that got the name
# check only: `format` of a template reads __globals__ (a string), `__globals__` itself
# hands out the module's namespace and so the real builtins
KEYWORD_PATTERN = """\
import json

match "{0.__globals__[__builtins__][open]}":
    case str(format=fmt):
        print("LEAKED", fmt(json.loads))
match json.loads:
    case object(__globals__=g):
        real = g["__builtins__"]
"""

ENDS = {
    "open": ('print("GOT", {os}.open("/etc/passwd", 0))', "open of '/etc/passwd'"),
    "listdir": ('print("GOT", {os}.listdir("/"))', "os.listdir of '/'"),
    "subprocess": ('print("GOT", {imp}("subprocess").run(["id"], capture_output=True))',
                   "import of module 'subprocess'"),
    "spawn": ('print("GOT", {os}.posix_spawn("/usr/bin/id", ["id"], {{}}))', "os.posix_spawn"),
    "frame": ('print("GOT", {sys}._getframe(0))', "sys._getframe"),
    "tb_frame": ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
                 "    print('GOT', e.__traceback__.tb_frame)", "reading 'tb_frame'"),
}
#: how each family names os, sys and the real __import__ once it has escaped
FAMILIES = {
    "match_abc": (MATCH_ABC, "found", "found.sys", "found.sys.modules['builtins'].__import__"),
    "dataclass_relay": (DATACLASS_RELAY, "found", "found.sys",
                        "found.sys.modules['builtins'].__import__"),
    "generic_alias_relay": (GENERIC_ALIAS_RELAY, "found.modules['os']", "found",
                            "found.modules['builtins'].__import__"),
    "keyword_pattern": (KEYWORD_PATTERN, "real['__import__']('os')",
                        "real['__import__']('sys')", "real['__import__']"),
}


def attack(family: str, end: str) -> tuple[str, str]:
    head, os_, sys_, imp = FAMILIES[family]
    line, event = ENDS[end]
    return head + line.format(os=os_, sys=sys_, imp=imp) + "\n", event


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("end", sorted(ENDS))
def test_the_escape_works_in_plain_python(family: str, end: str) -> None:
    """The control: each attack reaches its end outside corral."""
    source, _ = attack(family, end)
    if end == "spawn":  # a process started: it printed its pid
        source = source.replace('print("GOT", ', 'print("GOT", __import__("os").waitpid(') \
            .replace('{}))', '{}), 0))')
    out = plain_python(source)
    assert "GOT" in out, out
    assert "GuardViolation" not in out


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_run_time_guard_refuses_every_end_without_the_validator(
        level: str, family: str) -> None:
    for end in sorted(ENDS):
        source, event = attack(family, end)
        t = unvalidated(source, level)
        assert "GOT" not in printed(t), (end, t.to_dict())
        # (at strict too: the worker is the sandbox agent's own child, where `subprocess`
        # is loaded, but a run drops it from sys.modules first: importing it is an event)
        found = refused(t)
        assert found and event in found[0], (end, t.to_dict())
        assert found[0].startswith("the run-time guard refused ")


@pytest.mark.parametrize("level", LEVELS)
def test_the_keyword_pattern_still_reads_strings_but_not_files(level: str) -> None:
    """What the guard does NOT stop: reading ``__globals__`` raises no audit event, so the
    format leak still prints `<built-in function open>`; calling open is what is refused."""
    source, _ = attack("keyword_pattern", "open")
    t = unvalidated(source, level)
    assert "LEAKED <built-in function open>" in printed(t) and "GOT" not in printed(t)
    assert refused(t) == ["the run-time guard refused open of '/etc/passwd'"]


@pytest.mark.parametrize("level", LEVELS)
def test_a_caught_refusal_is_still_reported(level: str) -> None:
    source = DATACLASS_RELAY + """\
for path in ("/", "/etc"):
    try:
        found.listdir(path)
    except Exception:
        pass
print("went on")
"""
    t = unvalidated(source, level)
    assert printed(t) == "went on"
    assert [(e.type, e.message) for e in t.errors] == [
        ("GuardViolation", f"the run-time guard refused os.listdir of {p!r} (the "
         "GuardViolation was caught and the run went on)") for p in ("/", "/etc")]


@pytest.mark.parametrize("level", LEVELS)
def test_no_way_back_from_python(level: str) -> None:
    """The guard is not reachable: no new hook can be added (so none can raise first),
    a function's code cannot be swapped, code cannot be built from bytes, and the
    collector's object lists (which would hold the hook) are refused."""
    source = KEYWORD_PATTERN + """\
sys = real['__import__']('sys')
out = []
for name, step in [
    ("addaudithook", lambda: sys.addaudithook(lambda *a: None)),
    # gc and marshal: the run dropped them from sys.modules (the worker's, not granted),
    # so importing them is refused; their calls would be too
    ("get_objects", lambda: real['__import__']('gc').get_objects()),
    ("get_referrers", lambda: real['__import__']('gc').get_referrers(sys)),
    ("code", lambda: json.loads.__code__.replace(co_consts=())),
    ("marshal", lambda: real['__import__']('marshal').loads(b"N")),
    ("swap", lambda: real["setattr"](json.loads, "__code__", (lambda: 1).__code__)),
    ("settrace", lambda: sys.settrace(lambda *a: None)),
]:
    try:
        step()
        out.append(name)
    except PermissionError:
        pass
print("DONE", out)
print("GOT", real["open"]("/etc/passwd"))
"""
    t = unvalidated(source, level)
    # sys.addaudithook swallows a hook's refusal and adds nothing (CPython's design)
    assert "DONE ['addaudithook']" in printed(t) and "GOT" not in printed(t), t.to_dict()
    assert any("open of '/etc/passwd'" in m for m in refused(t)), t.to_dict()


@pytest.mark.parametrize("level", LEVELS)
def test_what_snippets_use_still_works(level: str) -> None:
    """The standard library the default allowlist offers runs as before under the guard,
    with nothing refused (lazy imports, time-zone data, generated code, logging,
    tracebacks through the standard library)."""
    source = """\
import collections, dataclasses, decimal, enum, json, logging, statistics, typing, uuid
import zoneinfo

P = collections.namedtuple("P", "a b")


@dataclasses.dataclass(frozen=True)
class D:
    a: int = 1
    b: list = dataclasses.field(default_factory=list)


E = enum.Enum("E", "x y")
T = typing.TypeVar("T")
logging.basicConfig()
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("x").exception("boom")
print(P(1, 2), D(), E.x, str(zoneinfo.ZoneInfo("Europe/Paris")), "x".encode("idna"),
      statistics.mean([1, 2]), decimal.Decimal(1) / 4, len(str(uuid.uuid4())))
json.loads("{")
"""
    t = unvalidated(source, level)
    assert "P(a=1, b=2) D(a=1, b=[]) E.x Europe/Paris b'x' 1.5 0.25 36" in printed(t)
    assert "ZeroDivisionError: division by zero" in printed(t)
    assert set(t.facts) >= {"P", "D", "E", "T"}
    (err,) = t.errors
    assert err.type == "JSONDecodeError" and err.line == 22
    assert "json/decoder.py" in err.traceback and "raw_decode" in err.traceback
