"""Network allowlist for a sandbox made by an unprivileged user (issue 13): the egress
listener comes from the sandbox's own namespace, so it needs no privilege."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
from netservers import http_server

UID = 65534
FETCH = ("import os, sys, urllib.request\n"
         "os.environ.pop('NO_PROXY'); os.environ.pop('no_proxy')\n"
         "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n")


def test_allowlist_as_an_unprivileged_user(linux: Any, nobody_python: tuple[str, str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to become an unprivileged user")
    py, src = nobody_python
    with http_server({"*": b"hello nobody"}) as srv:
        args = ["run", "--level", "strict", "--allow-host", f"127.0.0.1/32:{srv.port}", "--",
                py, "-c", FETCH, f"http://127.0.0.1:{srv.port}/"]
        code = (f"import sys; sys.path.insert(0, {src!r})\n"
                f"from corral.cli import main; sys.exit(main({args!r}))")
        r = subprocess.run([py, "-I", "-c", code], user=UID, group=UID, extra_groups=[],
                           capture_output=True, text=True, timeout=60, cwd="/",
                           env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "hello nobody"
        assert srv.connections == 1
