"""``corral run [options] -- CMD ARGS...``: one bounded run from the shell.

Thin over :func:`corral.run.strict.run_strict` at strict, the default level where
the host can run it (:func:`default_level`: otherwise context-isolated, with a warning
saying why), and :func:`corral.run.bounded.run_bounded` with ``--level
context-isolated``. The child's
output is streamed to ours as it arrives, or with ``--json`` the whole result
is printed as one JSON object on stdout. The exit status is the child's own
(128 + N if signal N killed it), or one from the table in
:mod:`corral.cli._common` (``docs/cli.md``): 64 bad option, 69 unavailable,
70 internal, 124 timeout, 126 cannot execute, 127 not found, 130 cancelled,
137 limit or output cap. SIGINT and SIGTERM cancel the run (shutdown signal,
grace, SIGKILL; outcome ``cancelled``).

Files: ``--copy FILE[:DEST]`` puts a file into the run's working directory
before the command starts (at strict through the sandbox's ``write_file``),
``--output PATH[:DEST]`` brings one back after it ends (``read_file``), and
``--cwd`` is created when missing. ``--here`` runs in the current directory
(not at strict). ``--bind`` shows a host path at strict (read-only unless ``:rw``).

Streamed output that goes to a terminal is sanitized (``_terminal``): escape
sequences and other control characters from the command are shown as text,
never obeyed. A pipe or file gets the exact bytes; ``--raw-output`` passes
them to a terminal too.

Where a person watches (stderr is a terminal) a live status line shows the
run and its time, corral's own messages are coloured, and a closing line says
how the run ended (``_style``: ``NO_COLOR``/``FORCE_COLOR``/``TERM=dumb``
respected). Piped, none of that: the command's bytes and corral's plain
messages. ``--events`` prints NDJSON events instead (one JSON object a line:
``start``, ``stdout``/``stderr`` chunks as they arrive, then ``result``, the
same object ``--json`` prints), for a program that follows a run live.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import shutil
import signal
import stat as st
import sys
import tempfile
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, BinaryIO, Final

from corral.cli._common import EXIT_CANNOT_EXECUTE, duration_ms
from corral.cli._style import LiveStatus, Palette, is_tty
from corral.cli._terminal import TerminalSanitizer
from corral.core.cancel import CancelToken
from corral.core.errors import ConfigInvalidError
from corral.core.spec import NetworkPolicy
from corral.run.bounded import (
    DEFAULT_MAX_STDERR_BYTES,
    DEFAULT_MAX_STDOUT_BYTES,
    Outcome,
    RunResult,
    exit_status_of,
    run_bounded,
)

if TYPE_CHECKING:
    from corral.core.spec import SandboxLimits
    from corral.providers.linux import LinuxProvider
    from corral.providers.linux.policy.plan import Bind

__all__ = ["DEFAULT_TIMEOUT_MS", "add_parser", "default_level", "run", "strict_verdict"]

#: --timeout when not given
DEFAULT_TIMEOUT_MS = 60_000
_LEVELS = ("none", "context-isolated", "strict")
#: a spawn error with one of these: the command was found but cannot be executed
_CANNOT_EXECUTE = frozenset({errno.EACCES, errno.ENOEXEC, errno.EISDIR, errno.EPERM})


def add_parser(subparsers: Any) -> None:
    """Register the ``run`` verb."""
    p = subparsers.add_parser(
        "run", help="run one command, bounded (timeout, output caps, env allowlist, limits)",
        description="Run CMD once under a wall-clock timeout, output caps and an environment "
                    "allowlist; its whole process tree is killed when it ends. Exit status: "
                    "the child's own (128+N if signal N killed it), or 64 bad option, "
                    "69 level or limit unavailable here, 70 internal error, 124 timeout, "
                    "126 cannot execute, 127 command not found, 130 cancelled, "
                    "137 limit or output cap (docs/cli.md). Times take a unit: 500ms, 5s, "
                    "2m (a plain number is ms).",
        usage="corral run [options] -- CMD [ARGS...]")
    p.add_argument("--timeout", type=duration_ms, default=DEFAULT_TIMEOUT_MS, metavar="TIME",
                   help=f"wall-clock timeout (default {DEFAULT_TIMEOUT_MS // 1000}s)")
    p.add_argument("--grace-ms", "--grace", type=duration_ms, default=None, metavar="TIME",
                   help="wait after SIGTERM before SIGKILL (default 2s, < timeout)")
    p.add_argument("--mem-mb", type=int, default=None, metavar="MIB",
                   help="RLIMIT_AS of each process, MiB")
    p.add_argument("--cpu-ms", "--cpu", type=duration_ms, default=None, metavar="TIME",
                   help="CPU time limit (context-isolated: RLIMIT_CPU of each process, "
                        "rounded up to whole seconds)")
    p.add_argument("--max-stdout", type=int, default=DEFAULT_MAX_STDOUT_BYTES, metavar="BYTES",
                   help="stdout cap (default 8 MiB)")
    p.add_argument("--max-stderr", type=int, default=DEFAULT_MAX_STDERR_BYTES, metavar="BYTES",
                   help="stderr cap (default 1 MiB)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable for the child (repeatable)")
    p.add_argument("--pass-env", action="append", default=[], metavar="KEY",
                   help="copy a variable from this environment (repeatable)")
    p.add_argument("--cwd", default=None, metavar="DIR",
                   help="working directory, created when missing (said on stderr). At "
                        "strict (the default level): a dir inside the sandbox's /work "
                        "(default /work itself); at context-isolated a host dir (default: a "
                        "fresh temp dir, removed afterwards)")
    p.add_argument("--here", action="store_true",
                   help="run in the current directory (--level context-isolated only: the "
                        "strict sandbox sees no host dir but what --bind shows)")
    p.add_argument("--copy", action="append", default=[], metavar="FILE[:DEST]",
                   help="copy FILE in before the command starts, to DEST relative to the "
                        "run's working directory (default: its base name); repeatable")
    p.add_argument("--output", action="append", default=[], metavar="PATH[:DEST]",
                   help="after the run, copy PATH (relative to the run's working directory) "
                        "back to DEST (default: its base name in the current directory); "
                        "repeatable. One not produced is said on stderr")
    p.add_argument("--stdin", default=None, metavar="FILE",
                   help="feed FILE (or - for our stdin) to the child; default: closed")
    p.add_argument("--max-processes", type=int, default=None, metavar="N",
                   help="processes alive at once in the sandbox (--level strict only)")
    p.add_argument("--bind", action="append", default=[], metavar="SRC[:DST][:ro|rw]",
                   help="show host path SRC inside the sandbox at DST (default: the same "
                        "path), read-only unless :rw (--level strict only; repeatable). "
                        "Writes through :rw land on the host as uid/gid 0x70000000, which "
                        "no sandbox runs as (as root: SRC must be writable by it, e.g. "
                        "world-writable or chowned to it; else yours), never setuid, "
                        "setgid or a device node. DST may not hide /proc, "
                        "/dev, /etc, /tmp, /work or the interpreter; a dir under /work "
                        "(DIR:/work/proj:rw) shares a project")
    p.add_argument("--ro-bind", action="append", default=[], metavar="PATH",
                   help="the same as --bind PATH")
    p.add_argument("--disk-mb", type=int, default=None, metavar="MIB",
                   help="size of the sandbox's /work and /tmp (--level strict only)")
    p.add_argument("--limits", choices=("cgroup", "rlimit"), default="cgroup",
                   help="how --level strict enforces --mem-mb, --max-processes and --cpu-ms: "
                        "cgroup (default; the whole sandbox; refused where there is no usable "
                        "cgroup) or rlimit (per process RLIMIT_AS / RLIMIT_CPU and the "
                        "sandbox's RLIMIT_NPROC: for a user without a delegated cgroup)")
    p.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="let the strict sandbox reach HOST through its egress proxy (a name, "
                        "*.suffix, IP literal or CIDR, optional :PORT; repeatable); implies "
                        "--network allowlist. See docs/network.md")
    p.add_argument("--image", default=None, metavar="REF",
                   help="run CMD in this image's own root file system, read-only, with a "
                        "private /work and /tmp (--level strict only): a local OCI layout, "
                        "LAYOUT:TAG, tar or rootfs dir, or a registry reference pulled when "
                        "missing (docs/images.md)")
    p.add_argument("--environment", default=None, metavar="NAME",
                   help="show a built environment's packages (corral env build) read-only "
                        "at /opt/corral/env, on PYTHONPATH (--level strict only; "
                        "docs/environments.md)")
    p.add_argument("--network", choices=("none", "allowlist", "unrestricted"), default=None,
                   help="network policy of the strict sandbox: none (default: loopback only), "
                        "allowlist (the --allow-host entries), unrestricted (every public "
                        "destination; --allow-host entries open non-public ranges). Out "
                        "only through HTTP_PROXY/HTTPS_PROXY/ALL_PROXY")
    p.add_argument("--level", choices=_LEVELS, default=None,
                   help="isolation level: strict (the default where this host can run it: "
                        "the Linux sandbox, namespaces, seccomp, cgroups; --mem-mb/--cpu-ms "
                        "then cap the whole tree) or context-isolated (a bounded child "
                        "process, NOT a security boundary). Where strict cannot run (`corral "
                        "doctor` says why) the default falls back to context-isolated with a "
                        "warning on stderr (and in --json/--events) saying why; give --level "
                        "context-isolated to choose it and silence that, --level strict to "
                        "refuse instead")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true",
                       help="print the whole result as JSON instead of streaming the output")
    shown.add_argument("--events", action="store_true",
                       help="print NDJSON events on stdout: start, each stdout/stderr chunk "
                            "as it arrives (text, or base64 when not UTF-8), then the result "
                            "(the --json object)")
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


def _network(args: argparse.Namespace) -> NetworkPolicy:
    """The network policy ``--network`` and ``--allow-host`` ask for."""
    kind = args.network or ("allowlist" if args.allow_host else "none")
    if kind == "none" and args.allow_host:
        raise ConfigInvalidError("--allow-host", "does not go with --network none")
    if kind == "allowlist" and not args.allow_host:
        raise ConfigInvalidError("--network", "allowlist needs at least one --allow-host")
    for entry in args.allow_host:
        _check_loopback_entry(entry)
    return NetworkPolicy(kind="allowlist" if kind == "allowlist" else
                         "unrestricted" if kind == "unrestricted" else "none",
                         hosts=tuple(args.allow_host))


def _check_loopback_entry(entry: str) -> None:
    """Refuse an ``--allow-host`` entry on the host's loopback that no client inside would
    reach: inside, loopback is the sandbox's own and ``NO_PROXY`` names it, so clients
    connect there directly. One IPv4 loopback address with a port gets a relay there
    (``netrelay.loopback_relays``); ``localhost``, ``::1``, a loopback address without a
    port or a CIDR inside loopback would get "connection refused" and no note."""
    from corral.providers.linux.host.egress import parse_entry
    from corral.providers.linux.host.netrelay import PROXY_PORT
    try:
        rule = parse_entry(entry)
    except ConfigInvalidError:
        return  # the provider says what is wrong with it
    net = rule.net
    if rule.kind == "host":
        looped = rule.name == "localhost" or rule.name.endswith(".localhost")
    elif rule.kind == "suffix":
        looped = rule.name == "localhost"
    else:
        assert net is not None
        looped = net.network_address.is_loopback and net.broadcast_address.is_loopback
    if not looped:
        return
    if (net is not None and net.version == 4 and net.prefixlen == 32
            and rule.port is not None and rule.port != PROXY_PORT):
        return  # relayed
    host = str(net.network_address) if net is not None and net.prefixlen == net.max_prefixlen \
        and net.version == 4 else "127.0.0.1"
    port = rule.port if rule.port is not None and rule.port != PROXY_PORT else None
    how = (f"{host}:{port}" if port is not None else f"{host}:PORT")
    raise ConfigInvalidError(
        "--allow-host", f"{entry!r} is on the host's loopback, which a program inside does "
        "not reach: inside the sandbox loopback is its own (and NO_PROXY names it). Name one "
        f"IPv4 loopback address and its port, e.g. {how}: corral relays that port of the "
        "sandbox's loopback to the host's, through the egress proxy's check"
        + (f" (port {PROXY_PORT} is the sandbox's egress proxy: serve on another)"
           if rule.port == PROXY_PORT else ""))


def _command(argv: list[str], *, strict: bool, image: bool = False
             ) -> tuple[str, list[str]] | RunResult:
    """The command's absolute path and its arguments; or, for a command not found on
    PATH, the ``spawn-error`` result the run would have given (exit 127). With
    ``--image`` the command is the image's: given as written (a bare name is looked up
    on the image's PATH inside)."""
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ConfigInvalidError("CMD", "no command given (corral run [options] -- CMD ARGS)")
    cmd = argv[0]
    if image:
        return cmd, argv[1:]
    if strict and "/" in cmd and not os.path.isabs(cmd):
        return cmd, argv[1:]  # a path inside the sandbox: resolved against its cwd
    if not os.path.isabs(cmd):
        found = shutil.which(cmd) if "/" not in cmd else os.path.abspath(cmd)
        if found is None:
            return RunResult(outcome=Outcome.SPAWN_ERROR, spawn_errno=errno.ENOENT,
                             detail=f"command not found on PATH: {cmd!r}")
        cmd = os.path.abspath(found)
    return cmd, argv[1:]


