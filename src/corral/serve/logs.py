"""Structured logs: one JSON object per line on stderr (``ts``, ``level``, ``event`` and
the event's fields), so a log shipper parses them without a grammar. Request lines carry
``method``, ``path``, ``status``, ``ms`` and ``tenant``; never a token or a body."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

__all__ = ["JsonLog"]


class JsonLog:
    """Write events as JSON lines to ``stream`` (default: stderr)."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True) -> None:
        self._stream = stream
        self.enabled = enabled

    def event(self, event: str, *, sev: str = "info", **fields: Any) -> None:
        """Log ``event`` with ``fields``; ``sev`` is the severity (the ``level`` key)."""
        if not self.enabled and event == "request":
            return
        doc = {"ts": round(time.time(), 3), "level": sev, "event": event, **fields}
        stream = self._stream or sys.stderr
        try:
            stream.write(json.dumps(doc, default=str, separators=(",", ":")) + "\n")
            stream.flush()
        except (OSError, ValueError):  # stderr closed: logs are best effort
            pass
