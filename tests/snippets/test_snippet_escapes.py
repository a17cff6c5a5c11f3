"""Escapes of the validator (issue 10, item 3): each case is a snippet that reached `os`, the
real builtins or unvalidated code on the old validator, run end to end through run_snippet.

For every case a *control* run goes through the same strict pool with the worker's run-time
guard on (restricted builtins, import guard, the stdlib guards) but WITHOUT the validator: it
shows what the snippet did before the fix ("escapes": it printed ESCAPED and os.getcwd() or
the real open), or that a run-time guard now refuses it as well ("guarded"). The validated
run is refused before anything runs, with the codes named.

A second group builds its strings at run time, which no static check sees, and is refused by
the worker's run-time guards; on the old worker each printed ESCAPED. Since issue 24 the
validator refuses most of them too, by their shape (dataclasses.dataclass only as a class
decorator, dataclasses.Field not allowed): those run unvalidated to show the guard.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from snippet_levels import STRICT_SKIP

from corral.core.spec import Level
from corral.snippets.host.runner import _DEFAULT, _run_in, run_snippet_sync, shutdown_snippet_pool
from corral.snippets.host.transcript import Transcript
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS, validate_source
from strict_tier import needs_strict

pytestmark = needs_strict(STRICT_SKIP)


@pytest.fixture(scope="module", autouse=True)
def _pool() -> Iterator[None]:
    yield
    shutdown_snippet_pool()


def _unvalidated(source: str) -> Transcript:
    """The run without the validator, with every run-time layer of the worker on."""
    return _DEFAULT.submit(lambda pool: _run_in(
        pool, [("main.py", source)], tenant_id="escapes", level=Level.STRICT, timeout_ms=5000,
        allowed=DEFAULT_ALLOWED_IMPORTS, guard=True)).result()


def _printed(t: Transcript) -> str:
    return "\n".join(line.text for line in t.logs)


VALIDATOR_ESCAPES = [
    # before: the reported bypass: abc.ABC's __subclasshook__ made `logging` match and the
    # positional sub-pattern read logging.os
    pytest.param("""\
import abc
import logging


class Any(abc.ABC):
    __match_args__ = ("os",)

    @classmethod
    def __subclasshook__(cls, other):
        return True


match logging:
    case Any(found):
        print("ESCAPED", found.getcwd())
""", ['forbidden-attribute', 'module-value', 'positional-pattern'], 'escapes',
                 id="match_abc_subclasshook"),
    # before: update_wrapper(assigned=('os',)) did getattr(logging, 'os') into the
    # snippet's __setattr__
    pytest.param("""\
import functools
import logging

got = []


class Catch:
    def __setattr__(self, name, value):
        got.append(value)


functools.update_wrapper(Catch(), logging, assigned=("os",), updated=())
print("ESCAPED", got[0].getcwd())
""", ['forbidden-attribute', 'module-value'], 'escapes', id="functools_update_wrapper"),
    # before: redirect_stdout with _stream='modules' handed back sys.modules
    pytest.param("""\
import contextlib

r = contextlib.redirect_stdout(None)
r._stream = "modules"
with r:
    mods = r._old_targets[0]
print("ESCAPED", mods["os"].getcwd())
""", ['forbidden-attribute'], 'escapes', id="contextlib_redirect_stream"),
    # before: a module under another name skipped the private-attribute check: random._os
    pytest.param("""\
import random

r = random
print("ESCAPED", r._os.getcwd())
""", ['module-value'], 'escapes', id="module_alias_private"),
    # before: ForwardRef._evaluate eval'd a string with typing's real builtins (printed the
    # real open)
    pytest.param("""\
import typing

ref = typing.get_args(typing.List["open"])[0]
print("ESCAPED", ref._evaluate({}, {}, recursive_guard=frozenset()))
""", ['forbidden-attribute'], 'escapes', id="typing_forwardref_evaluate"),
    # before: __annotations__/__module__ in a class body: dataclasses exec'd a field name as
    # code with logging's globals (os)
    pytest.param("""\
import dataclasses


class C:
    __module__ = "logging"
    __annotations__ = {"a,print('ESCAPED', os.getcwd())": int}
    a = 1


D = dataclasses.dataclass(init=False, repr=False)(C)
D() == D()
""", ['dunder-name', 'forbidden-attribute'], 'guarded',
                 id="dataclass_class_body_injection"),
    # before: the same through type(type(1))(name, bases, {...})
    pytest.param("""\
