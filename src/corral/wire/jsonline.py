"""Compact JSON for the fork server and the sandbox agent, straight to ``_json``'s C code.

``json.dumps``/``json.loads`` run a few Python functions per call (a fresh
``JSONEncoder``, ``iterencode``, ``decode``, ``raw_decode``). Every Python
function a process runs after a fork copies the pages its code, constants and
objects sit on, and the agent of every sandbox is such a fork of the fork
server: measured in a forked child, the first ``json.dumps(..., separators=...)``
costs ~300 KiB of copied pages, the C encoder built here ~90 KiB; ``json.loads``
~180 KiB against ~30 KiB for the C scanner. Output is byte-for-byte
``json.dumps(obj, separators=(",", ":"))`` (ASCII); input is one compact JSON
value. Falls back to :mod:`json` where ``_json`` is missing.
"""

from __future__ import annotations

import json
import json.decoder
import json.encoder
from collections.abc import Callable
from typing import Any, Final

__all__ = ["dumps", "loads"]


def _refuse(obj: object) -> Any:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)  # not in the stubs
#: markers=None: the callers send their own acyclic dicts
_ENCODE: Final = (_c_make_encoder(None, _refuse, json.encoder.encode_basestring_ascii, None,
                                  ":", ",", False, False, True)
                  if _c_make_encoder is not None else None)
_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = \
    json.decoder.JSONDecoder().scan_once  # type: ignore[attr-defined]


def dumps(obj: Any) -> bytes:
    """``json.dumps(obj, separators=(",", ":")).encode()``, without the Python layers."""
    if _ENCODE is None:
        return json.dumps(obj, separators=(",", ":")).encode()
    return "".join(_ENCODE(obj, 0)).encode()


def loads(data: bytes) -> Any:
    """One JSON value (no surrounding whitespace); ValueError if ``data`` is not one."""
    text = data.decode()
    try:
        obj, end = _SCAN(text, 0)
    except (StopIteration, json.JSONDecodeError):
        raise ValueError(f"not JSON: {text[:80]!r}") from None
    if end != len(text):
        raise ValueError(f"trailing data after JSON: {text[end:end + 80]!r}")
    return obj
