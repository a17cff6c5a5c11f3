"""netrelay's checks of what the agent passes (no sandbox needed): only a fresh, unbound,
unconnected TCP/IPv4 socket is used; anything else is closed and refused."""

from __future__ import annotations

import os
import socket

import pytest

from corral.core.errors import ProviderError
from corral.providers.linux.host.netrelay import check_agent_socket, proxy_env


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_fresh_tcp_socket_is_taken() -> None:
    s = socket.socket()
    fd = s.detach()
    got = check_agent_socket(fd)
    try:
        assert got.fileno() == fd and got.family == socket.AF_INET
    finally:
        got.close()


def _bound() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s.detach()


def _listening() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s.detach()


def _pipe_end() -> int:
    r, w = os.pipe()
    os.close(w)
    return r


@pytest.mark.parametrize("make", [
    lambda: socket.socket(socket.AF_UNIX).detach(),
    lambda: socket.socket(socket.AF_INET6).detach(),
    lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).detach(),
    _bound, _listening,
    lambda: os.open("/dev/null", os.O_RDONLY),
    _pipe_end,
], ids=["unix", "inet6", "udp", "bound", "listening", "file", "pipe"])
def test_anything_else_is_refused_and_closed(make: object) -> None:
    fd = make()  # type: ignore[operator]
    with pytest.raises(ProviderError):
        check_agent_socket(fd)
    assert _closed(fd)


def test_proxy_env_names_the_listener_and_the_bundle() -> None:
    env = proxy_env()
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://127.0.0.1:3128"
    assert env["ALL_PROXY"] == "socks5h://127.0.0.1:3128"
    assert "SSL_CERT_FILE" not in env
    assert proxy_env("/work/b.pem")["PIP_CERT"] == "/work/b.pem"
