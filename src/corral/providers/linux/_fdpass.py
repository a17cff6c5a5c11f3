"""Descriptors over unix sockets: one message and the SCM_RIGHTS that came with it."""

from __future__ import annotations

import array
import socket
from typing import Final

__all__ = ["recv", "send"]

#: the agent socket and one cgroup.procs per hierarchy (v1: up to 5)
MAX_FDS: Final = 8


def recv(sock: socket.socket, size: int = 1 << 20, max_fds: int = MAX_FDS
         ) -> tuple[bytes, list[int]]:
    """Up to ``size`` bytes and the descriptors (up to ``max_fds``) that came with them."""
    fds = array.array("i")
    data, anc, _f, _a = sock.recvmsg(size, socket.CMSG_SPACE(max_fds * fds.itemsize))
    for level, typ, cdata in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
    return data, list(fds)


def send(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """``data`` as one message, with ``fds`` attached (a partial send is not retried)."""
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                           array.array("i", fds).tobytes())] if fds else [])
