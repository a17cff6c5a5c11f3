"""Sessions: stateful code execution with rich outputs (docs/sessions.md).

A session is a strict sandbox holding a live Python interpreter whose globals persist
between cells; a cell's result is shaped like a notebook cell's (streams, display
outputs as MIME bundles, the last expression's value, the error). Snippets
(:mod:`corral.snippets`) are the one-shot companion.
"""

from corral.sessions.result import CellError, CellResult, DisplayItem
from corral.sessions.session import DEFAULT_LIMITS, AsyncSession
from corral.sessions.sync import Session

__all__ = ["DEFAULT_LIMITS", "AsyncSession", "CellError", "CellResult", "DisplayItem",
           "Session"]
