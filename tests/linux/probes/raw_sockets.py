"""Open raw and packet sockets and other unusual families. Nothing is sent."""

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
}


def main() -> None:
    json.loads(sys.argv[1])
    for probe, (family, kind, proto) in ATTEMPTS.items():
        try:
            s = socket.socket(family, kind, proto)
        except OSError as e:
            emit(probe, False, f"{type(e).__name__}: {e.strerror}")
        else:
            s.close()
            emit(probe, True, "socket created (and closed)")


main()
