"""The playground page of ``corral serve``: an editor, a run button, the transcript
(logs, facts, result, errors) and the output as it streams, for a person in a browser.

Static files only (``playground/index.html``, ``app.js``, ``style.css`` next to this
module): no build step, no CDN, nothing fetched from elsewhere. The page calls the
service's own API (``POST /v1/snippets`` with the bearer token typed into the page, or
given once as ``/playground/#token=...``: a fragment never reaches the server or its logs),
so it gets exactly what an API client gets: the same validation, tenant and caps.

:func:`routes` is mounted by :func:`corral.serve.app.create_app`: ``/`` redirects to
``/playground/``. Every file is served with a strict Content-Security-Policy (only this
origin's own script, style and API; no inline script, no frames), ``nosniff`` and
``no-referrer``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

__all__ = ["FILES", "HEADERS", "STATIC_DIR", "routes"]

#: where the page's files are
STATIC_DIR: Final = Path(__file__).with_name("playground")
#: the files served, by name, and their media types (nothing else under the folder is)
FILES: Final = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    # the notebook view of a session (docs/sessions.md): /playground/notebook.html
    "notebook.html": "text/html; charset=utf-8",
    "notebook.js": "text/javascript; charset=utf-8",
    "notebook.css": "text/css; charset=utf-8",
}
#: sent with every file of the page
HEADERS: Final = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def _file(name: str) -> Response:
    data = (STATIC_DIR / name).read_bytes()
    return Response(data, media_type=FILES[name], headers=dict(HEADERS))


async def _index(request: Request) -> Response:
    return _file("index.html")


async def _asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in FILES:
        return Response("not found\n", status_code=404, media_type="text/plain",
                        headers=dict(HEADERS))
    return _file(name)


async def _to_page(request: Request) -> Response:
    return RedirectResponse("/playground/", status_code=307)


def routes() -> list[BaseRoute]:
    """The page's routes: ``/`` and ``/playground`` redirect to ``/playground/`` (the
    page), ``/playground/{app.js,style.css,index.html}`` its files."""
    return [
        Route("/", _to_page, methods=["GET", "HEAD"], name="playground-root"),
        Route("/playground", _to_page, methods=["GET", "HEAD"], name="playground-bare"),
        Route("/playground/", _index, methods=["GET", "HEAD"], name="playground"),
        Route("/playground/{name}", _asset, methods=["GET", "HEAD"], name="playground-file"),
    ]
