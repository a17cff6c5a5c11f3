"""Sans-I/O HTTP/1.1 for the proxy: request heads parsed by h11, checked strictly.

A security proxy that reads a request head one way while the upstream reads it
another is where request smuggling lives, so the grammar is not this module's own:
:func:`parse_http_head` hands each head to `h11 <https://h11.readthedocs.io>`_ (a
well-kept, fuzzed sans-I/O HTTP/1.1 implementation) for the request line and header
fields, and refuses before it what h11 accepts leniently but an upstream may read
differently (RFC 9112 allows a recipient to tolerate each of them; a proxy must not):

* a bare CR or LF anywhere in the head (h11 takes a bare LF as a line end);
* obs-fold, a header line starting with a space or tab (h11 unfolds it);
* more than one ``Content-Length`` line, or one whose value is not digits only
  (h11 merges equal duplicates and ``5, 5``);
* ``Content-Length`` and ``Transfer-Encoding`` together (h11 lets the latter win);
* a version other than HTTP/1.0 or 1.1, and ``Transfer-Encoding`` in an HTTP/1.0
  request.

h11 refuses the rest: a malformed request line or header line (a space before the
colon, a control character, a NUL), several ``Host`` or ``Transfer-Encoding``
headers, a transfer coding other than ``chunked``, a bad ``Content-Length``. The proxy
never forwards the client's bytes of a head: it writes the head it parsed (see
``forward.py``), so the upstream reads exactly what was checked.

Every function here is pure and raises only :class:`EgressDenied` (or, on the
upstream side, :class:`BadUpstream`).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Final

import h11

from corral.providers.linux.host.egress.limits import MAX_HEADER
from corral.providers.linux.host.egress.policy import (
    TCHAR,
    UNDERSCORE_CHECKED,
    DenialKind,
    EgressDenied,
    Target,
    digits,
    normalize_host,
)

__all__ = ["HOP_BY_HOP", "HTTP_STATUS", "RESPONSE_HEAD", "BadUpstream", "HttpHead",
           "check_absolute", "check_connection_tokens", "clear_secrets", "host_key",
           "http_reply", "inner_request", "parse_http_head", "parse_response_head",
           "split_authority", "wants_close"]

#: the most bytes of a response head, and of a chunk-size or trailer line
RESPONSE_HEAD: Final = 64 * 1024
#: the Host header added for h11 to a head without one (h11 requires Host in HTTP/1.1;
#: a proxy request may leave it out), removed again from the result
_NO_HOST: Final = b"corral-no-host.invalid"


@dataclass(frozen=True, slots=True)
class HttpHead:
    """A parsed request head: request line parts and headers (names lower-cased, in order)."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    def get_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


def _framing(head: bytes) -> bool:
    """Refuse what h11 reads leniently (see the module doc); whether there is a Host
    header. ``head``: the head without its final CRLF CRLF."""
    rest = head.replace(b"\r\n", b"")
    if b"\n" in rest or b"\r" in rest:
        raise EgressDenied("bad-request", "bare CR or LF in the request head")
    lines = head.split(b"\r\n")
    lengths = 0
    chunked = host = False
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise EgressDenied("bad-request", "folded header line (obs-fold)")
        name, _sep, value = line.partition(b":")
        name = name.lower()
        if name == b"content-length":
            lengths += 1
            if not value.strip(b" \t").isdigit() or not value.strip(b" \t").isascii():
                raise EgressDenied("bad-request", "bad Content-Length")
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"host":
            host = True
    if lengths > 1:
        raise EgressDenied("bad-request", "more than one Content-Length")
    if lengths and chunked:
        raise EgressDenied("bad-request", "both Transfer-Encoding and Content-Length")
    return host


