"""Wire 1, host <-> sandbox agent (and wire 2's framing): sans-I/O frames, both ends.

A frame is one header line, then a payload::

    frame   = header "\\n" payload
    header  = one JSON object on one line (compact, no newline inside)
    payload = exactly header["len"] bytes (none when "len" is absent or 0)

Descriptors ride beside the bytes (``SCM_RIGHTS``); a frame that carries some says
how many in ``nfds``. This module never touches a socket: :func:`encode` turns a
header and payload into bytes, :class:`Decoder` takes the bytes (and the number of
descriptors) that came and yields :class:`Frame` values, or raises one
:class:`Violation` saying why the far end broke the protocol (see docs/wires.md).

The host reads an agent's and the fork server's frames as hostile
(:func:`Decoder.host`): a header line of at most :data:`MAX_HEADER` bytes, checked
before it is parsed; ``len`` and ``nfds`` non-negative integers within what the
caller's ``allowance`` gives the header (nothing for a frame that answers no
request), checked before a byte of payload is buffered; descriptors only where
allowed, at most :data:`MAX_QUEUED_FDS` waiting, never fewer than a frame claims.
The agent and the fork server trust the host (:func:`Decoder.trusted`): no caps.

Imported by the sandbox agent, every byte of which is copied into each sandbox:
stdlib and :mod:`corral.wire.jsonline` only, no dataclasses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple

from corral.wire import jsonline as _jsonline

__all__ = ["MAX_FRAME", "MAX_HEADER", "MAX_QUEUED_FDS", "Decoder", "Frame", "Violation",
           "encode", "parse_header"]

#: longest header line the host accepts (a spawn request's env and argv go the other way)
MAX_HEADER: Final = 64 * 1024
#: payload allowed in a frame no request asked a payload for (events, hello, plain replies)
MAX_FRAME: Final = 0
#: descriptors received but not yet claimed by a frame, at most (host side)
MAX_QUEUED_FDS: Final = 16

#: ``allowance(header) -> (payload bytes, descriptors)`` a frame with this header may carry
Allowance = Callable[[Mapping[str, Any]], tuple[int, int]]


class Violation(ValueError):
    """The far end broke the frame protocol; ``reason`` says how (text for a log)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Frame(NamedTuple):
    """One decoded frame: its header, its payload, how many descriptors it claims."""

    header: dict[str, Any]
    payload: bytes
    nfds: int


