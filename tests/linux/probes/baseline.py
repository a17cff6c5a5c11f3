"""What must keep working in the sandbox (ok = it works): the policy is not too tight."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading


def emit(probe: str, ok: bool, detail: str) -> None:
    print(json.dumps({"probe": probe, "ok": ok, "detail": detail}), flush=True)


def check(probe: str, fn: object) -> None:
    try:
        detail = fn()  # type: ignore[operator]
    except Exception as e:
        emit(probe, False, f"{type(e).__name__}: {e}")
    else:
        emit(probe, True, str(detail))


def file_io() -> str:
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as d:
        path = os.path.join(d, "f")
        with open(path, "w") as f:
            f.write("hello")
        with open(path) as f:
            return f.read()


def fork() -> str:
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    return f"child exit {os.waitstatus_to_exitcode(status)}"


def thread() -> str:
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(os.getpid()))
    t.start()
    t.join()
    return f"thread ran: {bool(out)}"


def tcp_loopback() -> str:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with socket.create_connection(srv.getsockname(), timeout=2) as c:
            conn, _ = srv.accept()
            conn.sendall(b"pong")
            data = c.recv(4)
            conn.close()
    return data.decode()


def unix_pair() -> str:
    a, b = socket.socketpair()
    a.sendall(b"ok")
    data = b.recv(2)
    a.close()
    b.close()
    return data.decode()


def subprocess_run() -> str:
    out = subprocess.run([sys.executable, "-I", "-S", "-c", "print(6*7)"],
                         capture_output=True, timeout=10, check=True)
    return out.stdout.decode().strip()


def main() -> None:
    json.loads(sys.argv[1])
    check("getpid", os.getpid)
    check("file_io", file_io)
    check("fork", fork)
    check("thread", thread)
    check("tcp_loopback", tcp_loopback)
    check("unix_socketpair", unix_pair)
    check("subprocess", subprocess_run)
    check("if_nameindex", lambda: socket.if_nameindex())


main()
