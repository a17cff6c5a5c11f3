"""The snippet worker: the code that runs inside the sandbox (stdlib only, ``-I -S``).

Run as ``python -I -S worker.py [--preload a,b,c]`` it is a *template*: it
pre-imports the allow-listed modules, freezes the collector and serves the
host over the JSON-lines frames of :mod:`corral.wire.protocol` (written here by
hand: this file must run without corral on ``sys.path``). One ``invoke``
frame per line on stdin; one ``output`` (or ``error``) frame per line on
stdout. ``input`` is ``{"op": "ping"}`` or ``{"op": "run", "files":
[[path, source], ...], "options": {...}}``.

Per ``run`` the template forks a fresh child that runs the payload and
streams log lines and, last, its results over a private pipe; the template
itself never runs caller code. Called as ``main(["--once"])`` in a fresh fork
of a strict sandbox's agent, the worker is that child itself: it reads one
invoke frame on stdin and streams the records on stdout (:func:`serve_once`);
the host collects them with :class:`Collector`. The child: new session, stdio on /dev/null,
rlimits (address space, file size 0, core 0, CPU), a soft timer that raises
inside the snippet, and a hard SIGKILL of its process group from the
template at ``timeout + grace``. The payload is served from memory under
the package ``__payload__`` (so relative imports work; ``import helpers``
is an alias of ``__payload__.helpers``); payload code gets builtins without
the forbidden names and an ``__import__`` that refuses modules outside the
allowlist and the payload (defense in depth behind the validator). Before the
snippet's first line, each run adds an audit hook to its own process (the run-time
guard, :func:`_audit_hook`): files, directories, processes, sockets, first imports,
frames and code from bytes are refused whatever code asks, validated or not.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal.py's C module: no enums
import ast
import builtins
import gc
import importlib
import json
import json.scanner
import linecache
import os
import resource
import select
import signal
import sys
import time
import traceback
import types
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from typing import TYPE_CHECKING, Any, NoReturn, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

try:  # forked from the zygote, or on the host: corral is importable
    from corral.wire import records as _records
except ImportError:  # run as a file (``-I -S``): the codec beside it (the pool wrote it
    # there), else in corral's source tree; executed, not imported: no __pycache__ written
    _records = types.ModuleType("_corral_wire_records")
    _here = os.path.dirname(os.path.abspath(__file__))
    _path = os.path.join(_here, "_corral_wire_records.py")
    if not os.path.exists(_path):
        _path = os.path.join(os.path.dirname(os.path.dirname(_here)), "wire", "records.py")
    with open(_path, encoding="utf-8") as _fh:
        exec(compile(_fh.read(), _path, "exec"), _records.__dict__)

__all__ = ["LOGS_PREFIX", "RECORDS_FILE", "BadRecord", "Collector", "main", "run_child", "serve",
           "serve_once"]

#: the record codec's file name beside a template's worker file (``corral.wire.records``)
RECORDS_FILE = "_corral_wire_records.py"
BadRecord = _records.BadRecord
#: the ``go`` record, encoded once (a run's first record: no encoder built for it)
_GO = _records.encode(_records.Go())

PKG = "__payload__"
CAPS = {"log_lines": 1000, "log_bytes": 65536, "line_chars": 4096, "facts_bytes": 65536,
        "facts_names": 256, "value_chars": 1024, "items": 100, "depth": 6, "result_chars": 4096,
        "message_chars": 4096, "traceback_chars": 16384}
MARK = "…[truncated]"
#: a job frame read by ``--once`` (the host caps payloads at 1 MiB)
_MAX_JOB_BYTES = 8 * 1024 * 1024
_real_import = builtins.__import__
_SELF = __file__


_SIG_BLOCK, _SIG_SETMASK = int(signal.SIG_BLOCK), int(signal.SIG_SETMASK)
_SIGALRM = int(signal.SIGALRM)
_ALARM = frozenset({_SIGALRM})
#: the snippet's builtins per forbidden set, built where runs are forked from
#: (:func:`prepare_builtins`), so a run takes its dict as it is instead of copying ~150
#: builtins (each copy writes the refcount of a builtin, a page copied per few)
_SAFE_BUILTINS: dict[frozenset[str], dict[str, Any]] = {}


def _safe_builtins(forbidden: frozenset[str]) -> dict[str, Any]:
    safe = {k: v for k, v in vars(builtins).items() if k not in forbidden}
    safe["__build_class__"] = builtins.__build_class__
    return safe


def prepare_builtins(*forbidden_sets: frozenset[str]) -> None:
    """Build the snippet builtins for these forbidden sets here, once: a run forked from
    this process whose job names one of them uses that dict (its own copy: the process
    is a fork) instead of building it. Call it where runs are forked from only."""
    for forbidden in forbidden_sets:
        _SAFE_BUILTINS[frozenset(forbidden)] = _safe_builtins(frozenset(forbidden))


def warm(rounds: int = 16) -> None:
    """Run the pure steps of a run (job parsing, records, streams, the payload finder, the
    import guard, facts, parse and compile) here on a dummy job, ``rounds`` times, sending
    its records into a pipe of its own: CPython rewrites a function's bytecode in place
    during its first runs (warm-up counter, quickening, specialisation), and a run forked
    from this process would otherwise write, so copy, those code pages itself. Installs
    nothing, runs no payload, reads no file. Call it where runs are forked from only."""
    caps = dict(CAPS)
    frame = json.dumps({"v": 1, "kind": "invoke", "input": {
        "op": "run", "files": [["main.py", "x = 1\nx + 1"]],
        "options": {"timeout_ms": 1000, "grace_ms": 500, "mem_mb": 64, "caps": caps,
                    "stream": True, "allowed": ["math"], "forbidden": ["eval"]}},
        "ctx": {"run_id": "warm", "tenant_id": "warm"}}).encode()
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        for _ in range(rounds):
            job = _job_of(frame)
            files = {str(p): str(s) for p, s in job["files"]}
            options = dict(job["options"])
            out = _Out(w, {**CAPS, **options.get("caps", {})})
            out.write(_GO)
            for name in ("stdout", "stderr"):
                stream = _Stream(out, name)
                stream.write("warm\n")
                stream.flush()
            payload = _Payload(files, {})
            payload.find_spec("json")
            payload.find_spec(PKG + ".main")
            guarded = _guard(frozenset(options["allowed"]), payload.tops)
            guarded("math")
            _cut("warm", 10)
            facts, facts_cut = _facts({"__package__": PKG, "x": 1, "y": [1.5, "a", None],
                                       "z": {"k": (1,)}}, out.caps)
            _compile_main(files["main.py"], [6, 2])  # the host's split (line 2, offset 6)
            _compile_main(files["main.py"], None)  # parsed here
            out.send(_records.End({"facts": facts, "result": repr(2), "errors": [],
                                   "duration_ms": 0.5, "timed_out": False,
                                   "truncated": ["facts"] if facts_cut else []}))
            os.read(r, 1 << 16)  # this round's records (well under a pipe's buffer)
            _warm_guard()
    finally:
        os.close(r)
        os.close(w)


def _warm_guard() -> None:
    """The run-time guard's hook, built and called on the common events but never added
    (this process is not a run): its code is specialised here, not in every run."""
    hook = _audit_hook(frozenset({"math"}), frozenset({"helpers"}), [])
    for event, args in (("exec", (None,)), ("compile", (b"", "main.py")),
                        ("import", ("math", None, [], [], [])),
                        ("import", ("__payload__.helpers", None, [], [], [])),
                        ("object.__getattr__", (warm, "__code__")),
                        ("open", (os.__file__, "r", 0)), ("os.system", ("",))):
        try:
            hook(event, args)
        except GuardViolation:
            pass
    try:
        1 / 0  # noqa: B018 (a traceback to walk)
    except ZeroDivisionError as exc:
        _tb_entries(exc.__traceback__)


class _Timeout(BaseException):
    """Raised inside the snippet by the soft timer."""


def _cut(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[: max(limit - len(MARK), 0)] + MARK, True)


class _Out:
    """The child's pipe to the template: one JSON record per line, SIGALRM blocked while writing."""

    def __init__(self, fd: int, caps: dict[str, int]) -> None:
        self.fd, self.caps, self.lines, self.bytes, self.dropped = fd, caps, 0, 0, False

    def send(self, record: _records.Record) -> None:
        self.write(_records.encode(record))

    def write(self, data: bytes) -> None:
        """One encoded record (:func:`_records.encode`)."""
        # _signal's, not signal's: no enum conversions (fewer pages copied in a fresh fork)
        old = _signal.pthread_sigmask(_SIG_BLOCK, _ALARM)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
        finally:
            _signal.pthread_sigmask(_SIG_SETMASK, old)

    def log(self, stream: str, text: str) -> None:
        if self.dropped:  # the caps are spent: no later line either (as the host keeps them)
            return
        text, cut = _cut(text, self.caps["line_chars"])
        size = len(text.encode("utf-8", "replace"))
        if self.lines >= self.caps["log_lines"] or self.bytes + size > self.caps["log_bytes"]:
            self.dropped = True
            return
        self.lines, self.bytes = self.lines + 1, self.bytes + size
        self.send(_records.Log(stream, text, cut))


