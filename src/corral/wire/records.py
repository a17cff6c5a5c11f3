"""Wire 3, snippet worker records: sans-I/O, imported by the writer and by both readers.

A snippet run writes *records*, one JSON object per line (UTF-8): ``go``, then ``log``
lines, then ``end``; or, for a ``--once`` worker, one ``pong`` or one ``refused``
instead (see docs/wires.md, "3. Snippet worker records"). :func:`encode` turns a
record into its line; a :class:`Decoder` takes the bytes a run wrote, in any chunks,
and yields typed records, or raises :class:`BadRecord` at the first thing no honest
worker writes: the writer is the process that runs the caller's snippet, so the
stream is hostile. Checked before anything is buffered or trusted: the total size
(:func:`size_limit`), JSON, an object nested at most :data:`MAX_RECORD_DEPTH`
containers, the record kinds, their shapes and types, their order, the log count.

Standalone on purpose: stdlib only and no corral import, so a snippet template that
runs without corral on ``sys.path`` loads this very file beside its worker (see
``snippets.sandbox.worker``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

__all__ = ["LOG_STREAMS", "MAX_RECORD_DEPTH", "BadRecord", "Decoder", "End", "Go", "Log",
           "Pong", "Record", "Refused", "encode", "size_limit"]

#: Nesting of a record: {"end": {"facts": {name: <caps["depth"] containers>}}} and margin.
MAX_RECORD_DEPTH = 16
LOG_STREAMS = ("stdout", "stderr", "log")
#: Keys of the end record, with the types an honest worker gives them.
END_TYPES: dict[str, tuple[type, ...]] = {
    "facts": (dict,), "result": (str, type(None)), "errors": (list,),
    "duration_ms": (int, float), "timed_out": (bool,), "truncated": (list,)}
#: characters of a refusal the reader keeps
REFUSED_CHARS = 500


class BadRecord(ValueError):
    """A record no honest worker writes (the run's process is hostile or broken)."""


class Go(NamedTuple):
    """The run's process is set up: what follows belongs to the run."""


class Log(NamedTuple):
    """One line the snippet printed or logged (``cut``: shortened to the line cap)."""

    stream: str
    text: str
    cut: bool


class End(NamedTuple):
    """The run's results (a subset of :data:`END_TYPES`' keys)."""

    fields: dict[str, Any]


class Pong(NamedTuple):
    """A ``--once`` worker's answer to a ping."""

    pid: int


class Refused(NamedTuple):
    """A ``--once`` worker refused its job (not a valid invoke frame)."""

    text: str


Record = Go | Log | End | Pong | Refused


#: what ``json.dumps(obj, ensure_ascii=False, default=repr)`` builds on every call, built
#: once (a run's process would otherwise make a new encoder per record)
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, default=repr)


def encode(record: Record) -> bytes:
    """One record's line: JSON (non-ASCII kept, anything not JSON as its ``repr``), UTF-8."""
    if isinstance(record, Log):
        obj: dict[str, Any] = {"log": [record.stream, record.text], "cut": record.cut}
    elif isinstance(record, End):
        obj = {"end": record.fields}
    elif isinstance(record, Pong):
        obj = {"pong": True, "pid": record.pid}
    elif isinstance(record, Refused):
        obj = {"refused": record.text}
    else:
        obj = {"go": True}
    return (_ENCODER.encode(obj) + "\n").encode("utf-8", "replace")


def size_limit(log_lines: int, log_bytes: int, facts_bytes: int) -> int:
    """More bytes than any honest run writes under these caps: its logs (JSON-escaped text
    can be 6x its UTF-8 size, plus each record's framing), the end record, and margin."""
    return log_bytes * 6 + log_lines * 64 + facts_bytes * 4 + 1_048_576


def depth_ok(value: Any, limit: int) -> bool:
    """Whether ``value`` (decoded JSON) nests at most ``limit`` containers deep (iterative)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                                   else item))
    return True


class Decoder:
    """Bytes a run wrote in (:meth:`feed`), checked records out, in order. Holds at most
    :attr:`limit` bytes in all; after a :class:`BadRecord` it is spent."""

    __slots__ = ("_buf", "_total", "done", "limit", "log_lines", "logs", "started")

    def __init__(self, *, log_lines: int, log_bytes: int, facts_bytes: int) -> None:
        self.log_lines = log_lines
        self.limit = size_limit(log_lines, log_bytes, facts_bytes)
        self.started = False  # a go record came
        self.done = False     # the last record (end, pong, refused) came
        self.logs = 0
        self._buf = bytearray()
        self._total = 0

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished record held."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[Record]:
        """The records ``chunk`` completes. Raises BadRecord at the first malformed
        record, or when the output grows past what any honest run writes (counted
        before the chunk is buffered)."""
        self._total += len(chunk)
        if self._total > self.limit:
            raise BadRecord(f"the run wrote more than {self.limit} bytes of records")
        self._buf += chunk
        out: list[Record] = []
        while (nl := self._buf.find(b"\n")) >= 0:
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            out.append(self._take(line))
        return out

    def cut_off(self) -> bool:
        """Whether the stream stopped inside a record (call at end of file)."""
        return bool(self._buf)

    def _take(self, line: bytes) -> Record:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError, MemoryError):  # not JSON, not UTF-8, too deep
            raise BadRecord("a record is not a JSON line") from None
        if type(rec) is not dict or not depth_ok(rec, MAX_RECORD_DEPTH):
            raise BadRecord("a record is not a JSON object of a few levels")
        if self.done:
            raise BadRecord("a record after the last one")
        keys = set(rec)
        if keys == {"go"} and rec["go"] is True and not self.started:
            self.started = True
            return Go()
        if keys == {"log", "cut"} and self.started:
            return self._take_log(rec)
        if keys == {"end"} and self.started:
            self.done = True
            return End(self._checked_end(rec["end"]))
        if keys == {"pong", "pid"} and not self.started and rec["pong"] is True \
                and type(rec["pid"]) is int:
            self.done = True
            return Pong(rec["pid"])
        if keys == {"refused"} and not self.started and type(rec["refused"]) is str:
            self.done = True
            return Refused(rec["refused"][:REFUSED_CHARS])
        raise BadRecord(f"an unexpected record (keys {sorted(keys)[:3]!r})")

    def _take_log(self, rec: Mapping[str, Any]) -> Log:
        entry, cut = rec.get("log"), rec.get("cut")
        if not (type(entry) is list and len(entry) == 2 and entry[0] in LOG_STREAMS
                and type(entry[1]) is str and type(cut) is bool):
            raise BadRecord("a malformed log record")
        if self.logs >= self.log_lines:
            raise BadRecord("more log records than the cap")
        self.logs += 1
        return Log(entry[0], entry[1], cut)

    @staticmethod
    def _checked_end(end: Any) -> dict[str, Any]:
        if type(end) is not dict or not set(end) <= set(END_TYPES):
            raise BadRecord("a malformed end record")
        for key, value in end.items():
            if type(value) not in END_TYPES[key]:
                raise BadRecord(f"a malformed end record ({key})")
        return end
