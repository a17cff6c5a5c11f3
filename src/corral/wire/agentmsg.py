"""Wire 1's meaning: the typed requests a host sends a sandbox agent, and its replies.

:mod:`corral.wire.agent` frames a message (a JSON header line, then a payload);
this module says what a header means. Each message is a small typed value (a
``NamedTuple``), with one codec each way:

* requests (host -> agent) carry an ``op`` tag: :func:`encode_request` on the
  host, :func:`decode_request` in the agent;
* replies (agent -> host) carry an ``r`` tag: :func:`encode_reply` in the agent,
  :func:`decode_reply` on the host; events carry ``ev`` (:class:`Exit`,
  :func:`decode_event`).

An error reply is :class:`Failed` holding ``CorralError.to_dict()`` (rebuilt on
the host by corral's one error codec, :func:`corral.core.errors.error_from_dict`)
or :class:`OsFailed` (an errno, for the host to raise the builtin ``OSError``
subclass where the contract says so, e.g. ``FileNotFoundError``).

The host reads replies as hostile: :func:`decode_reply` checks the tag is one the
request expects and every field's type (``bool`` is no ``int``), caps text, and
raises :class:`BadMessage` otherwise (the host then treats the agent as crashed).
A payload is bounded by the frame decoder's allowance before it gets here.

Imported into the sandbox agent, so every page of it is copied into a sandbox
that runs it: standard library only (``typing``), no ``dataclasses``, no
``msgspec`` (the fork server runs as ``python -I -S``: no site-packages), and
the field checks are built once, when the module is imported (in the fork
server, before any sandbox forks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple, TypeAlias

from corral.wire import jsonline as _jsonline

__all__ = [
    "DONE", "MAX_ENTRIES", "MAX_TEXT", "BadMessage", "Done", "EntryInfo", "Exit",
    "Failed", "ForkCall", "Kill", "ListDir", "Listing", "MakeDir", "Made", "OsFailed",
    "Ping", "Read", "Remove", "Reply", "Request", "Restore", "Snapshot", "SocketReq",
    "Spawn", "StartFailed", "Started", "Stat", "Write", "decode_event", "decode_listing",
    "decode_reply", "decode_request", "encode_event", "encode_listing", "encode_reply",
    "encode_request",
]

#: longest text field a reply may carry (a reason, a path, a name)
MAX_TEXT: Final = 8192
#: most entries one listing may hold
MAX_ENTRIES: Final = 100_000


class BadMessage(ValueError):
    """A header that is no message of this wire (unknown tag, a missing field, a field of
    the wrong type or size); ``reason`` says which, for a log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- requests: host -> agent ("op") ----------------------------------------------------

class Spawn(NamedTuple):
    """Start ``argv`` (posix_spawn); the three stdio descriptors ride beside it."""
    argv: list[str]
    env: dict[str, str]
    cwd: str = ""
    cpu_s: int | None = None


class ForkCall(NamedTuple):
    """Fork the agent and call the registered ``entry`` with ``args``."""
    entry: str
    args: list[str]
    env: dict[str, str]
    cwd: str = ""
    cpu_s: int | None = None


class Kill(NamedTuple):
    """Signal a started command's process group."""
    pid: int
    sig: int = 9


class Write(NamedTuple):
    """Create or replace the file at ``path`` with the payload."""
    path: str


class Read(NamedTuple):
    """The file at ``path``, as the reply's payload."""
    path: str


class ListDir(NamedTuple):
    """The entries of the directory at ``path`` ("" for the work dir), as a :class:`Listing`."""
    path: str


class Remove(NamedTuple):
    """Remove the file or (empty, or with ``recursive`` any) directory at ``path``."""
    path: str
    recursive: bool = False


class MakeDir(NamedTuple):
    """Make the directory ``path`` (``parents``: and its missing parents)."""
    path: str
    parents: bool = True


class Stat(NamedTuple):
    """What is at ``path`` (never following a last symlink), as :class:`EntryInfo`."""
    path: str


class Snapshot(NamedTuple):
    """The work dir as a tar payload."""


class Restore(NamedTuple):
    """Replace the work dir with the payload's tar."""


class Ping(NamedTuple):
    """Answer :class:`Done`."""


class SocketReq(NamedTuple):
    """A fresh TCP socket (``family`` 4 or 6) of the sandbox's network namespace."""
    family: int = 4


Request: TypeAlias = (Spawn | ForkCall | Kill | Write | Read | ListDir | Remove | MakeDir
                      | Stat | Snapshot | Restore | Ping | SocketReq)