class _Stream:
    """A text stream that turns writes into log lines of one stream name."""

    encoding, errors = "utf-8", "replace"

    def __init__(self, out: _Out, name: str) -> None:
        self.out, self.name, self.buf = out, name, ""

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self.buf += s
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            self.out.log(self.name, line)
        if len(self.buf) > self.out.caps["line_chars"] * 4:
            self.out.log(self.name, self.buf)
            self.buf = ""
        return len(s)

    def flush(self) -> None:
        if self.buf:
            self.out.log(self.name, self.buf)
            self.buf = ""

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


class _Payload:  # a meta path finder and its loader, duck-typed (importlib.abc: ~18 ms)
    """Serves the payload's modules from memory under ``__payload__``; aliases top-level names."""

    def __init__(self, files: dict[str, str], safe: dict[str, Any]) -> None:
        self.safe = safe
        self.mods: dict[str, tuple[str, str, bool]] = {}  # module -> (path, source, is_package)
        for path, source in files.items():
            parts = path[:-3].split("/")
            is_pkg = parts[-1] == "__init__"
            parts = parts[:-1] if is_pkg else parts
            for i in range(1, len(parts)):  # directories without __init__.py: empty packages
                self.mods.setdefault(".".join(parts[:i]), ("", "", True))
            self.mods[".".join(parts)] = (path, source, is_pkg)
        self.tops = {name.partition(".")[0] for name in self.mods}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        me = cast("Loader", self)
        if fullname == PKG:
            return ModuleSpec(fullname, me, is_package=True)
        if fullname.startswith(PKG + "."):
            entry = self.mods.get(fullname[len(PKG) + 1:])
            return None if entry is None else ModuleSpec(fullname, me, is_package=entry[2])
        if fullname.partition(".")[0] in self.tops and fullname in self.mods:
            return ModuleSpec(fullname, me, is_package=self.mods[fullname][2])
        return None

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        if spec.name.startswith(PKG):
            return None
        return importlib.import_module(f"{PKG}.{spec.name}")  # an alias: the same module

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        spec = module.__spec__
        if spec is not None and not spec.name.startswith(PKG):
            # an alias (``import helpers``): the module ran already as ``__payload__.helpers``;
            # the import system has just set its __spec__ to the alias's: give it back its
            # own (its parent is its __package__, as relative imports need; 3.12 warns else)
            module.__spec__ = self.find_spec(name)
            return
        if not name.startswith(PKG):
            return
        if module.__spec__ is not None and module.__spec__.submodule_search_locations is not None:
            module.__path__ = []
        path, source, _ = self.mods.get(name[len(PKG) + 1:], ("", "", True))
        module.__dict__["__builtins__"] = self.safe
        if path:
            exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)


def _guard(allowed: frozenset[str], tops: set[str]) -> Any:
    def ok(name: str) -> bool:
        if name.partition(".")[0] in tops or name in allowed:
            return True
        parts = name.split(".")
        return any(".".join(parts[:i]) + ".*" in allowed for i in range(1, len(parts) + 1))

    def guarded_import(name: str, globals_: Any = None, locals_: Any = None,
                       fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and not ok(name):
            raise ImportError(f"import of {name!r} is not allowed in a snippet", name=name)
        module = _real_import(name, globals_, locals_, fromlist, level)
        for item in fromlist or ():
            sub = module.__dict__.get(item) if isinstance(module, types.ModuleType) else None
            if isinstance(sub, types.ModuleType) and not sub.__name__.startswith(PKG) \
                    and not ok(sub.__name__):
                raise ImportError(f"import of {sub.__name__!r} is not allowed in a snippet")
        return module

    return guarded_import


def _jsonable(value: Any, caps: dict[str, int], depth: int = 0) -> Any:
    if value is None or (isinstance(value, bool | int) and abs(value) < 2**53):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, str):
        return _cut(value, caps["value_chars"])[0]
    if isinstance(value, types.FunctionType | types.BuiltinFunctionType):
        return f"<function {value.__qualname__}>"
    if isinstance(value, type):
        return f"<class {value.__qualname__}>"
    if depth < caps["depth"]:
        if isinstance(value, list | tuple | set | frozenset):
            items = list(value)
            out = [_jsonable(v, caps, depth + 1) for v in items[: caps["items"]]]
            return out + ([MARK] if len(items) > caps["items"] else [])
        if isinstance(value, dict):
            pairs = list(value.items())
            d = {(k if isinstance(k, str) else repr(k)): _jsonable(v, caps, depth + 1)
                 for k, v in pairs[: caps["items"]]}
            if len(pairs) > caps["items"]:
                d[MARK] = len(pairs) - caps["items"]
            return d
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ is the snippet's problem, not ours
        text = f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"
    return _cut(text, caps["value_chars"])[0]


def _facts(g: dict[str, Any], caps: dict[str, int]) -> tuple[dict[str, Any], bool]:
    out: dict[str, Any] = {}
    size, cut = 2, False
    for name, value in list(g.items()):
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if isinstance(value, type | types.FunctionType | types.BuiltinFunctionType) and not \
                str(getattr(value, "__module__", "")).startswith(("__main__", PKG)):
            continue  # imported, not defined by the snippet
        if len(out) >= caps["facts_names"]:
            return out, True
        item = _jsonable(value, caps)
        cost = len(json.dumps(item, ensure_ascii=False, default=repr)) + len(name) + 4
        if size + cost > caps["facts_bytes"]:  # too big for what is left: its name stays
            item, cut = MARK, True
            cost = len(json.dumps(item, ensure_ascii=False)) + len(name) + 4
            if size + cost > caps["facts_bytes"]:
                return out, True
        out[name], size = item, size + cost
    return out, cut


def _tb_entries(tb: Any) -> list[tuple[str, int, str]]:
    """``(file, line, function)`` of each entry of a traceback, read from the frames it
    holds. Under the run-time guard ``tb_frame`` is refused to everyone: the walk is then
    done by the guard itself (the ``corral.tb_entries`` event, :func:`_audit_hook`), which
    hands back these tuples and no frame, to whoever asks."""
    out: list[tuple[str, int, str]] = []
    if tb is None:
        return out
    sys.audit("corral.tb_entries", tb, out)
    if not out:  # no guard in this process: read them here
        while tb is not None:
            code = tb.tb_frame.f_code
            out.append((code.co_filename, tb.tb_lineno, code.co_name))
            tb = tb.tb_next
    return out


def _traceback_text(exc: BaseException, entries: list[tuple[str, int, str]]) -> str:
    """A traceback's text from its entries (:func:`_tb_entries`), without the worker's
    frames; source lines from linecache (the payload is cached there; the standard
    library's files are read, which the run-time guard allows)."""
    frames = traceback.StackSummary.from_list(
        [(f, n, name, None) for f, n, name in entries if f != _SELF])
    # format_exception_only builds the chained exceptions too (their tracebacks read
    # tb_frame): they are not shown, so they are set aside while it runs
    chained = exc.__cause__, exc.__context__, exc.__suppress_context__
    exc.__cause__ = exc.__context__ = None
    try:
        only = [f"GuardViolation: {exc}\n"] if isinstance(exc, GuardViolation) else \
            traceback.format_exception_only(type(exc), exc)  # (named as a builtin is)
    finally:
        exc.__cause__, exc.__context__ = chained[0], chained[1]
        exc.__suppress_context__ = chained[2]
    return "".join(["Traceback (most recent call last):\n", *traceback.format_list(frames),
                    *only]) if frames else "".join(only)


def _format_exception(self: Any, ei: Any) -> str:
    """``logging.Formatter.formatException`` without reading frames (``logging.exception``
    under the run-time guard): the traceback's entries come from :func:`_tb_entries`.
    Chained exceptions are not shown."""
    exc = ei[1]
    if not isinstance(exc, BaseException):
        return "".join(traceback.format_exception_only(ei[0], exc)).rstrip("\n")
    return _traceback_text(exc, _tb_entries(ei[2])).rstrip("\n")


def _error(exc: BaseException, paths: set[str], caps: dict[str, int]) -> dict[str, Any]:
    entries = _tb_entries(exc.__traceback__)
    first = next((i for i, e in enumerate(entries) if e[0] in paths), len(entries))
    entries = entries[first:]  # drop the worker's own frames before the payload's
    line, where = None, None
    for filename, lineno, _ in entries:
        if filename in paths:
            line, where = lineno, filename
    if isinstance(exc, SyntaxError) and exc.filename in paths:
        line, where = exc.lineno, exc.filename
    try:
        text = _traceback_text(exc, entries)
    except Exception as failed:  # e.g. a refused read in a snippet's __str__: say so
        text = f"(the traceback could not be formatted: {type(failed).__name__})"
    limit = caps["traceback_chars"]
    text = text if len(text) <= limit else MARK + text[-(limit - len(MARK)):]
    return {"type": type(exc).__name__, "message": _cut(str(exc), caps["message_chars"])[0],
            "line": line, "path": where, "traceback": text}


