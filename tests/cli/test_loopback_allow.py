"""A listed destination on the host's loopback (issue 27, item 3).

``corral run --level strict --allow-host 127.0.0.1:PORT -- CLIENT http://127.0.0.1:PORT/``
got "connection refused" and no denial: inside, loopback is the sandbox's own and the
proxy variables' ``NO_PROXY`` names it, so every client connects there directly and the
egress proxy never hears of it. Now such an entry gets a relay on the same address and
port inside the sandbox, which hands each connection to the egress proxy's check, and an
entry no relay can serve (no port, a CIDR, ``localhost``, ``::1``, the proxy's own port)
is refused at the CLI with what to write instead.

The server is the test's own, on the host's loopback. The clients inside are the ones a
user runs: urllib with the sandbox's own environment (``NO_PROXY`` kept) and a raw
socket. The control: the same client outside any sandbox reaches the server."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from strict_tier import host_can_sandbox, unavailable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "linux"))
from netservers import http_server

CORRAL = [sys.executable, "-c", "import sys, _corral_cli; sys.exit(_corral_cli.main())"]
SYS_PY = "/usr/bin/python3"

#: inside: GET the URL with urllib as is (the sandbox's proxy variables, NO_PROXY kept),
#: then the same server by a raw socket that knows no proxy at all
CLIENTS = ("import socket, sys, urllib.request\n"
           "url, port = sys.argv[1], int(sys.argv[2])\n"
           "print('urllib', urllib.request.urlopen(url, timeout=10).read().decode())\n"
           "s = socket.create_connection(('127.0.0.1', port), timeout=10)\n"
           "s.sendall(b'GET /raw HTTP/1.0\\r\\n\\r\\n')\n"
           "data = b''\n"
           "while chunk := s.recv(4096):\n"
           "    data += chunk\n"
           "head, body = data.split(b'\\r\\n')[0], data.rpartition(b'\\r\\n')[2]\n"
           "print('raw', head.decode(), body.decode())\n")


@pytest.fixture
def strict() -> None:
    reason = host_can_sandbox()
    if reason:
        unavailable(reason)
    if not Path(SYS_PY).exists():
        pytest.skip(f"{SYS_PY} is not on this host")


def corral(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CORRAL, *args], capture_output=True, text=True, timeout=120)


def test_control_the_clients_reach_the_server_unsandboxed() -> None:
    with http_server({"*": b"hello"}) as srv:
        r = subprocess.run([SYS_PY, "-c", CLIENTS, f"http://127.0.0.1:{srv.port}/",
                            str(srv.port)], capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "NO_PROXY": "localhost,127.0.0.1"})
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["urllib hello", "raw HTTP/1.1 200 OK hello"]


def test_a_listed_host_loopback_port_is_reached_from_inside(strict: Any) -> None:
    with http_server({"*": b"hello"}) as srv:
        r = corral("run", "--level", "strict", "--allow-host", f"127.0.0.1:{srv.port}",
                   "--", SYS_PY, "-c", CLIENTS, f"http://127.0.0.1:{srv.port}/",
                   str(srv.port))
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["urllib hello", "raw HTTP/1.1 200 OK hello"]
        assert srv.connections == 2


def test_an_unlisted_loopback_port_stays_unreached(strict: Any) -> None:
    with http_server({"*": b"hello"}) as srv, socket.create_server(("127.0.0.1", 0)) as other:
        listed = other.getsockname()[1]
        r = corral("run", "--level", "strict", "--allow-host", f"127.0.0.1:{listed}",
                   "--", SYS_PY, "-c", CLIENTS, f"http://127.0.0.1:{srv.port}/",
                   str(srv.port))
        assert r.returncode == 1
        assert "Connection refused" in r.stderr
        assert srv.connections == 0


@pytest.mark.parametrize("entry", ["127.0.0.1", "localhost:{port}", "[::1]:{port}",
                                   "127.0.0.0/8:{port}", "127.0.0.1:3128"])
def test_a_loopback_entry_no_relay_serves_is_refused_saying_what_to_write(entry: str) -> None:
    r = corral("run", "--level", "strict", "--allow-host", entry.format(port=8080),
               "--", "/bin/true")
    assert r.returncode == 64, r.stderr
    assert "corral: config-invalid: --allow-host:" in r.stderr
    assert "Name one IPv4 loopback address and its port, e.g. 127.0.0.1:" in r.stderr


def test_a_wide_cidr_is_not_taken_for_loopback() -> None:
    r = corral("run", "--level", "strict", "--network", "unrestricted", "--allow-host",
               "0.0.0.0/0:80", "--", "/bin/true")
    assert "--allow-host" not in r.stderr


def test_corral_python_reaches_a_listed_host_loopback_port(strict: Any) -> None:
    with http_server({"*": b"hello"}) as srv:
        code = ("import urllib.request\n"
                f"urllib.request.urlopen('http://127.0.0.1:{srv.port}/').read()")
        r = corral("python", "--json", "--allow-host", f"127.0.0.1:{srv.port}",
                   "--allow-import", "urllib.request", "-c", code)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "b'hello'" in r.stdout
        assert srv.connections == 1


def test_the_relay_follows_the_policy_of_the_moment(strict: Any) -> None:
    """A revoked entry's relay refuses (closes) and records the denial: the relay is the
    proxy's check, not a hole beside it."""
    from corral.core.spec import ExecOpts, NetworkPolicy, SandboxSpec
    from corral.providers.linux import LinuxProvider

    raw = ("import socket, sys\n"
           "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=10)\n"
           "try:\n"
           "    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
           "    print(s.recv(12) or 'closed')\n"
           "except OSError as e:\n"
           "    print('closed', type(e).__name__)\n")

    async def go(port: int) -> None:
        entry = f"127.0.0.1:{port}"
        async with LinuxProvider(spares=0) as p:
            sb = await p.create(SandboxSpec(network=NetworkPolicy(kind="allowlist",
                                                                  hosts=(entry,))))
            try:
                r = await sb.exec([SYS_PY, "-c", raw, str(port)], ExecOpts(timeout_ms=30_000))
                assert r.stdout == b"b'HTTP/1.1 200'\n", r
                sb.revoke_host(entry)
                r = await sb.exec([SYS_PY, "-c", raw, str(port)], ExecOpts(timeout_ms=30_000))
                assert r.stdout.startswith(b"closed"), r      # closed unanswered
                assert [(d.host, d.port) for d in r.denials] == [("127.0.0.1", port)]
            finally:
                await sb.destroy()

    with http_server({"*": b"hello"}) as srv:
        asyncio.run(go(srv.port))
        assert srv.connections == 1


def test_relays_are_bounded_per_sandbox() -> None:
    """Each relay is a listener the host keeps for the sandbox's life: a policy (a
    tenant's, through corral serve) cannot ask for thousands."""
    from corral.core.errors import ConfigInvalidError
    from corral.core.spec import NetworkPolicy
    from corral.providers.linux.host.netrelay import MAX_LOOPBACK_RELAYS, check_entries

    many = tuple(f"127.0.0.1:{20000 + i}" for i in range(MAX_LOOPBACK_RELAYS + 1))
    check_entries(NetworkPolicy(kind="allowlist", hosts=many[:-1]))
    with pytest.raises(ConfigInvalidError, match="at most 16 per sandbox"):
        check_entries(NetworkPolicy(kind="allowlist", hosts=many))
