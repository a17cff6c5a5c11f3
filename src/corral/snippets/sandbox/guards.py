"""Installs the snippet worker's run-time guards in the process that imports it.

Preloaded last into a strict snippet slot's fork server (``SnippetPool``), so every run
forked from it starts with ``dataclasses``, ``copy`` and ``logging`` already guarded
(see ``worker._harden`` and docs/validator.md, "Run-time guards"). Never import it
anywhere else: it changes those standard-library modules for the whole process.
"""

from __future__ import annotations

from corral.snippets.sandbox.worker import _harden

__all__: list[str] = []

_harden()
