"""``corral serve``: corral as an HTTP service (a versioned JSON API under ``/v1``, on
Starlette and uvicorn; ``pip install corral[serve]``). See docs/service.md.

* :mod:`.config`: the TOML config (tenants, tokens, caps, levels), stdlib only;
* :mod:`.service`: the operations, over the provider contract and the front doors;
* :mod:`.app`: the ASGI app (routes, auth, body caps, disconnect = cancel, errors);
* :mod:`.server`: uvicorn, binding (loopback by default), SIGTERM drain;
* :mod:`.openapi`, :mod:`.metrics`, :mod:`.logs`: the document, ``/metrics``, JSON logs.

Nothing here is imported by ``import corral``; starlette and uvicorn load only when the
app is made.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["create_app", "load_config", "serve"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from corral.serve.app import create_app
        return create_app
    if name == "serve":
        from corral.serve.server import serve
        return serve
    if name == "load_config":
        from corral.serve.config import load_config
        return load_config
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
