"""Validated options of one bounded run (seed 03's table, in snake_case).

Every bad value raises :class:`~corral.core.errors.ConfigInvalidError` naming the
option, before anything is spawned or created.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from corral.core.cancel import CancelToken
from corral.core.errors import ConfigInvalidError
from corral.core.result import DEFAULT_MAX_STDERR_BYTES, DEFAULT_MAX_STDOUT_BYTES, OutputCallback
from corral.runner.tree import Spawner

__all__ = [
    "DEFAULT_GRACE_PERIOD_MS",
    "DEFAULT_MAX_STDERR_BYTES",
    "DEFAULT_MAX_STDOUT_BYTES",
    "OutputCallback",
    "RunOptions",
    "build_env",
    "make_options",
]

DEFAULT_GRACE_PERIOD_MS: Final = 2000
#: the variables copied from the host when present (HOME/TMPDIR: see build_env)
BOOTSTRAP_VARS: Final = ("PATH", "HOME", "TMPDIR")
_NODE_NAMES: Final = frozenset({"node", "nodejs"})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    command: str
    args: tuple[str, ...]
    cwd: str | None
    env: Mapping[str, str]
    timeout_ms: int
    shutdown_signal: signal.Signals
    grace_period_ms: int
    stdin: bytes | None
    max_stdout_bytes: int
    max_stderr_bytes: int
    node_heap_mb: int | None
    mem_mb: int | None
    cpu_ms: int | None
    cancel: CancelToken | None
    on_stdout: OutputCallback | None
    on_stderr: OutputCallback | None
    spawner: Spawner

    @property
    def is_node(self) -> bool:
        return os.path.basename(self.command) in _NODE_NAMES


def _positive(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigInvalidError(name, f"must be a positive integer, got {value!r}")
    if value <= 0:
        raise ConfigInvalidError(name, f"must be a positive integer, got {value}")


def _check_str(name: str, value: object) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or "\0" in value:
        raise ConfigInvalidError(name, f"must be a string without NUL, got {value!r}")
    return value


def _signal(value: object) -> signal.Signals:
    try:
        if isinstance(value, str):
            name = value.upper()
            return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
        if isinstance(value, int) and not isinstance(value, bool):
            return signal.Signals(value)
    except (KeyError, ValueError):
        pass
    raise ConfigInvalidError("shutdown_signal", f"not a signal: {value!r}")


def make_options(
    command: object, args: Sequence[str], *, timeout_ms: object, cwd: object,
    env: Mapping[str, str] | None, shutdown_signal: object, grace_period_ms: object,
    stdin: object, max_stdout_bytes: object, max_stderr_bytes: object,
    node_heap_mb: object, mem_mb: object, cpu_ms: object, cancel: object,
    on_stdout: object, on_stderr: object, spawner: object,
) -> RunOptions:
    cmd = _check_str("command", command)
    if not cmd or not os.path.isabs(cmd):
        raise ConfigInvalidError(
            "command", f"must be an absolute path (no PATH lookup, no shell), got {cmd!r}")
    if isinstance(args, str | bytes):
        raise ConfigInvalidError("args", "must be a sequence of strings, not one string")
    argv = tuple(_check_str(f"args[{i}]", a) for i, a in enumerate(args))
    _positive("timeout_ms", timeout_ms)
    assert isinstance(timeout_ms, int)
    work: str | None = None
    if cwd is not None:
        work = _check_str("cwd", cwd)
        if not os.path.isabs(work):
            raise ConfigInvalidError("cwd", f"must be an absolute path, got {work!r}")
    if grace_period_ms is None:
        grace = min(DEFAULT_GRACE_PERIOD_MS, timeout_ms // 2)
    else:
        if isinstance(grace_period_ms, bool) or not isinstance(grace_period_ms, int) \
                or grace_period_ms < 0:
            raise ConfigInvalidError("grace_period_ms", f"must be an integer >= 0, "
                                     f"got {grace_period_ms!r}")
        if grace_period_ms >= timeout_ms:
            raise ConfigInvalidError(
                "grace_period_ms", f"must be < timeout_ms ({grace_period_ms} >= {timeout_ms})")
        grace = grace_period_ms
    data: bytes | None
    if stdin is None:
        data = None
    elif isinstance(stdin, str):
        data = stdin.encode()
    elif isinstance(stdin, bytes | bytearray | memoryview):
        data = bytes(stdin)
    else:
        raise ConfigInvalidError("stdin", f"must be bytes or str, got {type(stdin).__name__}")
    _positive("max_stdout_bytes", max_stdout_bytes)
    _positive("max_stderr_bytes", max_stderr_bytes)
    _positive("node_heap_mb", node_heap_mb, allow_none=True)
    _positive("mem_mb", mem_mb, allow_none=True)
    _positive("cpu_ms", cpu_ms, allow_none=True)
    if cancel is not None and not isinstance(cancel, CancelToken):
        raise ConfigInvalidError("cancel", "must be a CancelToken")
    for name, cb in (("on_stdout", on_stdout), ("on_stderr", on_stderr), ("spawner", spawner)):
        if cb is not None and not callable(cb):
            raise ConfigInvalidError(name, "must be callable")
    clean_env: dict[str, str] = {}
    for k, v in (env or {}).items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise ConfigInvalidError("env", f"bad variable name {k!r}")
        if not isinstance(v, str) or "\0" in v:
            raise ConfigInvalidError(f"env[{k}]", "value must be a string without NUL")
        clean_env[k] = v
    return RunOptions(
        command=cmd, args=argv, cwd=work, env=clean_env, timeout_ms=timeout_ms,
        shutdown_signal=_signal(shutdown_signal), grace_period_ms=grace, stdin=data,
        max_stdout_bytes=max_stdout_bytes,  # type: ignore[arg-type]
        max_stderr_bytes=max_stderr_bytes,  # type: ignore[arg-type]
        node_heap_mb=node_heap_mb, mem_mb=mem_mb, cpu_ms=cpu_ms,  # type: ignore[arg-type]
        cancel=cancel, on_stdout=on_stdout, on_stderr=on_stderr,  # type: ignore[arg-type]
        spawner=spawner)  # type: ignore[arg-type]


def build_env(opts: RunOptions, *, cwd: str, cwd_owned: bool) -> tuple[dict[str, str], bool]:
    """The child's whole environment, and whether the Node heap cap went in.

    Bootstrap: PATH copied from the host when present; HOME and TMPDIR set to
    the run's own cwd when the runner made it (a private, empty dir), else
    copied from the host when present. The caller's ``env`` overrides all of
    them. The host environment is never merged otherwise, and the runner adds
    nothing of its own (it holds the tree with a supervisor, not a marker).
    """
    out: dict[str, str] = {}
    for name in BOOTSTRAP_VARS:
        if cwd_owned and name in ("HOME", "TMPDIR"):
            out[name] = cwd
        elif name in os.environ:
            out[name] = os.environ[name]
    out.update(opts.env)
    applied = False
    if opts.node_heap_mb is not None and opts.is_node:
        flag = f"--max-old-space-size={opts.node_heap_mb}"
        prior = out.get("NODE_OPTIONS", "")
        out["NODE_OPTIONS"] = f"{flag} {prior}".strip()
        applied = True
    return out, applied
