"""The subproc provider: level ``context-isolated``, each command a bounded process tree.

See ``docs/providers/subproc.md`` for what it enforces and what it does not.
"""

from __future__ import annotations

from corral.providers.subproc._process import SubprocProcess as SubprocProcess
from corral.providers.subproc._provider import (
    SubprocProvider as SubprocProvider,
    SubprocSandbox as SubprocSandbox,
)

__all__ = ["PROVIDER_CLASS", "SubprocProcess", "SubprocProvider", "SubprocSandbox"]

#: the class the registry (corral.providers) hands out for "subproc"
PROVIDER_CLASS = SubprocProvider
