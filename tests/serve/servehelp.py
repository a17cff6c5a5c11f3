"""A real ``corral serve`` for tests: a subprocess on 127.0.0.1, port 0 (the port is read
from its first log line), stopped by its pid only. Its JSON-lines log is kept in a file."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ALICE", "BOB", "CAROL", "Server", "config_text", "metric", "running",
           "wait_metric"]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"
CAROL = "carol-token-0123456789abcdef"


def config_text(levels: dict[str, str], *, max_body_bytes: int = 12 << 20,
                grace_s: float = 2.0, carol: str = "", extra: str = "",
                image_roots: tuple[str, ...] = ()) -> str:
    """A config: tenants alice (default caps), bob (2 sandboxes, 1 run, 512 MiB, 2
    processes per sandbox) and
    carol (caps given by ``carol``, TOML lines). Each tenant is given every level in
    ``levels`` by name (a level that is not a boundary is offered only so)."""
    lv = "\n".join(f'{k} = "{v}"' for k, v in levels.items())
    given = f"levels = {json.dumps(list(levels))}"
    return f"""
[server]
max_body_bytes = {max_body_bytes}
grace_s = {grace_s}
snippet_workers = 2
image_roots = {json.dumps(list(image_roots))}
{extra}
[levels]
{lv}

[provider_options.linux]
spares = 0

[[tenants]]
name = "alice"
token = "{ALICE}"
{given}

[[tenants]]
name = "bob"
token = "{BOB}"
{given}
max_sandboxes = 2
max_runs = 1
max_memory_mb = 512
max_processes = 2

[[tenants]]
name = "carol"
token = "{CAROL}"
{given}
{carol}
"""


class Server:
    """``python -m corral serve --config FILE --port 0`` as a child process."""

    def __init__(self, tmp: Path, config: str, *, env: dict[str, str] | None = None,
                 reaper: bool = False, tls_ca: str | None = None) -> None:
        self.dir = tmp
        self.image_root: Path | None = None
        tmp.mkdir(parents=True, exist_ok=True)
        self.config_path = tmp / "serve.toml"
        self.config_path.write_text(config)
        self.log_path = tmp / "serve.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        full_env = {**os.environ, **(env or {})}
        argv = [sys.executable, "-m", "corral", "serve", "--config", str(self.config_path),
                "--port", "0"]
        #: with ``reaper``: the processes the server left when it exited (see reaper.py)
        self.leftovers_path = tmp / "leftovers.json"
        if reaper:
            argv = [sys.executable, str(Path(__file__).with_name("reaper.py")),
                    str(self.leftovers_path), *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self._log,
                                     env=full_env)
        self.pid = self.proc.pid
        if reaper:  # the server is the reaper's child: signal it, not the reaper
            self.pid = self._wait_pid(Path(str(self.leftovers_path) + ".pid"))
        self.port = self._wait_listening()
        #: with ``tls_ca``: the server speaks HTTPS with a certificate that CA file verifies
        self.verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=tls_ca) if tls_ca else True)
        self.url = f"{'https' if tls_ca else 'http'}://127.0.0.1:{self.port}"
        self._wait_ready()

    def _wait_pid(self, path: Path, seconds: float = 30.0) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                return int(json.loads(path.read_text())["pid"])
            time.sleep(0.02)
        raise RuntimeError("the reaper did not start the server")

    def leftovers(self) -> list[dict[str, Any]]:
        """The processes the server left behind (after stop(), with ``reaper=True``)."""
        left: list[dict[str, Any]] = json.loads(self.leftovers_path.read_text())
        return left

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def _wait_listening(self, seconds: float = 30.0) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for ev in self.logs():
                if ev.get("event") == "listening":
                    return int(ev["port"])
            if self.proc.poll() is not None:
                raise RuntimeError(f"corral serve exited {self.proc.returncode}: "
                                   f"{self.log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        raise RuntimeError("corral serve did not log 'listening'")

    def _wait_ready(self, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v1/health", timeout=5,
                             verify=self.verify).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError("corral serve did not become healthy")

    def client(self, token: str | None = ALICE, **kw: Any) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60,
                            verify=self.verify, **kw)

    def stop(self, sig: int = signal.SIGTERM, seconds: float = 60.0) -> int:
        """Signal the server (by its pid) and wait for it to exit; its exit status."""
        if self.proc.poll() is None:
            os.kill(self.pid, sig)
        try:
            code = self.proc.wait(seconds)  # the reaper exits with the server's status
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise AssertionError(f"corral serve did not exit within {seconds} s of "
                                 f"{signal.Signals(sig).name}") from None
        finally:
            self._log.close()
        return code


@contextlib.contextmanager
def running(tmp: Path, config: str, **kw: Any) -> Iterator[Server]:
    server = Server(tmp, config, **kw)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.stop()


def metric(server: Server, series: str) -> float | None:
    """The value of one series (``name{labels}``) on ``/metrics`` now."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:  # http.client, not httpx.get: no TLS context to build per call (tens of ms)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_metric(server: Server, series: str, value: float, seconds: float = 10.0) -> float:
    """Poll ``/metrics`` until ``series`` equals ``value``; the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if metric(server, series) == value:
            return time.monotonic() - t0
        time.sleep(0.005)
    raise AssertionError(f"{series} did not reach {value} within {seconds} s "
                         f"(it is {metric(server, series)})")
