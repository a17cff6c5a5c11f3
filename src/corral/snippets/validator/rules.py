"""The validator's AST checker (internal; see validate.py).

Pure: no I/O imports. The walk is iterative so a deep tree cannot overflow the
Python stack; depth beyond the cap is reported, not followed.
"""

from __future__ import annotations

import ast
import sys

from corral.snippets.validator.policy import (
    BASIC_CONFIG_KEYWORDS,
    CALL_ONLY_NAMES,
    CLASS_DECORATOR_ONLY_MEMBERS,
    CLASS_DUNDERS_OK,
    DUNDER_ATTRS_OK,
    DUNDER_LOADS_OK,
    DUNDER_STORES_OK,
    FIELD_ONLY_MEMBERS,
    FORBIDDEN_NAMES,
    KNOWN_SUBMODULES,
    MODULE_MEMBERS_FORBIDDEN,
    MODULE_REEXPORTS,
    NAME_FACTORIES,
    SCOPES,
    SELF_MATCHING_BUILTINS,
    SPECIAL_METHODS,
    SUPER_DUNDERS_OK,
    annotation_problem,
    attribute_forbidden,
    confusable_identifiers,
    format_problem,
    is_dunder,
    nfkc,
)

__all__ = ["Found", "check_tree"]

Found = tuple[str, int, int, str]

#: Bases that make a class a metaclass (it would decide isinstance and build classes from
#: run-time strings when called with (name, bases, namespace)).
_METACLASS_BASES = frozenset({"type", "ABCMeta", "EnumMeta", "EnumType"})
#: Class-body names whose string values become attribute names of the class's instances.
_NAME_LISTS = frozenset({"__slots__", "__match_args__"})
#: The node types each pass looks at (most nodes, contexts and operators included, are none
#: of these: one set lookup instead of a chain of isinstance calls).
_PREPARE_KINDS: frozenset[type] = frozenset({
    ast.Import, ast.ImportFrom, ast.Attribute, ast.FunctionDef, ast.AsyncFunctionDef,
    ast.ClassDef, ast.Name, ast.arg, ast.alias, ast.ExceptHandler, ast.MatchAs, ast.MatchStar,
    ast.MatchMapping, ast.Global, ast.Nonlocal,
})
_VISIT_KINDS: frozenset[type] = frozenset({
    ast.Name, ast.Attribute, ast.Import, ast.ImportFrom, ast.Call, ast.Subscript, ast.Constant,
    ast.Dict, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.arg, ast.AnnAssign,
    ast.ExceptHandler, ast.Global, ast.Nonlocal, ast.MatchAs, ast.MatchStar, ast.MatchMapping,
    ast.MatchClass,
})


def check_tree(
    tree: ast.Module,
    source: str,
    *,
    allowed: frozenset[str],
    module_names: frozenset[str],
    package: tuple[str, ...],
    max_depth: int,
) -> list[Found]:
    checker = _Checker(source, allowed, module_names, package, max_depth)
    checker.run(tree)
    return checker.found


