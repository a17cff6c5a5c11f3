"""validate_source / validate_files: positions, payloads, configuration, robustness."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from corral.snippets.validator import (
    DEFAULT_ALLOWED_IMPORTS,
    DEFAULT_MAX_SOURCE_BYTES,
    Violation,
    ViolationCode,
    validate_files,
    validate_source,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "validator.md"


def codes(source: str, **kwargs: object) -> list[str]:
    return [v.code.value for v in validate_source(source, **kwargs)]  # type: ignore[arg-type]


def test_positions_are_one_based_lines_and_character_columns() -> None:
    src = "x = 1\nname = 'é'; y = ().__class__\n"
    (v,) = validate_source(src)
    assert (v.code, v.line, v.column) == (ViolationCode.DUNDER_ATTRIBUTE, 2, 19)
    assert src.splitlines()[1][v.column :].startswith("__class__")


def test_all_violations_reported_sorted() -> None:
    src = "import os\nexec('1')\nimport sys\n"
    got = [(v.line, v.code.value) for v in validate_source(src)]
    assert got == [(1, "forbidden-import"), (2, "forbidden-name"), (3, "forbidden-import")]


def test_violation_is_frozen_value() -> None:
    v = Violation(code=ViolationCode.FORBIDDEN_NAME, line=1, column=0, message="m")
    assert v.path == "main.py"
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.line = 2  # type: ignore[misc]


def test_syntax_error_has_position() -> None:
    (v,) = validate_source("x = 1\ny = (\n")
    assert v.code is ViolationCode.SYNTAX_ERROR
    assert v.line >= 2


@pytest.mark.parametrize(
    "source",
    ["a\0b", "x = '\ud800'", "(" * 500, "-" * 200_000 + "1", "[" * 100 + "]" * 100, "\ufeffx=1"],
)
def test_hostile_inputs_become_violations_not_exceptions(source: str) -> None:
    result = validate_source(source)
    assert all(isinstance(v, Violation) for v in result)


def test_null_byte_position() -> None:
    (v,) = validate_source("x = 1\nab\0")
    # the validator places it itself where compile() raises ValueError (3.11.2); where
    # compile() raises a SyntaxError without a position (3.11.7, 3.12, 3.13) the
    # violation says line 1, column 0
    assert (v.code, v.line, v.column) in ((ViolationCode.SYNTAX_ERROR, 2, 2),
                                          (ViolationCode.SYNTAX_ERROR, 1, 0))


def test_size_cap_in_utf8_bytes() -> None:
    assert codes("x = 1\n" * 50_000) == ["source-too-large"]
    assert codes("é" * 150_000) == ["source-too-large"]  # 300 KB of UTF-8
    assert codes("x = 1\n", max_source_bytes=3) == ["source-too-large"]
    assert codes("x = 1\n" * 100, max_source_bytes=DEFAULT_MAX_SOURCE_BYTES) == []


def test_depth_cap_is_configurable() -> None:
    src = "x = " + "-" * 50 + "1"
    assert codes(src) == []
    assert codes(src, max_ast_depth=20) == ["source-too-complex"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_never_raises(source: str) -> None:
    for v in validate_source(source):
        assert isinstance(v.code, ViolationCode)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["x", "(", ")", ".", "__class__", "[", "]", "'", "{", "}",
                                 "\n", " ", "import ", "os", ":", "f'", "\\", "\uff45", "0"]),
                max_size=60))
def test_never_raises_on_python_like_noise(tokens: list[str]) -> None:
    validate_source("".join(tokens))


# -- configuration ----------------------------------------------------------------


def test_default_allowlist_excludes_io_and_introspection() -> None:
    for name in ["os", "sys", "io", "pathlib", "subprocess", "socket", "ctypes", "importlib",
                 "inspect", "gc", "builtins", "pickle", "marshal", "types", "threading",
                 "asyncio", "tempfile", "shutil", "logging.config", "logging.handlers"]:
        assert name not in DEFAULT_ALLOWED_IMPORTS
    assert {"math", "json", "re", "logging", "collections.abc"} <= DEFAULT_ALLOWED_IMPORTS


def test_allowed_imports_override_and_wildcard() -> None:
    assert codes("import math", allowed_imports=frozenset({"json"})) == ["forbidden-import"]
    assert codes("import json.decoder", allowed_imports=frozenset({"json"})) == [
        "forbidden-import"
    ]
    assert codes("import json.decoder", allowed_imports=frozenset({"json.*"})) == []
    assert codes("from json import decoder", allowed_imports=frozenset({"json.*"})) == []
    assert codes("import urllib.parse") == []
    assert codes("from urllib import parse") == []
    assert codes("from urllib import request") == ["forbidden-import"]


def test_submodule_access_through_a_module_name() -> None:
    assert codes("import collections\ncollections.abc.Mapping") == []
    assert codes("import logging as L\nL.config") == ["forbidden-import"]
    assert codes("from collections import abc as a\na._x") == ["private-module-attribute"]


# -- rules needing a specific shape --------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("super().__init__()", []),
        ("super().__getattribute__('x')", ["dunder-attribute"]),
        ("object.__setattr__(1, 'x', 2)", ["dunder-attribute"]),
        ("class A:\n    __hash__ = None\n    __slots__ = ()", []),
        ("class A:\n    __class__ = int", ["dunder-name"]),
        ("__all__ = ['f']\n__version__ = '1'", []),
        ("__spam__ = 1", ["dunder-name"]),
        ("def __getattr__(name):\n    return name", []),
        ("def f(__builtins__): pass", ["forbidden-name"]),
        ("import math as open", ["forbidden-name"]),
        ("try:\n    pass\nexcept Exception as exec:\n    pass", ["forbidden-name"]),
        ("type(1)", []),
        ("type(*args)", ["dynamic-class"]),
        ("type(1, x=2)", ["dynamic-class"]),
        ("'{}'.format(1)", []),
        ("'{a.b[0]}'.format(a=1)", []),
        ("'{a.gi_frame}'.format(a=1)", ["format-string-escape"]),
        ("'{0!r:>{1}}'.format(1, 2)", []),
        ("x: 'list[int]' = []", []),
        ("x: Literal['hello world', 3] = 3", []),
        ("x: Annotated[int, print('meta')] = 3", []),
        ("x: 'not valid python (' = 3", ["non-type-annotation"]),
        ("def f() -> 1 + 1: pass", ["non-type-annotation"]),
        ("d = {}\nd['__x']", []),
        ("from helpers import f", ["forbidden-import"]),
        ("import logging\nlogging.basicConfig(**{})", ["forbidden-keyword"]),
        # class patterns: positional sub-patterns only on an unbound self-matching builtin
        ("match 1:\n    case int(n) | str(n):\n        pass", []),
        ("match 1:\n    case P(x=a, y=b):\n        pass", []),
        ("match 1:\n    case P(a):\n        pass", ["positional-pattern"]),
        ("match 1:\n    case int(a, b):\n        pass", ["positional-pattern"]),
        ("def f(int):\n    match 1:\n        case int(n):\n            pass",
         ["positional-pattern"]),
        ("import enum\nmatch 1:\n    case enum.Enum(a):\n        pass", ["positional-pattern"]),
        ("match 1:\n    case object(__dict__=d):\n        pass", ["dunder-attribute"]),
        # modules are receivers only: not stored, passed, matched or written to
        ("import json\nx = json", ["module-value"]),
        ("import json\nprint([json])", ["module-value"]),
        ("import json\njson.x = 1", ["module-value"]),
        ("import json\ndel json.dumps", ["module-value"]),
        ("import collections\nc = collections.abc", ["module-value"]),
        ("import collections\ncollections.abc.Mapping", []),
        ("import typing\nr = typing.stdlib_re", ["module-value"]),
        ("import typing\ntyping.stdlib_re._compile", ["private-module-attribute"]),
        ("import dataclasses\ndataclasses.copy.deepcopy([])", []),
        ("import uuid\nuuid.platform.system()", ["forbidden-import"]),
        ("from uuid import platform", ["forbidden-import"]),
        ("import os\nx = os", ["forbidden-import"]),
        # names reaching attributes or code by a string they hold
        ("import functools\n@functools.wraps(f)\ndef g(): pass", []),
        ("from functools import wraps\n@wraps(f)\ndef g(): pass", []),
        ("import functools\nfunctools.wraps(f, ())", ["forbidden-attribute"]),
        ("import functools\nfunctools.wraps(f, assigned=())", ["forbidden-attribute"]),
        ("from functools import wraps\nw = wraps", ["forbidden-attribute"]),
        ("from functools import wraps as w", ["forbidden-attribute"]),
        ("import functools\nfunctools.update_wrapper", ["forbidden-attribute"]),
        ("import contextlib\ncontextlib.redirect_stderr(None)", ["forbidden-attribute"]),
        ("x._evaluate({}, {}, frozenset())", ["forbidden-attribute"]),
        # class bodies: only the hooks of operators and protocols
        ("class A:\n    __match_args__ = ('x',)\n    __eq__ = None\n    __radd__ = 1", []),
        ("class A:\n    __module__ = 'logging'", ["dunder-name"]),
        ("class A:\n    __annotations__ = {}", ["dunder-name"]),
        ("class A:\n    __dataclass_fields__ = {}", ["dunder-name"]),
        ("class A:\n    def __reduce_ex__(self, p): pass", ["dunder-name"]),
        ("class A:\n    @staticmethod\n    def __annotations__(): pass", ["dunder-name"]),
        ("def __annotations__(): pass", ["dunder-name"]),
        ("class M(type): pass", ["dynamic-class"]),
        ("class M(type(int)): pass", ["dynamic-class"]),
        ("import abc\nclass M(abc.ABCMeta): pass", ["dynamic-class"]),
        ("import abc\nclass A(abc.ABC): pass", []),
        ("d = {'__module__': 1}", ["dunder-subscript"]),
        ("f(__module__=1)", ["dunder-subscript"]),
        ("d = {'__x': 1, 'y__': 2}", []),
    ],
)
def test_rule_shapes(source: str, expected: list[str]) -> None:
    assert codes(source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # issue 24: names that become attribute names are checked like `x.name`
        ("class A:\n    tb_frame: int", ["forbidden-attribute"]),
        ("class A:\n    f_back = 1", ["forbidden-attribute"]),
        ("class A:\n    def mro(self): pass", ["forbidden-attribute"]),
        ("class A:\n    class gi_frame: pass", ["forbidden-attribute"]),
        ("class A:\n    with x as co_code: pass", ["forbidden-attribute"]),
        ("class A:\n    (os := 1)", ["forbidden-attribute"]),
        ("class A:\n    match 1:\n        case f_globals: pass", ["forbidden-attribute"]),
        ("class A:\n    __slots__ = ('f_locals',)", ["forbidden-attribute"]),
        ("class A:\n    __slots__ = ('__dict__',)", ["forbidden-attribute"]),
        ("class A:\n    __match_args__ = ('sys', 'x')", ["forbidden-attribute"]),
        ("class A:\n    name: int\n    __slots__ = ('items',)\n    def f(self): pass", []),
        ("def f():\n    tb_frame = 1\n    return tb_frame", []),  # a local, not an attribute
        ("class A:\n    x = [gi_frame for gi_frame in ()]", []),  # a comprehension's own scope
        ("f(tb_frame=1)", ["forbidden-attribute"]),
        ("dict(os=1)", ["forbidden-attribute"]),
        ("import collections\ncollections.namedtuple('P', 'x f_back')", ["forbidden-attribute"]),
        ("import collections\ncollections.namedtuple('P', ['x', 'y'])", []),
        ("import enum\nenum.Enum('E', ['gi_frame'])", ["forbidden-attribute"]),
        ("import typing\ntyping.NamedTuple('P', [('tb_frame', int)])", ["forbidden-attribute"]),
        # the alias types that relay attribute reads
        ("import typing\nclass R(type(typing.List[int]), _root=True): pass",
         ["dynamic-class", "forbidden-keyword"]),
        ("class R(Alias, _root=True): pass", ["forbidden-keyword"]),
        ("class R(Base, _private=1): pass", ["forbidden-keyword"]),
        ("class R(Base, total=False): pass", []),
        ("class R(type(list[int])): pass", ["dynamic-class"]),
        ("T('R', (A,), {}, _root=True)", ["forbidden-keyword"]),
        ("T('R', (A,), {}, **{'_root': True})", ["forbidden-keyword"]),
        ("import abc\nabc.ABCMeta('A', (), {})", ["dynamic-class"]),
        ("import enum\nenum.EnumType('E', (), {})", ["dynamic-class"]),
        # dataclasses: fields only from class bodies, no helper reading them by name
        ("import dataclasses\ndataclasses.replace(x)", ["forbidden-attribute"]),
        ("import dataclasses\ndataclasses.asdict(x)", ["forbidden-attribute"]),
        ("import dataclasses\ndataclasses.astuple(x)", ["forbidden-attribute"]),
        ("import dataclasses\ndataclasses.fields(x)", ["forbidden-attribute"]),
        ("import dataclasses\ndataclasses.Field.name = 'x'", ["forbidden-attribute"]),
        ("from dataclasses import replace", ["forbidden-attribute"]),
        ("import dataclasses as dc\ndc.asdict(x)", ["forbidden-attribute"]),
        ("s.replace('a', 'b')", []),  # only the dataclasses member
        ("import copy\ncopy.replace(x)", ["forbidden-attribute"]),  # 3.13: dataclass replace
        ("import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass A:\n"
         "    x: list = dataclasses.field(default_factory=list)", []),
        ("from dataclasses import dataclass, field\n@dataclass\nclass A:\n"
         "    x: list = field(default_factory=list)", []),
        ("from dataclasses import dataclass\n@other\n@dataclass\nclass A:\n    x: int", []),
        ("from dataclasses import dataclass\n@dataclass\n@other\nclass A:\n    x: int",
         ["forbidden-attribute"]),
        ("import dataclasses\nD = dataclasses.dataclass(C)", ["forbidden-attribute"]),
        ("import dataclasses\nd = dataclasses.dataclass", ["forbidden-attribute"]),
        ("import dataclasses\nf = dataclasses.field()", ["forbidden-attribute"]),
        ("from dataclasses import field\nclass A:\n    x: list = field()",
         ["forbidden-attribute"]),  # not a dataclass: the Field would stay a class attribute
        ("import dataclasses\ndataclasses.is_dataclass(x)", []),
        # typing and pprint members dropped
        ("import typing\ntyping.no_type_check(f)", ["forbidden-attribute"]),
        ("import pprint\nclass P(pprint.PrettyPrinter): pass", ["forbidden-attribute"]),
        ("import pprint\npprint.pformat({'a': 1})", []),
        # wraps: only as the decorator of a def
        ("import functools\nfunctools.wraps(f)(g)", ["forbidden-attribute"]),
        ("import functools\n@functools.wraps(f)\nclass C: pass", ["forbidden-attribute"]),
        # keyword class patterns get the rules of `subject.name` for an unknown subject
        ("match t:\n    case str(format=f):\n        pass", ["dynamic-format"]),
        ("match t:\n    case str(format_map=f):\n        pass", ["dynamic-format"]),
        ("match t:\n    case object(_os=m):\n        pass", ["private-module-attribute"]),
        ("match t:\n    case object(stdlib_re=m):\n        pass", ["module-value"]),
        ("match t:\n    case object(wraps=w):\n        pass", ["forbidden-attribute"]),
        ("match t:\n    case object(gi_frame=f):\n        pass", ["forbidden-attribute"]),
        ("match p:\n    case Point(x=px, y=py):\n        pass", []),
    ],
)
def test_names_that_become_attribute_names(source: str, expected: list[str]) -> None:
    assert sorted(set(codes(source))) == expected


def test_module_reexports_cover_this_interpreter() -> None:
    """Every module an allowed module exposes as a public attribute is in MODULE_REEXPORTS,
    so reaching it (``dataclasses.copy``) is treated as the import it is."""
    import importlib
    import types

    from corral.snippets.validator.policy import KNOWN_SUBMODULES, MODULE_REEXPORTS

    for name in sorted(DEFAULT_ALLOWED_IMPORTS):
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, types.ModuleType) and not attr.startswith("_"):
                known = MODULE_REEXPORTS.get(name, {}).get(attr)
                sub = attr in KNOWN_SUBMODULES.get(name, ())
                assert sub or known == value.__name__, f"{name}.{attr} is {value.__name__}"


def test_nfkc_stable_non_ascii_identifiers_are_fine() -> None:
    assert codes("café = 1\nπ = café") == []
    (v,) = [v for v in validate_source("x = 1\n\uff58 = 2") if v.code == "non-ascii-identifier"]
    assert (v.line, v.column) == (2, 0)


# -- payloads -------------------------------------------------------------------


def test_payload_modules_and_relative_imports() -> None:
    files = {
        "main.py": "from helpers import twice\nfrom pkg.sub import f\nimport pkg\n"
        "from . import helpers\nprint(twice(f()))\n",
        "helpers.py": "from .pkg import sub\n\ndef twice(x):\n    return 2 * x\n",
        "pkg/__init__.py": "from . import sub\nfrom .sub import f\n",
        "pkg/sub.py": "from .. import helpers\nfrom . import f as g\n\ndef f():\n    return 1\n",
    }
    assert validate_files(files) == ()
    assert validate_files(list(files.items())) == ()


def test_payload_module_names_for_validate_source() -> None:
    names = frozenset({"helpers", "pkg", "pkg.sub"})
    assert codes("from .helpers import f\nimport pkg.sub\nfrom pkg import sub",
                 module_names=names) == []
    assert codes("from .nothere import f", module_names=names) == ["unresolved-relative-import"]
    assert codes("from .. import helpers", module_names=names) == ["unresolved-relative-import"]
    # a payload name never grants a standard-library module
    assert codes("import os", module_names=frozenset({"os"})) == ["forbidden-import"]


def test_payload_violations_carry_the_path() -> None:
    found = validate_files({"main.py": "import helpers\n", "helpers.py": "x = 1\neval('1')\n"})
    assert [(v.path, v.line, v.code.value) for v in found] == [
        ("helpers.py", 2, "forbidden-name")
    ]


@pytest.mark.parametrize(
    "path",
    ["/abs.py", "C:\\x.py", "a\\b.py", "../x.py", "pkg/../x.py", "x.txt", "x", "",
     "my-mod.py", "pkg//x.py", "./x.py", "class.py", "1x.py", "os.py", "json/x.py",
     "__init__.py", "__main__.py", "mödule.py"],
)
def test_invalid_paths_are_named(path: str) -> None:
    found = validate_files({path: "x = 1\n", "main.py": "y = 2\n"})
    assert [(v.path, v.code.value, v.line) for v in found] == [(path, "invalid-path", 0)]


def test_duplicate_modules_are_invalid() -> None:
    found = validate_files([("pkg.py", ""), ("pkg/__init__.py", ""), ("pkg.py", "")])
    assert [v.code.value for v in found] == ["invalid-path", "invalid-path"]


# -- docs --------------------------------------------------------------------------


def test_every_code_is_documented() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for code in ViolationCode:
        assert f"`{code.value}`" in text, code


# -- purity and package surface ------------------------------------------------------------


def test_validator_modules_import_only_pure_modules() -> None:
    import ast as pyast

    import corral.snippets

    pure = {"__future__", "ast", "collections", "dataclasses", "enum", "keyword", "string",
            "sys", "tokenize", "typing", "unicodedata"}
    root = Path(corral.snippets.__file__).parent / "validator"
    for name in ["__init__.py", "rules.py", "policy.py"]:
        tree = pyast.parse((root / name).read_text(encoding="utf-8"))
        for node in pyast.walk(tree):
            if isinstance(node, pyast.Import):
                assert {a.name.split(".")[0] for a in node.names} <= pure, name
            elif isinstance(node, pyast.ImportFrom):
                mod = node.module or ""
                assert node.level == 0, name
                assert mod.split(".")[0] in pure or mod.startswith(
                    ("corral.snippets.validator", "corral.core.errors")), (name, mod)


def test_package_reexports_lazily() -> None:
    import corral.snippets as pkg

    for name in pkg.__all__:
        assert getattr(pkg, name) is not None
    assert pkg.__all__ == sorted(pkg.__all__)
    with pytest.raises(AttributeError):
        _ = pkg.no_such_name  # type: ignore[attr-defined]