# -- replies: agent -> host ("r") ------------------------------------------------------


class Done(NamedTuple):
    """The request was done (a payload, if any, is the answer: read, snapshot)."""


#: the one :class:`Done` (built in the fork server, shared by every agent: each object
#: an agent creates or touches is memory copied into that sandbox)
DONE: Final = Done()


class Started(NamedTuple):
    """A command (spawn, fork_call) started as ``pid``."""
    pid: int


class StartFailed(NamedTuple):
    """A command could not start (``errno``, as a shell says it)."""
    errno: int
    reason: str


class EntryInfo(NamedTuple):
    """One file system entry: ``type`` is file, dir, symlink or other; ``mtime`` in
    seconds since the epoch; ``target`` a symlink's target (never followed)."""
    name: str
    type: str
    size: int
    mode: int
    mtime: float
    target: str | None = None


class Listing(NamedTuple):
    """A directory's ``n`` entries follow as the payload (:func:`encode_listing`)."""
    n: int


class Made(NamedTuple):
    """A directory was made (``created``) or was there already."""
    created: bool


class Failed(NamedTuple):
    """A request failed with one of corral's errors: ``CorralError.to_dict()``."""
    error: dict[str, Any]


class OsFailed(NamedTuple):
    """A request failed with an OS error (``errno``; ``path`` the sandbox path)."""
    errno: int
    reason: str
    path: str = ""


Reply: TypeAlias = (Done | Started | StartFailed | EntryInfo | Listing | Made | Failed
                    | OsFailed)

# -- events: agent -> host ("ev") ------------------------------------------------------


class Exit(NamedTuple):
    """A started command ended: its exit code (negative: the signal), its own CPU time
    and peak memory, and the work dir's free bytes (-1: not read)."""
    pid: int
    code: int
    cpu_ms: int = 0
    maxrss_kb: int = 0
    disk_free: int = -1


# -- the field checks, built once ------------------------------------------------------

_INT_BOUND: Final = 2 ** 63


def _is_int(v: object) -> bool:
    return type(v) is int and -_INT_BOUND <= v < _INT_BOUND


def _is_str(v: object) -> bool:
    return type(v) is str and len(v) <= MAX_TEXT


def _is_str_list(v: object) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _is_str_dict(v: object) -> bool:
    return type(v) is dict and all(type(k) is str and type(x) is str
                                   for k, x in v.items())


_CHECKS: Final[Mapping[str, Callable[[object], bool]]] = {
    "str": _is_str,
    "int": _is_int,
    "bool": lambda v: type(v) is bool,
    "float": lambda v: type(v) is float or _is_int(v),
    "int | None": lambda v: v is None or _is_int(v),
    "str | None": lambda v: v is None or _is_str(v),
    "list[str]": _is_str_list,
    "dict[str, str]": _is_str_dict,
    "dict[str, Any]": lambda v: type(v) is dict,
}

#: per message class: (field, check, required) in order
_Fields: TypeAlias = tuple[tuple[str, Callable[[object], bool], bool], ...]


def _fields(cls: type) -> _Fields:
    hints = cls.__annotations__
    defaults = getattr(cls, "_field_defaults", {})
    return tuple((name, _CHECKS[str(getattr(t, "__forward_arg__", t))], name not in defaults)
                 for name, t in hints.items())


_REQUESTS: Final[Mapping[str, tuple[type, _Fields]]] = {
    op: (cls, _fields(cls)) for op, cls in (
        ("spawn", Spawn), ("fork_call", ForkCall), ("kill", Kill), ("write", Write),
        ("read", Read), ("list", ListDir), ("remove", Remove), ("mkdir", MakeDir),
        ("stat", Stat), ("snapshot", Snapshot), ("restore", Restore), ("ping", Ping),
        ("socket", SocketReq))}
_OP_OF: Final[Mapping[type, str]] = {cls: op for op, (cls, _f) in _REQUESTS.items()}

_REPLIES: Final[Mapping[str, tuple[type, _Fields]]] = {
    tag: (cls, _fields(cls)) for tag, cls in (
        ("done", Done), ("started", Started), ("start-failed", StartFailed),
        ("entry", EntryInfo), ("listing", Listing), ("made", Made),
        ("failed", Failed), ("os-failed", OsFailed))}
_TAG_OF: Final[Mapping[type, str]] = {cls: tag for tag, (cls, _f) in _REPLIES.items()}