class _Checker:
    def __init__(
        self,
        source: str,
        allowed: frozenset[str],
        module_names: frozenset[str],
        package: tuple[str, ...],
        max_depth: int,
    ) -> None:
        self.source = source
        self.lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self.allowed = allowed
        self.module_names = module_names
        self.package = package
        self.max_depth = max_depth
        self.found: list[Found] = []
        self.modules: dict[str, str] = {}  # local name -> dotted module it is bound to
        self.receivers: set[int] = set()  # ids of expressions used as `expr.attr`
        self.bound: set[str] = set()  # every name bound anywhere in the file
        self.call_ok: set[int] = set()  # ids of call-only names used in an allowed call
        self.members: dict[str, tuple[str, str]] = {}  # local name -> (module, member)
        self.field_ok: set[int] = set()  # ids of field-only members used as a class field
        self.decorator_ok: set[int] = set()  # ids of class-decorator-only members so used
        self.classes: list[ast.ClassDef] = []

    # -- helpers ---------------------------------------------------------------

    def add(self, code: str, node: ast.AST | None, message: str) -> None:
        line = getattr(node, "lineno", 1) if node is not None else 1
        col = getattr(node, "col_offset", 0) if node is not None else 0
        self.found.append((code, line, self._char_col(line, col), message))

    def _char_col(self, line: int, byte_col: int) -> int:
        """ast columns count UTF-8 bytes; report characters."""
        if not 1 <= line <= len(self.lines):
            return byte_col
        text = self.lines[line - 1]
        if text.isascii():
            return byte_col
        return len(text.encode("utf-8", "surrogatepass")[:byte_col].decode("utf-8", "ignore"))

    def import_allowed(self, dotted: str) -> bool:
        top = dotted.partition(".")[0]
        if top not in sys.stdlib_module_names and dotted in self.module_names:
            return True
        if dotted in self.allowed:
            return True
        parts = dotted.split(".")
        return any(".".join(parts[:i]) + ".*" in self.allowed for i in range(1, len(parts) + 1))

    def is_payload(self, dotted: str) -> bool:
        return dotted.partition(".")[0] not in sys.stdlib_module_names and (
            dotted in self.module_names
        )

    # -- driver ------------------------------------------------------------------

    def run(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            self.prepare(node)
        for cls in self.classes:
            self.prepare_class(cls)
        stack: list[tuple[ast.AST, int, bool]] = [(tree, 0, False)]
        too_deep = False
        while stack:
            node, depth, in_class = stack.pop()
            if depth > self.max_depth:
                if not too_deep:
                    too_deep = True
                    self.add(
                        "source-too-complex",
                        node,
                        f"syntax tree nests deeper than {self.max_depth} levels",
                    )
                continue
            self.visit(node, in_class)
            if isinstance(node, ast.ClassDef):
                child_class = True
            elif isinstance(node, SCOPES):
                child_class = False
            else:
                child_class = in_class
            for child in ast.iter_child_nodes(node):
                stack.append((child, depth + 1, child_class))
        self.check_identifiers()

    def prepare(self, node: ast.AST) -> None:
        """First pass: module bindings, attribute receivers, bound names, allowed calls."""
        kind = type(node)
        if kind not in _PREPARE_KINDS:
            return
        if kind is ast.Name:
            if type(node.ctx) is not ast.Load:  # type: ignore[attr-defined]
                self.bound.add(node.id)  # type: ignore[attr-defined]
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.modules[alias.asname] = alias.name
                else:
                    top = alias.name.partition(".")[0]
                    self.modules[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = self.from_base(node)
            for alias in node.names:
                if base is None or alias.name == "*":
                    continue
                sub = f"{base}.{alias.name}" if base else alias.name
                real = MODULE_REEXPORTS.get(base, {}).get(alias.name)
                if alias.name in KNOWN_SUBMODULES.get(base, ()) or self.is_payload(sub):
                    self.modules[alias.asname or alias.name] = sub
                elif real is not None:
                    self.modules[alias.asname or alias.name] = real
                else:
                    self.members[alias.asname or alias.name] = (base, alias.name)
        elif isinstance(node, ast.Attribute):
            self.receivers.add(id(node.value))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            # call-only names (wraps) only as a decorator of a def: @wraps(func)
            for deco in node.decorator_list:
                if not isinstance(deco, ast.Call):
                    continue
                wanted = CALL_ONLY_NAMES.get(_callee_name(deco.func) or "")
                if wanted is not None and len(deco.args) == wanted and not deco.keywords and \
                        not any(isinstance(a, ast.Starred) for a in deco.args):
                    self.call_ok.add(id(deco.func))
        elif isinstance(node, ast.ClassDef):
            self.classes.append(node)
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            self.bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.bound.add(node.name)
        elif isinstance(node, ast.arg):
            self.bound.add(node.arg)
        elif isinstance(node, ast.alias):
            self.bound.add((node.asname or node.name).partition(".")[0])
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            self.bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            self.bound.add(node.rest)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            self.bound.update(node.names)

    def prepare_class(self, node: ast.ClassDef) -> None:
        """Class-decorator-only members (``@dataclass``) as the innermost decorator; then
        field-only members (``field(...)``) as the value of the class's annotated fields."""
        if not node.decorator_list:
            return
        inner = node.decorator_list[-1]
        head = inner.func if isinstance(inner, ast.Call) else inner
        if not isinstance(head, ast.Name | ast.Attribute):
            return
        member = self.member_of(head)
        if member is None or member[1] not in CLASS_DECORATOR_ONLY_MEMBERS.get(member[0], ()):
            return
        self.decorator_ok.add(id(head))
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.value, ast.Call):
                self.field_ok.add(id(stmt.value.func))

    def from_base(self, node: ast.ImportFrom) -> str | None:
        """The module a ``from`` import reads from ("" for ``from . import x`` at the top)."""
        if node.level == 0:
            return node.module
        up = node.level - 1
        if up > len(self.package):
            return None
        parts = list(self.package[: len(self.package) - up])
        if node.module:
            parts.extend(node.module.split("."))
        return ".".join(parts)

    def visit(self, node: ast.AST, in_class: bool) -> None:
        if type(node) not in _VISIT_KINDS:
            return
        if isinstance(node, ast.Name):
            self.check_name(node, in_class)
            if in_class and not isinstance(node.ctx, ast.Load):
                self.check_class_attribute(node.id, node)
        elif isinstance(node, ast.Attribute):
            self.check_attribute(node)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            self.check_import(node)
        elif isinstance(node, ast.Call):
            self.check_call(node)
        elif isinstance(node, ast.Subscript):
            idx = node.slice
            if (
                isinstance(idx, ast.Constant)
                and isinstance(idx.value, str)
                and (is_dunder(idx.value) or is_dunder(nfkc(idx.value)))
            ):
                self.add("dunder-subscript", node, f"subscript with dunder key {idx.value!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            bad = format_problem(node.value, 0)
            if bad is not None:
                self.add(
                    "format-string-escape",
                    node,
                    f"format template reaches forbidden field {bad!r}",
                )
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and (
                    is_dunder(key.value) or is_dunder(nfkc(key.value))
                ):
                    self.add("dunder-subscript", key, f"dunder string key {key.value!r}")
                elif isinstance(key, ast.Constant) and key.value == "_root":
                    self.add("forbidden-keyword", key, "the key '_root' (typing's sentinel "
                             "for subclassing its aliases) is not allowed")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.check_binding(node.name, node, allow_dunder=True)
            if in_class:
                self.check_class_attribute(node.name, node)
            if isinstance(node, ast.ClassDef):
                self.check_class(node)
            else:
                self.check_annotation(node.returns)
        elif isinstance(node, ast.arg):
            self.check_binding(node.arg, node, allow_dunder=False)
            self.check_annotation(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            self.check_annotation(node.annotation)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            self.check_binding(node.name, node, allow_dunder=False)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for name in node.names:
                self.check_binding(name, node, allow_dunder=False)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            self.check_binding(node.name, node, allow_dunder=False)
            if in_class:
                self.check_class_attribute(node.name, node)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            self.check_binding(node.rest, node, allow_dunder=False)
            if in_class:
                self.check_class_attribute(node.rest, node)
        elif isinstance(node, ast.MatchClass):
            for attr in node.kwd_attrs:
                self.check_pattern_keyword(attr, node)
            cls = node.cls
            if node.patterns and not (
                isinstance(cls, ast.Name)
                and cls.id in SELF_MATCHING_BUILTINS
                and cls.id not in self.bound
                and len(node.patterns) == 1
            ):
                self.add(
                    "positional-pattern",
                    node,
                    "positional sub-patterns read the attributes named by the class's "
                    "__match_args__ at run time; use keywords: case Point(x=x, y=y)",
                )

    # -- names -----------------------------------------------------------------

    def check_name(self, node: ast.Name, in_class: bool) -> None:
        name = node.id
        if name in FORBIDDEN_NAMES:
            self.add("forbidden-name", node, f"name {name!r} is not allowed")
        elif is_dunder(name):
            if isinstance(node.ctx, ast.Load):
                ok = name in DUNDER_LOADS_OK
            else:
                ok = name in DUNDER_STORES_OK or (in_class and name in CLASS_DUNDERS_OK)
            if not ok:
                self.add("dunder-name", node, f"dunder name {name!r} is not allowed here")
        if isinstance(node.ctx, ast.Load):
            self.check_use(node, name)

    def check_use(self, node: ast.Name | ast.Attribute, name: str) -> None:
        """A module may only be the receiver of an attribute; a call-only name only called."""
        if id(node) not in self.receivers:
            module = self.module_of(node)
            if module is not None and (self.is_payload(module) or self.import_allowed(module)):
                self.add_at_attr(
                    "module-value",
                    node,
                    name,
                    f"module {module!r} may only be used as `{name}.attribute` (not stored, "
                    "passed, returned or matched)",
                )
        if name in CALL_ONLY_NAMES and id(node) not in self.call_ok:
            self.add_at_attr(
                "forbidden-attribute",
                node,
                name,
                f"{name!r} is allowed only as a decorator of a def with "
                f"{CALL_ONLY_NAMES[name]} positional argument(s), e.g. @{name}(func)",
            )
        member = self.member_of(node)
        if member is None:
            return
        module, attr = member
        if attr in MODULE_MEMBERS_FORBIDDEN.get(module, ()):
            self.add_at_attr(
                "forbidden-attribute",
                node,
                name,
                f"{module}.{attr} is not allowed (it reads or writes attributes by a run-time "
                "string; docs/validator.md, \"The allowlist audit\")",
            )
        elif attr in FIELD_ONLY_MEMBERS.get(module, ()) and id(node) not in self.field_ok:
            self.add_at_attr(
                "forbidden-attribute",
                node,
                name,
                f"{module}.{attr}(...) is allowed only as a field's value in a dataclass "
                f"body (`x: list = {attr}(default_factory=list)`)",
            )
        elif attr in CLASS_DECORATOR_ONLY_MEMBERS.get(module, ()) and \
                id(node) not in self.decorator_ok:
            self.add_at_attr(
                "forbidden-attribute",
                node,
                name,
                f"{module}.{attr} is allowed only as the innermost decorator of a class "
                f"statement (@{attr} or @{attr}(...)): its fields are then names in the body",
            )

    def member_of(self, node: ast.Name | ast.Attribute) -> tuple[str, str] | None:
        """(module, member) when ``node`` names a member of an imported module."""
        if isinstance(node, ast.Name):
            return self.members.get(node.id)
        module = self.module_of(node.value)
        return None if module is None else (module, node.attr)

    def check_binding(self, name: str, node: ast.AST, *, allow_dunder: bool) -> None:
        if name in FORBIDDEN_NAMES:
            self.add("forbidden-name", node, f"binding the name {name!r} is not allowed")
        elif is_dunder(name) and (not allow_dunder or name not in SPECIAL_METHODS):
            self.add("dunder-name", node, f"binding the dunder name {name!r} is not allowed")

    def check_class_attribute(self, name: str, node: ast.AST) -> None:
        """A name bound in a class body is an attribute name: dataclass and NamedTuple fields
        (read back by name), methods, class attributes."""
        for spelling in {name, nfkc(name)}:
            if attribute_forbidden(spelling):
                self.add("forbidden-attribute", node, f"class attribute {spelling!r} is not "
                         "allowed (a class-body name becomes an attribute name)")
                return

    def check_class(self, node: ast.ClassDef) -> None:
        for kw in node.keywords:
            if kw.arg is None or kw.arg == "metaclass":
                what = "metaclass=" if kw.arg else "**keywords"
                self.add("forbidden-keyword", kw, f"class keyword {what} is not allowed")
            elif kw.arg.startswith("_"):
                self.add("forbidden-keyword", kw, f"private class keyword {kw.arg}= is not "
                         "allowed (_root=True subclasses typing's attribute-relaying aliases)")
        for base in node.bases:
            head = base.func if isinstance(base, ast.Call) else base
            if _callee_name(head) in _METACLASS_BASES:
                self.add("dynamic-class", base, "a class derived from a metaclass is "
                         "a metaclass (it builds classes from run-time strings)")
            elif isinstance(base, ast.Call) and _callee_name(base.func) == "type":
                self.add("dynamic-class", base, "a base computed by type(...) (the class of "
                         "a value, e.g. an alias type that relays attribute reads)")
        for stmt in node.body:
            targets: list[ast.expr] = []
            if isinstance(stmt, ast.Assign):
                targets, value = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, value = [stmt.target], stmt.value
            if not any(isinstance(t, ast.Name) and t.id in _NAME_LISTS for t in targets):
                continue
            for sub in ast.walk(value):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    self.check_string_name(sub.value, sub)

    def check_string_name(self, text: str, node: ast.AST) -> None:
        """A string that becomes an attribute name (``__slots__``, namedtuple fields)."""
        for part in text.replace(",", " ").split():
            for spelling in {part, nfkc(part)}:
                if is_dunder(spelling) or attribute_forbidden(spelling):
                    self.add("forbidden-attribute", node,
                             f"{spelling!r} would become an attribute name")
                    return

    def check_pattern_keyword(self, attr: str, node: ast.MatchClass) -> None:
        """``case C(name=p)`` reads ``subject.name`` from whatever the subject is: the rules
        of ``expr.name`` whose receiver is unknown."""
        before = len(self.found)
        self.check_attr_name(attr, node, receiver=None)
        if len(self.found) > before:
            return
        if attr in ("format", "format_map"):
            self.add("dynamic-format", node, f"a keyword pattern may not bind .{attr} (a "
                     "template built at run time can reach attributes)")
        elif attr in CALL_ONLY_NAMES:
            self.add("forbidden-attribute", node, f"a keyword pattern may not bind {attr!r}")
        elif attr.startswith("_") and not is_dunder(attr):
            self.add("private-module-attribute", node, f"a keyword pattern may not read the "
                     f"private attribute {attr!r} (the subject may be a module)")
        elif any(attr in names for names in MODULE_REEXPORTS.values()) or any(
            attr in names for names in MODULE_MEMBERS_FORBIDDEN.values()
        ):
            self.add("module-value", node, f"a keyword pattern may not bind {attr!r} (a "
                     "module, or a module member that is not allowed, on a module subject)")

    # -- attributes --------------------------------------------------------------

    def check_attribute(self, node: ast.Attribute) -> None:
        self.check_attr_name(node.attr, node, receiver=node.value)
        if isinstance(node.ctx, ast.Load):
            self.check_use(node, node.attr)
        elif self.module_of(node.value) is not None:
            self.add_at_attr(
                "module-value",
                node,
                node.attr,
                "assigning or deleting a module's attributes is not allowed",
            )
        if node.attr in ("format", "format_map") and not (
            isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        ):
            self.add_at_attr(
                "dynamic-format",
                node,
                node.attr,
                f".{node.attr} is allowed only on a string literal (templates built at run "
                "time can reach attributes)",
            )
        module = self.module_of(node.value)
        if module is not None and not self.is_payload(module):
            sub = f"{module}.{node.attr}"
            real = MODULE_REEXPORTS.get(module, {}).get(node.attr)
            if node.attr in KNOWN_SUBMODULES.get(module, ()):
                if not self.import_allowed(sub):
                    self.add_at_attr(
                        "forbidden-import", node, node.attr, f"module {sub!r} is not allowed"
                    )
            elif real is not None and not attribute_forbidden(node.attr):
                if not self.import_allowed(real):
                    self.add_at_attr(
                        "forbidden-import",
                        node,
                        node.attr,
                        f"{sub!r} is the module {real!r}, which is not allowed",
                    )
            elif node.attr.startswith("_") and not is_dunder(node.attr):
                self.add_at_attr(
                    "private-module-attribute",
                    node,
                    node.attr,
                    f"private module attribute {sub!r}",
                )

    def add_at_attr(self, code: str, node: ast.AST, attr: str, message: str) -> None:
        """Report at the attribute name itself (``a.__class__``: the column of ``__class__``)."""
        end_line = getattr(node, "end_lineno", None)
        end_col = getattr(node, "end_col_offset", None)
        if not isinstance(node, ast.Attribute) or end_line is None or end_col is None:
            self.add(code, node, message)
            return
        start = max(end_col - len(attr.encode("utf-8")), 0)
        self.found.append((code, end_line, self._char_col(end_line, start), message))

    def check_attr_name(self, attr: str, node: ast.AST, *, receiver: ast.expr | None) -> None:
        for name in {attr, nfkc(attr)}:
            if is_dunder(name):
                if name in DUNDER_ATTRS_OK:
                    continue
                if name in SUPER_DUNDERS_OK and _is_super_call(receiver):
                    continue
                self.add_at_attr(
                    "dunder-attribute", node, attr, f"dunder attribute {name!r} is not allowed"
                )
                return
            if attribute_forbidden(name):
                self.add_at_attr(
                    "forbidden-attribute", node, attr, f"attribute {name!r} is not allowed"
                )
                return

    def module_of(self, expr: ast.expr) -> str | None:
        """The module an expression certainly names (``json``, ``collections.abc``,
        ``typing.stdlib_re``), or None."""
        if isinstance(expr, ast.Name):
            return self.modules.get(expr.id)
        if isinstance(expr, ast.Attribute):
            parent = self.module_of(expr.value) if _chain_depth(expr) < 16 else None
            if parent is None:
                return None
            sub = f"{parent}.{expr.attr}"
            if expr.attr in KNOWN_SUBMODULES.get(parent, ()) or self.is_payload(sub):
                return sub
            return MODULE_REEXPORTS.get(parent, {}).get(expr.attr)
        return None

    # -- imports -----------------------------------------------------------------

    def check_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not self.import_allowed(alias.name):
                    self.add("forbidden-import", node, f"import of {alias.name!r} is not allowed")
                if alias.asname:
                    self.check_binding(alias.asname, node, allow_dunder=False)
            return
        star = any(a.name == "*" for a in node.names)
        if star:
            self.add("star-import", node, "'from ... import *' is not allowed")
        if node.level:
            self.check_relative(node)
        elif node.module is not None:
            self.check_from(node, node.module, star)
        for alias in node.names:
            if alias.name != "*":
                self.check_binding(alias.asname or alias.name, node, allow_dunder=False)
            if alias.name in CALL_ONLY_NAMES and alias.asname not in (None, alias.name):
                self.add("forbidden-attribute", node,
                         f"{alias.name!r} may not be imported under another name")

    def check_from(self, node: ast.ImportFrom, module: str, star: bool) -> None:
        if self.is_payload(module):
            return
        for alias in node.names:
            name = alias.name
            sub = f"{module}.{name}"
            if name == "*":
                continue
            if self.import_allowed(sub):
                continue
            if name in KNOWN_SUBMODULES.get(module, ()):
                self.add("forbidden-import", node, f"import of {sub!r} is not allowed")
            elif not self.import_allowed(module):
                self.add("forbidden-import", node, f"import of {module!r} is not allowed")
                return
            elif name in MODULE_REEXPORTS.get(module, {}) and not attribute_forbidden(name):
                real = MODULE_REEXPORTS[module][name]
                if not self.import_allowed(real):
                    self.add("forbidden-import", node, f"{sub!r} is the module {real!r}, "
                             "which is not allowed")
            elif is_dunder(name):
                self.add("dunder-attribute", node, f"importing {sub!r} is not allowed")
            elif name.startswith("_"):
                self.add("private-module-attribute", node, f"private module attribute {sub!r}")
            elif attribute_forbidden(name) or name in MODULE_MEMBERS_FORBIDDEN.get(module, ()):
                self.add("forbidden-attribute", node, f"importing {sub!r} is not allowed")
        if star and not self.import_allowed(module):
            self.add("forbidden-import", node, f"import of {module!r} is not allowed")

    def check_relative(self, node: ast.ImportFrom) -> None:
        up = node.level - 1
        if up > len(self.package):
            self.add(
                "unresolved-relative-import", node, "relative import goes above the payload"
            )
            return
        base = list(self.package[: len(self.package) - up])
        if node.module:
            base.extend(node.module.split("."))
        target = ".".join(base)
        if target:
            if target not in self.module_names:
                self.add(
                    "unresolved-relative-import",
                    node,
                    f"relative import of {target!r}, which is not in the payload",
                )
            return
        for alias in node.names:
            if alias.name != "*" and alias.name not in self.module_names:
                self.add(
                    "unresolved-relative-import",
                    node,
                    f"relative import of {alias.name!r}, which is not in the payload",
                )

    # -- calls and annotations --------------------------------------------------------

    def check_call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id == "type"
            and (len(node.args) != 1 or node.keywords or isinstance(node.args[0], ast.Starred))
        ):
            self.add("dynamic-class", node, "type() is allowed only with one argument, type(x)")
        name = _callee_name(func)
        if name in _METACLASS_BASES and name != "type" and (len(node.args) != 1 or node.keywords):
            self.add("dynamic-class", node, f"{name}() builds a class from run-time strings")
        for kw in node.keywords:
            if kw.arg is None:
                continue
            if is_dunder(kw.arg) or is_dunder(nfkc(kw.arg)):
                self.add("dunder-subscript", kw, f"dunder keyword argument {kw.arg!r}")
            elif attribute_forbidden(kw.arg) or attribute_forbidden(nfkc(kw.arg)):
                self.add("forbidden-attribute", kw, f"keyword argument {kw.arg!r} (keywords "
                         "become attribute names: dataclass fields, records)")
            elif kw.arg == "_root":
                self.add("forbidden-keyword", kw, "_root= (typing's sentinel for subclassing "
                         "its attribute-relaying aliases) is not allowed")
        if name in NAME_FACTORIES:
            for arg in [*node.args, *(kw.value for kw in node.keywords)]:
                for sub in ast.walk(arg):
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                        self.check_string_name(sub.value, sub)
        fname = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if fname == "basicConfig":
            for kw in node.keywords:
                if kw.arg is None or kw.arg in BASIC_CONFIG_KEYWORDS:
                    self.add(
                        "forbidden-keyword",
                        kw,
                        f"basicConfig({kw.arg or '**'}=...) is not allowed (files, streams, "
                        "format styles)",
                    )

    def check_annotation(self, node: ast.expr | None) -> None:
        if node is None:
            return
        bad = annotation_problem(node, 0)
        if bad is not None:
            self.add(
                "non-type-annotation",
                bad,
                "annotations must be type expressions (names, subscripts, X | Y, strings "
                "holding those)",
            )

    # -- raw identifiers ---------------------------------------------------------

    def check_identifiers(self) -> None:
        if self.source.isascii():
            return
        for line, col, raw, norm in confusable_identifiers(self.source):
            self.found.append(
                (
                    "non-ascii-identifier",
                    line,
                    col,
                    f"identifier {raw!r} is read by Python as {norm!r}; spell it {norm!r}",
                )
            )




def _callee_name(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def _chain_depth(expr: ast.expr) -> int:
    depth = 0
    while isinstance(expr, ast.Attribute):
        expr = expr.value
        depth += 1
    return depth


def _is_super_call(expr: ast.expr | None) -> bool:
    return (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == "super"
    )
