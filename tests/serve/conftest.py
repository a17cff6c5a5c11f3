"""Fixtures for ``corral serve``: real servers on 127.0.0.1, started per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from servehelp import Server, config_text, running


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server offering context-isolated (subproc): fast, no kernel primitives needed."""
    tmp = tmp_path_factory.mktemp("serve")
    images = tmp_path_factory.mktemp("images")
    with running(tmp, config_text({"context-isolated": "subproc"},
                                  carol="max_memory_mb = 600\nmax_sandboxes = 8",
                                  image_roots=(str(images),))) as s:
        s.image_root = images  # the one directory whose images tenants may name
        yield s
