"""``corral run --level strict --allow-host/--network`` and ``corral doctor``'s proxy row
(issue 13). The server is one the test starts on the host's loopback; the sandbox
reaches it only through its egress proxy, by IP literal (listed as ``/32:PORT``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.cli import main
from strict_tier import host_can_sandbox, unavailable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "linux"))
from netservers import http_server

PY = os.path.realpath(sys.executable)
CORRAL = [sys.executable, "-c", "import sys, _corral_cli; sys.exit(_corral_cli.main())"]

#: inside: GET argv[1] through the proxy the env names (NO_PROXY dropped: it lists
#: 127.0.0.1 as the sandbox's own loopback, here the test means the host's)
FETCH = ("import os, sys, urllib.request, urllib.error\n"
         "os.environ.pop('NO_PROXY'); os.environ.pop('no_proxy')\n"
         "o = urllib.request.build_opener()\n"
         "try:\n"
         "    print(o.open(sys.argv[1], timeout=10).read().decode())\n"
         "except urllib.error.HTTPError as e:\n"
         "    print('HTTP', e.code)\n")


@pytest.fixture
def strict() -> None:
    reason = host_can_sandbox()
    if reason:
        unavailable(reason)


def corral(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``corral`` command as a user runs it (pipes, so the one-shot path is tried
    first and must hand network flags to the full CLI)."""
    return subprocess.run([*CORRAL, *args], capture_output=True, text=True, timeout=120)


def test_allow_host_reaches_the_listed_host_and_notes_refusals(strict: Any) -> None:
    with http_server({"*": b"hello"}) as srv:
        r = corral("run", "--level", "strict", "--allow-host", f"127.0.0.1/32:{srv.port}",
                   "--", PY, "-c", FETCH, f"http://127.0.0.1:{srv.port}/a")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "hello"
        r = corral("run", "--level", "strict", "--json", "--allow-host",
                   f"127.0.0.1/32:{srv.port}", "--", PY, "-c", FETCH,
                   f"http://127.0.0.2:{srv.port}/b")
        doc = json.loads(r.stdout)
        assert doc["stdout"].strip() == "HTTP 403"
        assert [(d["host"], d["kind"]) for d in doc["denials"]] == [
            ("127.0.0.2", "non-public-address")]
        r = corral("run", "--level", "strict", "--allow-host", f"127.0.0.1/32:{srv.port}",
                   "--", PY, "-c", FETCH, f"http://127.0.0.3:{srv.port}/c")
        assert "corral: note: network refused 127.0.0.3" in r.stderr
        assert srv.connections == 1


def test_network_unrestricted_and_none(strict: Any) -> None:
    env = "import os; print(os.environ.get('ALL_PROXY'))"
    r = corral("run", "--level", "strict", "--network", "unrestricted", "--", PY, "-c", env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "socks5h://127.0.0.1:3128"
    r = corral("run", "--level", "strict", "--network", "none", "--", PY, "-c", env)
    assert r.stdout.strip() == "None"


def test_network_flag_mistakes_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--network", "none", "--allow-host", "a.example", "--level", "strict",
                 "--", "/bin/true"]) == 64
    assert "--allow-host" in capsys.readouterr().err
    assert main(["run", "--network", "allowlist", "--level", "strict", "--",
                 "/bin/true"]) == 64
    assert main(["run", "--level", "context-isolated", "--allow-host", "a.example", "--",
                 "/bin/true"]) == 64
    assert "--level strict" in capsys.readouterr().err


def test_doctor_names_the_proxy_path(capsys: pytest.CaptureFixture[str]) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("the strict provider's report is Linux-only")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "network allowlist / unrestricted" in out and "127.0.0.1:3128" in out


def test_python_takes_a_network_policy(strict: Any) -> None:
    with http_server({"*": b"hello snippet"}) as srv:
        # urllib skips the proxy for 127.0.0.1 (NO_PROXY: the sandbox's own loopback), so
        # the snippet speaks SOCKS5 to the proxy itself, naming the host's 127.0.0.1
        code = ("import struct, socket\n"
                "s = socket.create_connection(('127.0.0.1', 3128))\n"
                "s.sendall(b'\\x05\\x01\\x00'); s.recv(2)\n"
                f"s.sendall(b'\\x05\\x01\\x00\\x01' + bytes([127, 0, 0, 1]) + "
                f"struct.pack('!H', {srv.port}))\n"
                "print(s.recv(10)[1])\n")
        r = corral("python", "--allow-host", f"127.0.0.1/32:{srv.port}",
                   "--allow-import", "socket", "-c", code)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "0" in r.stdout.split()
        r = corral("python", "--allow-import", "socket", "-c", code)
        assert r.returncode != 0
    assert main(["python", "--network", "none", "--allow-host", "a.example", "-c", "1"]) == 64
