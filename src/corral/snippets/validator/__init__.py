"""Pure AST allow-list for Python snippets: source in, violations out.

:func:`validate_source` parses one source string and reports every rule it
breaks as a :class:`Violation` (stable kebab-case code, 1-based line, 0-based
column counted in characters, message, file path). :func:`validate_files`
does the same for each file of a multi-file payload and also checks the paths.
Neither ever raises for any input string: a syntax error, null bytes, lone
surrogates or a parser blow-up are violations too.

The validator is defense in depth in front of the strict sandbox, never the
only boundary: Python is too dynamic for a static check to be complete (an
alias such as ``t = type(type(1))`` is not tracked). See ``docs/validator.md``
for every rule and the reason for each choice.

This module is pure: no I/O imports (``ast``, ``tokenize``, ``string``,
``unicodedata``, ``keyword`` and reading the constant ``sys.stdlib_module_names``).
"""

from __future__ import annotations

import ast
import keyword
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, final

from corral.snippets.validator import rules as _rules
from corral.snippets.validator.policy import (
    DEFAULT_ALLOWED_IMPORTS as DEFAULT_ALLOWED_IMPORTS,
    FORBIDDEN_ATTRIBUTE_PREFIXES as FORBIDDEN_ATTRIBUTE_PREFIXES,
    FORBIDDEN_ATTRIBUTES as FORBIDDEN_ATTRIBUTES,
    FORBIDDEN_NAMES as FORBIDDEN_NAMES,
)

__all__ = [
    "DEFAULT_ALLOWED_IMPORTS",
    "DEFAULT_MAX_AST_DEPTH",
    "DEFAULT_MAX_SOURCE_BYTES",
    "FORBIDDEN_ATTRIBUTES",
    "FORBIDDEN_ATTRIBUTE_PREFIXES",
    "FORBIDDEN_NAMES",
    "Violation",
    "ViolationCode",
    "validate_files",
    "validate_source",
]

DEFAULT_MAX_SOURCE_BYTES: Final = 256 * 1024
"""Largest source accepted per file, in UTF-8 bytes."""

DEFAULT_MAX_AST_DEPTH: Final = 200
"""Deepest AST nesting accepted (deeper trees can crash the compiler)."""


class ViolationCode(StrEnum):
    """The closed set of violation codes (documented in docs/validator.md)."""

    SYNTAX_ERROR = "syntax-error"
    SOURCE_TOO_LARGE = "source-too-large"
    SOURCE_TOO_COMPLEX = "source-too-complex"
    INVALID_PATH = "invalid-path"
    FORBIDDEN_IMPORT = "forbidden-import"
    STAR_IMPORT = "star-import"
    UNRESOLVED_RELATIVE_IMPORT = "unresolved-relative-import"
    FORBIDDEN_NAME = "forbidden-name"
    DUNDER_NAME = "dunder-name"
    FORBIDDEN_ATTRIBUTE = "forbidden-attribute"
    DUNDER_ATTRIBUTE = "dunder-attribute"
    PRIVATE_MODULE_ATTRIBUTE = "private-module-attribute"
    DUNDER_SUBSCRIPT = "dunder-subscript"
    FORMAT_STRING_ESCAPE = "format-string-escape"
    DYNAMIC_FORMAT = "dynamic-format"
    DYNAMIC_CLASS = "dynamic-class"
    FORBIDDEN_KEYWORD = "forbidden-keyword"
    NON_TYPE_ANNOTATION = "non-type-annotation"
    NON_ASCII_IDENTIFIER = "non-ascii-identifier"
    POSITIONAL_PATTERN = "positional-pattern"
    MODULE_VALUE = "module-value"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """One broken rule. ``line`` is 1-based (0 = the whole file), ``column`` 0-based characters."""

    code: ViolationCode
    line: int
    column: int
    message: str
    path: str = "main.py"


def validate_source(
    source: str,
    *,
    allowed_imports: frozenset[str] | None = None,
    max_source_bytes: int = DEFAULT_MAX_SOURCE_BYTES,
    module_names: frozenset[str] = frozenset(),
    max_ast_depth: int = DEFAULT_MAX_AST_DEPTH,
) -> tuple[Violation, ...]:
    """Validate one snippet; return its violations sorted by (line, column), empty if clean.

    ``module_names`` are the other modules of a multi-file payload (``{"helpers", "pkg",
    "pkg.sub"}``); they may be imported, relative imports included. The source is treated as
    a top-level module (``main.py``).
    """
    return _validate_one(
        source,
        path="main.py",
        package=(),
        allowed=DEFAULT_ALLOWED_IMPORTS if allowed_imports is None else allowed_imports,
        max_source_bytes=max_source_bytes,
        module_names=module_names,
        max_ast_depth=max_ast_depth,
    )


