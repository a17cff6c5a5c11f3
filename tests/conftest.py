"""Suite-wide test hooks: the strict tier (see strict_tier.py).

Test modules in any folder import ``strict_tier`` (and ``cgroup_view``) by that name:
this folder is put on ``sys.path`` here (several folders have a conftest.py, so
conftests are not importable by name).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from strict_tier import pytest_configure, pytest_runtest_setup

__all__ = ["pytest_configure", "pytest_runtest_setup"]