import dataclasses

T = type(type(1))
C = T("C", (), {"a": 1, "__module__": "logging",
                "__annotations__": {"a,print('ESCAPED', os.getcwd())": int}})
D = dataclasses.dataclass(init=False, repr=False)(C)
D() == D()
""", ['dunder-subscript', 'forbidden-attribute'], 'guarded',
                 id="dynamic_class_namespace"),
    # before: global_enum replaced builtins.exec with a member; dataclasses then called it
    # with a module's globals
    pytest.param("""\
import dataclasses
import enum


class Spy(enum.Enum):
    def __call__(self, source, namespace, *rest):
        print("ESCAPED", sorted(namespace)[:3])


enum.global_enum(Spy("E", "ex" + "ec", module="builtins"))
try:
    dataclasses.make_dataclass("P", ["x"])
except Exception:
    pass
""", ['forbidden-attribute'], 'escapes', id="enum_global_enum_hook"),
    # before: Enum._convert_ built members from builtins' namespace (the real open)
    pytest.param("""\
import enum

E = enum.Enum._convert_("E", "builtins", lambda name: name == "open")
print("ESCAPED", E.open.value)
""", ['forbidden-attribute'], 'escapes', id="enum_convert_builtins"),
    # before: a {-style template built at run time walked msg.__init__.__globals__ (the
    # format check only sees literal templates) and printed the os module
    pytest.param("""\
import logging

style = logging.StrFormatStyle("ESCAPED {msg." + "__init__." + "__globals__[os]}")
print(style._format(logging.makeLogRecord({"msg": logging.Handler()})))
""", ['forbidden-attribute'], 'escapes', id="logging_str_format_style"),
    # before: uuid re-exports platform, which was never allowlisted (it runs `file`,
    # reads the interpreter binary); platform catches the OSError of a refused run and
    # returns the default, so only a run that happened prints
    pytest.param("""\
import uuid

ran = uuid.platform._syscmd_file("/", None)
if ran is not None:
    print("ESCAPED", uuid.platform.libc_ver(), ran)
""", ['forbidden-import', 'private-module-attribute'], 'guarded',
                 id="uuid_platform_reexport"),
]


@pytest.mark.parametrize(("source", "codes", "control"), VALIDATOR_ESCAPES)
def test_validator_refuses_the_escape(source: str, codes: list[str], control: str) -> None:
    before = _unvalidated(source)
    if control == "escapes":
        assert "ESCAPED" in _printed(before), before.errors  # the validator is the layer here
    else:
        assert "ESCAPED" not in _printed(before)
        # a run-time guard: the stdlib guards (TypeError) or the audit hook (issue 24);
        # or this interpreter lacks the door (3.13's uuid no longer imports platform)
        absent = ("AttributeError",) if "uuid.platform" in source and not hasattr(
            __import__("uuid"), "platform") else ()
        assert before.errors and before.errors[0].type in ("TypeError", "GuardViolation",
                                                           *absent)
    t = run_snippet_sync(source, tenant_id="escapes")
    assert t.rejected and not t.logs and t.duration_ms == 0
    assert {e.code for e in t.errors} == set(codes)
    assert {v.code.value for v in validate_source(source)} == set(codes)


RUNTIME_ESCAPES = [
    # before: the namespace keys are built at run time; dataclasses exec'd the field name
    # with logging's globals (printed os.getcwd())
    pytest.param("""\
import dataclasses

T = type(type(1))
u = "_" * 2
ns = {"a": 1}
ns[u + "module" + u] = "logging"
ns[u + "annotations" + u] = {"a,print('ESCAPED', os.getcwd())": int}
D = dataclasses.dataclass(init=False, repr=False)(T("C", (), ns))
D() == D()
""", ["forbidden-attribute"], id="dataclass_names_from_runtime_strings"),
    # before: a class attribute replaced Field's name slot; the subclass's generated __eq__
    # ran unvalidated code (walked object.__subclasses__())
    pytest.param("""\
import dataclasses


@dataclasses.dataclass
class A:
    x: int
    a = 1


dataclasses.Field.name = "a,print('ESCAPED', len(().__class__.__base__.__subclasses__()))"


@dataclasses.dataclass(init=False, repr=False)
class B(A):
    pass


