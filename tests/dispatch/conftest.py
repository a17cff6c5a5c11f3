"""Dispatch test fixtures; their code lives in dispatch_support.py, which tests import
by that unique name (several test folders have a conftest.py)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from dispatch_support import _remove_shared, proc_via, via

__all__ = ["_remove_shared", "proc_via", "via"]
