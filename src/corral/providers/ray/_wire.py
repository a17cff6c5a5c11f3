"""What crosses between the driver and a node actor besides plain values: errors.

Ray pickles an exception raised in an actor method by its ``args``, which loses
the facts of corral's errors (``LevelNotSupportedError.field``, a timeout's partial
output, ``err.result``). So a node actor never raises across the wire: every call
returns a tagged reply, ``("ok", value)`` or ``("err", encoded)``, and the driver
rebuilds the same error class with the same facts (:func:`decode_error`) by corral's
one error codec (:meth:`CorralError.to_dict` and :func:`corral.core.errors.error_from_dict`);
the run an error ended (``err.result``) rides beside it as the value it is.

Pure: no Ray import (both ends use it; the node's side runs inside a Ray worker).
"""

from __future__ import annotations

from typing import Any

from corral.core.errors import CorralError, ProviderError, error_from_dict
from corral.core.result import RunResult

__all__ = ["Reply", "decode_error", "encode_error", "err", "ok", "unwrap"]

#: ("ok", value) or ("err", encoded error)
Reply = tuple[str, Any]


def ok(value: Any = None) -> Reply:
    return ("ok", value)


def err(e: BaseException, *, where: str) -> Reply:
    return ("err", encode_error(e, where=where))


def encode_error(e: BaseException, *, where: str) -> dict[str, Any]:
    """An error as plain data: corral's closed set keeps its class and facts; a missing
    file stays ``FileNotFoundError``; anything else becomes ``provider-error`` naming its
    type and ``where`` (the node)."""
    if isinstance(e, CorralError):
        return {"kind": "corral", "error": e.to_dict(), "result": e.result}
    if isinstance(e, FileNotFoundError):
        return {"kind": "enoent", "errno": e.errno, "strerror": e.strerror,
                "filename": e.filename}
    if isinstance(e, OSError) and isinstance(e.errno, int):  # a file operation's refusal
        return {"kind": "oserror", "errno": e.errno, "strerror": str(e.strerror or ""),
                "filename": None if e.filename is None else str(e.filename)}
    return {"kind": "other", "message": f"{where}: {type(e).__name__}: {e}"}


def decode_error(doc: dict[str, Any]) -> BaseException:
    """The error :func:`encode_error` described (the same class, message and facts)."""
    kind = doc.get("kind")
    if kind == "corral":
        result = doc.get("result")
        return error_from_dict(doc.get("error"),
                               result=result if isinstance(result, RunResult) else None)
    if kind == "enoent":
        return FileNotFoundError(doc.get("errno"), doc.get("strerror"), doc.get("filename"))
    if kind == "oserror" and isinstance(doc.get("errno"), int):
        # OSError(errno, ...) is the builtin subclass for it (NotADirectoryError, ...)
        return OSError(doc["errno"], str(doc.get("strerror", "")), doc.get("filename"))
    return ProviderError(str(doc.get("message", "unknown remote error")))


def unwrap(reply: Reply) -> Any:
    """The value of an ``ok`` reply; raise the error of an ``err`` one."""
    tag, value = reply
    if tag == "ok":
        return value
    raise decode_error(value)
