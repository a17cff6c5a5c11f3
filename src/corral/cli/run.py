"""``corral run [options] -- CMD ARGS...``: one bounded run from the shell.

Thin over :func:`corral.run.bounded.run_bounded`. The child's output is streamed
to ours as it arrives, or with ``--json`` the whole result is printed as one
JSON object on stdout. The exit status is the child's own (128 + N if signal
N killed it), or the outcome's status from the one table,
:data:`corral.run.bounded.OUTCOME_EXIT_STATUS` (timeout 124, cancelled 130,
overflow / memory / cpu 137, spawn error 127); an invalid option exits with
``ConfigInvalidError.exit_status`` (64). SIGINT and SIGTERM cancel the run
(shutdown signal, grace, SIGKILL; outcome ``cancelled``).

Streamed output that goes to a terminal is sanitized (``_terminal``): escape
sequences and other control characters from the command are shown as text,
never obeyed. A pipe or file gets the exact bytes; ``--raw-output`` passes
them to a terminal too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, BinaryIO

from corral.cli._terminal import TerminalSanitizer
from corral.core.cancel import CancelToken
from corral.core.errors import ConfigInvalidError
from corral.run.bounded import (
    DEFAULT_MAX_STDERR_BYTES,
    DEFAULT_MAX_STDOUT_BYTES,
    Outcome,
    RunResult,
    exit_status_of,
    run_bounded,
)

__all__ = ["DEFAULT_TIMEOUT_MS", "add_parser", "run"]

#: --timeout when not given
DEFAULT_TIMEOUT_MS = 60_000
_LEVELS = ("none", "context-isolated", "strict")


def add_parser(subparsers: Any) -> None:
    """Register the ``run`` verb."""
    p = subparsers.add_parser(
        "run", help="run one command, bounded (timeout, output caps, env allowlist, limits)",
        description="Run CMD once under a wall-clock timeout, output caps and an environment "
                    "allowlist; its whole process tree is killed when it ends. Exit status: "
                    "the child's, or 124 timeout, 130 cancelled, 137 overflow/memory/cpu, "
                    "127 cannot run.",
        usage="corral run [options] -- CMD [ARGS...]")
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_MS, metavar="MS",
                   help=f"wall-clock timeout in ms (default {DEFAULT_TIMEOUT_MS})")
    p.add_argument("--grace-ms", type=int, default=None, metavar="MS",
                   help="wait after SIGTERM before SIGKILL (default 2000, < timeout)")
    p.add_argument("--mem-mb", type=int, default=None, metavar="MIB",
                   help="RLIMIT_AS of each process, MiB")
    p.add_argument("--cpu-ms", type=int, default=None, metavar="MS",
                   help="RLIMIT_CPU of each process, ms (rounded up to whole seconds)")
    p.add_argument("--max-stdout", type=int, default=DEFAULT_MAX_STDOUT_BYTES, metavar="BYTES",
                   help="stdout cap (default 8 MiB)")
    p.add_argument("--max-stderr", type=int, default=DEFAULT_MAX_STDERR_BYTES, metavar="BYTES",
                   help="stderr cap (default 1 MiB)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable for the child (repeatable)")
    p.add_argument("--pass-env", action="append", default=[], metavar="KEY",
                   help="copy a variable from this environment (repeatable)")
    p.add_argument("--cwd", default=None, metavar="DIR",
                   help="working directory (default: a fresh temp dir, removed afterwards; "
                        "with --level strict: a dir inside the sandbox's /work)")
    p.add_argument("--stdin", default=None, metavar="FILE",
                   help="feed FILE (or - for our stdin) to the child; default: closed")
    p.add_argument("--max-processes", type=int, default=None, metavar="N",
                   help="processes alive at once in the sandbox (--level strict only)")
    p.add_argument("--ro-bind", action="append", default=[], metavar="PATH",
                   help="show a host path read-only inside (--level strict only; repeatable)")
    p.add_argument("--disk-mb", type=int, default=None, metavar="MIB",
                   help="size of the sandbox's /work and /tmp (--level strict only)")
    p.add_argument("--level", choices=_LEVELS, default="context-isolated",
                   help="isolation level: context-isolated (default; a bounded child process, "
                        "NOT a security boundary) or strict (the Linux sandbox: namespaces, "
                        "seccomp, cgroups; --mem-mb/--cpu-ms then cap the whole tree)")
    p.add_argument("--json", action="store_true",
                   help="print the whole result as JSON instead of streaming the output")
    p.add_argument("--raw-output", action="store_true",
                   help="write the command's output to a terminal as is; by default escape "
                        "sequences and other control characters are shown as text (a pipe "
                        "or file always gets the exact bytes)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                   help="the command and its arguments")
    p.set_defaults(handler=run)


def _env(args: argparse.Namespace) -> dict[str, str]:
    env: dict[str, str] = {}
    for key in args.pass_env:
        if key in os.environ:
            env[key] = os.environ[key]
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigInvalidError("--env", f"expected KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def _command(argv: list[str]) -> tuple[str, list[str]]:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ConfigInvalidError("CMD", "no command given (corral run [options] -- CMD ARGS)")
    cmd = argv[0]
    if not os.path.isabs(cmd):
        found = shutil.which(cmd) if "/" not in cmd else os.path.abspath(cmd)
        if found is None:
            raise ConfigInvalidError("CMD", f"command not found on PATH: {cmd!r}")
        cmd = os.path.abspath(found)
    return cmd, argv[1:]


def _stdin(spec: str | None) -> bytes | None:
    if spec is None:
        return None
    if spec == "-":
        return sys.stdin.buffer.read()
    try:
        with open(spec, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigInvalidError("--stdin", f"cannot read {spec!r}: {e.strerror}") from None


class _Output:
    """Where one of the command's streams goes: ``write`` each chunk as it arrives,
    ``close`` at the end. On a terminal (unless ``raw``) through a sanitizer."""

    def __init__(self, stream: Any, *, raw: bool) -> None:
        self.stream = stream
        self.buffer: BinaryIO | None = getattr(stream, "buffer", None)
        self.sanitizer = None if raw or not _is_tty(stream) else TerminalSanitizer()

    def write(self, chunk: bytes) -> None:
        if self.sanitizer is not None:
            chunk = self.sanitizer.feed(chunk)
        self._put(chunk)

    def close(self) -> None:
        if self.sanitizer is not None:
            self._put(self.sanitizer.flush())

    def _put(self, data: bytes) -> None:
        if not data:
            return
        if self.buffer is not None:
            self.buffer.write(data)
            self.buffer.flush()
        else:
            self.stream.write(data.decode("utf-8", "replace"))
            self.stream.flush()


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def _outputs(args: argparse.Namespace) -> tuple[_Output, _Output] | None:
    """stdout and stderr for streaming, or None with --json."""
    if args.json:
        return None
    return (_Output(sys.stdout, raw=args.raw_output), _Output(sys.stderr, raw=args.raw_output))


def _with_signals_cancelling(token: CancelToken, fn: Callable[[], RunResult]) -> RunResult:
    if threading.current_thread() is not threading.main_thread():
        return fn()

    def handler(signum: int, frame: FrameType | None) -> None:
        del frame
        token.cancel(f"received {signal.Signals(signum).name}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return fn()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run(args: argparse.Namespace) -> int:
    """Run the command; return the exit status (see the module docstring)."""
    cmd, cmd_args = _command(list(args.argv))
    token = CancelToken()
    out = _outputs(args)
    if args.level == "strict":
        result = _with_signals_cancelling(
            token, lambda: _run_strict(args, cmd, cmd_args, token, out))
        return _finish(args, result, out)
    if args.max_processes is not None or args.disk_mb is not None or args.ro_bind:
        raise ConfigInvalidError("--max-processes/--disk-mb/--ro-bind",
                                 "need --level strict (a cgroup, a private disk, a root)")
    if args.cwd is not None and not os.path.isabs(args.cwd):
        args.cwd = os.path.abspath(args.cwd)  # the CLI's convenience; the library refuses
    result = _with_signals_cancelling(token, lambda: run_bounded(
        cmd, cmd_args, timeout_ms=args.timeout, cwd=args.cwd, env=_env(args),
        grace_period_ms=args.grace_ms, stdin=_stdin(args.stdin),
        max_stdout_bytes=args.max_stdout, max_stderr_bytes=args.max_stderr,
        mem_mb=args.mem_mb, cpu_ms=args.cpu_ms, cancel=token,
        on_stdout=out[0].write if out else None,
        on_stderr=out[1].write if out else None))
    return _finish(args, result, out)


def _run_strict(args: argparse.Namespace, cmd: str, cmd_args: list[str],
                token: CancelToken, out: tuple[_Output, _Output] | None) -> RunResult:
    from corral.core.spec import SandboxLimits
    from corral.run.strict import run_strict

    limits = SandboxLimits(mem_mb=args.mem_mb, cpu_ms=args.cpu_ms,
                           max_processes=args.max_processes, disk_mb=args.disk_mb)
    # the sandbox sees the host's /usr and the interpreter's prefix: resolve symlinks
    # (a venv's bin/python) to the real file, which is bound in
    return run_strict(
        os.path.realpath(cmd), cmd_args, timeout_ms=args.timeout, env=_env(args),
        cwd=args.cwd, stdin=_stdin(args.stdin), max_stdout_bytes=args.max_stdout,
        max_stderr_bytes=args.max_stderr, limits=limits, cancel=token,
        ro_binds=[os.path.abspath(p) for p in args.ro_bind],
        on_stdout=out[0].write if out else None,
        on_stderr=out[1].write if out else None)


def _finish(args: argparse.Namespace, result: RunResult,
            out: tuple[_Output, _Output] | None) -> int:
    if out is not None:
        for o in out:
            o.close()
    if args.json:
        print(json.dumps(result.to_dict()))
    elif result.outcome is not Outcome.EXIT:
        err = result.error()
        detail = err.message if err is not None else ""
        print(f"corral: {result.outcome}: {detail}", file=sys.stderr)
    return exit_status_of(result)
