"""A property-based search for validator bypasses (issue 24, item 1).

Hypothesis writes snippets from the constructs that turn a name or a string into an attribute
read or a call: attribute syntax, literal and run-time format templates, ``match`` keyword and
positional patterns, class bodies and dataclass fields (over plain classes and the alias
types that relay reads), dataclass helpers, ``operator`` and ``string.Formatter`` lookups,
``functools.wraps``, namedtuple fields, log records, keyword arguments, copies, with
forbidden attribute names mixed in, spelled in the source or built at run time. Every
snippet the validator ACCEPTS is run the way the worker runs it (tests/snippets/
validator_probe.py: restricted builtins, import guard, run-time guards, in a fork) and
fails the test if it obtained a forbidden object: a frame, code object or traceback, a
module outside the allowlist, the real ``open``/``eval``/``exec``/``getattr``/
``__import__``, or a module's namespace (a function's ``__globals__``).

A fixed seed (``derandomize``) and a bounded number of examples keep it reproducible and
short; the control test shows the probe does see each kind of escape.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from corral.snippets.validator import validate_source

PROBE = Path(__file__).with_name("validator_probe.py")
HERE = Path(__file__).parent


class Probe:
    """The probe process: one snippet in, one verdict out."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(PROBE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=HERE)

    def run(self, source: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(source) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the probe process died"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def probe() -> Iterator[Probe]:
    p = Probe()
    try:
        yield p
    finally:
        p.close()


PRELUDE = """\
import collections
import copy
import dataclasses
import difflib
import enum
import functools
import json
import logging
import operator
import pprint
import random
import string
import typing

out = []
u = "_" * 2
Alias = type(typing.List[int])
try:
    1 / 0
except ZeroDivisionError as caught:
    err = caught


class Catch:
    def __getattr__(self, name):
        return self

    def __eq__(self, other):
        out.append(other)
        return True

    __hash__ = None
"""

#: attribute names: forbidden ones (frames, code, globals, modules) and a few plain ones, so
#: that accepted snippets are generated too
NAMES = [
    "gi_frame", "f_back", "f_globals", "f_builtins", "f_locals", "tb_frame", "gi_code",
    "co_consts", "cr_frame", "f_trace", "mro", "os", "sys", "builtins", "modules", "_os",
    "_sys", "__globals__", "__builtins__", "__class__", "__subclasses__", "__init__",
    "__dict__", "__code__", "__closure__", "__self__", "__func__", "__module__", "__mro__",
    "__base__", "__reduce_ex__", "__getattribute__", "format", "format_map", "stdlib_re",
    "copy", "_root", "name", "level", "args", "real", "a", "f_lineno", "func", "keywords",
    "manager", "root", "parent", "value", "fget", "start",
]
#: objects whose attributes lead somewhere: stdlib generators (frames), stdlib functions
#: and instances (__globals__ of a stdlib module), aliases that relay, exceptions
TARGETS = [
    'difflib.ndiff(["a"], ["b"])', "logging.Handler()", "logging.getLogger", "json.dumps",
    "(lambda: 0)", "typing.List[int]", "list[int]", "Catch()", "err", 'string.Template("$a")',
    "functools.partial(print)", "random.Random()", "(x for x in [1])",
]
#: target and name pairs that reach a forbidden object when the read happens
PAIRS = [
    ('difflib.ndiff(["a"], ["b"])', "gi_frame"), ("(x for x in [1])", "gi_frame"),
    ('difflib.ndiff(["a"], ["b"])', "gi_code"), ("logging.getLogger", "__globals__"),
    ("json.dumps", "__globals__"), ("logging.getLogger", "__code__"),
]
BASES = ["", "Alias, ", "type(list[int]), "]
CLASS_KWS = ["", ", _root=True"]


def _name_expr(draw: st.DrawFn, name: str) -> str:
    """The name as a string expression: a literal, or built at run time."""
    if len(name) < 2 or not draw(st.booleans()):
        return repr(name)
    cut = draw(st.integers(1, len(name) - 1))
    return f"{name[:cut]!r} + {name[cut:]!r}"


def _attr(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    return f"out.append({t}.{n})\n"


def _format_literal(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    path = draw(st.sampled_from([n, f"__init__.{n}", f"{n}[os]", f"{n}.{n}"]))
    return f'out.append("{{0.{path}}}".format({t}))\n'


def _format_runtime(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    ne = _name_expr(draw, n)
    how = draw(st.sampled_from(["method", "pattern", "str", "map"]))
    tmpl = f'("{{0." + {ne} + "}}")'
    if how == "method":
        return f"out.append({tmpl}.format({t}))\n"
    if how == "str":
        return f"out.append(str.format({tmpl}, {t}))\n"
    if how == "map":
        return f'out.append(("{{a." + {ne} + "}}").format_map({{"a": {t}}}))\n'
    attr = draw(st.sampled_from(["format", "format_map"]))
    arg = t if attr == "format" else f'{{"0": {t}}}'
    return (f"match {tmpl}:\n    case str({attr}=fmt{i}):\n"
            f"        out.append(fmt{i}({arg}))\n")


def _pattern_keyword(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    cls = draw(st.sampled_from(["object", "Catch", "Alias", "type(list[int])"]))
    if cls.startswith("type("):
        cls = "object"
    return f"match {t}:\n    case {cls}({n}=found{i}):\n        out.append(found{i})\n"


def _match_args(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    ne = _name_expr(draw, n)
    return (f"class M{i}:\n    __match_args__ = ({ne},)\n\n\n"
            f"match {t}:\n    case M{i}(found{i}):\n        out.append(found{i})\n")


def _dataclass_field(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    base = draw(st.sampled_from(BASES))
    kw = draw(st.sampled_from(CLASS_KWS)) if base else ""
    bases = f"({base.rstrip(', ')}{kw})" if base else ""
    consumer = draw(st.sampled_from([
        f"dataclasses.replace(r{i})", f"out.append(dataclasses.asdict(r{i}))",
        f"out.append(r{i} == R{i}(Catch(), ()))", f"out.append(pprint.pformat(r{i}))",
    ]))
    eq = "eq=True" if "==" in consumer else "eq=False"
    how = draw(st.sampled_from(["body", "field", "namespace"]))
    init = ("    def __init__(self, origin=None, args=(), **found):\n"
            "        if found:\n            out.append(found)\n"
            "        else:\n            try:\n"
            "                super().__init__(origin, args, name='x')\n"
            "            except Exception:\n                pass\n")
    if how == "body":
        head = (f"@dataclasses.dataclass(init=False, {eq})\n"
                f"class R{i}{bases}:\n    {n}: int\n\n{init}")
    elif how == "field":
        ne = _name_expr(draw, n)
        head = (f"spec{i} = dataclasses.field()\n\n\n@dataclasses.dataclass\n"
                f"class B{i}:\n    a: int = spec{i}\n\n\nspec{i}.name = {ne}\n\n\n"
                f"@dataclasses.dataclass(init=False, repr=False, {eq})\n"
                f"class R{i}({base}B{i}{kw}):\n{init}")
    else:
        ne = _name_expr(draw, n)
        head = (f"ns{i} = {{}}\nns{i}[u + 'annotations' + u] = {{{ne}: int}}\n"
                f"ns{i}[u + 'doc' + u] = 'x'\n"
                f"R{i} = dataclasses.dataclass(init=False, repr=False, {eq})"
                f"(type(type(1))('R{i}', ({base}), ns{i}))\n")
    return (f"{head}\n\ntry:\n    r{i} = R{i}({t}, ())\n    {consumer}\n"
            "except Exception:\n    pass\n")


def _operator(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    ne = _name_expr(draw, n)
    fn = draw(st.sampled_from(["attrgetter", "methodcaller"]))
    return f"out.append(operator.{fn}({ne})({t}))\n"


def _formatter(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    ne = _name_expr(draw, n)
    return f'out.append(string.Formatter().get_field("0." + {ne}, ({t},), {{}})[0])\n'


def _wraps(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    if draw(st.booleans()):
        return (f"@functools.wraps({t})\ndef w{i}():\n    pass\n\n\n"
                f"out.append(w{i}.{n})\n")
    return f"def w{i}():\n    pass\n\n\nout.append(functools.wraps({t})(w{i}))\n"


def _class_body(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    base = draw(st.sampled_from(["", "Catch"]))
    return f"class C{i}({base}):\n    {n} = {t}\n\n\nout.append(C{i}().{n})\n"


def _namedtuple(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    ne = _name_expr(draw, n)
    return (f"P{i} = collections.namedtuple('P{i}', [{ne}], rename=True)\n"
            f"out.append(P{i}({t}))\n")


def _record(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    ne = _name_expr(draw, n)
    return (f"rec{i} = logging.makeLogRecord({{{ne}: {t}, 'msg': '%(' + {ne} + ')r', "
            f"'args': ({{{ne}: {t}}},)}})\nout.append(rec{i}.getMessage())\n")


def _template(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    ne = _name_expr(draw, n)
    return f'out.append(string.Template("$" + {ne}).substitute({{{ne}: {t}}}))\n'


def _json_hook(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    ne = _name_expr(draw, n)
    return (f"out.append(json.loads('{{\"k\": 1}}', object_hook=lambda d: ({t}, d)))\n"
            f"out.append(json.dumps({{{ne}: 1}}, default=lambda o: {t}))\n")


def _enum(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    ne = _name_expr(draw, n)
    return f"E{i} = enum.Enum('E{i}', [({ne}, {t})])\nout.append(E{i}[{ne}].value)\n"


def _pprint(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    return f"out.append(pprint.pformat({t}))\nout.append(hasattr({t}, {_name_expr(draw, n)}))\n"


def _keywords(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    return f"out.append(dict({n}={t}))\n"


def _alias_direct(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    cls = draw(st.sampled_from(["Alias", "type(list[int])", "type(typing.List)"]))
    args = "0" if cls == "type(typing.List)" else "()"
    return (f"a{i} = {cls}({t}, {args})\nout.append(a{i}.{n})\n"
            f"out.append(copy.copy(a{i}))\n")


def _copy(draw: st.DrawFn, i: int, n: str, t: str) -> str:
    fn = draw(st.sampled_from(["copy", "deepcopy"]))
    return f"try:\n    out.append(copy.{fn}({t}))\nexcept Exception:\n    pass\n"


CONSTRUCTS: list[Callable[[st.DrawFn, int, str, str], str]] = [
    _attr, _format_literal, _format_runtime, _pattern_keyword, _match_args,
    _dataclass_field, _dataclass_field, _dataclass_field, _dataclass_field,
    _operator, _formatter, _wraps, _class_body, _namedtuple, _record, _keywords,
    _alias_direct, _copy, _template, _json_hook, _enum, _pprint,
]


@st.composite
def snippets(draw: st.DrawFn) -> str:
    """The prelude and one to three constructs. A construct the validator refuses with the
    prelude is drawn again (a few times), so most snippets written get through and run."""
    parts = [PRELUDE]
    for i in range(draw(st.integers(1, 3))):
        for _attempt in range(6):
            construct = draw(st.sampled_from(CONSTRUCTS))
            if draw(st.integers(0, 3)):
                target, name = draw(st.sampled_from(PAIRS))
            else:
                name = draw(st.sampled_from(NAMES))
                target = draw(st.sampled_from(TARGETS))
            part = f"\n\ntry:\n{_indent(construct(draw, i, name, target))}except Exception:\n" \
                   "    pass\n"
            if not validate_source(PRELUDE + part):
                break
        parts.append(part)
    return "".join(parts)


def _indent(text: str) -> str:
    return "".join(f"    {line}\n" if line else "\n" for line in text.splitlines())


def test_the_search_writes_python_the_validator_mostly_accepts() -> None:
    """The search is only worth something if what it writes compiles and gets through."""
    accepted: list[bool] = []

    @settings(max_examples=60, derandomize=True, deadline=None, database=None)
    @given(source=snippets())
    def collect(source: str) -> None:
        compile(source, "main.py", "exec", dont_inherit=True)
        accepted.append(not validate_source(source))

    collect()
    assert sum(accepted) > len(accepted) // 2


@pytest.mark.parametrize("source", [
    "def g():\n    yield 1\n\n\nout = [g().gi_frame]",
    "import logging\nout = [logging.os]",
    "import logging\nout = [logging.Handler.__init__.__globals__]",
    "import random\nout = [random._os]",
    "def g():\n    yield 1\n\n\nout = [type(list[int])(g(), ()).gi_frame]",
])
def test_the_probe_sees_a_forbidden_object(probe: Probe, source: str) -> None:
    """Control: each of these obtains a forbidden object (the validator refuses them)."""
    assert validate_source(source)
    assert probe.run(source)["found"], source


def test_the_probe_sees_the_issue_24_bypasses(probe: Probe) -> None:
    """Control: the bypasses of test_validator_bypasses.py, run unvalidated, are found."""
    import test_validator_bypasses as bypasses

    for source in (bypasses.DATACLASS_FIELD_NAMES, bypasses.TYPING_ALIAS_RELAY,
                   bypasses.GENERIC_ALIAS_DYNAMIC_FIELDS):
        found = probe.run(source)["found"]
        assert "frame" in found and "namespace of builtins" in found, found


@pytest.mark.slow
@settings(max_examples=400, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(source=snippets())
def test_no_accepted_snippet_obtains_a_forbidden_object(probe: Probe, source: str) -> None:
    if validate_source(source):
        return
    answer = probe.run(source)
    assert not answer["found"], f"{answer}\n{source}"