_EXIT_FIELDS: Final = _fields(Exit)
#: header keys the frame layer owns (not a message's fields)
_FRAME_KEYS: Final = frozenset({"id", "len", "nfds", "op", "r", "ev"})


def _build(cls: type, fields: _Fields, h: Mapping[str, Any], what: str) -> Any:
    values = []
    for name, check, required in fields:
        if name in h:
            v = h[name]
            if not check(v):
                raise BadMessage(f"{what}: field {name!r} has a wrong type or size")
            values.append(v)
        elif required:
            raise BadMessage(f"{what}: field {name!r} is missing")
        else:
            values.append(cls._field_defaults[name])  # type: ignore[attr-defined]
    # tuple's own constructor (C), not the class's generated Python __new__: the agent
    # runs this for every request (see the module docstring on copied pages)
    return tuple.__new__(cls, values)


def _header(tag_key: str, tag: str, msg: tuple[Any, ...]) -> dict[str, Any]:
    # zip over the class's field names, not ``_asdict``: the agent runs this for every
    # reply, and each Python function it calls is pages copied into every sandbox
    h: dict[str, Any] = dict(zip(type(msg)._fields, msg, strict=True))  # type: ignore[attr-defined]
    h[tag_key] = tag
    return h


# -- the codecs ------------------------------------------------------------------------

def encode_request(req: Request) -> dict[str, Any]:
    """The header of a request (the channel adds its ``id``)."""
    return _header("op", _OP_OF[type(req)], req)


def decode_request(h: Mapping[str, Any]) -> Request:
    """The request a header holds, or :class:`BadMessage`."""
    op = h.get("op")
    entry = _REQUESTS.get(op) if type(op) is str else None
    if entry is None:
        raise BadMessage(f"unknown op {str(op)[:40]!r}")
    return _build(entry[0], entry[1], h, str(op))  # type: ignore[no-any-return]


def encode_reply(reply: Reply) -> dict[str, Any]:
    """The header of a reply (the agent adds the request's ``id``)."""
    return _header("r", _TAG_OF[type(reply)], reply)


def decode_reply(h: Mapping[str, Any], expect: tuple[type, ...]) -> Reply:
    """The reply a header holds, one of ``expect`` or an error reply (:class:`Failed`,
    :class:`OsFailed`), or :class:`BadMessage`."""
    tag = h.get("r")
    entry = _REPLIES.get(tag) if type(tag) is str else None
    if entry is None:
        raise BadMessage(f"a reply of unknown type {str(tag)[:40]!r}")
    cls, fields = entry
    if cls not in expect and cls is not Failed and cls is not OsFailed:
        raise BadMessage(f"a {tag!r} reply where {[_TAG_OF[c] for c in expect]} may come")
    return _build(cls, fields, h, str(tag))  # type: ignore[no-any-return]


def encode_event(ev: Exit) -> dict[str, Any]:
    return _header("ev", "exit", ev)


def decode_event(h: Mapping[str, Any]) -> Exit | None:
    """The event a header holds (None: an event of a kind this host does not know, which
    it ignores), or :class:`BadMessage`."""
    if h.get("ev") != "exit":
        return None
    return _build(Exit, _EXIT_FIELDS, h, "exit")  # type: ignore[no-any-return]


_ENTRY_FIELDS: Final = _fields(EntryInfo)
_ENTRY_NAMES: Final = tuple(name for name, _c, _r in _ENTRY_FIELDS)


def encode_listing(entries: list[EntryInfo]) -> bytes:
    """A listing's payload: one compact JSON array of entry arrays."""
    return _jsonline.dumps([list(e) for e in entries])


def decode_listing(payload: bytes, count: int) -> list[EntryInfo]:
    """The entries of a listing's payload (exactly ``count`` of them), or :class:`BadMessage`."""
    try:
        rows = _jsonline.loads(payload) if payload else []
    except (ValueError, RecursionError):
        raise BadMessage("a listing that is not JSON") from None
    if type(rows) is not list or len(rows) != count or count > MAX_ENTRIES:
        raise BadMessage("a listing that is not a list of the count it announced")
    out: list[EntryInfo] = []
    for row in rows:
        if type(row) is not list or not 5 <= len(row) <= len(_ENTRY_NAMES):
            raise BadMessage("a listing entry that is not an entry")
        out.append(_build(EntryInfo, _ENTRY_FIELDS, dict(zip(_ENTRY_NAMES, row, strict=False)),
                          "listing entry"))
    return out
