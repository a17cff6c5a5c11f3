"""Installs the snippet worker's run-time guards in the process that imports it.

Preloaded last into a strict snippet slot's fork server (``SnippetPool``), so every run
forked from it starts with ``dataclasses``, ``copy`` and ``logging`` already guarded
(see ``worker._harden`` and docs/validator.md, "Run-time guards"). Never import it
anywhere else: it changes those standard-library modules for the whole process. The
run-time guard's audit hook is not added here (agents fork and open files): each run adds
its own, in its own process (``worker._arm_guard``, docs/snippets.md). It also
builds the snippet builtins every run takes (``worker.prepare_builtins``), works out the
modules a run drops (``worker.prepare_shed``) and warms the code of a run (``worker.warm``).
"""

from __future__ import annotations

from corral.snippets.sandbox.worker import _harden, prepare_builtins, prepare_shed, warm
from corral.snippets.validator.policy import DEFAULT_ALLOWED_IMPORTS, FORBIDDEN_NAMES

__all__: list[str] = []

_harden()
# the builtins of a validated run (runner._job: the forbidden names but __build_class__)
# and of an unvalidated one (none forbidden), built here once for every run
prepare_builtins(FORBIDDEN_NAMES - {"__build_class__"}, frozenset())
# which of the agent's modules a run with the default allowlist drops (worker._shed_runtime)
prepare_shed(DEFAULT_ALLOWED_IMPORTS)
warm()  # the code every run takes, specialised here and shared