def _split_pair(spec: str, option: str) -> tuple[str, str | None]:
    """``A[:B]`` -> (A, B or None); a whole spec that names an existing file is A."""
    if not spec:
        raise ConfigInvalidError(option, "empty value")
    if ":" not in spec or os.path.exists(spec):
        return spec, None
    a, _, b = spec.partition(":")
    if not a or not b:
        raise ConfigInvalidError(option, f"expected PATH[:DEST], got {spec!r}")
    return a, b


def _relative_dest(dest: str, option: str) -> str:
    """A destination inside the run's working directory: relative, no '..'."""
    parts = [x for x in dest.split("/") if x not in ("", ".")]
    if os.path.isabs(dest) or not parts or ".." in parts:
        raise ConfigInvalidError(option, f"destination must be a relative path inside the "
                                         f"run's working directory, without '..': {dest!r}")
    return "/".join(parts)


def _copies(args: argparse.Namespace) -> dict[str, bytes]:
    """``--copy``: destination (relative to the run's cwd) -> content."""
    files: dict[str, bytes] = {}
    for spec in args.copy:
        src, dest = _split_pair(spec, "--copy")
        dest = _relative_dest(dest or os.path.basename(src.rstrip("/")), "--copy")
        try:
            with open(src, "rb") as f:
                files[dest] = f.read()
        except OSError as e:
            raise ConfigInvalidError("--copy", f"cannot read {src!r}: {e.strerror}") from None
    return files


