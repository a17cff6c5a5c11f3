"""``python -m corral.handler MODULE_OR_FILE:ATTRIBUTE``: the handler-base entrypoint."""

from __future__ import annotations

import sys

from corral.handler.base import main

__all__: list[str] = []

sys.exit(main())
