"""What a session's cell gives back: a notebook cell's outputs, as frozen values."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["CellError", "CellResult", "DisplayItem", "cell_from_json"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True, slots=True)
class DisplayItem:
    """One rich output: a MIME bundle (``{"text/plain": ..., "image/png": base64, ...}``).

    ``kind`` is ``display`` (``display(obj)``, a matplotlib figure) or ``result`` (the
    cell's last expression, Jupyter's ``execute_result``)."""

    kind: Literal["display", "result"]
    data: Mapping[str, Any]

    def text(self, mime: str = "text/plain") -> str | None:
        v = self.data.get(mime)
        return v if isinstance(v, str) else None

    @property
    def png(self) -> bytes | None:
        """The ``image/png`` value decoded, if it is a PNG (signature checked)."""
        return _image(self.data.get("image/png"), PNG_SIGNATURE)

    @property
    def html(self) -> str | None:
        return self.text("text/html")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "data": dict(self.data)}


def _image(value: object, signature: bytes) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if raw.startswith(signature) else None


@dataclass(frozen=True, slots=True)
class CellError:
    """The exception that ended a cell: its class name, ``str()`` and a sanitized
    traceback (host paths replaced; the driver's own frames left out)."""

    name: str
    value: str
    traceback: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "traceback": self.traceback}


@dataclass(frozen=True, slots=True)
class CellResult:
    """How one ``run`` ended.

    Attributes:
        cell: the cell's number in its session (1, 2, ...).
        stdout / stderr: the text written, at most the session's output cap
            (``truncated`` says more was written; a note ends the text).
        result: the last expression's value as a bundle (``None``: no expression,
            or its value was ``None``).
        displays: the display outputs, in order (figures, ``display(obj)``).
        error: the exception, if the cell raised (a ``KeyboardInterrupt`` when it
            was interrupted at its timeout: ``timed_out`` is then true).
        duration_ms: wall time of the call.
    """

    cell: int
    stdout: str = ""
    stderr: str = ""
    result: DisplayItem | None = None
    displays: tuple[DisplayItem, ...] = ()
    error: CellError | None = None
    timed_out: bool = False
    truncated: bool = False
    duration_ms: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def outputs(self) -> tuple[DisplayItem, ...]:
        """Displays then the result, as a notebook shows them."""
        return self.displays + ((self.result,) if self.result is not None else ())

    def pngs(self) -> list[bytes]:
        return [p for d in self.outputs if (p := d.png) is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell, "ok": self.ok, "stdout": self.stdout, "stderr": self.stderr,
            "result": self.result.to_json() if self.result is not None else None,
            "displays": [d.to_json() for d in self.displays],
            "error": self.error.to_json() if self.error is not None else None,
            "timed_out": self.timed_out, "truncated": self.truncated,
            "duration_ms": round(self.duration_ms, 3), "notes": list(self.notes),
        }


def _bundle_of(doc: object) -> DisplayItem | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        return None
    kind: Literal["display", "result"] = "result" if doc.get("kind") == "result" \
        else "display"
    data = {k: v for k, v in doc["data"].items() if isinstance(k, str)
            and isinstance(v, str | dict | list)}
    return DisplayItem(kind, data)


def cell_from_json(doc: object) -> CellResult:
    """The inverse of :meth:`CellResult.to_json` (what a server sent: checked field by
    field, a field of the wrong type takes its neutral value)."""
    if not isinstance(doc, dict):
        raise ValueError("a cell is a JSON object")

    def text(name: str) -> str:
        v = doc.get(name)
        return v if isinstance(v, str) else ""

    err = doc.get("error")
    error = None
    if isinstance(err, dict):
        error = CellError(name=str(err.get("name", "Error")), value=str(err.get("value", "")),
                          traceback=str(err.get("traceback", "")))
    displays = doc.get("displays")
    cell = doc.get("cell")
    duration = doc.get("duration_ms")
    notes = doc.get("notes")
    return CellResult(
        cell=cell if isinstance(cell, int) and not isinstance(cell, bool) else 0,
        stdout=text("stdout"), stderr=text("stderr"), result=_bundle_of(doc.get("result")),
        displays=tuple(d for d in (_bundle_of(x) for x in displays) if d is not None)
        if isinstance(displays, list) else (),
        error=error, timed_out=doc.get("timed_out") is True,
        truncated=doc.get("truncated") is True,
        duration_ms=float(duration) if isinstance(duration, int | float) else 0.0,
        notes=tuple(n for n in notes if isinstance(n, str)) if isinstance(notes, list) else ())