def _outputs_wanted(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``--output``: (path relative to the run's cwd, host destination)."""
    wanted: list[tuple[str, str]] = []
    for spec in args.output:
        src, _, dest = spec.partition(":")
        src = _relative_dest(src, "--output")
        wanted.append((src, os.path.abspath(dest or os.path.basename(src))))
    return wanted


def _binds(args: argparse.Namespace) -> list[Bind]:
    """``--ro-bind PATH`` and ``--bind SRC[:DST][:ro|rw]``: host paths shown in the
    sandbox (bubblewrap's ``--ro-bind`` / ``--bind``), read-only at the same path
    unless DST or ``:rw`` says otherwise."""
    from corral.providers.linux.policy.plan import Bind  # not on the CLI's start-up path
    binds = [Bind(os.path.abspath(p)) for p in args.ro_bind]
    for spec in args.bind:
        parts = spec.split(":")
        mode = parts.pop() if len(parts) > 1 and parts[-1] in ("ro", "rw") else "ro"
        if not parts or len(parts) > 2 or not parts[0] or (len(parts) == 2 and not parts[1]):
            raise ConfigInvalidError("--bind", f"expected SRC[:DST][:ro|rw], got {spec!r}")
        if len(parts) == 2 and not parts[1].startswith("/"):
            raise ConfigInvalidError("--bind", f"DST must be an absolute path inside the "
                                     f"sandbox, got {parts[1]!r}")
        src = os.path.abspath(parts[0])
        dst = os.path.normpath(parts[1]) if len(parts) == 2 else None
        binds.append(Bind(src, dst, rw=mode == "rw"))
    return binds


def _check_bind_writer(src: str) -> None:
    """As root, a write through ``--bind SRC:DST:rw`` lands as corral's bind writer (uid
    and gid 0x70000000, docs/cli.md), never as root: a SRC the bind writer cannot write
    would give the command inside only "Permission denied", with nothing saying why in a
    pipe. So it is refused before anything starts, naming the fix."""
    from corral.providers.linux.host.uidpool import BIND_UID
    try:
        info = os.stat(src)
    except OSError:
        return  # the provider says what is wrong with SRC
    writable = ((info.st_uid == BIND_UID and info.st_mode & st.S_IWUSR)
                or (info.st_uid != BIND_UID and info.st_gid == BIND_UID
                and info.st_mode & st.S_IWGRP)
                or (info.st_uid != BIND_UID and info.st_gid != BIND_UID
                and info.st_mode & st.S_IWOTH))
    if not writable:
        raise ConfigInvalidError(
            "--bind", f"{src} is not writable by corral's bind writer (uid and gid "
            f"{BIND_UID}), as which writes through :rw land on the host when corral runs as "
            f"root (never as root itself): `chown {BIND_UID}:{BIND_UID} {src}` (or "
            f"`chmod o+w {src}`) first, or bind it read-only (docs/cli.md)")


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

    #: whether the last byte written to either stream ended a line (both may be one
    #: terminal): corral's own message then needs no newline of its own first
    at_line_start = True

    def __init__(self, stream: Any, *, raw: bool, status: LiveStatus | None = None) -> None:
        self.stream = stream
        self.buffer: BinaryIO | None = getattr(stream, "buffer", None)
        self.sanitizer = None if raw or not is_tty(stream) else TerminalSanitizer()
        self.status = status

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
        _Output.at_line_start = data.endswith(b"\n")
        if self.status is not None and self.status.enabled:  # above the live status line
            self.status.write(self.stream, data.decode("utf-8", "replace"))
        elif self.buffer is not None:
            self.buffer.write(data)
            self.buffer.flush()
        else:
            self.stream.write(data.decode("utf-8", "replace"))
            self.stream.flush()


#: the two streams' sinks: for a person (or a pipe), or ``--events``
_Outs = tuple["_Output", "_Output"] | tuple["_Events", "_Events"]


class _Events:
    """``--events``: one NDJSON line per chunk of one stream (stdout or stderr)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, chunk: bytes) -> None:
        _event(self.name, **_data(chunk))

    def close(self) -> None:
        pass


def _data(chunk: bytes) -> dict[str, str]:
    """A chunk as JSON: text when it is UTF-8 on its own, else base64 (lossless)."""
    try:
        return {"data": chunk.decode("utf-8")}
    except UnicodeDecodeError:
        import base64
        return {"data": base64.b64encode(chunk).decode("ascii"), "encoding": "base64"}


def _event(kind: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": kind, **fields}) + "\n")
    sys.stdout.flush()


def _outputs(args: argparse.Namespace, status: LiveStatus | None = None) -> _Outs | None:
    """stdout and stderr for streaming, or None with --json."""
    if args.json:
        return None
    if args.events:
        return (_Events("stdout"), _Events("stderr"))
    _Output.at_line_start = True
    return (_Output(sys.stdout, raw=args.raw_output, status=status),
            _Output(sys.stderr, raw=args.raw_output, status=status))


def _live_status(args: argparse.Namespace, cmd: str) -> LiveStatus:
    """The status line for this run: drawn only where stderr is a terminal and the
    output is streamed for a person (not --json, not --events)."""
    enabled = is_tty(sys.stderr) and not args.json and not args.events
    return LiveStatus(f"running {os.path.basename(cmd)} at {args.level}", stream=sys.stderr,
                      enabled=enabled, palette=Palette.for_stream(sys.stderr))


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


#: options only the strict level takes: given with the default level, strict is kept even
#: where it cannot run (the run then fails saying why) rather than falling back
_STRICT_ONLY: Final = ("bind", "ro_bind", "allow_host", "network", "max_processes", "disk_mb",
                       "image", "environment")


def strict_verdict() -> tuple[bool, str]:
    """Whether the strict level can run on this host, and the doctor's one-line summary
    (why not, when it cannot): the linux provider's row of ``corral doctor``."""
    if not sys.platform.startswith("linux"):
        return False, f"strict needs Linux; this is {sys.platform}"
    from corral.providers.linux.host import hostinfo
    for row in hostinfo.providers_report(hostinfo.probe()):
        if row.name == "linux":
            return row.usable, row.summary
    return False, "no linux provider row"  # pragma: no cover


def default_level(args: argparse.Namespace,
                  verdict: Callable[[], tuple[bool, str]] = strict_verdict
                  ) -> tuple[str, str | None]:
    """The level ``corral run`` takes when ``--level`` is not given, and the warning to
    give when that is not strict.

    Strict where the host can run it (``verdict``: the doctor's). Where it cannot, a
    run that asked for something only strict gives (a bind, a network policy, a process
    or disk cap, ``--limits rlimit``) stays strict and fails saying why; any other falls
    back to context-isolated, which is NOT a security boundary: never silently, the
    warning says so, why, and how to choose either level on purpose."""
    usable, why = verdict()
    if usable:
        return "strict", None
    if args.limits != "cgroup" or any(getattr(args, k) not in (None, [])
                                      for k in _STRICT_ONLY):
        return "strict", None
    return "context-isolated", (
        f"running at context-isolated, NOT a security boundary: the default level, strict, "
        f"cannot run here ({why}; `corral doctor` says more). --level context-isolated "
        "chooses it and silences this; --level strict refuses instead")


def run(args: argparse.Namespace) -> int:
    """Run the command; return the exit status (see the module docstring)."""
    args.warnings = []
    if args.level is None:
        args.level, warning = default_level(args)
        if warning is not None:
            args.warnings.append(warning)
            print(f"corral: warning: {warning}", file=sys.stderr)
    strict = args.level == "strict"
    if args.image is not None and not strict:
        raise ConfigInvalidError("--image", "the image as the root needs --level strict")
    if args.environment is not None and not strict:
        raise ConfigInvalidError("--environment", "an environment needs --level strict")
    command = _command(list(args.argv), strict=strict, image=args.image is not None)
    if isinstance(command, RunResult):
        return _finish(args, command, None, [])
    cmd, cmd_args = command
    status = _live_status(args, cmd)
    _live.append(status)
    try:
        return _run(args, cmd, cmd_args, status)
    finally:
        status.stop()
        _live.remove(status)


def _run(args: argparse.Namespace, cmd: str, cmd_args: list[str], status: LiveStatus) -> int:
    strict = args.level == "strict"
    if args.here and args.cwd is not None:
        raise ConfigInvalidError("--here", "give --here or --cwd, not both")
    copies = _copies(args)
    wanted = _outputs_wanted(args)
    token = CancelToken()
    out = _outputs(args, status)
    if args.events:
        for warning in args.warnings:
            _event("warning", message=warning)
        _event("start", argv=[cmd, *cmd_args], level=args.level)
    status.start()
    if strict:
        if args.here:
            raise ConfigInvalidError(
                "--here", "the strict sandbox sees no host directory but what --bind shows "
                "(read-only); use --copy FILE and --output PATH, or --level context-isolated")
        saved: list[dict[str, Any]] = []
        result = _with_signals_cancelling(
            token, lambda: _run_strict(args, cmd, cmd_args, token, out, copies, wanted, saved))
        if not (args.json or args.events or args.image):  # an image's files are its own
            _hint_unseen(cmd, result)
        return _finish(args, result, out, saved, status)
    if _network(args).kind != "none":
        raise ConfigInvalidError("--network/--allow-host",
                                 "need --level strict (the only level that enforces a network "
                                 "policy; context-isolated shares the host's network)")
    if args.max_processes is not None or args.disk_mb is not None or args.ro_bind or args.bind:
        raise ConfigInvalidError("--max-processes/--disk-mb/--bind",
                                 "need --level strict (a cgroup, a private disk, a root)")
    if args.limits != "cgroup":
        raise ConfigInvalidError("--limits", "chooses how --level strict enforces its limits; "
                                 "the context-isolated level uses rlimits always")
    own_dir: str | None = None
    cwd: str | None = os.getcwd() if args.here else args.cwd
    if cwd is not None:
        cwd = os.path.abspath(cwd)  # the CLI's convenience; the library refuses relative
        if not os.path.isdir(cwd):
            try:
                os.makedirs(cwd)
            except OSError as e:
                raise ConfigInvalidError("--cwd", f"cannot create {cwd!r}: {e.strerror}"
                                         ) from None
            _note(f"created --cwd {cwd} (it is left in place)")
    elif copies or wanted:  # the run's own temp dir, made here so files can go in and out
        own_dir = cwd = tempfile.mkdtemp(prefix="corral-run-")
    try:
        for dest, data in copies.items():
            _put_host_file(os.path.join(cwd or "", dest), data)
        result = _with_signals_cancelling(token, lambda: run_bounded(
            cmd, cmd_args, timeout_ms=args.timeout, cwd=cwd, env=_env(args),
            grace_period_ms=args.grace_ms, stdin=_stdin(args.stdin),
            max_stdout_bytes=args.max_stdout, max_stderr_bytes=args.max_stderr,
            mem_mb=args.mem_mb, cpu_ms=args.cpu_ms, cancel=token,
            on_stdout=out[0].write if out else None,
            on_stderr=out[1].write if out else None))
        saved = []
        for src, dest in wanted:
            try:
                with open(os.path.join(result.cwd or cwd or "", src), "rb") as f:
                    data_out: bytes | None = f.read()
            except OSError:
                data_out = None
            saved.append(_save(src, dest, data_out))
    finally:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
    if own_dir is not None:
        result = dataclasses.replace(result, cwd_owned=True)
    return _finish(args, result, out, saved, status)


#: a provider default's field -> how the note names it
_NAMES: dict[str, str] = {"mem_mb": "memory", "max_processes": "process-count",
                          "cpu_ms": "CPU"}


def _hint_unseen(cmd: str, result: RunResult) -> None:
    """A command that exists on this host but not inside the strict sandbox (a pyenv
    shim under ~, a tool in /opt): its 127 says only "No such file or directory"."""
    real = os.path.realpath(cmd) if os.path.isabs(cmd) else None
    if (real is not None and result.outcome is Outcome.EXIT and result.exit_code == 127
            and result.detail == f"{real}: No such file or directory"
            and os.path.exists(real)):
        _note(f"{real} exists on this host but not inside the strict sandbox, which sees "
              "/usr, the interpreter's prefix and --bind/--ro-bind paths: give a path "
              "under /usr, or --ro-bind its directory (docs/cli.md)")


#: the status line of the run in progress (a note is written above it)
_live: list[LiveStatus] = []


def _note(text: str) -> None:
    if _live and _live[-1].enabled:
        paint = _live[-1].palette.paint
        _live[-1].write(sys.stderr, f"{paint('corral', 'bold')}: {paint('note', 'yellow')}: "
                                    f"{text}\n")
    else:
        print(f"corral: note: {text}", file=sys.stderr)


def _put_host_file(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _save(src: str, dest: str, data: bytes | None) -> dict[str, Any]:
    """Write one ``--output`` file back; the fact for ``--json``."""
    if data is None:
        _note(f"--output {src}: the run left no such file")
        return {"path": src, "saved_to": None}
    _put_host_file(dest, data)
    return {"path": src, "saved_to": dest, "bytes": len(data)}


def _run_strict(args: argparse.Namespace, cmd: str, cmd_args: list[str],
                token: CancelToken, out: _Outs | None,
                copies: dict[str, bytes], wanted: list[tuple[str, str]],
                saved: list[dict[str, Any]]) -> RunResult:
    from corral.core.spec import SandboxLimits
    from corral.core.sync import close_sync
    from corral.providers.linux import LinuxProvider

    # the provider is made here, not by run_strict, to say what it cannot enforce
    binds = _binds(args)
    provider = LinuxProvider(limits_by=args.limits, stdout_cap=args.max_stdout,
                             stderr_cap=args.max_stderr, spares=0, binds=binds)
    try:
        if os.geteuid() == 0:  # after the provider's own checks of each bind
            for bind in binds:
                if bind.rw:
                    _check_bind_writer(bind.src)
        dropped = {k: v for k, v in provider.unenforced_defaults.items()
                   if getattr(args, k) is None}
        if dropped:
            _note(f"this sandbox has no {' or '.join(_NAMES[k] for k in dropped)} limit "
                  "(no usable cgroup here: `corral doctor` says why); --limits rlimit "
                  "enforces them per process")
        return _strict_on(provider, args, cmd, cmd_args, token, out, copies, wanted, saved,
                          SandboxLimits(mem_mb=args.mem_mb, cpu_ms=args.cpu_ms,
                                        max_processes=args.max_processes,
                                        disk_mb=args.disk_mb))
    finally:
        close_sync(provider)


def _strict_on(provider: LinuxProvider, args: argparse.Namespace, cmd: str,
               cmd_args: list[str], token: CancelToken, out: _Outs | None,
               copies: dict[str, bytes], wanted: list[tuple[str, str]],
               saved: list[dict[str, Any]], limits: SandboxLimits) -> RunResult:
    from corral.run.strict import run_strict

    base = args.cwd.strip("/") if args.cwd and not args.cwd.startswith("/") else None
    if args.cwd and args.cwd.startswith("/"):
        base = args.cwd[len("/work"):].strip("/") if (
            args.cwd == "/work" or args.cwd.startswith("/work/")) else None
        if base is None and (copies or wanted):
            raise ConfigInvalidError("--cwd", "with --copy or --output, the strict cwd must be "
                                              f"inside /work: {args.cwd!r}")

    def inside(rel: str) -> str:
        return f"{base}/{rel}" if base else rel

    dests = iter(wanted)  # run_strict hands the files back in the order asked

    def on_file_out(path: str, data: bytes | None) -> None:
        src, dest = next(dests)
        saved.append(_save(src, dest, data))

    # the sandbox sees the host's /usr and the interpreter's prefix: resolve symlinks
    # (a venv's bin/python) to the real file, which is bound in
    command = os.path.realpath(cmd) if cmd.startswith("/") else (
        f"/work/{inside(cmd)}" if not args.cwd or not args.cwd.startswith("/")
        else os.path.join(args.cwd, cmd))
    if args.image is not None:  # the image's own file (or a name on its PATH)
        command = cmd if cmd.startswith("/") or "/" not in cmd else command
    return run_strict(
        command, cmd_args, timeout_ms=args.timeout, env=_env(args),
        cwd=args.cwd, stdin=_stdin(args.stdin), max_stdout_bytes=args.max_stdout,
        max_stderr_bytes=args.max_stderr, limits=limits, cancel=token,
        provider=provider, make_cwd=args.cwd is not None, network=_network(args),
        files_in={inside(d): data for d, data in copies.items()},
        files_out=[inside(src) for src, _ in wanted], on_file_out=on_file_out,
        image=args.image, environment=args.environment,
        on_stdout=out[0].write if out else None,
        on_stderr=out[1].write if out else None)


def _finish(args: argparse.Namespace, result: RunResult, out: _Outs | None,
            saved: list[dict[str, Any]], live: LiveStatus | None = None) -> int:
    if out is not None:
        for o in out:
            o.close()
    if live is not None:
        live.stop()
    status = _status(result)
    if args.json or args.events:
        doc = result.to_dict()
        doc["exit_status"] = status
        doc.setdefault("level", args.level)
        if getattr(args, "warnings", None):
            doc["warnings"] = list(args.warnings)
        if saved:
            doc["files_out"] = saved
        if args.events:
            _event("result", **doc)
        else:
            print(json.dumps(doc))
        return status
    paint = Palette.for_stream(sys.stderr).paint
    # the streamed output may have stopped mid-line (a cap cuts it anywhere): corral's
    # own lines start on a line of their own
    nl = "\n" if out is not None and not _Output.at_line_start else ""
    if result.outcome is not Outcome.EXIT:
        err = result.error()
        detail = err.message if err is not None else ""
        print(f"{nl}{paint('corral', 'bold')}: {paint(str(result.outcome), 'red', 'bold')}: "
              f"{detail}", file=sys.stderr)
        nl = ""
    for d in result.denials:
        _note(f"network refused {d.host}:{d.port} ({d.kind}): {d.reason}")
    if live is not None and live.enabled:  # a person watches: how it ended, in one line
        code = result.exit_code
        how = (paint(f"exit {code}", "green" if code == 0 else "yellow")
               if result.outcome is Outcome.EXIT else paint(str(result.outcome), "red"))
        took = round(result.duration_ms) if result.duration_ms else result.usage.wall_ms
        print(f"{nl}{paint('corral', 'bold')}: {how} {paint(f'in {took} ms', 'dim')} "
              f"{paint(f'({args.level})', 'dim')}", file=sys.stderr)
    return status


def _status(result: RunResult) -> int:
    """The exit status: :func:`exit_status_of`'s table, with a command that could not
    be started split as a shell does (126 found but not executable, 127 not found)."""
    if result.outcome is Outcome.SPAWN_ERROR and result.spawn_errno in _CANNOT_EXECUTE:
        return EXIT_CANNOT_EXECUTE
    return exit_status_of(result)
