"""The validator's policy tables and pure helpers (internal; see validate.py and
docs/validator.md for the reason behind every entry).

Pure: no I/O imports.
"""

from __future__ import annotations

import ast
import string
import unicodedata
from collections.abc import Iterator
from typing import Final

__all__ = [
    "BASIC_CONFIG_KEYWORDS",
    "CALL_ONLY_NAMES",
    "CLASS_DUNDERS_OK",
    "DEFAULT_ALLOWED_IMPORTS",
    "DUNDER_ATTRS_OK",
    "DUNDER_LOADS_OK",
    "DUNDER_STORES_OK",
    "FORBIDDEN_ATTRIBUTES",
    "FORBIDDEN_ATTRIBUTE_PREFIXES",
    "FORBIDDEN_NAMES",
    "CLASS_DECORATOR_ONLY_MEMBERS",
    "FIELD_ONLY_MEMBERS",
    "KNOWN_SUBMODULES",
    "MODULE_MEMBERS_FORBIDDEN",
    "MODULE_REEXPORTS",
    "NAME_FACTORIES",
    "SCOPES",
    "SELF_MATCHING_BUILTINS",
    "SPECIAL_METHODS",
    "SUPER_DUNDERS_OK",
    "annotation_problem",
    "attribute_forbidden",
    "confusable_identifiers",
    "format_problem",
    "is_dunder",
    "nfkc",
]

DEFAULT_ALLOWED_IMPORTS: Final[frozenset[str]] = frozenset(
    {
        "__future__", "abc", "array", "base64", "binascii", "bisect", "calendar", "cmath",
        "collections", "collections.abc", "colorsys", "contextlib", "copy", "csv",
        "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools",
        "graphlib", "hashlib", "heapq", "hmac", "html", "ipaddress", "itertools", "json",
        "keyword", "logging", "math", "numbers", "operator", "pprint", "random", "re",
        "reprlib", "secrets", "statistics", "string", "struct", "textwrap", "time", "typing",
        "unicodedata", "urllib.parse", "uuid", "zlib", "zoneinfo",
    }
)  # fmt: skip

FORBIDDEN_NAMES: Final[frozenset[str]] = frozenset(
    {
        # code execution and the import system
        "eval", "exec", "compile", "__import__", "__build_class__",
        # namespaces and reflection by string
        "globals", "locals", "vars", "dir", "getattr", "setattr", "delattr",
        # I/O, interactive helpers and site's file-reading builtins
        "open", "input", "breakpoint", "help", "exit", "quit", "copyright", "credits",
        "license", "memoryview",
        # module machinery
        "__builtins__", "__loader__", "__spec__", "__file__", "__cached__", "__path__",
    }
)  # fmt: skip

FORBIDDEN_ATTRIBUTES: Final[frozenset[str]] = frozenset(
    {
        # frames, code and function internals (non-dunder spellings)
        "f_back", "f_builtins", "f_code", "f_globals", "f_locals", "f_trace",
        "f_trace_lines", "f_trace_opcodes", "f_lasti", "func_globals", "func_code",
        "func_closure", "func_defaults", "func_dict", "im_func", "im_self", "im_class",
        "cell_contents", "mro",
        # modules that allowed modules import and expose as attributes
        "os", "sys", "builtins", "bltns", "inspect", "types", "io", "importlib",
        "subprocess", "threading", "_thread", "traceback", "linecache", "weakref", "gc",
        "ctypes", "copyreg", "marshal", "pickle", "codecs", "posix", "nt", "signal",
        "socket", "warnings", "tokenize", "atexit", "shutil", "tempfile", "pathlib", "glob",
        "modules", "sysconfig", "site", "runpy", "pkgutil", "zipimport",
        # library functions that reach attributes by string, eval, frames or I/O
        "attrgetter", "methodcaller", "get_type_hints", "ForwardRef", "singledispatch",
        "singledispatchmethod", "Formatter", "get_field", "vformat", "FileHandler",
        "currentframe", "reset_tzpath", "getnode", "uuid1", "chdir",
        # library members that read or write attributes, or evaluate code, by a string they
        # hold (docs/validator.md, "Strings that become attribute reads")
        "update_wrapper", "redirect_stdout", "redirect_stderr", "global_enum", "_convert_",
        "_evaluate", "StrFormatStyle", "make_dataclass",
    }
)  # fmt: skip

