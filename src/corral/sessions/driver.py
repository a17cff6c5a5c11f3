"""The session driver: the program a session runs inside its sandbox (stdlib only).

It is written into the sandbox and run as ``python -S -B <file>``; it unlinks its file
at start. It reads JSON lines on stdin (``{"op": "run", "id": N, "code": "..."}``,
``{"op": "interrupt", "id": N}``) in a thread, runs each cell in the main thread in
one persistent globals dict, and writes JSON lines on a private copy of the original
stdout (fd 1 then points at stderr, so output written to the fd directly, by a C
library or a child process, reaches the host as the process's stderr):

* ``{"t": "ready", "pid": P}`` once, at start;
* ``{"t": "stream", "id": N, "name": "stdout"|"stderr", "text": "..."}``;
* ``{"t": "display", "id": N, "data": {mime: value}}`` and ``{"t": "result", ...}``
  (the last expression's value), as MIME bundles;
* ``{"t": "error", "id": N, "ename": ..., "evalue": ..., "traceback": "..."}``;
* ``{"t": "done", "id": N}`` when the cell ended.

Rich display is the IPython rich-repr protocol (``_repr_mimebundle_``, ``_repr_html_``,
``_repr_png_`` ...) read directly, without IPython; matplotlib draws with Agg through a
backend of this driver (``module://_corral_mpl``) whose ``show()`` displays the open
figures as PNG, and every figure still open at the end of a cell is displayed and closed
(as Jupyter's inline backend does).

Nothing here is trusted by the host: it checks and caps every frame it reads.
"""

import ast
import base64
import json
import linecache
import os
import queue
import signal
import sys
import threading
import traceback
from typing import Any

_MAX_TEXT_FRAME = 16 * 1024      # characters of stream text per frame
_MAX_MIME = 4 * 1024 * 1024      # bytes of one MIME value (base64 for images)
_MAX_PLAIN = 64 * 1024           # characters of a text/plain repr
_FILE = os.path.abspath(__file__)
_MIMES = (
    ("text/html", "_repr_html_"), ("image/png", "_repr_png_"),
    ("image/svg+xml", "_repr_svg_"), ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"), ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
)
_BINARY = ("image/png", "image/jpeg")

_out_fd = os.dup(1)
os.dup2(2, 1)
_lock = threading.Lock()


def _send(obj: Any) -> None:
    data = (json.dumps(obj, separators=(",", ":"), default=repr) + "\n").encode("utf-8",
                                                                            "replace")
    with _lock:
        view = memoryview(data)
        while view:
            n = os.write(_out_fd, view)
            view = view[n:]


class _State:
    def __init__(self) -> None:
        self.cell = 0
        self.running = False
        self.shown: set[int] = set()


_state = _State()


