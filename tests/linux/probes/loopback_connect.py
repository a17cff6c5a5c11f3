"""Connect to listeners the test opened on the host's loopback and abstract unix namespace."""

import json
import socket
import sys


def emit(probe: str, ok: bool, detail: str) -> None:
    print(json.dumps({"probe": probe, "ok": ok, "detail": detail}), flush=True)


def attempt(probe: str, family: int, addr: object) -> None:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(addr)
        reply = s.recv(64)
        emit(probe, True, reply.decode("utf-8", "replace"))
    except OSError as e:
        emit(probe, False, f"{type(e).__name__}: {e}")
    finally:
        s.close()


def main() -> None:
    params = json.loads(sys.argv[1])
    attempt("connect_host_loopback_tcp", socket.AF_INET, ("127.0.0.1", params["port"]))
    attempt("connect_host_abstract_unix", socket.AF_UNIX, "\0" + params["abstract"])


main()