B(1) == B(1)
""", ["forbidden-attribute"], id="dataclass_field_class_attribute"),
    # before: copy applied a reduced state with setattr(Target, "__annotations__", ...) and
    # dataclasses exec'd the planted field name with logging's globals
    pytest.param("""\
import copy
import dataclasses

T = type(type(1))
u = "_" * 2


class Target:
    a = 1


def reduce(self, protocol):
    state = {u + "module" + u: "logging",
             u + "annotations" + u: {"a,print('ESCAPED', os.getcwd())": int}}
    return (lambda: Target, (), (None, state))


ns = {}
ns[u + "reduce_ex" + u] = reduce
Carrier = T("Carrier", (), ns)
copy.copy(Carrier())
D = dataclasses.dataclass(init=False, repr=False)(Target)
D() == D()
""", ["forbidden-attribute"], id="copy_state_writes_dunders"),
    # before: a {-style Formatter (made through type(formatter)) walked msg.__init__.__globals__
    # and logged the os module
    pytest.param("""\
import logging

logging.basicConfig(format="%(message)s")
fmt = logging.root.handlers[0].formatter
brace = type(fmt)("ESCAPED {msg." + "__init__." + "__globals__[os]}", None, "{")
logging.root.handlers[0].setFormatter(brace)
logging.warning(logging.Handler())
""", [], id="logging_brace_style_formatter"),
]


@pytest.mark.parametrize(("source", "codes"), RUNTIME_ESCAPES)
def test_run_time_guards_refuse_what_the_validator_cannot_see(source: str,
                                                              codes: list[str]) -> None:
    assert {v.code.value for v in validate_source(source)} == set(codes)
    t = run_snippet_sync(source, tenant_id="escapes") if not codes else _unvalidated(source)
    assert not t.rejected
    assert "ESCAPED" not in _printed(t)
    assert t.errors and t.errors[0].type in ("TypeError", "ValueError"), t.errors


def test_run_time_guards_cover_modules_imported_during_the_run() -> None:
    """A template started without --preload imports dataclasses (and, lazily, copy) only
    when the snippet does: the guard is applied on that import too."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).parents[2] / "src" / "corral" / "snippets" / "sandbox" / "worker.py"
    options = {"timeout_ms": 3000, "grace_ms": 200, "allowed": sorted(DEFAULT_ALLOWED_IMPORTS),
               "forbidden": []}
    frames = b"".join(
        json.dumps({"v": 1, "kind": "invoke", "ctx": {"runId": "r", "tenantId": "t"},
                    "input": {"op": "run", "files": [["main.py", source.values[0]]],
                              "options": options}}).encode() + b"\n"
        for source in RUNTIME_ESCAPES[:3])
    out = subprocess.run([sys.executable, "-I", "-S", str(worker)], input=frames,
                         capture_output=True, timeout=60, check=True)
    outputs = [json.loads(line)["output"] for line in out.stdout.splitlines()]
    assert len(outputs) == 3
    for output in outputs:
        assert not any("ESCAPED" in log["text"] for log in output["logs"]), output
        assert output["errors"][0]["type"] == "TypeError", output


def test_guards_come_preinstalled_in_strict_runs_and_never_touch_the_host() -> None:
    import copy
    import dataclasses
    import logging

    # 3.11 and 3.12 build each method with _create_fn, 3.13 with _FuncBuilder
    generator = "_create_fn" if hasattr(dataclasses, "_create_fn") else \
        "_FuncBuilder.add_fns_to_class"
    t = run_snippet_sync("import sys, dataclasses, copy, logging\n"
                         "('corral.snippets.sandbox.guards' in sys.modules, "
                         f"dataclasses.{generator}.__name__, copy._reconstruct.__name__, "
                         "'{' in logging._STYLES)", tenant_id="escapes",
                         _unsafe_skip_validation=True)
    checked = "_checked_" + generator.rpartition(".")[2].lstrip("_")
    assert t.result == f"(True, '{checked}', '_checked_reconstruct', False)", t
    original = dataclasses._create_fn if generator == "_create_fn" else \
        dataclasses._FuncBuilder.add_fns_to_class  # type: ignore[attr-defined]
    assert original.__name__ == generator.rpartition(".")[2]
    assert copy._reconstruct.__name__ == "_reconstruct"  # type: ignore[attr-defined]
    assert "{" in logging._STYLES  # type: ignore[attr-defined]
