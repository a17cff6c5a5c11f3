"""Descriptors over unix sockets: one message and the SCM_RIGHTS that came with it.

Received descriptors are close-on-exec from the start (``MSG_CMSG_CLOEXEC``): a
descriptor that arrives in a sandbox's pid 1 (its socket to the host) must never
reach a command the agent starts with ``posix_spawn``.
"""

from __future__ import annotations

import array
import socket
from typing import Final

__all__ = ["recv", "recv_checked", "send"]

#: the agent socket and one cgroup.procs per hierarchy (v1: up to 5)
MAX_FDS: Final = 8


def recv(sock: socket.socket, size: int = 1 << 20, max_fds: int = MAX_FDS
         ) -> tuple[bytes, list[int]]:
    """Up to ``size`` bytes and the descriptors (up to ``max_fds``) that came with them."""
    data, fds, _truncated = recv_checked(sock, size, max_fds)
    return data, fds


def recv_checked(sock: socket.socket, size: int = 1 << 20, max_fds: int = MAX_FDS
                 ) -> tuple[bytes, list[int], bool]:
    """:func:`recv`, and whether the kernel dropped descriptors that did not fit
    (``MSG_CTRUNC``: the sender sent more than ``max_fds``)."""
    fds = array.array("i")
    data, anc, flags, _a = sock.recvmsg(size, socket.CMSG_SPACE(max_fds * fds.itemsize),
                                        socket.MSG_CMSG_CLOEXEC)
    for level, typ, cdata in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
    return data, list(fds), bool(flags & socket.MSG_CTRUNC)


def send(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """``data`` as one message, with ``fds`` attached (a partial send is not retried)."""
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                           array.array("i", fds).tobytes())] if fds else [])
