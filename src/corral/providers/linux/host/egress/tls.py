"""Sans-I/O TLS: the ClientHello's SNI, parsed and bounded before a tunnel forwards it.

:func:`parse_client_hello` is pure and raises only :class:`EgressDenied`;
:func:`read_client_hello` reads whole TLS records from any ``readexactly`` until one
ClientHello message, bounded by :data:`MAX_CLIENT_HELLO`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol

from corral.providers.linux.host.egress.limits import MAX_CLIENT_HELLO
from corral.providers.linux.host.egress.policy import EgressDenied, normalize_host

__all__ = ["TLS_ALERT_ACCESS_DENIED", "TLS_OTHER_RECORDS", "ExactReader", "PrefixedReader",
           "parse_client_hello", "read_client_hello"]

#: a fatal access_denied alert (TLS 1.2 record framing): the answer to a refused ClientHello
TLS_ALERT_ACCESS_DENIED: Final = b"\x15\x03\x03\x00\x02\x02\x31"
#: TLS record types other than handshake (change_cipher_spec, alert, application_data,
#: heartbeat): with a version byte 3 after them, a client starts TLS without a ClientHello
TLS_OTHER_RECORDS: Final = frozenset({0x14, 0x15, 0x17, 0x18})


def _tls_record_length(header: bytes) -> int:
    if len(header) != 5 or header[0] != 0x16 or header[1] != 3:
        raise EgressDenied("bad-request", "not a TLS handshake record")
    length = int.from_bytes(header[3:5], "big")
    if not 0 < length <= 16384 + 256:
        raise EgressDenied("bad-request", "bad TLS record length")
    return length


def parse_client_hello(message: bytes) -> str | None:
    """The SNI host name (normalized) of a ClientHello handshake message (the 4-byte
    handshake header included, record framing removed), or None if it has none.
    Raises :class:`EgressDenied` for anything malformed."""
    bad = EgressDenied("bad-request", "malformed TLS ClientHello")
    if len(message) < 4 or len(message) > MAX_CLIENT_HELLO or message[0] != 1:
        raise bad
    if int.from_bytes(message[1:4], "big") != len(message) - 4:
        raise bad
    body = memoryview(message)[4:]
    pos = 0

    def take(n: int) -> memoryview:
        nonlocal pos
        if n < 0 or pos + n > len(body):
            raise bad
        out = body[pos:pos + n]
        pos += n
        return out

    def u8() -> int:
        return take(1)[0]

    def u16() -> int:
        b = take(2)
        return (b[0] << 8) | b[1]

    take(2 + 32)                       # legacy_version, random
    sid = u8()
    if sid > 32:
        raise bad
    take(sid)
    suites = u16()
    if suites < 2 or suites % 2:
        raise bad
    take(suites)
    comp = u8()
    if comp < 1:
        raise bad
    take(comp)
    if pos == len(body):
        return None                    # no extensions at all
    ext_total = u16()
    if pos + ext_total != len(body):
        raise bad
    sni: str | None = None
    seen: set[int] = set()
    while pos < len(body):
        etype = u16()
        elen = u16()
        data = bytes(take(elen))
        if etype in seen:
            raise bad
        seen.add(etype)
        if etype != 0:
            continue
        if len(data) < 2 or int.from_bytes(data[:2], "big") != len(data) - 2:
            raise bad
        i = 2
        names: list[bytes] = []
        while i < len(data):
            if i + 3 > len(data):
                raise bad
            ntype = data[i]
            nlen = int.from_bytes(data[i + 1:i + 3], "big")
            if i + 3 + nlen > len(data) or nlen == 0:
                raise bad
            if ntype == 0:
                names.append(data[i + 3:i + 3 + nlen])
            i += 3 + nlen
        if len(names) != 1:
            raise bad
        raw = names[0]
        if not raw.isascii():
            raise bad
        try:
            key = normalize_host(raw.decode("ascii"))
        except EgressDenied:
            raise bad from None
        if not isinstance(key, str):
            raise bad                  # RFC 6066: SNI is never an IP literal
        sni = key
    return sni


class ExactReader(Protocol):
    async def readexactly(self, n: int, /) -> bytes: ...


async def read_client_hello(reader: ExactReader) -> tuple[bytes, bytes]:
    """Read TLS records until one whole ClientHello message: (raw records, message)."""
    raw = bytearray()
    msg = bytearray()
    need: int | None = None
    while need is None or len(msg) < need:
        header = await reader.readexactly(5)
        length = _tls_record_length(header)
        payload = await reader.readexactly(length)
        raw += header + payload
        msg += payload
        if need is None and len(msg) >= 4:
            need = 4 + int.from_bytes(msg[1:4], "big")
            if msg[0] != 1 or need > MAX_CLIENT_HELLO:
                raise EgressDenied("bad-request", "malformed TLS ClientHello")
        if len(raw) > MAX_CLIENT_HELLO + 5 * 4:
            raise EgressDenied("too-large", "TLS ClientHello too large")
    if len(msg) != need:
        raise EgressDenied("bad-request", "trailing data after the TLS ClientHello")
    return bytes(raw), bytes(msg)


@dataclass(slots=True)
class PrefixedReader:
    """A StreamReader that first returns ``prefix`` (for bytes already read)."""

    prefix: bytes
    inner: ExactReader
    _pos: int = field(default=0)

    async def readexactly(self, n: int) -> bytes:
        take = self.prefix[self._pos:self._pos + n]
        self._pos += len(take)
        if len(take) == n:
            return take
        return take + await self.inner.readexactly(n - len(take))
