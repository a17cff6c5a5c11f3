"""What ``expose(port)`` returns: a preview URL and the token that opens it.

A preview URL listens on the host's loopback, where every local user of the host can
connect; so each URL has its own unguessable token (32 random bytes, URL-safe base64)
and a connection that does not present it is refused before anything reaches the
sandbox. :class:`PreviewURL` is a ``str`` (the URL, as before) carrying ``token``;
the token is not part of the string, so printing or logging the URL does not reveal it.

How a client presents it, as the first thing it sends on each connection:

- HTTP: the header ``X-Corral-Preview-Token: <token>`` in the (first) request
  (:attr:`PreviewURL.headers`); the header is removed before the request goes on;
- any other TCP protocol: the line ``CORRAL-PREVIEW-TOKEN <token>\\r\\n``
  (:meth:`PreviewURL.preamble`), removed before the rest goes on.
"""

from __future__ import annotations

from typing import Final, final

__all__ = ["PREVIEW_PREAMBLE", "PREVIEW_TOKEN_HEADER", "PreviewURL"]

#: the HTTP request header that carries a preview URL's token
PREVIEW_TOKEN_HEADER: Final = "X-Corral-Preview-Token"
#: what a raw TCP client sends first, before the token and CRLF
PREVIEW_PREAMBLE: Final = b"CORRAL-PREVIEW-TOKEN "


@final
class PreviewURL(str):
    """A preview URL (the ``str``) with the ``token`` that opens it and the sandbox
    ``port`` it reaches."""

    token: str
    port: int

    def __new__(cls, url: str, token: str, port: int) -> PreviewURL:
        self = super().__new__(cls, url)
        self.token = token
        self.port = port
        return self

    @property
    def headers(self) -> dict[str, str]:
        """The header an HTTP client adds to its requests."""
        return {PREVIEW_TOKEN_HEADER: self.token}

    def preamble(self) -> bytes:
        """The line a raw TCP client sends first."""
        return PREVIEW_PREAMBLE + self.token.encode() + b"\r\n"

    def __reduce__(self) -> tuple[type[PreviewURL], tuple[str, str, int]]:
        return (PreviewURL, (str(self), self.token, self.port))