FORBIDDEN_ATTRIBUTE_PREFIXES: Final[tuple[str, ...]] = ("co_", "gi_", "cr_", "ag_", "tb_")

# Members of allowed modules refused on that module only (``s.replace`` is fine,
# ``dataclasses.replace`` is not): each turns a run-time string into an attribute read, or
# hands every object it meets to a snippet's hook (docs/validator.md, "The allowlist audit").
MODULE_MEMBERS_FORBIDDEN: Final[dict[str, frozenset[str]]] = {
    # getattr(obj, field.name) for every field: Field.name is writable and a namespace built
    # at run time names fields the validator never sees; Field is the class whose name slot
    # every field shares
    "dataclasses": frozenset({"asdict", "astuple", "replace", "fields", "Field"}),
    # Python 3.13's copy.replace calls __replace__, which dataclasses implement as replace()
    "copy": frozenset({"replace"}),
    # setattr on what dir() finds; of no use to a snippet (no type checker runs)
    "typing": frozenset({"no_type_check", "no_type_check_decorator"}),
    # a subclass's format() hook is handed every object printed (dataclass fields read by
    # name); pprint/pformat/pp/saferepr stay
    "pprint": frozenset({"PrettyPrinter"}),
}

# Members allowed only as the value of an annotated assignment in a class body
# (``tags: list[str] = field(default_factory=list)``), so no reference to the Field it
# returns is kept: its ``name`` is the attribute that generated methods read.
FIELD_ONLY_MEMBERS: Final[dict[str, frozenset[str]]] = {"dataclasses": frozenset({"field"})}

# Members allowed only as the innermost decorator of a class statement (``@dataclass`` or
# ``@dataclass(frozen=True)``): then every field name is a name in that class body, which
# the validator checks. Called on a class built at run time (``type(name, bases, ns)``), it
# would make fields of names the validator never saw.
CLASS_DECORATOR_ONLY_MEMBERS: Final[dict[str, frozenset[str]]] = {
    "dataclasses": frozenset({"dataclass"})
}