def validate_files(
    files: Sequence[tuple[str, str]] | Mapping[str, str],
    *,
    allowed_imports: frozenset[str] | None = None,
    max_source_bytes: int = DEFAULT_MAX_SOURCE_BYTES,
    max_ast_depth: int = DEFAULT_MAX_AST_DEPTH,
    trees: dict[str, ast.Module] | None = None,
) -> tuple[Violation, ...]:
    """Validate every file of a payload (``[(path, source), ...]`` or ``{path: source}``).

    Paths are relative POSIX paths of ``.py`` files that name importable modules
    (``main.py``, ``helpers.py``, ``pkg/__init__.py``, ``pkg/sub.py``). The payload's modules
    may import each other. Violations carry the file path, sorted by (path, line, column).
    ``trees``: when given, each file that parsed gets its tree there, by path (for a caller
    that needs more of the source's shape, so it is not parsed twice).
    """
    items = list(files.items()) if isinstance(files, Mapping) else list(files)
    out: list[Violation] = []
    modules: dict[str, tuple[str, ...]] = {}  # path -> module parts
    seen_modules: set[tuple[str, ...]] = set()
    seen_paths: set[str] = set()
    for path, _source in items:
        where = path if isinstance(path, str) else repr(path)
        problem, parts = _module_parts(path)
        if problem is None and where in seen_paths:
            problem = "duplicate path"
        if problem is None and parts in seen_modules:
            problem = f"module {'.'.join(parts)!r} is defined twice"
        seen_paths.add(where)
        if problem is not None:
            out.append(_whole_file(ViolationCode.INVALID_PATH, f"invalid path: {problem}", where))
            continue
        modules[where] = parts
        seen_modules.add(parts)
    names: set[str] = set()
    for parts in seen_modules:
        names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    allowed = DEFAULT_ALLOWED_IMPORTS if allowed_imports is None else allowed_imports
    for path, source in items:
        where = path if isinstance(path, str) else repr(path)
        parts = modules.get(where, ("main",))
        is_package = where.endswith("/__init__.py")
        out.extend(
            _validate_one(
                source if isinstance(source, str) else "",
                path=where,
                package=parts if is_package else parts[:-1],
                allowed=allowed,
                max_source_bytes=max_source_bytes,
                module_names=frozenset(names),
                max_ast_depth=max_ast_depth,
                trees=trees,
            )
        )
    return tuple(sorted(out, key=_sort_key))


def _sort_key(v: Violation) -> tuple[str, int, int, str, str]:
    return (v.path, v.line, v.column, v.code.value, v.message)


def _whole_file(code: ViolationCode, message: str, path: str) -> Violation:
    return Violation(code=code, line=0, column=0, message=message, path=path)


def _module_parts(path: object) -> tuple[str | None, tuple[str, ...]]:
    """(problem or None, module parts) for a payload path."""
    if not isinstance(path, str) or not path:
        return "path must be a non-empty string", ()
    if path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        return "absolute paths are not allowed", ()
    if "\\" in path:
        return "use '/' as the separator", ()
    segments = path.split("/")
    if ".." in segments:
        return "'..' is not allowed", ()
    if any(s in ("", ".") for s in segments):
        return "empty or '.' path segment", ()
    if not path.endswith(".py"):
        return "only .py files are allowed", ()
    segments[-1] = segments[-1][: -len(".py")]
    parts = tuple(segments[:-1]) if segments[-1] == "__init__" else tuple(segments)
    if not parts:
        return "a top-level __init__.py names no module", ()
    for part in parts:
        if not (part.isascii() and part.isidentifier()) or keyword.iskeyword(part):
            return f"{part!r} is not a valid module name", ()
        if part.startswith("__"):
            return f"{part!r}: dunder module names are reserved", ()
    if parts[0] in sys.stdlib_module_names:
        return f"{parts[0]!r} would shadow the standard-library module", ()
    return None, parts


def _validate_one(
    source: str,
    *,
    path: str,
    package: tuple[str, ...],
    allowed: frozenset[str],
    max_source_bytes: int,
    module_names: frozenset[str],
    max_ast_depth: int,
    trees: dict[str, ast.Module] | None = None,
) -> tuple[Violation, ...]:
    size = len(source)
    if size > max_source_bytes or (
        size * 4 > max_source_bytes
        and len(source.encode("utf-8", "surrogatepass")) > max_source_bytes
    ):
        return (
            _whole_file(
                ViolationCode.SOURCE_TOO_LARGE,
                f"source is larger than {max_source_bytes} bytes (UTF-8)",
                path,
            ),
        )
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        line = exc.lineno or 1
        col = max((exc.offset or 1) - 1, 0)
        return (
            Violation(
                code=ViolationCode.SYNTAX_ERROR,
                line=line,
                column=col,
                message=f"syntax error: {exc.msg}",
                path=path,
            ),
        )
    except (RecursionError, MemoryError):
        return (
            _whole_file(
                ViolationCode.SOURCE_TOO_COMPLEX, "source nests too deeply to parse", path
            ),
        )
    except Exception as exc:  # null bytes, lone surrogates, ...
        line, col = _first_bad_char(source)
        return (
            Violation(
                code=ViolationCode.SYNTAX_ERROR,
                line=line,
                column=col,
                message=f"source cannot be parsed: {exc}",
                path=path,
            ),
        )
    if trees is not None:
        trees[path] = tree
    found = _rules.check_tree(
        tree,
        source,
        allowed=allowed,
        module_names=module_names,
        package=package,
        max_depth=max_ast_depth,
    )
    return tuple(
        sorted(
            (
                Violation(code=ViolationCode(code), line=line, column=col, message=msg, path=path)
                for code, line, col, msg in found
            ),
            key=_sort_key,
        )
    )


def _first_bad_char(source: str) -> tuple[int, int]:
    """Position of the first NUL or lone surrogate (what ``ast.parse`` refuses)."""
    line, col = 1, 0
    for ch in source:
        if ch == "\0" or "\ud800" <= ch <= "\udfff":
            return line, col
        if ch == "\n":
            line, col = line + 1, 0
        else:
            col += 1
    return 1, 0
