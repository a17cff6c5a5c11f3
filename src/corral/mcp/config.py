"""The MCP server's settings: one frozen value, checked when made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from corral.core.errors import ConfigInvalidError
from corral.core.spec import Level

__all__ = ["LEVEL_ORDER", "McpConfig", "level_at_least", "offered_levels"]

#: weakest first; a call may ask for the server's level or a stronger one, never weaker
LEVEL_ORDER: Final = (Level.NONE, Level.CONTEXT_ISOLATED, Level.STRICT)


def offered_levels(floor: Level) -> frozenset[Level]:
    """The levels a server whose weakest level is ``floor`` runs at (never ``none``)."""
    return frozenset(lv for lv in LEVEL_ORDER
                     if lv != Level.NONE and LEVEL_ORDER.index(lv) >= LEVEL_ORDER.index(floor))


def level_at_least(asked: str | None, floor: Level) -> Level:
    """The level a call runs at: ``asked`` (default: ``floor``), refused with
    ConfigInvalidError when unknown or weaker than ``floor`` (the server's level)."""
    if asked is None or asked == "":
        return floor
    try:
        lv = Level(asked)
    except ValueError:
        known = ", ".join(x.value for x in LEVEL_ORDER)
        raise ConfigInvalidError("level", f"unknown level {asked!r} (known: {known})") from None
    if LEVEL_ORDER.index(lv) < LEVEL_ORDER.index(floor):
        raise ConfigInvalidError("level", f"this server runs at {floor.value!r} or stronger; "
                                 f"{lv.value!r} is weaker")
    return lv


@dataclass(frozen=True, slots=True, kw_only=True)
class McpConfig:
    """What ``corral mcp`` serves and its bounds.

    Attributes:
        level: the weakest level any tool runs at (and the default): ``strict`` (the
            default, the linux provider) or ``context-isolated`` (subproc). ``none`` is
            refused: an MCP client's code is never run without a boundary.
        idle_timeout_s: a named sandbox nobody used for this long is destroyed.
        max_sandboxes: named sandboxes alive at once per session.
        max_total_sandboxes: named sandboxes alive at once in the whole server.
        max_command_timeout_ms: the longest ``run_command`` / ``sandbox_exec`` a call
            may ask for (its default is 10 s or this, whichever is less).
        max_output_bytes: stdout and stderr caps of each command (each stream).
        max_file_bytes: the largest file ``sandbox_write_file`` / ``sandbox_read_file``
            moves.
        snippet_workers: snippets run at once (None: the CPU count); more wait FIFO.
        playground_url: the address of a ``corral serve`` playground page (for example
            ``http://127.0.0.1:8580/playground/``); when set, ``run_in_sandbox`` answers
            also carry ``playground_url``, that page with the snippet in it (as seed 02's
            tool answers with its ``playgroundUrl``).
        max_sessions: MCP sessions (handshake protocol) open at once in the whole
            server, over all tenants (each tenant has its own ``max_sessions`` too).
        session_start_timeout_s: a session that did nothing after its handshake is
            closed after this long (``idle_timeout_s`` once it did something).
        shutdown_grace_s: on SIGTERM, how long requests in flight may finish before they
            are cancelled (every sandbox is then destroyed).
        providers / provider_options: the provider for each level (level -> registry
            name, ``corral serve``'s ``[levels]``) and its options; a level left out gets
            corral's default provider for it.
        environments: the built environments (docs/environments.md) the stdio client,
            the local tenant, may name (``corral mcp --environment NAME``); an HTTP
            tenant gets those its ``[[tenants]]`` table lists (``environments``).
    """

    level: Level = Level.STRICT
    idle_timeout_s: float = 600.0
    max_sandboxes: int = 8
    max_total_sandboxes: int = 64
    max_command_timeout_ms: int = 60_000
    max_output_bytes: int = 1024 * 1024
    max_file_bytes: int = 4 * 1024 * 1024
    snippet_workers: int | None = None
    playground_url: str | None = None
    max_sessions: int = 64
    session_start_timeout_s: float = 30.0
    shutdown_grace_s: float = 1.0
    providers: Mapping[str, str] = field(default_factory=dict)
    provider_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    environments: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "environments", frozenset(self.environments))
        if not isinstance(self.level, Level):
            object.__setattr__(self, "level", level_at_least(str(self.level), Level.NONE))
        if self.level == Level.NONE:
            raise ConfigInvalidError("level", "corral mcp runs at 'strict' or "
                                     "'context-isolated', never at 'none'")
        if not (isinstance(self.idle_timeout_s, int | float) and self.idle_timeout_s > 0):
            raise ConfigInvalidError("idle_timeout_s", "must be a positive number of seconds")
        for name in ("session_start_timeout_s", "shutdown_grace_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise ConfigInvalidError(name, "must be a positive number of seconds")
        for name in ("max_sandboxes", "max_total_sandboxes", "max_command_timeout_ms",
                     "max_output_bytes", "max_file_bytes", "max_sessions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigInvalidError(name, "must be a positive integer")
        url = self.playground_url
        if url is not None and (not isinstance(url, str)
                                or not url.startswith(("http://", "https://")) or "#" in url):
            raise ConfigInvalidError("playground_url", "an http(s) URL without a #fragment")
        w = self.snippet_workers
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w <= 0):
            raise ConfigInvalidError("snippet_workers", "must be a positive integer")