def encode(header: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """A frame's bytes: ``header`` (with ``len`` set when there is a payload) as one
    compact ASCII JSON line, then the payload. The header must hold JSON values only."""
    h = dict(header)
    if payload:
        h["len"] = len(payload)
    return _jsonline.dumps(h) + b"\n" + payload


def parse_header(line: bytes) -> dict[str, Any]:
    """One header line (without its newline) as a JSON object, or :class:`Violation`."""
    try:
        header = _jsonline.loads(line)
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep
        raise Violation(f"a header that is not JSON ({type(e).__name__})") from None
    if type(header) is not dict:
        raise Violation("a header that is not a JSON object")
    return header


def _no_payload(_header: Mapping[str, Any]) -> tuple[int, int]:
    return MAX_FRAME, 0


class Decoder:
    """Bytes in (:meth:`feed`), frames out (:meth:`next_frame`), one at a time.

    Frames are parsed lazily, one per :meth:`next_frame`, so ``allowance`` sees the
    caller's state after every earlier frame was handled (a reply's request is gone
    once its reply was). After any :class:`Violation` the decoder is spent: the
    caller closes the wire."""

    __slots__ = ("_allowance", "_buf", "_fds", "_frame", "accept_fds", "max_fds",
                 "max_header")

    def __init__(self, *, max_header: int | None, allowance: Allowance | None,
                 accept_fds: bool, max_fds: int | None) -> None:
        """``max_header``/``max_fds``: None for no cap; ``allowance``: None for any
        payload and descriptor count (a trusted far end)."""
        self.max_header = max_header
        self.accept_fds = accept_fds
        self.max_fds = max_fds
        self._allowance = allowance
        self._buf = bytearray()
        self._fds = 0  # descriptors received, not yet claimed by a frame
        #: the frame being received: (header, payload length, descriptors)
        self._frame: tuple[dict[str, Any], int, int] | None = None

    @classmethod
    def host(cls, allowance: Allowance | None = None, *, accept_fds: bool = False
             ) -> Decoder:
        """The host's reader of a hostile far end: every cap of docs/wires.md, wire 1.
        ``allowance`` defaults to no payload and no descriptor for every frame."""
        return cls(max_header=MAX_HEADER, allowance=allowance or _no_payload,
                   accept_fds=accept_fds, max_fds=MAX_QUEUED_FDS)

    @classmethod
    def trusted(cls) -> Decoder:
        """The agent's and the fork server's reader of the host: no caps."""
        return cls(max_header=None, allowance=None, accept_fds=True, max_fds=None)

    @property
    def buffered(self) -> int:
        """Bytes held, not yet handed out in a frame."""
        return len(self._buf)

    @property
    def fds_waiting(self) -> int:
        """Descriptors received and not yet claimed by a frame."""
        return self._fds

    def feed(self, data: bytes, nfds: int = 0, fds_truncated: bool = False) -> None:
        """Take bytes and the number of descriptors that came with them
        (``fds_truncated``: the kernel dropped some, ``MSG_CTRUNC``). Raises
        :class:`Violation` for descriptors where none may come or too many."""
        if nfds:
            self._fds += nfds
            if not self.accept_fds:
                raise Violation(f"sent {nfds} descriptor(s); it may send none")
        if fds_truncated or (self.max_fds is not None and self._fds > self.max_fds):
            raise Violation("sent more descriptors than its frames claim")
        self._buf += data

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes come. Raises
        :class:`Violation` at the first broken rule, before buffering past a cap."""
        if self._frame is None:
            cap = self.max_header
            nl = self._buf.find(b"\n", 0, cap + 1) if cap is not None else self._buf.find(b"\n")
            if nl < 0:
                if cap is not None and len(self._buf) > cap:
                    raise Violation(f"a header line longer than {cap} bytes")
                return None
            header = parse_header(bytes(self._buf[:nl]))
            del self._buf[: nl + 1]
            self._frame = (header, *self._sizes(header))
        header, n, k = self._frame
        if len(self._buf) < n:
            return None
        payload = bytes(self._buf[:n])
        del self._buf[:n]
        if k > self._fds:
            raise Violation(f"a frame claims {k} descriptors, {self._fds} came")
        self._fds -= k
        self._frame = None
        return Frame(header, payload, k)

    def frames(self) -> list[Frame]:
        """Every complete frame buffered (for a far end whose allowance does not change
        between frames)."""
        out: list[Frame] = []
        while (frame := self.next_frame()) is not None:
            out.append(frame)
        return out

    def _sizes(self, header: Mapping[str, Any]) -> tuple[int, int]:
        """(payload length, descriptor count) of a frame, checked against its allowance."""
        n, k = header.get("len", 0), header.get("nfds", 0)
        if type(n) is not int or type(k) is not int or n < 0 or k < 0:
            raise Violation(f"bad len/nfds: {str(n)[:40]!r}/{str(k)[:40]!r}")
        if self._allowance is not None:
            max_n, max_k = self._allowance(header)
            if n > max_n:
                raise Violation(f"a frame of {n} bytes where at most {max_n} may come")
            if k > max_k:
                raise Violation(f"a frame with {k} descriptors where at most {max_k} may come")
        return n, k

    def reset(self) -> None:
        """Drop whatever is buffered (the wire closed)."""
        self._buf = bytearray()
        self._frame = None
        self._fds = 0
