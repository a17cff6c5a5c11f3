"""The validator bypasses of issue 24, item 1, each run end to end at every snippet level.

Each case is a snippet that ``validate_source`` accepted before issue 24 and that, run, obtained
the real ``open`` (and ``os.getcwd()`` through the real ``__import__``) at ``strict`` and at
``context-isolated``. The *control* run goes through the same pool at the same level with the
worker's run-time layer on but WITHOUT the validator: on the old code each printed ESCAPED
(checked on 415554f); if a later run-time layer refuses it there, the control says so instead.
The validated run is refused before anything runs, with the codes named.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from snippet_levels import LEVELS

from corral.core.spec import Level
from corral.snippets.host.runner import _DEFAULT, _run_in, run_snippet_sync, shutdown_snippet_pool
from corral.snippets.host.transcript import Transcript
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS, validate_source


@pytest.fixture(scope="module", autouse=True)
def _pool() -> Iterator[None]:
    yield
    shutdown_snippet_pool()


def _unvalidated(source: str, level: str) -> Transcript:
    """The run without the validator, with every run-time layer of the worker on."""
    return _DEFAULT.submit(lambda pool: _run_in(
        pool, [("main.py", source)], tenant_id="bypasses", level=Level(level), timeout_ms=5000,
        allowed=DEFAULT_ALLOWED_IMPORTS, guard=True)).result()


def _printed(t: Transcript) -> str:
    return "\n".join(line.text for line in t.logs)


# (a) dataclasses.replace reads getattr(obj, field.name) for every field, and a field name is a
# plain name in a class body (gi_frame, f_builtins), never checked; the typing alias subclass
# (class keyword _root=True) relays the read to the object it wraps
DATACLASS_FIELD_NAMES = """\
import dataclasses
import difflib
import typing

Alias = type(typing.List[int])
got = {}


@dataclasses.dataclass(init=False, repr=False, eq=False)
class Frame(Alias, _root=True):
    gi_frame: int

    def __init__(self, origin=None, **found):
        if found:
            got.update(found)
        else:
            super().__init__(origin, (), name="x")


@dataclasses.dataclass(init=False, repr=False, eq=False)
class Builtins(Alias, _root=True):
    f_builtins: int

    def __init__(self, origin=None, **found):
        if found:
            got.update(found)
        else:
            super().__init__(origin, (), name="x")


gen = difflib.ndiff(["a"], ["b"])
dataclasses.replace(Frame(gen))
dataclasses.replace(Builtins(got["gi_frame"]))
real = got["f_builtins"]
print("ESCAPED", real["open"], real["__imp" + "ort__"]("os").getcwd())
"""

# (b) the typing alias relay fed a name built at run time: a Field kept from
# dataclasses.field() is renamed after its class is made, and a subclass's generated __eq__
# reads that name through the relay and hands the object to the snippet's __eq__
TYPING_ALIAS_RELAY = """\
import dataclasses
import difflib
import typing

Alias = type(typing.List[int])


class Catch:
    got = []

    def __getattr__(self, name):
        return self

    def __eq__(self, other):
        Catch.got.append(other)
        return True


def read(obj, name):
    # obj.<name> for a name built at run time: the alias relays the read to obj
    spec = dataclasses.field()

    @dataclasses.dataclass
    class Base:
        a: int = spec

    spec.name = name

    @dataclasses.dataclass(init=False, repr=False)
    class Relay(Alias, Base, _root=True):
        pass

    Relay(obj, (), name="x") == Relay(Catch(), (), name="x")
    return Catch.got.pop()


frame = read(difflib.ndiff(["a"], ["b"]), "gi_" + "frame")
real = read(frame, "f_" + "builtins")
print("ESCAPED", real["open"], real["__imp" + "ort__"]("os").getcwd())
"""

# (c) a keyword class pattern binds str.format of a template built at run time (the
# dynamic-format rule saw only `x.format`), which walks __init__.__globals__ to the real open
MATCH_KEYWORD_FORMAT = """\
import logging

template = "ESCAPED {0._" + "_init__._" + "_globals__[_" + "_builtins__][open]}"
match template:
    case str(format=fmt):
        print(fmt(logging.Handler()))
"""

# (d) found by the audit: the C alias type (type(list[int])) relays every read, dunders too,
# without _root; a class built at run time names its field from a run-time string and
# dataclasses.dataclass, called as a function, generates an __eq__ that reads it
GENERIC_ALIAS_DYNAMIC_FIELDS = """\
import dataclasses
import difflib

T = type(type(1))
G = type(list[int])
u = "_" * 2


class Catch:
    got = []

    def __getattr__(self, name):
        return self

    def __eq__(self, other):
        Catch.got.append(other)
        return True


def read(obj, name):
    ns = {}
    ns[u + "annotations" + u] = {name: int}
    ns[u + "doc" + u] = "relay"
    Relay = dataclasses.dataclass(init=False, repr=False)(T("Relay", (G,), ns))
    Relay(obj, ()) == Relay(Catch(), ())
    return Catch.got.pop()


frame = read(difflib.ndiff(["a"], ["b"]), "gi_" + "frame")
real = read(frame, "f_" + "builtins")
print("ESCAPED", real["open"], real["__imp" + "ort__"]("os").getcwd())
"""

BYPASSES = [
    pytest.param(DATACLASS_FIELD_NAMES, {"forbidden-attribute", "forbidden-keyword"},
                 id="dataclass_field_names"),
    pytest.param(TYPING_ALIAS_RELAY, {"forbidden-attribute", "forbidden-keyword"},
                 id="typing_alias_relay"),
    pytest.param(MATCH_KEYWORD_FORMAT, {"dynamic-format"}, id="match_keyword_format"),
    pytest.param(GENERIC_ALIAS_DYNAMIC_FIELDS, {"forbidden-attribute"},
                 id="generic_alias_dynamic_fields"),
]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("source", "codes"), BYPASSES)
def test_bypass_is_refused_at_every_level(source: str, codes: set[str], level: str) -> None:
    before = _unvalidated(source, level)
    if "ESCAPED" not in _printed(before):  # a run-time layer refused it: it must have raised
        assert before.errors and before.errors[0].type not in ("SyntaxError", "NameError"), \
            before
    else:
        assert "<built-in function open>" in _printed(before)
    assert {v.code.value for v in validate_source(source)} == codes
    t = run_snippet_sync(source, tenant_id="bypasses", level=level)
    assert t.rejected and not t.logs and t.duration_ms == 0
    assert {e.code for e in t.errors} == codes