class _Stream:
    """sys.stdout / sys.stderr: text becomes stream frames (a line at a time)."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, name: str) -> None:
        self.name = name
        self._buf: list[str] = []
        self._size = 0

    def write(self, s: Any) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self._buf.append(s)
        self._size += len(s)
        if "\n" in s or self._size >= _MAX_TEXT_FRAME:
            self.flush()
        return len(s)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self._buf:
            return
        text = "".join(self._buf)
        self._buf, self._size = [], 0
        for i in range(0, len(text), _MAX_TEXT_FRAME):
            _send({"t": "stream", "id": _state.cell, "name": self.name,
                   "text": text[i:i + _MAX_TEXT_FRAME]})

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def fileno(self) -> int:
        return 2 if self.name == "stderr" else 1


class _NoStdin:
    encoding = "utf-8"

    def read(self, *args: Any) -> str:
        raise OSError("a session has no stdin (input() is not available)")

    readline = read

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError("a session has no stdin")


def _plain(obj: Any) -> str:
    try:
        text = repr(obj)
    except BaseException as exc:  # a broken __repr__ is the cell's problem, not ours
        text = f"<repr failed: {type(exc).__name__}>"
    if len(text) > _MAX_PLAIN:
        text = text[:_MAX_PLAIN] + f"... [{len(text) - _MAX_PLAIN} characters cut]"
    return text


def _is_figure(obj: Any) -> bool:
    mod = getattr(type(obj), "__module__", "") or ""
    return mod.startswith("matplotlib.figure") and hasattr(obj, "savefig")


def _figure_png(fig: Any) -> bytes:
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _bundle(obj: Any) -> dict[str, Any]:
    """The MIME bundle of ``obj`` (values JSON-safe: images base64, JSON as objects)."""
    data: dict[str, Any] = {}
    if not isinstance(obj, type):
        hook = getattr(obj, "_repr_mimebundle_", None)
        if callable(hook):
            try:
                got = hook(include=None, exclude=None)
            except TypeError:
                got = hook()
            except Exception:
                got = None
            if isinstance(got, tuple) and got:
                got = got[0]
            if isinstance(got, dict):
                data.update({k: v for k, v in got.items() if isinstance(k, str)})
        for mime, name in _MIMES:
            if mime in data:
                continue
            fn = getattr(obj, name, None)
            if not callable(fn):
                continue
            try:
                value = fn()
            except Exception:
                continue
            if isinstance(value, tuple) and value:
                value = value[0]
            if value is not None:
                data[mime] = value
        if "image/png" not in data and _is_figure(obj):
            data["image/png"] = _figure_png(obj)
            _state.shown.add(id(obj))
    if "text/plain" not in data:
        data["text/plain"] = _plain(obj)
    out: dict[str, Any] = {}
    for mime, value in data.items():
        if mime in _BINARY and isinstance(value, bytes | bytearray):
            value = base64.b64encode(value).decode("ascii")
        elif isinstance(value, bytes | bytearray):
            value = bytes(value).decode("utf-8", "replace")
        elif mime == "application/json" or mime.endswith("+json"):
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
        elif not isinstance(value, str):
            value = str(value)
        if isinstance(value, str) and len(value) > _MAX_MIME:
            out.setdefault("text/x-corral-note", "")
            out["text/x-corral-note"] += f"{mime} dropped: {len(value)} bytes past the cap\n"
            continue
        out[mime] = value
    return out


def display(*objs: Any, raw: bool = False) -> None:
    """Show each object as a display output of the running cell (its MIME bundle;
    ``raw=True``: each object is already a bundle, a dict of MIME type to value)."""
    sys.stdout.flush()
    sys.stderr.flush()
    for obj in objs:
        data = _bundle(obj) if not raw else {str(k): v for k, v in dict(obj).items()}
        _send({"t": "display", "id": _state.cell, "data": data})


def _flush_figures() -> None:
    """Display and close every open matplotlib figure (plt.show(), and a cell's end)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        import importlib
        gcf = importlib.import_module("matplotlib._pylab_helpers").Gcf
        managers = list(gcf.get_all_fig_managers())
    except Exception:
        return
    for manager in managers:
        fig = manager.canvas.figure
        if id(fig) not in _state.shown:
            display(fig)
    pyplot.close("all")


_MPL_BACKEND = """
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas
from matplotlib.backend_bases import FigureManagerBase as FigureManager


def show(*args, **kwargs):
    _corral_flush_figures()
"""


class _MplBackendFinder:
    """Makes ``import _corral_mpl`` (matplotlib's ``module://_corral_mpl`` backend)."""

    @classmethod
    def find_spec(cls, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "_corral_mpl":
            return None
        import importlib.util
        return importlib.util.spec_from_loader(name, cls)  # type: ignore[arg-type]

    @staticmethod
    def create_module(spec: Any) -> None:
        return None

    @staticmethod
    def exec_module(module: Any) -> None:
        module.__dict__["_corral_flush_figures"] = _flush_figures
        exec(compile(_MPL_BACKEND, "<corral-mpl-backend>", "exec"), module.__dict__)


def _on_sigint(signum: int, frame: Any) -> None:
    if _state.running:
        raise KeyboardInterrupt


def _user_traceback(exc: BaseException) -> str:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _FILE:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _run(cid: int, code: str, ns: dict[str, Any]) -> None:
    name = f"<cell {cid}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tree = ast.parse(code, filename=name, mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        tree.body.pop()
    exec(compile(tree, name, "exec"), ns)
    if last is not None:
        value = eval(compile(last, name, "eval"), ns)
        if value is not None:
            ns["_"] = value
            sys.stdout.flush()
            sys.stderr.flush()
            _send({"t": "result", "id": cid, "data": _bundle(value)})


def _reader(jobs: Any) -> None:
    main = threading.main_thread().ident or 0
    stdin = os.fdopen(0, "rb", buffering=0)
    while True:
        line = stdin.readline(64 * 1024 * 1024)
        if not line:
            jobs.put(None)
            return
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        if msg.get("op") == "interrupt":
            if _state.running and msg.get("id") == _state.cell:
                signal.pthread_kill(main, signal.SIGINT)
        elif msg.get("op") == "run":
            jobs.put(msg)


def main() -> None:
    try:
        os.unlink(_FILE)
    except OSError:
        pass
    os.environ.setdefault("MPLBACKEND", "module://_corral_mpl")
    sys.meta_path.append(_MplBackendFinder)
    signal.signal(signal.SIGINT, _on_sigint)
    sys.stdout, sys.stderr, sys.stdin = _Stream("stdout"), _Stream("stderr"), _NoStdin()
    ns = {"__name__": "__main__", "__builtins__": __builtins__, "display": display}
    jobs: queue.Queue[Any] = queue.Queue()
    threading.Thread(target=_reader, args=(jobs,), daemon=True).start()
    _send({"t": "ready", "pid": os.getpid(),
           "python": ".".join(str(v) for v in sys.version_info[:3])})
    while True:
        try:
            msg = jobs.get()
            if msg is None:
                return
            cid = msg.get("id")
            code = msg.get("code")
            if not isinstance(cid, int) or not isinstance(code, str):
                continue
            _state.cell, _state.shown = cid, set()
            _state.running = True
            try:
                _run(cid, code, ns)
                _flush_figures()
            except BaseException as exc:  # the cell's error, whatever it is
                _state.running = False
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    evalue = str(exc)
                except BaseException:
                    evalue = "<str failed>"
                _send({"t": "error", "id": cid, "ename": type(exc).__name__,
                       "evalue": evalue[:_MAX_PLAIN], "traceback": _user_traceback(exc)})
                try:
                    _flush_figures()
                except BaseException:
                    pass
            finally:
                _state.running = False
            sys.stdout.flush()
            sys.stderr.flush()
            _send({"t": "done", "id": cid})
        except KeyboardInterrupt:  # an interrupt that came just after its cell ended
            continue


if __name__ == "__main__":
    main()