# Factories whose string arguments become attribute (field, member) names of the class they
# build: string literals given to them are checked like attribute names.
NAME_FACTORIES: Final = frozenset(
    {"namedtuple", "NamedTuple", "TypedDict", "Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}
)

# Known submodules of packages, so `from pkg import sub` and `pkg.sub` are import checks.
KNOWN_SUBMODULES: Final[dict[str, frozenset[str]]] = {
    "collections": frozenset({"abc"}),
    "logging": frozenset({"config", "handlers"}),
    "json": frozenset({"decoder", "encoder", "scanner", "tool"}),
    "urllib": frozenset({"error", "parse", "request", "response", "robotparser"}),
    "html": frozenset({"entities", "parser"}),
    "concurrent": frozenset({"futures"}),
    "os": frozenset({"path"}),
    "importlib": frozenset({"abc", "machinery", "metadata", "resources", "util"}),
    "xml": frozenset({"dom", "etree", "parsers", "sax"}),
    "email": frozenset({"mime", "parser", "policy", "message", "utils"}),
    "http": frozenset({"client", "cookiejar", "cookies", "server"}),
    "ctypes": frozenset({"util", "wintypes"}),
    "unittest": frozenset({"mock"}),
}

# Modules that allowed modules expose as public attributes (``dataclasses.copy``,
# ``typing.stdlib_re``): reaching one is an import of the real module, which must be allowed.
# Generated from CPython 3.11, 3.12 and 3.13 for the default allowlist; the test suite
# checks it against the running interpreter. Private ones (``random._os``) are refused as
# private module attributes.
MODULE_REEXPORTS: Final[dict[str, dict[str, str]]] = {
    "base64": {"re": "re", "struct": "struct", "binascii": "binascii"},
    "calendar": {"sys": "sys", "datetime": "datetime", "warnings": "warnings"},  # +3.12
    "contextlib": {"abc": "abc", "os": "os", "sys": "sys"},
    "collections.abc": {"sys": "sys"},  # 3.13
    "csv": {"re": "re", "types": "types"},  # types: 3.12+
    "dataclasses": {"re": "re", "sys": "sys", "copy": "copy", "types": "types",
                    "inspect": "inspect", "keyword": "keyword", "builtins": "builtins",
                    "functools": "functools", "itertools": "itertools", "abc": "abc"},
    "datetime": {"sys": "sys"},
    "enum": {"sys": "sys", "bltns": "builtins"},
    "fractions": {"math": "math", "numbers": "numbers", "operator": "operator", "re": "re",
                  "sys": "sys", "functools": "functools"},  # functools: 3.12+
    "ipaddress": {"functools": "functools"},
    "json": {"codecs": "codecs"},
    "logging": {"sys": "sys", "os": "os", "time": "time", "io": "io", "re": "re",
                "traceback": "traceback", "warnings": "warnings", "weakref": "weakref",
                "collections": "collections", "threading": "threading", "atexit": "atexit"},
    "pprint": {"re": "re"},
    "re": {"enum": "enum", "functools": "functools", "copyreg": "copyreg"},
    "reprlib": {"builtins": "builtins"},
    "secrets": {"base64": "base64", "binascii": "binascii"},
    "statistics": {"math": "math", "numbers": "numbers", "random": "random", "sys": "sys"},
    "textwrap": {"re": "re"},
    "typing": {"collections": "collections", "contextlib": "contextlib",
               "functools": "functools", "operator": "operator", "stdlib_re": "re",
               "sys": "sys", "types": "types", "warnings": "warnings",
               "copyreg": "copyreg"},  # copyreg: 3.12+
    "urllib.parse": {"functools": "functools", "re": "re", "sys": "sys", "types": "types",
                     "warnings": "warnings", "ipaddress": "ipaddress",
                     "math": "math"},  # math: 3.12+
    "uuid": {"os": "os", "sys": "sys", "platform": "platform"},
}

# Builtins whose class pattern matches the subject itself: `case int(n)` binds the int.
# Every other class pattern reads, per positional sub-pattern, the attribute named by the
# class's __match_args__ (a run-time string): positional sub-patterns are refused there.
SELF_MATCHING_BUILTINS: Final = frozenset(
    {"bool", "bytearray", "bytes", "dict", "float", "frozenset", "int", "list", "set", "str",
     "tuple"}
)  # fmt: skip

# Dunder names a snippet may define (def, class) or, in a class body, assign: the hooks of
# Python's operators and protocols. Not: what metaclasses, dataclasses, pickle and copy read
# from a class (__module__, __annotations__, __dataclass_fields__, __reduce_ex__, ...).
SPECIAL_METHODS: Final = frozenset(
    {
        "__init__", "__new__", "__del__", "__repr__", "__str__", "__bytes__", "__format__",
        "__hash__", "__bool__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
        "__getattr__", "__getattribute__", "__setattr__", "__delattr__", "__dir__",
        "__get__", "__set__", "__delete__", "__set_name__", "__init_subclass__",
        "__class_getitem__", "__subclasshook__", "__call__", "__len__", "__length_hint__",
        "__getitem__", "__setitem__", "__delitem__", "__missing__", "__iter__", "__next__",
        "__reversed__", "__contains__", "__neg__", "__pos__", "__abs__", "__invert__",
        "__complex__", "__int__", "__float__", "__index__", "__round__", "__trunc__",
        "__floor__", "__ceil__", "__enter__", "__exit__", "__aenter__", "__aexit__",
        "__await__", "__aiter__", "__anext__", "__post_init__", "__sizeof__", "__fspath__",
        *(f"__{p}{op}__" for op in (
            "add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "pow",
            "lshift", "rshift", "and", "xor", "or") for p in ("", "r", "i")),
    }
)  # fmt: skip
CLASS_DUNDERS_OK: Final = SPECIAL_METHODS | {"__slots__", "__match_args__", "__doc__"}

# Names allowed only as a direct call with exactly this many positional arguments and no
# keywords (``@wraps(func)``): any other use could pass attribute names as strings.
CALL_ONLY_NAMES: Final[dict[str, int]] = {"wraps": 1}

DUNDER_LOADS_OK: Final = frozenset({"__name__", "__debug__", "__doc__", "__all__", "__version__"})
DUNDER_STORES_OK: Final = frozenset({"__all__", "__version__", "__author__", "__doc__"})
DUNDER_ATTRS_OK: Final = frozenset({"__name__", "__qualname__", "__doc__"})
SUPER_DUNDERS_OK: Final = frozenset(
    {
        "__init__", "__new__", "__init_subclass__", "__post_init__", "__repr__", "__str__",
        "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__iter__",
        "__next__", "__len__", "__getitem__", "__setitem__", "__delitem__", "__contains__",
        "__call__", "__enter__", "__exit__", "__bool__",
    }
)  # fmt: skip
BASIC_CONFIG_KEYWORDS: Final = frozenset({"filename", "filemode", "style", "handlers", "stream"})
SCOPES: Final = (
    ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
    ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
)  # fmt: skip
_FORMATTER: Final = string.Formatter()

def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def attribute_forbidden(name: str) -> bool:
    return name in FORBIDDEN_ATTRIBUTES or name.startswith(FORBIDDEN_ATTRIBUTE_PREFIXES)


def nfkc(text: str) -> str:
    return text if text.isascii() else unicodedata.normalize("NFKC", text)






def format_problem(template: str, depth: int) -> str | None:
    """The first forbidden part of a replacement-field path in a format template, if any."""
    if "{" not in template or depth > 2:
        return None
    try:
        parsed = list(_FORMATTER.parse(template))
    except Exception:  # not a valid template: .format() would raise, nothing to reach
        return None
    for _literal, field, spec, _conversion in parsed:
        if field:
            for part in field.replace("[", ".").replace("]", ".").split("."):
                for name in (part, nfkc(part)):
                    if is_dunder(name) or attribute_forbidden(name) or name in FORBIDDEN_NAMES:
                        return part
        if spec:
            bad = format_problem(spec, depth + 1)
            if bad is not None:
                return bad
    return None


def annotation_problem(node: ast.expr, depth: int) -> ast.expr | None:
    """The first node of an annotation that is not a type expression, or None."""
    if depth > 3:
        return node
    if isinstance(node, ast.Name):
        return None
    if isinstance(node, ast.Attribute):
        return annotation_problem(node.value, depth)
    if isinstance(node, ast.Constant):
        if node.value is None or node.value is Ellipsis:
            return None
        if isinstance(node.value, str):
            try:
                inner = ast.parse(node.value.strip(), mode="eval").body
            except Exception:
                return node
            return node if annotation_problem(inner, depth + 1) is not None else None
        return node
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return annotation_problem(node.left, depth) or annotation_problem(node.right, depth)
    if isinstance(node, ast.Subscript):
        bad = annotation_problem(node.value, depth)
        if bad is not None:
            return bad
        head = node.value.attr if isinstance(node.value, ast.Attribute) else None
        if isinstance(node.value, ast.Name):
            head = node.value.id
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Literal":
            return None  # literal values are data, never evaluated as code by typing
        if head == "Annotated":
            args = args[:1]  # metadata is ordinary run-time code, checked by the other rules
        for arg in args:
            elts = arg.elts if isinstance(arg, ast.List) else [arg]
            for elt in elts:
                bad = annotation_problem(elt, depth)
                if bad is not None:
                    return bad
        return None
    return node


def confusable_identifiers(source: str) -> Iterator[tuple[int, int, str, str]]:
    """NAME tokens whose raw spelling differs from the NFKC form Python reads."""
    import tokenize  # only for non-ASCII sources; keeps the common path import-light

    pieces = source.split("\n")
    lines = iter([p + "\n" for p in pieces[:-1]] + [pieces[-1]])
    try:
        for tok in tokenize.generate_tokens(lambda: next(lines, "")):
            if tok.type == tokenize.NAME and not tok.string.isascii():
                norm = unicodedata.normalize("NFKC", tok.string)
                if norm != tok.string:
                    yield tok.start[0], tok.start[1], tok.string, norm
    except Exception:  # the AST already parsed; a tokenizer disagreement is not fatal
        return