def parse_http_head(data: bytes) -> HttpHead:
    """Parse a request head ending in CRLF CRLF (at most :data:`MAX_HEADER` bytes) with
    h11, after the strict framing checks of the module doc. HTTP/1.0 or 1.1 only."""
    if len(data) > MAX_HEADER:
        raise EgressDenied("too-large", "request header too large")
    if not data.endswith(b"\r\n\r\n"):
        raise EgressDenied("bad-request", "request head is not terminated")
    head = data[:-4]
    has_host = _framing(head)
    if not has_host:
        data = head + b"\r\nHost: " + _NO_HOST + b"\r\n\r\n"
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=len(data) + 1)
    try:
        conn.receive_data(data)
        event = conn.next_event()
    except h11.RemoteProtocolError as e:
        kind: DenialKind = ("unsupported" if e.error_status_hint == 501 else
                            "too-large" if e.error_status_hint == 431 else "bad-request")
        # h11's message may quote the line: bounded, and escaped where it is recorded
        raise EgressDenied(kind, f"malformed request head ({str(e)[:100]})") from None
    if not isinstance(event, h11.Request):
        raise EgressDenied("bad-request", "malformed request head")
    if event.http_version not in (b"1.0", b"1.1"):
        raise EgressDenied("bad-request", "unsupported HTTP version")
    # raw_items: a list (iterating Headers goes item by item through its Sequence ABC)
    headers = [(k.lower().decode("latin-1"), v.decode("latin-1"))
               for k, v in event.headers.raw_items()]
    if not has_host:
        headers = [(k, v) for k, v in headers if k != "host"]
    if event.http_version == b"1.0" and any(k == "transfer-encoding" for k, _v in headers):
        raise EgressDenied("bad-request", "Transfer-Encoding in an HTTP/1.0 request")
    return HttpHead(event.method.decode("ascii"), event.target.decode("ascii"),
                    "HTTP/" + event.http_version.decode("ascii"), tuple(headers))


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) -> (host, port); raises EgressDenied."""
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise EgressDenied("bad-request", "malformed authority")
        host, rest = authority[:close + 1], authority[close + 1:]
    else:
        host, sep, p = authority.rpartition(":")
        if not sep:
            host, rest = authority, ""
        else:
            rest = ":" + p
    if rest:
        p = rest[1:]
        if not rest.startswith(":") or not digits(p) or len(p) > 5 or not 0 < int(p) < 65536:
            raise EgressDenied("bad-request", "malformed port")
        port = int(p)
    elif default_port is None:
        raise EgressDenied("bad-request", "CONNECT target needs a port")
    else:
        port = default_port
    if not host:
        raise EgressDenied("bad-request", "empty host")
    return host, port


def host_key(host: str) -> str:
    n = normalize_host(host)
    return n if isinstance(n, str) else str(n)


def check_connection_tokens(head: HttpHead, secret_names: frozenset[str]) -> None:
    """Refuse a ``Connection`` header that lists a framing or routing header (or a
    secret's): a hop that honours it drops ``Content-Length`` (the body becomes the next
    request, unchecked, with any ``Host``) or the secret, where this proxy did not."""
    listed = {t.strip(" \t").lower() for v in head.get_all("connection") for t in v.split(",")}
    bad = listed & (UNDERSCORE_CHECKED | secret_names)
    if bad:
        raise EgressDenied("bad-request", f"Connection lists {sorted(bad)[0][:40]!r}")


def clear_secrets(port: int) -> EgressDenied:
    """The refusal of plain HTTP to a TLS port (443) of a host with secrets: they would
    cross the network in clear, though the entry names the TLS port."""
    return EgressDenied("not-allowed", f"plain HTTP to port {port} of a host with secrets "
                        "(they would cross the network in clear): use TLS")


def http_reply(status: int, text: str, reason: str) -> bytes:
    body = f"corral egress: {reason}\n".encode("utf-8", "replace")
    return (f"HTTP/1.1 {status} {text}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
            f"X-Corral-Egress: denied\r\n\r\n").encode("latin-1") + body


#: the HTTP answer to each kind of denial
HTTP_STATUS: Final[dict[DenialKind, tuple[int, str]]] = {
    "not-allowed": (403, "Forbidden"), "non-public-address": (403, "Forbidden"),
    "sni-mismatch": (403, "Forbidden"), "bad-request": (400, "Bad Request"),
    "unresolvable": (502, "Bad Gateway"), "too-large": (431, "Request Header Fields Too Large"),
    "timeout": (408, "Request Timeout"), "busy": (503, "Service Unavailable"),
    "unsupported": (501, "Not Implemented"),
}
#: headers of one hop, never forwarded
HOP_BY_HOP: Final = frozenset({"connection", "proxy-connection", "keep-alive",
                               "proxy-authorization", "proxy-authenticate", "te",
                                "trailer", "upgrade"})


def check_absolute(head: HttpHead) -> tuple[str, int, str]:
    """Check an absolute-form request; return (host, port, origin-form target)."""
    t = head.target
    if not t.lower().startswith("http://"):
        if t.lower().startswith("https://"):
            raise EgressDenied("unsupported", "https:// through a plain proxy request; "
                               "use CONNECT")
        raise EgressDenied("bad-request", "a proxy request needs an absolute http:// URI")
    try:
        u = urllib.parse.urlsplit(t)
    except ValueError:
        raise EgressDenied("bad-request", "malformed URI") from None
    netloc = u.netloc
    if "@" in netloc:
        raise EgressDenied("bad-request", "user info in the URI is not allowed")
    host, port = split_authority(netloc, 80)
    origin = u.path or "/"
    if not origin.startswith("/"):
        raise EgressDenied("bad-request", "malformed URI path")
    if u.query:
        origin += "?" + u.query
    hosts = head.get_all("host")
    if len(hosts) > 1:
        raise EgressDenied("bad-request", "more than one Host header")
    if hosts:
        h_host, h_port = split_authority(hosts[0], 80)
        if host_key(h_host) != host_key(host) or h_port != port:
            raise EgressDenied("not-allowed",
                               f"Host header {hosts[0][:80]!r} does not match the URI")
    te = head.get_all("transfer-encoding")
    if te:
        raise EgressDenied("unsupported", "request bodies with Transfer-Encoding are not "
                           "carried; send Content-Length")
    lengths = head.get_all("content-length")
    if len(set(lengths)) > 1 or any(not digits(v) or len(v) > 18 for v in lengths):
        raise EgressDenied("bad-request", "bad Content-Length")
    check_connection_tokens(head, frozenset())
    return host, port, origin


def inner_request(head: HttpHead, target: Target, tls: bool) -> tuple[bytes, int | None]:
    """Check one request inside an intercepted tunnel; return the head to send upstream
    and its body (a Content-Length, 0 for none, or None for chunked)."""
    if head.method in ("CONNECT", "TRACE"):
        raise EgressDenied("not-allowed" if head.method == "TRACE" else "unsupported",
                           f"{head.method} is not carried to a host with secrets")
    if not (head.target.startswith("/") or (head.target == "*"
                                             and head.method == "OPTIONS")):
        raise EgressDenied("bad-request", "requests inside a tunnel use origin form "
                           "(/path)")
    hosts = head.get_all("host")
    if len(hosts) > 1:
        raise EgressDenied("bad-request", "more than one Host header")
    if hosts:
        h_host, h_port = split_authority(hosts[0], 443 if tls else 80)
        if host_key(h_host) != target.tls_host or h_port != target.port:
            raise EgressDenied("not-allowed", f"Host header {hosts[0][:80]!r} does not "
                               f"match the tunnel host {target.tls_host}:{target.port}")
    secret_names = {h.name for h in target.secrets}
    check_connection_tokens(head, frozenset(secret_names))
    for k, _v in head.headers:
        # an upstream that reads "_" as "-" (CGI-style) would frame or authorize by a
        # header this proxy does not treat as such: refused, not forwarded
        if "_" in k and k.replace("_", "-") in UNDERSCORE_CHECKED | secret_names:
            raise EgressDenied("bad-request", f"header {k[:40]!r} looks like "
                               f"{k.replace('_', '-')[:40]!r}")
    # strip(" \t") only: str.strip() also drops "\xa0" and "\x85", which an upstream
    # keeps ("chunked\xa0" is not chunked to it)
    te = [t.strip(" \t").lower() for v in head.get_all("transfer-encoding")
          for t in v.split(",")]
    lengths = head.get_all("content-length")
    body: int | None
    if te:
        if te != ["chunked"]:
            raise EgressDenied("unsupported", "request Transfer-Encoding other than "
                               "chunked")
        if lengths:
            raise EgressDenied("bad-request", "both Transfer-Encoding and Content-Length")
        body = None
    else:
        if len(set(lengths)) > 1 or any(not digits(v) or len(v) > 18 for v in lengths):
            raise EgressDenied("bad-request", "bad Content-Length")
        body = int(lengths[0]) if lengths else 0
    lines = [f"{head.method} {head.target} {head.version}"]
    if not hosts:
        default = 443 if tls else 80
        lines.append(f"host: {target.tls_host}" + ("" if target.port == default
                                                   else f":{target.port}"))
    for k, v in head.headers:
        if k in secret_names or k in ("proxy-connection", "proxy-authorization"):
            continue
        lines.append(f"{k}: {v}")
    lines.extend(f"{h.name}: {h.value}" for h in target.secrets)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), body


class BadUpstream(Exception):
    """The upstream broke HTTP/1.1 framing: the client connection is closed."""


def wants_close(head: HttpHead) -> bool:
    tokens = {t.strip().lower() for v in head.get_all("connection") for t in v.split(",")}
    if head.version == "HTTP/1.0":
        return "keep-alive" not in tokens
    return "close" in tokens


def parse_response_head(data: bytes) -> tuple[str, int, list[tuple[str, str]]]:
    """(version, status, headers with lower-case names) of a response head."""
    lines = data[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or parts[0] not in ("HTTP/1.0", "HTTP/1.1") or \
            not digits(parts[1]) or len(parts[1]) != 3:
        raise BadUpstream("malformed status line")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= TCHAR:
            raise BadUpstream("malformed response header")
        headers.append((name.lower(), value.strip(" \t")))
    return parts[0], int(parts[1]), headers

