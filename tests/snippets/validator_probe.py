"""Runs snippets the way the worker does and says whether each obtained a forbidden object.

A helper process for tests/snippets/test_validator_search.py (not a test module). It reads
one JSON string (a snippet's source) per line on stdin and answers one JSON object per line
on stdout: ``{"found": [...], "error": "..."}``. Each snippet runs in a fork of this process
through the worker's own ``run_child`` (restricted builtins, the import guard over the
default allowlist, the run-time guards), as a run does; after it ran, everything reachable
from its globals (containers, the snippet's own instances, classes, closures, bound
methods) is searched for a forbidden object:

- a frame, code object or traceback;
- a module outside the default allowlist (``os``, ``sys``, ``builtins``, ...);
- the real builtins a snippet never gets (``open``, ``eval``, ``exec``, ``getattr``,
  ``__import__``, ...);
- the namespace dict of any module (a function's ``__globals__``, the real builtins' dict),
  its own globals included.

The run-time guard (the worker's audit hook, issue 24) is NOT armed here: this probe
measures the validator, and a bypass of the validator must be seen even where the guard
would refuse its end (tests/snippets/test_runtime_guard.py tests the guard on its own).

The parent of each fork bounds it (the run's own 1.5 s timer, a 3 s alarm, SIGKILL of that
child after 5 s).
"""

from __future__ import annotations

import builtins
import json
import os
import select
import signal
import sys
import time
import types
from typing import Any

from corral.snippets.sandbox import worker
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS, FORBIDDEN_NAMES

_REAL = {id(getattr(builtins, n)): n for n in (
    "open", "eval", "exec", "compile", "getattr", "setattr", "delattr", "vars", "globals",
    "locals", "__import__", "breakpoint", "input")}
_REAL[id(worker._real_import)] = "__import__"
_FRAMEISH = (types.FrameType, types.CodeType, types.TracebackType)


def _forbidden(obj: Any, namespaces: dict[int, str]) -> str | None:
    if isinstance(obj, _FRAMEISH):
        return type(obj).__name__
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
        if name not in DEFAULT_ALLOWED_IMPORTS and name != "__main__":
            return f"module {name}"
        return None
    if id(obj) in _REAL and callable(obj):
        return f"builtin {_REAL[id(obj)]}"
    if type(obj) is dict and id(obj) in namespaces:
        return f"namespace of {namespaces[id(obj)]}"
    return None


def _children(obj: Any) -> list[Any]:
    kind = type(obj)
    if isinstance(obj, types.ModuleType):  # an allowed module: what it holds is its own
        return []
    if kind is dict:
        return [*obj.keys(), *obj.values()]
    if kind in (list, tuple, set, frozenset):
        return list(obj)
    if isinstance(obj, types.MethodType):
        return [obj.__self__, obj.__func__]
    if isinstance(obj, types.FunctionType):
        if obj.__module__ != "__main__":
            return []
        cells = []
        for cell in obj.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:
                pass
        return [*cells, *(obj.__defaults__ or ()), obj.__kwdefaults__ or {}]
    if isinstance(obj, type):
        return list(vars(obj).values()) if obj.__module__ == "__main__" else []
    out: list[Any] = []
    try:
        state = object.__getattribute__(obj, "__dict__")
    except Exception:
        state = None
    if type(state) is dict:
        out.append(state)
    if isinstance(obj, BaseException):  # not __traceback__: no snippet can read that
        out.append(obj.args)
    if isinstance(obj, (list, tuple, set, frozenset, dict)):  # subclasses of containers
        try:
            out.extend(list(obj.values() if isinstance(obj, dict) else obj))
        except Exception:
            pass
    return out


def _search(g: dict[str, Any]) -> list[str]:
    namespaces = {id(m.__dict__): m.__name__ for m in list(sys.modules.values())
                  if isinstance(m, types.ModuleType)}
    namespaces[id(vars(builtins))] = "builtins"
    found: list[str] = []
    seen = {id(g), id(g["__builtins__"])}
    todo = [(v, 0) for k, v in g.items() if k != "__builtins__"]
    budget = 50_000
    while todo and budget:
        obj, depth = todo.pop()
        budget -= 1
        if id(obj) in seen:
            if obj is g and depth:
                found.append("its own globals")
            continue
        seen.add(id(obj))
        what = _forbidden(obj, namespaces)
        if what is not None:
            found.append(what)
            continue
        if depth < 12:
            try:
                todo.extend((c, depth + 1) for c in _children(obj))
            except Exception:
                pass
    return found


def _no_audit_hook(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``worker._arm_guard`` in this probe's forks (see the module doc)."""


def _child(source: str, fd: int) -> None:
    """One run, through the worker's own ``run_child`` (its builtins, import guard and
    stdlib run-time checks, without the audit hook), then the search of what the run's
    globals hold."""
    worker._arm_guard = _no_audit_hook  # type: ignore[assignment]  # this fork only
    signal.alarm(3)
    null = os.open(os.devnull, os.O_WRONLY)
    options = {"timeout_ms": 1500, "grace_ms": 200, "split": None,
               "allowed": sorted(DEFAULT_ALLOWED_IMPORTS),
               "forbidden": sorted(FORBIDDEN_NAMES - {"__build_class__"})}
    record = worker.run_child({"main.py": source}, options, worker._Out(null, dict(worker.CAPS)))
    signal.alarm(0)
    errors = record.get("errors") or []
    result: dict[str, Any] = {"found": [], "error": errors[0]["type"] if errors else None}
    try:
        result["found"] = _search(sys.modules["__main__"].__dict__)
    except BaseException as exc:
        result["found"] = [f"search failed: {type(exc).__name__}"]
    os.write(fd, json.dumps(result).encode())
    os._exit(0)


def _run(source: str) -> dict[str, Any]:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            _child(source, wfd)
        finally:
            os._exit(1)
    os.close(wfd)
    data = b""
    deadline = time.monotonic() + 5
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([rfd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(rfd)
        os.waitpid(pid, 0)
    if not data:
        return {"found": [], "error": "the run died or timed out"}
    answer: dict[str, Any] = json.loads(data)
    return answer


def main() -> None:
    for line in sys.stdin:
        answer = _run(json.loads(line))
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
