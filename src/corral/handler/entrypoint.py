"""The handler-base entrypoint as a standalone script.

Run as ``python entrypoint.py MODULE_OR_FILE:ATTRIBUTE`` (images carry it at
``/corral/handler-base/entrypoint.py``). If ``corral`` is not importable, the
script puts the import root it sits in (``<root>/corral/handler/entrypoint.py``)
and then ``$CORRAL_PYTHONPATH`` on ``sys.path``; failing that it says so on
stderr and exits 70 without a frame (the host reports unhandled-worker).
Importing this module does nothing.
"""

from __future__ import annotations

import os
import sys

__all__ = ["bootstrap"]


def bootstrap() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]  # the script's own dir is not an import root
    try:
        from corral.handler.base import main
    except ImportError:
        extra = [os.path.dirname(os.path.dirname(here))]
        extra += [p for p in os.environ.get("CORRAL_PYTHONPATH", "").split(":") if p]
        sys.path[:0] = extra
        try:
            from corral.handler.base import main
        except ImportError as exc:
            sys.stderr.write(f"corral handler-base: cannot import corral: {exc}\n")
            return 70
    return main()


if __name__ == "__main__":
    sys.exit(bootstrap())