_PAGE = os.sysconf("SC_PAGE_SIZE")
#: address space kept above a run's RLIMIT_AS for reporting its MemoryError
_MEMORY_RESERVE = 16 * 1024 * 1024


def _use_memory_reserve() -> None:
    """Raise the soft RLIMIT_AS to the hard one (the reserve), once the run hit it."""
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    except (OSError, ValueError):
        pass


def _compile_main(source: str, split: Any) -> tuple[types.CodeType, types.CodeType | None]:
    """main.py as the module's code and, when its last statement is an expression, that
    expression's (its value is the run's result).

    ``split`` comes from the host, which parsed the source when it validated it
    (``runner.expression_split``): ``[offset, line]`` where the last statement, an
    expression, starts (column 0), or ``[-1, 0]`` when it is not an expression. Then
    both parts are compiled straight from their text (the expression padded with line
    ends, so its line numbers stay), which costs this forked run about 30 copy-on-write
    page faults and 0.1-0.2 ms of CPU less than building and compiling Python AST objects
    (measured against the parse, in alternation). Without it (or when the parts do not
    compile: they always do for a split the host found), the source is parsed here."""
    if isinstance(split, list) and len(split) == 2 and all(type(v) is int for v in split):
        offset, line = split
        try:
            if offset == -1:
                return compile(source, "main.py", "exec", dont_inherit=True), None
            if 0 <= offset <= len(source) and line >= 1:
                return (compile(source[:offset], "main.py", "exec", dont_inherit=True),
                        compile("\n" * (line - 1) + source[offset:], "main.py", "eval",
                                dont_inherit=True))
        except (SyntaxError, ValueError):
            pass  # parsed below: a real syntax error is raised there
    tree = ast.parse(source, "main.py")
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    code = compile(tree, "main.py", "exec", dont_inherit=True)
    expr = None if last is None else compile(ast.Expression(last.value), "main.py", "eval",
                                              dont_inherit=True)
    return code, expr


# -- the run-time guard: an audit hook (PEP 578) in every run's process --------------------
# It does not depend on the validator having seen a trick: whatever Python code the run
# manages to reach, CPython raises an audit event before it opens a file, starts a
# process, opens a socket, loads a module, hands out a frame or builds code from bytes,
# and the hook refuses the events snippets never need (docs/snippets.md, "The run-time
# guard").


class GuardViolation(PermissionError):
    """Raised by the run-time guard for an event a snippet is not allowed: its message
    names the event. A PermissionError, so code that handles a refused ``open`` (an
    ``OSError``) goes on; every refusal is reported in the transcript anyway."""


class _FrameRefused(GuardViolation, ValueError):
    """``sys._getframe`` refused: also a ValueError (what ``sys._getframe`` raises when
    there is no such frame), so the standard library's best-effort callers (namedtuple,
    enum and typing on 3.11) go on without a caller's module name."""


_FrameRefused.__name__ = _FrameRefused.__qualname__ = "GuardViolation"

#: events every run raises and that give nothing: running code the run already holds
#: (``exec``, ``compile``: the guard checks what code *does*, not where it came from;
#: building code from bytes is refused below), sleeping, a module's name
_GUARD_QUIET = frozenset({
    "exec", "compile", "time.sleep", "sys._getframemodulename", "builtins.id",
    "array.__new__", "sys.excepthook", "sys.unraisablehook", "os.urandom",
    "marshal.dumps",  # code -> bytes (the import system, before it writes a .pyc: refused)
})
#: the events with a rule (everything else is refused)
_GUARD_CHECKED = frozenset({
    "import", "open", "os.listdir", "os.scandir", "object.__getattr__",
    "object.__setattr__", "object.__delattr__", "resource.setrlimit", "sys._getframe",
    "corral.tb_entries", "os.mkdir",
})
#: audited attribute reads that hand out code objects and defaults, not frames: reading is
#: allowed (``inspect.signature`` reads ``__code__``; dataclasses calls it); what code
#: could be turned into (``code.__new__``, ``replace``, ``function.__new__``,
#: ``marshal.loads``, writing ``__code__``) is refused. ``tb_frame``, ``gi_frame``,
#: ``cr_frame``, ``ag_frame`` (frames) are refused.
_CODE_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__", "f_code", "gi_code",
                         "cr_code", "ag_code"})
#: function attributes whose writes would swap what a function runs
_GUARD_FUNC_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
#: the allowlist's entries that mean "this run talks to the network" (through the
#: sandbox's egress proxy at strict): socket events are allowed for such a run only
_NETWORK_MODULES = frozenset({"socket", "http.client", "urllib.request", "http.*",
                              "urllib.*"})
_NETWORK_EVENTS = ("socket.", "http.client.", "urllib.Request")
#: standard-library modules that allowed functions import lazily, on first use
#: (``datetime.strptime``, ``str.encode("idna")``, zoneinfo's data): loading them gives
#: nothing an allowed module does not
_LAZY_STDLIB = frozenset({
    "_strptime", "locale", "calendar", "encodings", "stringprep", "_pydecimal",
    "_pydatetime", "_pylong", "_uuid", "importlib.resources", "tzdata",
})
#: where a run may read files: data the allowed modules read (zoneinfo's default TZPATH)
_TZ_ROOTS = ("/usr/share/zoneinfo", "/usr/lib/zoneinfo", "/usr/share/lib/zoneinfo",
             "/etc/zoneinfo")
#: at most this many refusals are reported (each a GuardViolation error)
_MAX_REFUSALS = 8


#: the pool's warm-up code (``--warmup``), run once in the template after the preloads
_WARMUP: list[str] = []
#: the modules an environment's preloads and warm-up imported (:func:`serve`): a run
#: does not shed them (:func:`_runtime_state`)
_ENV_LOADED: set[str] = set()
#: an environment's dir (``--path``): its packages read their own files at run time
_EXTRA_ROOTS: list[str] = []
#: the pool's prefault code (``--prefault``): what a spare (:func:`_fork_spare`) runs while
#: it waits for its job, so the pages a typical run writes are copied before the run
_PREFAULT: list[str] = []


def _read_roots() -> tuple[str, ...]:
    """The directories a run may read from: the standard library (its source, for lazy
    imports and traceback lines) and the time-zone data, each as ``dir/``."""
    roots = [os.path.dirname(os.__file__), *_TZ_ROOTS]
    zoneinfo = sys.modules.get("zoneinfo")
    tzpath = getattr(zoneinfo, "TZPATH", ()) if zoneinfo is not None else ()
    roots += [p for p in tzpath if isinstance(p, str)]
    roots += _EXTRA_ROOTS
    return tuple(sorted({r.rstrip("/") + "/" for r in roots if r.startswith("/")}))


def _import_ok(name: Any, allowed: frozenset[str], tops: frozenset[str],
               lazy: frozenset[str], pkg: str, typ: type, string: type) -> bool:
    """Whether a module may be loaded during the run: the allowlist (``pkg.*``; a
    submodule of an allowed module), the payload, the lazy standard-library helpers.
    Reads nothing but its arguments (no global, no builtin: rebinding one changes
    nothing here)."""
    if typ(name) is not string:
        return False
    top = name.partition(".")[0]
    if top == pkg or top in tops or name in allowed or top in lazy or name in lazy \
            or top == "encodings" or name + ".*" in allowed:
        return True
    prefix = name
    while "." in prefix:
        prefix = prefix.rpartition(".")[0]
        if prefix in allowed or prefix + ".*" in allowed:
            return True
    return False


def _guard_constants() -> tuple[Any, ...]:
    """The hook's fixed rules, built once where runs are forked from (:data:`_ARM_STATE`):
    a run's hook holds this one tuple, so making it touches one object, not thirty."""
    return (_GUARD_QUIET, _GUARD_CHECKED, _import_ok, _read_roots(), _GUARD_FUNC_ATTRS,
            _NETWORK_EVENTS, os.O_RDONLY, os.O_ACCMODE, os.O_CREAT | os.O_TRUNC | os.O_APPEND,
            type, str, int, tuple, len, list, types.TracebackType, _CODE_ATTRS,
            GuardViolation, _FrameRefused, _MAX_REFUSALS, _LAZY_STDLIB, PKG)


