"""Open raw and packet sockets, unusual families and unusual inet protocols.
Nothing is sent.

``(AF_INET, SOCK_PACKET)`` is the obsolete spelling of a packet socket: the
kernel turns it into ``AF_PACKET`` (``__sock_create``). Python adds
``SOCK_CLOEXEC`` to every type it passes, so the flag bits are exercised too.
"""

import json
import socket
import sys


def emit(probe: str, ok: bool, detail: str) -> None:
    print(json.dumps({"probe": probe, "ok": ok, "detail": detail}), flush=True)


ATTEMPTS = {
    "raw_icmp": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "raw_inet6": (socket.AF_INET6, socket.SOCK_RAW, 58),
    "packet": (17, socket.SOCK_RAW, 0),  # AF_PACKET
    "packet_dgram": (17, socket.SOCK_DGRAM, 0),
    "vsock": (40, socket.SOCK_STREAM, 0),  # AF_VSOCK: to the hypervisor
    "alg": (38, socket.SOCK_SEQPACKET, 0),  # AF_ALG: kernel crypto API
    "netlink_netfilter": (16, socket.SOCK_RAW, 12),  # AF_NETLINK / NETLINK_NETFILTER
    "inet_sock_packet": (socket.AF_INET, 10, 0x0300),  # SOCK_PACKET, htons(ETH_P_ALL)
    "inet_sock_packet_nonblock": (socket.AF_INET, 10 | socket.SOCK_NONBLOCK, 0x0300),
    "sctp": (socket.AF_INET, socket.SOCK_STREAM, 132),  # IPPROTO_SCTP
    "sctp_seqpacket": (socket.AF_INET6, socket.SOCK_SEQPACKET, 132),
    "dccp": (socket.AF_INET, 6, 33),  # SOCK_DCCP, IPPROTO_DCCP
    "l2tp_ip": (socket.AF_INET, socket.SOCK_DGRAM, 115),  # IPPROTO_L2TP
    "udplite": (socket.AF_INET6, socket.SOCK_DGRAM, 136),
}
#: what ordinary programs open (getaddrinfo names the protocol): must keep working
ORDINARY = {
    "tcp_explicit": (socket.AF_INET, socket.SOCK_STREAM, 6),
    "tcp6_nonblock": (socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_NONBLOCK, 0),
    "udp_explicit": (socket.AF_INET, socket.SOCK_DGRAM, 17),
    "udp6": (socket.AF_INET6, socket.SOCK_DGRAM, 0),
    "mptcp": (socket.AF_INET, socket.SOCK_STREAM, 262),  # IPPROTO_MPTCP
    "unix_raw": (socket.AF_UNIX, socket.SOCK_RAW, 0),  # the kernel makes it SOCK_DGRAM
}


def main() -> None:
    json.loads(sys.argv[1])
    for probe, (family, kind, proto) in {**ATTEMPTS, **ORDINARY}.items():
        try:
            s = socket.socket(family, kind, proto)
        except OSError as e:
            emit(probe, False, f"{type(e).__name__}: {e.strerror}")
        else:
            s.close()
            emit(probe, True, "socket created (and closed)")


main()