def _audit_hook(allowed: frozenset[str], tops: frozenset[str],
                refusals: list[str]) -> Callable[[str, tuple[Any, ...]], None]:
    """The run's audit hook. Its rules live in its default values, immutable (tuples,
    frozensets, builtins taken when it is made), and the function itself is held by no
    global: once added with ``sys.addaudithook`` nothing in Python can reach it, change
    its rules or remove it (writing ``__code__``/``__defaults__`` of any function is
    refused as well). The two mutable values: the objects of the traceback walk it is
    doing (only while it walks, see :func:`_tb_entries`) and ``refusals`` (what is
    reported)."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    run: tuple[Any, ...] = (allowed, tops, set(), refusals, bool(allowed & _NETWORK_MODULES),
           (resource.RLIMIT_AS, (hard, hard)))
    consts = _ARM_STATE.get("consts") or _guard_constants()

    def hook(event: str, args: tuple[Any, ...], _c: tuple[Any, ...] = consts,
             _run: tuple[Any, ...] = run) -> None:
        if event in _c[0]:  # quiet: the common events, one set lookup
            return
        (_, _checked, _ok_import, _roots, _func_attrs, _net_events, _rdonly, _accmode,
         _wflags, _type, _str, _int, _tuple, _len, _list, _tbtype, _code_attrs, _gv, _fr,
         _max, _lazy, _pkg) = _c
        _allowed, _tops, _trusted, _refusals, _network, _as = _run
        what = ""
        if event in _checked:
            if event == "import":
                if _ok_import(args[0], _allowed, _tops, _lazy, _pkg, _type, _str):
                    return
                what = f" of module {args[0]!r}" if _type(args[0]) is _str else ""
            elif event == "open" or event == "os.listdir" or event == "os.scandir":
                path: Any = args[0] if args else None
                if _type(path) is _str and ((path[:1] == "<" and path[-1:] == ">")
                                            or path.endswith(".pyc") or ".pyc." in path):
                    # refused, not reported: the parser reads a SyntaxError's line from
                    # its "file" (compile's "<string>"...) and shows none instead; the
                    # import system reads and writes .pyc files (unmarshalled: bytes ->
                    # code, refused) and compiles the module's source instead
                    raise _gv(f"the run-time guard refused {event} of {path[:200]!r}")
                # a directory and what is under it: "<root>/", "<root>/a/b/" (as given:
                # ".", ".." and "//" refused, not resolved)
                tail = path + "/" if _type(path) is _str else ""
                if tail.startswith(_roots) and "/../" not in tail and "/./" not in tail \
                        and "//" not in tail:
                    if event != "open":
                        return
                    mode, flags = args[1], args[2]
                    if (_type(mode) is _str and "w" not in mode and "a" not in mode
                            and "x" not in mode and "+" not in mode) or (
                            mode is None and _type(flags) is _int
                            and flags & _accmode == _rdonly and not flags & _wflags):
                        return
                what = f" of {path[:200]!r}" if _type(path) is _str else \
                    f" of a {_type(path).__name__}"
            elif event == "object.__getattr__":
                if args[1] in _code_attrs or args[0] in _trusted:
                    return
                what = f": reading {args[1]!r} of a {_type(args[0]).__name__}"
            elif event == "object.__setattr__" or event == "object.__delattr__":
                if args[1] not in _func_attrs:
                    return
                what = f": writing {args[1]!r} of a {_type(args[0]).__name__}"
            elif event == "resource.setrlimit":
                if _type(args) is _tuple and args == _as:  # the MemoryError reserve
                    return
            elif event == "corral.tb_entries":  # the worker's traceback walk
                tb, out = args
                tbs = []
                while _type(tb) is _tbtype:
                    tbs.append(tb)
                    tb = tb.tb_next
                if tb is None and _type(out) is _list:
                    entries = []
                    _trusted.update(tbs)  # tb_frame of these, for this walk only
                    try:
                        for t in tbs:
                            code = t.tb_frame.f_code
                            entries.append((code.co_filename, t.tb_lineno, code.co_name))
                    finally:
                        _trusted.clear()
                    out.extend(entries)  # a list's own: no snippet code
                    return
            elif event == "os.mkdir" and _type(args[0]) is _str \
                    and args[0].endswith("/__pycache__"):  # the import system's, as above
                raise _gv("the run-time guard refused os.mkdir of a __pycache__")
            elif event == "sys._getframe":
                raise _fr("the run-time guard refused sys._getframe: a snippet gets no "
                          "frames")
        elif _network and event.startswith(_net_events):
            return
        message = f"the run-time guard refused {event}{what}"
        if _len(_refusals) < _max:
            _refusals.append(message)
        raise _gv(message)

    return hook


#: computed where runs are forked from (:func:`_harden`), so a run does not: the read roots,
#: and the modules loaded there
_ARM_STATE: dict[str, Any] = {}


def _arm_guard(allowed: frozenset[str], tops: frozenset[str], refusals: list[str],
               sources: Any = ()) -> list[Any]:
    """Load the allowlist's modules that the payload names and that are not loaded yet
    (usually none: they are preloaded where runs are forked from), so that what they
    import is loaded before the guard; then add the run's audit hook. From here on, for
    the rest of this process's life, every audit event goes through it; an audit hook
    cannot be removed from Python. (An allowed module imported by a name built at run
    time, and not preloaded, may have its own imports refused: the guard fails closed.)
    Before the hook, the run sheds what the worker and the agent loaded for themselves
    (:func:`_shed_runtime`); the modules it dropped are returned, for the caller to hold
    while the run lasts."""
    loaded: frozenset[str] = _ARM_STATE.get("loaded") or frozenset()
    for name in allowed - loaded:  # (a set difference: no per-name work for the preloads)
        if name not in sys.modules and not name.endswith("*") \
                and any(name.partition(".")[0] in source for source in sources):
            try:
                importlib.import_module(name)
            except Exception:  # a module this Python lacks: never loaded
                pass
    if not _ARM_STATE:  # (else done where runs are forked from)
        _without_frames()
    shed = _shed_runtime(allowed)
    sys.addaudithook(_audit_hook(allowed, tops, refusals))
    return shed


#: the top-level names of modules that the worker and the sandbox's agent (a strict run is
#: forked from it) load for themselves and that no snippet is granted: a run's process
#: drops them from ``sys.modules`` (:func:`_shed_runtime`), so a snippet that reaches
#: ``sys`` or ``importlib`` gets none of them (importing one again is an import event,
#: refused by the run-time guard); one the run's allowlist grants stays
_RUNTIME_TOPS = frozenset({
    "corral", "asyncio", "_asyncio", "subprocess", "_posixsubprocess", "multiprocessing",
    "_multiprocessing", "_posixshmem", "concurrent", "selectors", "select", "socket",
    "_socket", "ssl", "_ssl", "fcntl", "termios", "pty", "tty", "resource", "grp", "pwd",
    "shutil", "tempfile", "tarfile", "zipfile", "ctypes", "_ctypes", "mmap", "gc", "signal",
    "_signal", "marshal", "runpy", "pdb", "code", "socketserver", "bz2", "_bz2", "lzma",
    "_lzma", "_compression", "fnmatch",
})


def _refused_fork_exec(*args: Any, **kwargs: Any) -> NoReturn:
    """What a run's process has for ``_posixsubprocess.fork_exec`` (and ``subprocess``'s
    copy of it): the C function starts a process without raising an audit event, so the
    run-time guard would never see it. This one raises one, which the guard refuses
    (and reports); without a guard it refuses all the same."""
    sys.audit("_posixsubprocess.fork_exec")
    raise GuardViolation("the run-time guard refused _posixsubprocess.fork_exec")


def _runtime_state() -> dict[str, Any]:
    """Where runs are forked from (:func:`_harden`), or in a run that finds it missing:
    the loaded modules of :data:`_RUNTIME_TOPS`, and every module attribute that holds
    ``_posixsubprocess.fork_exec`` (``_posixsubprocess.fork_exec``,
    ``subprocess._fork_exec``) as ``(module dict, name)`` pairs."""
    modules = sys.modules
    runtime = tuple(sorted(n for n in modules if n.partition(".")[0] in _RUNTIME_TOPS
                           and n not in _ENV_LOADED))
    spawn: list[tuple[dict[str, Any], str]] = []
    posixsubprocess = modules.get("_posixsubprocess")
    fork_exec = getattr(posixsubprocess, "fork_exec", None)
    if fork_exec is not None:
        for module in list(modules.values()):
            space = getattr(module, "__dict__", None)
            if type(space) is dict:
                spawn += [(space, k) for k, v in list(space.items()) if v is fork_exec]
    return {"runtime": runtime, "spawn": tuple(spawn), "drops": {},
            "from": (posixsubprocess, modules.get("subprocess"))}


#: what a run whose allowlist names a network client (:data:`_NETWORK_MODULES`) keeps:
#: the clients import some of these lazily (``socket.sendfile``: ``selectors``)
_NETWORK_TOPS = frozenset({"socket", "_socket", "ssl", "_ssl", "select", "selectors"})


def _drops(state: dict[str, Any], allowed: frozenset[str]) -> tuple[str, ...]:
    """The names of ``state["runtime"]`` a run with this allowlist drops (a payload's
    module of the same name does not keep one: the payload's is imported instead)."""
    keep = _NETWORK_TOPS if allowed & _NETWORK_MODULES else frozenset()
    return tuple(n for n in state["runtime"] if n.partition(".")[0] not in keep
                 and not _import_ok(n, allowed, frozenset(), _LAZY_STDLIB, PKG, type, str))


def prepare_shed(*allowed_sets: frozenset[str]) -> None:
    """Work out here, once, which modules a run with one of these allowlists (and a
    payload that shadows none of them) drops (:func:`_shed_runtime`): a run forked from
    this process takes that list as it is. Call it where runs are forked from only, after
    :func:`_harden`."""
    state = _ARM_STATE.get("shed")
    if state is not None:
        for allowed in allowed_sets:
            state["drops"][frozenset(allowed)] = _drops(state, frozenset(allowed))


def _shed_runtime(allowed: frozenset[str]) -> list[Any]:
    """In a run's process, before the snippet's first line: no module attribute holds
    ``fork_exec`` any more (the function is freed: nothing reaches it, not even a walk
    from an object the snippet holds through ``__globals__`` or ``__subclasses__``),
    the run may not start a process at all (``RLIMIT_NPROC`` 0: the kernel refuses the
    fork, whatever code asks, for a sandbox's user; not for the host's root), and the
    modules of :data:`_RUNTIME_TOPS` the allowlist does not grant leave ``sys.modules``.
    Returns those modules: they stay alive (freeing them would write to every page they
    fill) but are held by no module, only by this process's caller."""
    state = _ARM_STATE.get("shed")
    modules = sys.modules
    if state is None or state["from"] != (modules.get("_posixsubprocess"),
                                          modules.get("subprocess")):
        state = _runtime_state()  # (either loaded since: found here, at a cost)
    for space, name in state["spawn"]:
        space[name] = _refused_fork_exec
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    except (OSError, ValueError):
        pass
    names = state["drops"].get(allowed)
    if names is None:
        names = _drops(state, allowed)
    return [modules.pop(name) for name in names if name in modules]


def _without_frames() -> None:
    """What the standard library would ask a frame for, answered without one (the guard
    refuses frames): 3.11's namedtuple names ``__main__`` as its class's module (logging:
    :func:`_guard_logging`). Where runs are forked from (or in a run, if not there)."""
    collections = sys.modules.get("collections")
    kwdefaults = getattr(getattr(collections, "namedtuple", None), "__kwdefaults__", None)
    if sys.version_info < (3, 12) and isinstance(kwdefaults, dict) \
            and kwdefaults.get("module", "") is None:
        kwdefaults["module"] = "__main__"


def _report_refusals(errors: list[dict[str, Any]], refusals: list[str]) -> None:
    """Every refusal is in the transcript, also when the snippet caught the exception
    and went on: one GuardViolation error each, unless an error already says so."""
    said = {e["message"] for e in errors}
    for message in refusals:
        if message not in said:
            errors.append({"type": "GuardViolation", "line": None, "path": None,
                           "traceback": "", "message": message + " (the GuardViolation was "
                           "caught and the run went on)"})


def run_child(files: dict[str, str], options: dict[str, Any], out: _Out) -> dict[str, Any]:
    """Run the payload in this (fresh, forked) process; return the end record.

    ``random`` needs no reseed here: every process that gets here was forked with one
    (a template's child by ``os.fork``, whose at-fork hook ``random`` registers; a
    ``--once`` worker by the agent's ``fork_call``, ``agent._reseed_random``)."""
    caps = out.caps
    forbidden = frozenset(options.get("forbidden", ()))
    # prebuilt: this process is a fresh fork, what the run does to it stays here
    safe = _SAFE_BUILTINS.get(forbidden) or _safe_builtins(forbidden)
    payload = _Payload(files, safe)
    if options.get("allowed") is not None:  # None: no import guard (unvalidated test runs)
        safe["__import__"] = _guard(frozenset(options["allowed"]), payload.tops)
    sys.meta_path.insert(0, payload)
    for path, source in files.items():
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    main = types.ModuleType("__main__")
    g = main.__dict__
    g.update(__package__=PKG, __builtins__=safe)
    sys.modules["__main__"] = main
    sys.stdout, sys.stderr = _Stream(out, "stdout"), _Stream(out, "stderr")
    if not _HARDENED:
        _harden()
    _RUN_LOG.target = _Stream(out, "log")
    if "logging" in sys.modules and not _LOGGING_CAPTURED[0]:
        _capture_logging(sys.modules["logging"])
    errors: list[dict[str, Any]] = []
    result: str | None = None
    timed_out = cut = False
    armed = [False]
    refusals: list[str] = []  # what the run-time guard refused

    def on_alarm(signum: int, frame: Any) -> None:
        if armed[0]:
            raise _Timeout

    _signal.signal(_SIGALRM, on_alarm)  # _signal's: no enum conversions
    # the modules the run dropped from sys.modules (a local: held, reached by no module)
    shed: list[Any] = []
    if options.get("allowed") is not None:  # None: no guards (unvalidated test runs)
        shed = _arm_guard(frozenset(options["allowed"]), frozenset(payload.tops), refusals,
                          files.values())
    t0 = time.perf_counter()
    try:
        code, expr = _compile_main(files["main.py"], options.get("split"))
        signal.setitimer(signal.ITIMER_REAL, options["timeout_ms"] / 1000, 0.02)
        armed[0] = True
        try:
            exec(code, g)
            value = None if expr is None else eval(expr, g)
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        if value is not None:
            result, cut = _cut(repr(value), caps["result_chars"])
    except _Timeout:
        timed_out = True
        errors.append({"type": "TimeoutError", "message": f"the snippet ran past its "
                       f"{options['timeout_ms']} ms timeout", "line": None, "path": None,
                       "traceback": ""})
    except MemoryError as exc:  # the address-space cap: say so, keep what was captured
        _use_memory_reserve()
        err = _error(exc, set(files), caps)
        err["message"] = (f"the snippet ran out of memory (its limit is "
                          f"{options.get('mem_mb')} MiB)")
        errors.append(err)
    except BaseException as exc:  # the snippet's own failure, SystemExit included
        errors.append(_error(exc, set(files), caps))
    finally:
        duration = (time.perf_counter() - t0) * 1000
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        facts, facts_cut = _facts(g, caps)
    _report_refusals(errors, refusals)
    del shed  # (the process ends with the run)
    errors_cut = any(e["message"].endswith(MARK) or e["traceback"].startswith(MARK)
                     for e in errors)
    truncated = [n for n, c in (("result", cut), ("facts", facts_cut), ("logs", out.dropped),
                                ("errors", errors_cut)) if c]
    return {"facts": facts, "result": result, "errors": errors, "duration_ms": duration,
            "timed_out": timed_out, "truncated": truncated}


# -- run-time guards for what the validator cannot see ------------------------------------
# A class namespace can be built from run-time strings (type(name, bases, dict), the enum
# functional API, copy's state); the validator never sees those names. These guards close
# the standard-library corners that would turn such strings into code or attribute writes
# (docs/validator.md, "Run-time guards").

_UNSET: Any = object()
#: Names the methods dataclasses generates may read, besides their own parameters and the
#: generator's locals; and the dunder attributes they use.
_CODEGEN_NAMES = frozenset({"type", "super", "hash", "NotImplemented"})
_CODEGEN_DUNDERS = frozenset({"__class__", "__qualname__", "__setattr__", "__delattr__",
                              "__post_init__"})
_CODEGEN_BANNED = (ast.Lambda, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom,
                   ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.Await,
                   ast.NamedExpr, ast.comprehension)


def _fn_shape_ok(fn: ast.AST, known: set[str] | frozenset[str]) -> bool:
    """Whether one generated method reads only its parameters, the generator's locals and
    a few builtins, defines nothing and touches only the dunders generated code uses."""
    if not isinstance(fn, ast.FunctionDef):
        return False
    params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    names = params | set(known) | _CODEGEN_NAMES
    for node in ast.walk(fn):
        if node is fn:
            continue
        if isinstance(node, (ast.FunctionDef, *_CODEGEN_BANNED)):
            return False
        if isinstance(node, ast.Name) and node.id not in names:
            return False
        if (isinstance(node, ast.Attribute) and node.attr.startswith("__")
                and node.attr.endswith("__") and node.attr not in _CODEGEN_DUNDERS):
            return False
    return True


def _refuse_generated(name: str, text: str) -> TypeError:
    return TypeError("dataclass field names must be identifiers; refused to generate "
                     f"{name} from {text[:200]!r}")


def _check_generated(text: str, name: str, local_names: list[str]) -> None:
    """Refuse source generated by dataclasses unless it has the shape the generators give it:
    a field name that is not an identifier (``"a,print(os)"``) would otherwise run as code."""
    try:
        tree = ast.parse(text)
        (outer,) = tree.body
        fn, ret = outer.body  # type: ignore[attr-defined]
        ok = (isinstance(outer, ast.FunctionDef) and outer.name == "__create_fn__"
              and [a.arg for a in outer.args.args] == local_names
              and not (outer.args.defaults or outer.args.kwonlyargs or outer.args.posonlyargs
                       or outer.args.vararg or outer.args.kwarg or outer.decorator_list)
              and isinstance(fn, ast.FunctionDef) and fn.name == name and not fn.decorator_list
              and isinstance(ret, ast.Return) and isinstance(ret.value, ast.Name)
              and ret.value.id == name and _fn_shape_ok(fn, set(local_names)))
    except (SyntaxError, ValueError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise _refuse_generated(name, text)


def _checked_add_fns_to_class(self: Any, cls: Any) -> Any:
    """``dataclasses._FuncBuilder.add_fns_to_class`` (3.13+), with the text it is about to
    exec checked first: built here as the builder builds it (its names, sources and
    locals), every method checked as :func:`_check_generated` checks one."""
    names, local_names = list(self.names), list(self.locals)
    text = (f"def __create_fn__({','.join(local_names)}):\n" + "\n".join(self.src)
            + f"\n return {'(' + ','.join(names) + ',)' if names else '()'}")
    try:
        tree = ast.parse(text)
        (outer,) = tree.body
        *fns, ret = outer.body  # type: ignore[attr-defined]
        ok = (isinstance(outer, ast.FunctionDef) and outer.name == "__create_fn__"
              and [a.arg for a in outer.args.args] == local_names
              and not (outer.args.defaults or outer.args.kwonlyargs or outer.args.posonlyargs
                       or outer.args.vararg or outer.args.kwarg or outer.decorator_list)
              and [getattr(f, "name", None) for f in fns] == names
              and isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple)
              and [getattr(e, "id", None) for e in ret.value.elts] == names)
        for fn in fns:
            decorators = getattr(fn, "decorator_list", [])
            ok = ok and _fn_shape_ok(fn, set(local_names)) and all(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Name)
                and d.func.id in local_names and d.func.id.startswith("__dataclass")
                and not d.args and not d.keywords for d in decorators)
    except (SyntaxError, ValueError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise _refuse_generated(",".join(names), text)
    return sys.modules["dataclasses"]._FuncBuilder._unguarded_add_fns_to_class(self, cls)


def _refuse_dataclasses(*args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError("dataclasses is not available in a snippet on this Python: its code "
                    "generation could not be guarded (the guard fails closed)")


def _checked_create_fn(name: str, args: list[str], body: list[str], *,
                       globals: Any = None, locals: Any = None,  # noqa: A002 (its names)
                       return_type: Any = _UNSET) -> Any:
    """``dataclasses._create_fn`` (3.11/3.12), with the generated text checked first."""
    local_vars: dict[str, Any] = dict(locals or {})
    ret = ""
    if return_type is not _UNSET and return_type is not sys.modules["dataclasses"].MISSING:
        local_vars["_return_type"] = return_type
        ret = "->_return_type"
    text = (f"def __create_fn__({', '.join(local_vars)}):\n"
            f" def {name}({','.join(args)}){ret}:\n"
            + "\n".join(f"  {line}" for line in body) + f"\n return {name}")
    _check_generated(text, name, list(local_vars))
    ns: dict[str, Any] = {}
    exec(text, globals, ns)
    return ns["__create_fn__"](**local_vars)


def _guard_dataclasses(dc: Any) -> None:
    """dataclasses writes field names into source it execs: check every generated text.
    3.11/3.12 build each method with ``_create_fn``, 3.13 all of a class's at once with
    ``_FuncBuilder.add_fns_to_class``; a dataclasses with neither is refused whole (the
    guard fails closed: a new code generator is not run unchecked)."""
    builder = getattr(dc, "_FuncBuilder", None)
    if callable(getattr(dc, "_create_fn", None)):  # 3.11, 3.12
        dc._unguarded_create_fn = dc._create_fn  # kept: freeing it would touch many pages
        dc._create_fn = _checked_create_fn
    elif isinstance(builder, type) and callable(getattr(builder, "add_fns_to_class", None)):
        builder._unguarded_add_fns_to_class = builder.add_fns_to_class  # type: ignore[attr-defined]
        builder.add_fns_to_class = _checked_add_fns_to_class  # type: ignore[attr-defined]
    else:
        dc._process_class = _refuse_dataclasses
        dc.dataclass = dc.make_dataclass = _refuse_dataclasses


_PLAIN = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
          types.MethodType)


def _state_keys_ok(part: Any) -> bool:
    return part is None or (type(part) is dict and not any(
        isinstance(k, str) and k.startswith("__") for k in part))


def _checked_reconstruct(x: Any, memo: Any, func: Any, args: Any, state: Any = None,
                         *rest: Any, **kw: Any) -> Any:
    """``copy._reconstruct``, refusing a state for a class, module or function and dunder
    state keys (``setattr(y, key, value)`` for each)."""
    original = sys.modules["copy"]._unguarded_reconstruct
    if state is None:
        return original(x, memo, func, args, state, *rest, **kw)

    def make(*a: Any) -> Any:
        y = func(*a)
        if isinstance(y, _PLAIN):
            raise TypeError("copy: refusing to set the state of a class, module or function")
        pieces = state if type(state) is tuple and len(state) == 2 else (state,)
        if not hasattr(y, "__setstate__") and not all(_state_keys_ok(p) for p in pieces):
            raise TypeError("copy: a state with dunder keys is refused")
        return y

    return original(x, memo, make, args, state, *rest, **kw)


def _guard_copy(cp: Any) -> None:
    """copy applies a reduced object's state with setattr(y, key, value)."""
    if callable(getattr(cp, "_reconstruct", None)):
        cp._unguarded_reconstruct = cp._reconstruct
        cp._reconstruct = _checked_reconstruct


def _guard_logging(logging: Any) -> None:
    """{-style formats walk attributes by a template built at run time."""
    logging._srcfile = None  # no caller lookup: it walks frames (refused by the guard)
    formatter = getattr(logging, "Formatter", None)
    if isinstance(formatter, type):  # the stock one reads tb_frame (traceback module)
        formatter.formatException = _format_exception  # type: ignore[attr-defined]
    styles = getattr(logging, "_STYLES", None)
    if isinstance(styles, dict) and "{" in styles:
        logging._unguarded_brace_style = styles.pop("{")  # kept, not freed


class _NoFrame:
    """What 3.11's enum gets for its caller's frame (:func:`_guard_enum`)."""

    f_globals = types.MappingProxyType({"__name__": "__main__"})


class _SysWithoutFrames:
    """``sys`` as 3.11's enum sees it: ``_getframe`` answers a frame-like object that names
    ``__main__``, without asking for a frame (the run-time guard refuses that)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _getframe(self, depth: int = 0) -> Any:
        return _NoFrame


def _guard_enum(enum: Any) -> None:
    """3.11's functional API (``Enum("E", "a b")``) names the class's module from its
    caller's frame; the guard refuses frames, so it would name it ``enum``."""
    if sys.version_info < (3, 12) and getattr(enum, "sys", None) is sys:
        enum.sys = _SysWithoutFrames(sys)


_GUARDS = {"dataclasses": _guard_dataclasses, "copy": _guard_copy, "logging": _guard_logging,
           "enum": _guard_enum}


class _GuardingLoader:  # a loader (duck-typed, see _Payload)
    """Loads a guarded module with its real loader, then applies its guard."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        made: types.ModuleType | None = self.inner.create_module(spec)
        return made

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        _GUARDS[self.name](module)


class _GuardOnImport:  # a meta path finder (duck-typed, see _Payload)
    """Guards a module of ``_GUARDS`` that is first imported during the run (a template
    started without ``--preload``; the standard library's own lazy imports)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname not in _GUARDS:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = cast("Loader", _GuardingLoader(spec.loader, fullname))
                return spec
        return None


_GUARD_FINDER = _GuardOnImport()
_HARDENED = False


def _harden() -> None:
    """Install the run-time guards in this process. Done once where runs are forked from
    (a template after its preloads; a strict slot's fork server, through the preload of
    :mod:`corral.snippets.sandbox.guards`), so a run starts guarded without paying the
    page copies that patching in a fresh fork costs (~0.1 ms); a run that finds them
    missing installs them itself. Never in the host: it changes the standard library."""
    global _HARDENED
    _HARDENED = True
    modules = sys.modules
    if "dataclasses" in modules:
        _guard_dataclasses(modules["dataclasses"])
    if "copy" in modules:
        _guard_copy(modules["copy"])
    if "enum" in modules:
        _guard_enum(modules["enum"])
    if "logging" in modules:
        _guard_logging(modules["logging"])
        _capture_logging(modules["logging"])
    sys.meta_path.insert(0, _GUARD_FINDER)
    _without_frames()
    _ARM_STATE.update(consts=_guard_constants(), loaded=frozenset(modules),
                      shed=_runtime_state())


class _RunLog:
    """logging's stream for a run: the run's ``log`` stream (:attr:`target`, set by
    :func:`run_child`), or ``sys.stderr`` as logging's own last resort has it where no
    run is. Installed once where runs are forked from (:func:`_harden`), so a run sets
    one attribute instead of building a handler (a lock, weak references: pages copied)."""

    def __init__(self) -> None:
        self.target: _Stream | None = None

    def write(self, s: str) -> int:
        target = self.target if self.target is not None else sys.stderr
        return int(target.write(s))

    def flush(self) -> None:
        (self.target if self.target is not None else sys.stderr).flush()


_RUN_LOG = _RunLog()
_LOGGING_CAPTURED = [False]


def _capture_logging(logging: Any) -> None:
    """``logging.basicConfig()`` without a file or handlers and ``logging.lastResort`` write
    to the run's ``log`` stream (:data:`_RUN_LOG`)."""
    _LOGGING_CAPTURED[0] = True
    original = logging.basicConfig

    def basic_config(**kwargs: Any) -> None:
        if _RUN_LOG.target is not None and "filename" not in kwargs and "handlers" not in kwargs:
            kwargs.setdefault("stream", _RUN_LOG)
        original(**kwargs)

    logging.basicConfig = basic_config
    logging.lastResort = logging.StreamHandler(_RUN_LOG)
    logging.lastResort.setLevel(logging.WARNING)


def _child(files: dict[str, str], options: dict[str, Any], fd: int, *,
           new_session: bool = True) -> None:
    """Set up this fresh process for one run (session, stdio, rlimits) and run it;
    its records go to ``fd``."""
    if new_session:
        os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    cpu = int(options["timeout_ms"] / 1000 + options["grace_ms"] / 1000) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    if options.get("mem_mb"):
        statm = os.open("/proc/self/statm", os.O_RDONLY)
        try:
            vm = int(os.read(statm, 256).split()[0]) * _PAGE
        finally:
            os.close(statm)
        cap = vm + int(options["mem_mb"]) * 1024 * 1024
        # the hard limit keeps a reserve above the soft one: the run's MemoryError
        # handler raises the soft limit to it, so the transcript (facts, traceback,
        # records) can still be written (the sandbox's cgroup bounds it all anyway)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap + _MEMORY_RESERVE))
    out = _Out(fd, {**CAPS, **options.get("caps", {})})
    out.write(_GO)  # the worker is set up: from here on, what happens is the run's
    out.send(_records.End(run_child(files, options, out)))


class Collector:
    """Turns a run's record stream (``go``, log lines, ``end``) into its output: used by the
    template for its children, and by the host for a run forked straight from a sandbox's
    agent (``--once``). The stream is hostile input (the run's process writes it): every
    record is checked (JSON, size, nesting, kind, types, order) and anything an honest
    worker never writes raises :class:`BadRecord`; so does more output than any honest run
    writes. Never buffers more than that bound."""

    def __init__(self, options: dict[str, Any],
                 on_logs: Callable[[list[dict[str, str]]], None] | None = None) -> None:
        #: called with the log lines of each chunk fed (records that arrived together, in
        #: order, as they go into ``logs``), as soon as they are read
        self.on_logs = on_logs
        given = options.get("caps")
        caps: dict[str, Any] = given if isinstance(given, dict) else {}
        self.caps = {**CAPS, **{k: v for k, v in caps.items() if isinstance(v, int)}}
        timeout = options.get("timeout_ms", 0)
        self.timeout_ms = timeout if isinstance(timeout, int) else 0
        self.logs: list[dict[str, str]] = []
        self.end: dict[str, Any] | None = None
        self.reply: dict[str, Any] | None = None  # a --once child's pong or refusal
        self.cut = False  # the worker cut a log line to the line cap
        self._decoder = _records.Decoder(log_lines=self.caps["log_lines"],
                                         log_bytes=self.caps["log_bytes"],
                                         facts_bytes=self.caps["facts_bytes"])
        #: more bytes than any honest run writes (``wire.records.size_limit``)
        self.limit: int = self._decoder.limit

    @property
    def started(self) -> bool:
        """Whether the run's ``go`` record came."""
        return bool(self._decoder.started)

    def feed(self, chunk: bytes) -> None:
        """Take some output. Raises BadRecord at the first malformed record, or when the
        output grows past what any honest run writes."""
        first = len(self.logs)
        for rec in self._decoder.feed(chunk):
            if isinstance(rec, _records.Log):
                self.logs.append({"stream": rec.stream, "text": rec.text})
                self.cut = self.cut or rec.cut
            elif isinstance(rec, _records.End):
                self.end = rec.fields
            elif isinstance(rec, _records.Pong):
                self.reply = {"pong": True, "pid": rec.pid}
            elif isinstance(rec, _records.Refused):
                self.reply = {"refused": rec.text}
        if self.on_logs is not None and len(self.logs) > first:
            self.on_logs(self.logs[first:])

    def finish(self, code: int, killed: bool, elapsed_ms: float) -> dict[str, Any]:
        """The run's output, given how its process ended (exit code, negative: signal)."""
        if self._decoder.cut_off() and self.end is None and not killed:
            raise BadRecord("the run's last record is cut off")
        end = self.end
        if end is None:
            how = f"signal {-code}" if code < 0 else f"exit status {code}"
            error: dict[str, Any] = {
                "type": "WorkerCrashed", "line": None, "path": None, "traceback": "",
                "message": f"the snippet's process ended with {how} before finishing",
                "exit_code": code}
            if killed:
                error = {"type": "TimeoutError", "line": None, "path": None, "traceback": "",
                         "message": f"the snippet ran past its {self.timeout_ms} ms timeout "
                         "and was killed"}
            end = {"facts": {}, "result": None, "duration_ms": elapsed_ms, "timed_out": killed,
                   "truncated": [], "errors": [error]}
        if self.cut and "logs" not in end.get("truncated", ()):  # a line cut to the line cap
            end = {**end, "truncated": [*end.get("truncated", ()), "logs"]}
        return {**end, "logs": self.logs}


#: how a template's line of streamed log lines starts (``{"logs": [[stream, text], ...]}``);
#: a frame starts ``{"v":``, so the host tells them apart by the first bytes
LOGS_PREFIX = b'{"logs":'


def _forward_logs(lines: list[dict[str, str]]) -> None:
    """A template streams a run's log lines to the host as they arrive: one line per
    chunk read from the child (the records that arrived together), flushed at once."""
    out = sys.stdout.buffer
    out.write(json.dumps({"logs": [[x["stream"], x["text"]] for x in lines]},
                         ensure_ascii=False, separators=(",", ":"))
              .encode("utf-8", "replace") + b"\n")
    out.flush()


class _SpareLost(Exception):
    """The template's spare (:func:`_fork_spare`) is gone before its job came: only a run
    (or something it left behind) kills it; the template refuses to serve on."""


#: set by ``--eof-ends-run`` (a pool's template: its host sends one job at a time and
#: closes stdin only to close the slot): stdin's EOF during a run kills the run (its own
#: session: the kill of the template would not reach it) and ends the template
_EOF_ENDS_RUN: list[bool] = []
#: the template's spare, when it keeps one (``--prefork``): ``(pid, job fd, record fd)``
_SPARE: list[tuple[int, int, int]] = []


def _fork_spare() -> tuple[int, int, int]:
    """Fork the child of the next run ahead of its job (``--prefork``): the fork, and the
    page copies of a typical run (:data:`_PREFAULT`), are paid while the template waits,
    not on the next job's path. The child (:func:`_spare`) holds nothing of the template's
    but its memory: a new session, stdio on /dev/null, every other descriptor closed;
    it reads its job (the invoke frame) from a pipe of its own, to EOF (none: the template
    closed or died, it exits), then runs it as :func:`_run`'s child would. Returns
    ``(pid, job write end, record read end)``."""
    jr, jw = os.pipe2(os.O_CLOEXEC)
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except BaseException:
        for fd in (jr, jw, r, w):
            os.close(fd)
        raise
    if pid == 0:
        code = 0
        try:
            _spare(jr, w)
        except BaseException:
            code = 70
        os._exit(code)
    os.close(jr)
    os.close(w)
    return pid, jw, r


def _spare(jr: int, w: int) -> None:
    """The spare's life: set up, prefault, wait for the job, run it (records to ``w``)."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    keep = sorted({jr, w})
    os.closerange(3, keep[0])  # the template's pipes (the host's, the previous run's)
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 1 << 20)
    # the pool's own (trusted) code, a line a step: copies the pages a run writes. Only
    # while no job waits: a job that comes meanwhile starts after the step under way
    waiting = select.poll()
    waiting.register(jr, select.POLLIN)
    space: dict[str, Any] = {"__name__": "__corral_warmup__"}
    for step in (line for code in _PREFAULT for line in code.splitlines() if line.strip()):
        if waiting.poll(0):
            break
        try:
            exec(compile(step, "<corral-prefault>", "exec"), space)
        except Exception:
            pass
    space.clear()
    chunks, size = [], 0
    while chunk := os.read(jr, 1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > _MAX_JOB_BYTES:
            break
    os.close(jr)
    if not chunks:
        return  # the template closed (or died) before a job came
    job = _job_of(b"".join(chunks))
    _child({str(p): str(s) for p, s in job["files"]}, dict(job["options"]), w,
           new_session=False)


def _hand_over(raw: bytes) -> tuple[int, int]:
    """Give ``raw`` (the job's invoke frame) to the spare; ``(pid, record fd)`` of the run.
    Raises _SpareLost if the spare is gone."""
    pid, jw, r = _SPARE.pop()
    try:
        gone = os.waitpid(pid, os.WNOHANG)[0] != 0
        if not gone:
            try:
                view = memoryview(raw)
                while view:
                    view = view[os.write(jw, view):]
            except BrokenPipeError:
                gone = True
    finally:
        os.close(jw)
    if gone:
        os.close(r)
        _killpg(pid)
        raise _SpareLost("the template's spare process is gone")
    return pid, r


def _next_spare(pid: int, r: int) -> None:
    """Fork the next spare (the run ``pid``, reading on ``r``, is over or ends: its exit
    runs beside this fork). On failure the run is killed and the error raised: the
    template never answers a job without its spare (the host counts on it)."""
    try:
        _SPARE.append(_fork_spare())
    except BaseException:
        _killpg(pid)
        os.close(r)
        raise


def _run(job: dict[str, Any], raw: bytes = b"") -> dict[str, Any]:
    """One run in a fresh child, collected here: a spare's (``--prefork``: it gets ``raw``)
    or one forked now. With ``options["stream"]`` the log lines go to the host as they
    arrive (:func:`_forward_logs`) and the output leaves them out (``logs`` is empty:
    the host has them already). With ``--eof-ends-run``, when the host closes the
    template's stdin during the run (the slot is being closed), the run is killed and
    the template exits."""
    files = {str(p): str(s) for p, s in job["files"]}
    options = dict(job["options"])
    stream = options.get("stream") is True
    collector = Collector(options, _forward_logs if stream else None)
    t0 = time.monotonic()
    prefork = bool(_SPARE)
    if prefork:
        pid, r = _hand_over(raw)
    else:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(r)
                _child(files, options, w)
            except BaseException:
                code = 70
            os._exit(code)
        os.close(w)
    deadline = t0 + (options["timeout_ms"] + options["grace_ms"]) / 1000
    killed = False
    bad: ValueError | None = None
    poller = select.poll()
    poller.register(r, select.POLLIN)
    if _EOF_ENDS_RUN:  # the pool's template: its host's EOF during a run closes the slot
        poller.register(0, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        events = poller.poll(max(left, 0) * 1000) if left > 0 else []
        if not events:
            killed = True
            break
        host = [ev for fd, ev in events if fd == 0]
        if host:
            peek = getattr(sys.stdin.buffer, "peek", None)  # a frame read ahead, held
            if host[0] & select.POLLIN or (peek is not None and peek(1)):
                poller.unregister(0)  # the host's next frame (sent ahead): read after the run
            else:  # its EOF: the host closed the slot; end the run, then this process
                _killpg(pid)
                os.waitpid(pid, 0)
                _killpg(pid)
                os._exit(0)
            if len(events) == 1:
                continue
        chunk = os.read(r, 65536)
        if not chunk:
            break
        try:
            collector.feed(chunk)
        except BadRecord as exc:
            bad = exc
            break
        if prefork and collector.end is not None and not _SPARE:
            # the run's last record: its process is on its way out (freeing its memory
            # takes milliseconds); the next spare's fork goes beside that, not after it
            _next_spare(pid, r)
    if prefork and not _SPARE:
        _next_spare(pid, r)
    os.close(r)
    _killpg(pid)
    _, status = os.waitpid(pid, 0)
    _killpg(pid)  # anything the child started and left behind
    if bad is not None:
        raise bad  # the host gets an error frame: the worker is not to be trusted
    elapsed = (time.monotonic() - t0) * 1000
    output = collector.finish(os.waitstatus_to_exitcode(status), killed, elapsed)
    return {**output, "logs": []} if stream else output


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _write(frame: dict[str, Any]) -> None:
    out = sys.stdout.buffer
    out.write(json.dumps(frame, ensure_ascii=False, separators=(",", ":"), default=repr)
              .encode("utf-8", "replace") + b"\n")
    out.flush()


def serve(preload: list[str], *, prefork: bool = False) -> None:
    """The template loop: one invoke frame in, one output (or error) frame out. With
    ``prefork`` the child of the next run is forked ahead of its job
    (:func:`_fork_spare`): the template then holds one child between jobs."""
    before = frozenset(sys.modules)
    for name in preload:
        try:
            _real_import(name)
        except Exception:
            pass
    for code in _WARMUP:  # the pool's own (trusted) warm-up: lazy imports paid here, once
        try:
            exec(compile(code, "<corral-warmup>", "exec"), {"__name__": "__corral_warmup__"})
        except Exception:
            pass
    if _EXTRA_ROOTS:
        # an environment's packages keep what they imported (pandas: shutil, tempfile
        # ...): they import it again lazily, and hold it in their own globals anyway;
        # the shed's other parts (fork_exec refused, RLIMIT_NPROC 0) still hold
        _ENV_LOADED.update(frozenset(sys.modules) - before)
    _harden()  # once, here: every run is a fork of this process
    gc.collect()
    gc.freeze()
    if prefork:
        _SPARE.append(_fork_spare())
    stdin = sys.stdin.buffer
    while line := stdin.readline():
        try:
            job = _job_of(line)
            if job.get("op") == "ping":
                output: dict[str, Any] = {"pong": True, "pid": os.getpid()}
            elif job.get("op") == "run":
                output = _run(job, line)
            else:
                raise ValueError(f"unknown op {job.get('op')!r}")
        except (ValueError, KeyError, TypeError) as exc:
            _write({"v": 1, "kind": "error", "error": {"code": "config-invalid",
                                                      "message": str(exc)[:500]}})
            continue
        except _SpareLost as exc:  # the host discards this slot
            _write({"v": 1, "kind": "error", "error": {"code": "provider-error",
                                                      "message": str(exc)}})
            return
        _write({"v": 1, "kind": "output", "output": output})


#: json.loads' C scanner, called straight: json.loads runs enough Python around it
#: (encoding detection, the decoder's methods, a regex) to copy ~30 more pages in a fork
_SCAN: Any = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # its stub


def _job_of(data: bytes) -> dict[str, Any]:
    """The job of one invoke frame (UTF-8 JSON, as json.loads reads it); ValueError if
    it is not one."""
    text = data.decode("utf-8").strip(" \t\n\r")  # JSON's whitespace
    try:
        frame, end = _SCAN(text, 0)
    except StopIteration:
        raise ValueError("expected an invoke frame, not JSON") from None
    if end != len(text):
        raise ValueError("extra data after the invoke frame")
    if not isinstance(frame, dict):
        raise ValueError("expected an invoke frame with an object input")
    job = frame["input"]
    if frame.get("v") != 1 or frame.get("kind") != "invoke" or not isinstance(job, dict):
        raise ValueError("expected an invoke frame with an object input")
    return job


def serve_once() -> NoReturn:
    """One job, in this process (a fresh fork of the sandbox's agent, ``--once``): read
    one invoke frame from stdin to EOF, run it here and write its records (``go``, log
    lines, ``end``) on stdout; the host collects them (:class:`Collector`). Never
    returns: the process exits when the run is over."""
    chunks, size = [], 0
    while chunk := os.read(0, 1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > _MAX_JOB_BYTES:
            break
    reply: _records.Pong | _records.Refused | None = None
    try:
        job = _job_of(b"".join(chunks))
        if job.get("op") == "ping":
            reply = _records.Pong(os.getpid())
        elif job.get("op") != "run":
            raise ValueError(f"unknown op {job.get('op')!r}")
        files = {str(p): str(s) for p, s in job["files"]} if reply is None else {}
        options = dict(job["options"]) if reply is None else {}
    except (ValueError, KeyError, TypeError) as exc:
        reply = _records.Refused(str(exc)[:500])
    code = 0
    try:
        if reply is not None:
            os.write(1, _records.encode(reply))
        else:
            fd = os.dup(1)  # the record pipe; 0/1/2 go to /dev/null
            _child(files, options, fd, new_session=False)  # a session leader already
    except BaseException:
        code = 70
    os._exit(code)


def main(argv: list[str]) -> int:
    if "--once" in argv:
        serve_once()
    preload = argv[argv.index("--preload") + 1].split(",") if "--preload" in argv else []
    if "--warmup" in argv:  # the pool's own warm-up code (trusted, never a snippet's):
        _WARMUP.append(argv[argv.index("--warmup") + 1])  # run once before any fork
    if "--path" in argv:  # an environment's packages (-I ignores PYTHONPATH): after the
        extra = argv[argv.index("--path") + 1]  # standard library, never before it
        sys.path.append(extra)
        _EXTRA_ROOTS.append(extra.rstrip("/") + "/")
    if "--eof-ends-run" in argv:
        _EOF_ENDS_RUN.append(True)
    if "--prefault" in argv:  # the pool's own code, run by each spare before its job
        _PREFAULT.append(argv[argv.index("--prefault") + 1])
    serve([p for p in preload if p], prefork="--prefork" in argv)
    return 0


# a fork entry of the sandbox agent (``--once``): its I/O is os.read/os.write on 0/1/2, so
# the agent's child builds no text wrappers for it (agent.RAW_STDIO; a plain attribute:
# this file runs without corral too)
setattr(main, "corral_raw_stdio", True)  # noqa: B010 (mypy: a function's attribute)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
