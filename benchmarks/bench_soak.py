"""Soak ``corral serve``: many mixed requests from several tenants, then count what leaked.

    .venv/bin/python benchmarks/bench_soak.py [--count 12000] [--seconds 300] [--clients 12]
                                              [--level strict] [--seed 1]

Starts a server (a subprocess on 127.0.0.1, port 0: loopback traffic only) as the child of
this process, made a child subreaper first (so whatever the server leaves behind when it
exits is reparented here and seen). Then ``--clients`` clients (asyncio streams, a lean
HTTP/1.1 client that reads NDJSON streams too) of three tenants send a fixed mix of
requests until ``--count`` are done or ``--seconds`` pass (bounded both ways; it stops by
itself), chosen by a seeded random:

* the plain work: ``GET /v1/info``, snippets, ``/v1/runs``, sandbox create / exec /
  files (write 64 KiB, read) / destroy;
* clients that go away mid-stream (a streamed exec of ``echo; sleep 30``, the socket
  closed after the first line: the server must kill the command);
* slow clients (a request sent in four pieces, 100 ms apart; answered normally);
* half heads without a token (``slowloris``: must be closed by the server after
  ``head_timeout_s``, 2 s here, with a 408);
* oversized bodies (413), requests without a token (401), and requests past a cap (the
  tenant ``tight`` has ``max_sandboxes = 1``: a second create or a run is refused 422).

Every request's answer is checked against what it should be; anything else is an error,
counted by kind. Reports requests, throughput, p50 / p99 (all, and per kind), errors by
kind, and the leaks: after the load (settled), runs and sandboxes the server counts, the
processes under it, its open fds and resident size (VmRSS) against before the load (the
goal: back within 10 %); after SIGTERM, its exit status, the processes it left (orphans
reparented here), its cgroups, the host's mounts and its temp dirs. The server does not
report snapshot bytes (this mix takes none).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOKENS = {"alpha": "alpha-token-0123456789abcdef", "beta": "beta-token-0123456789abcdef0",
          "tight": "tight-token-0123456789abcdef"}
MAX_BODY = 1 << 20
HEAD_TIMEOUT_S = 2.0
PR_SET_CHILD_SUBREAPER = 36


def _config(level: str) -> str:
    provider = {"strict": "linux", "context-isolated": "subproc"}[level]
    roomy = "max_runs = 16\nmax_sandboxes = 16\nmax_memory_mb = 65536\n"
    return f"""
[server]
access_log = false
grace_s = 5
max_body_bytes = {MAX_BODY}
head_timeout_s = {HEAD_TIMEOUT_S}
body_timeout_s = 2
[levels]
{level} = "{provider}"
[[tenants]]
name = "alpha"
token = "{TOKENS['alpha']}"
{roomy}
[[tenants]]
name = "beta"
token = "{TOKENS['beta']}"
{roomy}
[[tenants]]
name = "tight"
token = "{TOKENS['tight']}"
max_runs = 4
max_sandboxes = 1
"""


class Conn:
    """One keep-alive HTTP/1.1 connection (reopened after a close); reads Content-Length
    and chunked answers."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.r is None or self.w is None:
            self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)
        return self.r, self.w

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None

    @staticmethod
    def encode(method: str, path: str, body: bytes | None, token: str | None,
               length: int | None = None) -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        if body is not None:
            n = len(body) if length is None else length
            head += f"Content-Type: application/json\r\nContent-Length: {n}\r\n"
        return head.encode() + b"\r\n" + (body or b"")

    async def head(self) -> tuple[int, dict[str, str]]:
        r, _ = await self.open()
        raw = await r.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if k:
                headers[k.strip().lower()] = v.strip()
        return int(lines[0][9:12]), headers

    async def body(self, headers: dict[str, str], status: int) -> bytes:
        r, _ = await self.open()
        if "content-length" in headers:
            out = await r.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while True:
                n = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
                if n == 0:
                    await r.readuntil(b"\r\n")
                    break
                out += await r.readexactly(n)
                await r.readexactly(2)
        else:
            out = b""
        if headers.get("connection", "").lower() == "close":
            self.close()
        return out

    async def request(self, data: bytes) -> tuple[int, bytes]:
        """Send, read the answer. A kept-alive connection the server closed meanwhile
        (idle past its keep-alive time) is reopened and the request sent again, once, as
        HTTP clients do when nothing of the answer came."""
        reused = self.w is not None
        _, w = await self.open()
        try:
            w.write(data)
            status, headers = await self.head()
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            if not reused or (isinstance(e, asyncio.IncompleteReadError) and e.partial):
                raise
            self.close()
            _, w = await self.open()
            w.write(data)
            status, headers = await self.head()
        return status, await self.body(headers, status)


class Soak:
    def __init__(self, port: int, level: str, seed: int, count: int, seconds: float) -> None:
        self.port, self.level = port, level
        self.rng = random.Random(seed)
        self.left = count
        self.stop = time.monotonic() + seconds
        self.lat: dict[str, list[float]] = {}
        self.errors: Counter[str] = Counter()
        self.done = 0
        self.loris: list[asyncio.Task[None]] = []
        spec: dict[str, Any] = {"level": level, "network": {
            "kind": "none" if level == "strict" else "unrestricted"}}
        self.spec = spec

    def _count(self, kind: str, t0: float, ok: bool, why: str = "") -> None:
        self.lat.setdefault(kind, []).append((time.perf_counter() - t0) * 1000)
        self.done += 1
        if not ok:
            self.errors[f"{kind}: {why}"] += 1

    async def call(self, conn: Conn, kind: str, method: str, path: str, token: str | None,
                   doc: Any = None, raw: bytes | None = None, want: int = 200,
                   check: Callable[[bytes], bool] | None = None) -> bytes | None:
        body = raw if raw is not None else (None if doc is None else json.dumps(doc).encode())
        t0 = time.perf_counter()
        try:
            status, out = await conn.request(Conn.encode(method, path, body, token))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError) as e:
            conn.close()
            self._count(kind, t0, False, type(e).__name__)
            return None
        ok = status == want and (check is None or check(out))
        self._count(kind, t0, ok, f"status {status}" if status != want else "bad answer")
        return out if ok else None

    async def new_sandbox(self, conn: Conn, tenant: str, tok: str) -> str | None:
        """A sandbox with f0 (64 KiB) in it."""
        out = await self.call(conn, "create", "POST", "/v1/sandboxes", tok,
                              {"spec": self.spec}, want=201)
        if out is None:
            return None
        sid = str(json.loads(out)["id"])
        await self.call(conn, "write-file", "PUT", f"/v1/sandboxes/{sid}/files?path=f0",
                        tok, raw=b"z" * 65536, want=204)
        return sid

    # -- the odd clients ---------------------------------------------------------------
    async def stream_cut(self, tenant: str, sid: str) -> None:
        """A streamed exec whose client goes away mid-stream: after the answer's head and
        (where the provider streams exec output: linux) its first line."""
        conn = Conn(self.port)
        t0 = time.perf_counter()
        ok, why = False, ""
        try:
            _, w = await conn.open()
            w.write(Conn.encode("POST", f"/v1/sandboxes/{sid}/exec",
                                json.dumps({"argv": ["/bin/sh", "-c", "echo start; sleep 30"],
                                            "stream": True}).encode(), TOKENS[tenant]))
            status, _headers = await conn.head()
            assert conn.r is not None
            ok, why = status == 200, f"status {status}"
            if self.level == "strict":
                size = await asyncio.wait_for(conn.r.readuntil(b"\r\n"), 30)  # chunked
                line = await conn.r.readexactly(int(size.split(b";")[0], 16))
                ok, why = ok and b"start" in line, "no first line"
            else:
                await asyncio.sleep(0.2)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as e:
            why = type(e).__name__
        finally:
            conn.close()  # gone mid-stream
        self._count("stream-cut", t0, ok, why)

    async def slow(self, tenant: str) -> None:
        """A request sent in four pieces, 100 ms apart."""
        conn = Conn(self.port)
        data = Conn.encode("POST", "/v1/snippets", json.dumps({"source": "6 * 7"}).encode(),
                           TOKENS[tenant])
        t0 = time.perf_counter()
        ok, why = False, ""
        try:
            _, w = await conn.open()
            step = len(data) // 4 + 1
            for i in range(0, len(data), step):
                w.write(data[i:i + step])
                await w.drain()
                await asyncio.sleep(0.1)
            status, headers = await conn.head()
            out = await conn.body(headers, status)
            ok = status == 200 and json.loads(out).get("result") == "42"
            why = f"status {status}"
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            why = type(e).__name__
        finally:
            conn.close()
        self._count("slow", t0, ok, why)

    async def slowloris(self) -> None:
        """Half a head, no token; the server must close it (408) after head_timeout_s."""
        conn = Conn(self.port)
        t0 = time.perf_counter()
        ok, why = False, ""
        try:
            r, w = await conn.open()
            w.write(b"GET /v1/info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Wait: ")
            got = await asyncio.wait_for(r.read(), HEAD_TIMEOUT_S + 10)
            # 408 after the deadline, or closed at once (evicted: too many token-less)
            ok = got.startswith(b"HTTP/1.1 408 ") or got == b""
            why = repr(got[:20])
        except (OSError, TimeoutError) as e:
            why = type(e).__name__
        finally:
            conn.close()
        self._count("slowloris", t0, ok, why)

    async def oversized(self, conn: Conn, tenant: str) -> None:
        """A body past max_body_bytes: 413 (the server reads none of it)."""
        t0 = time.perf_counter()
        ok, why = False, ""
        try:
            _, w = await conn.open()
            w.write(Conn.encode("POST", "/v1/snippets", b"", TOKENS[tenant],
                                length=MAX_BODY + 4096))
            status, headers = await conn.head()
            await conn.body(headers, status)
            ok, why = status == 413, f"status {status}"
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            why = type(e).__name__
        conn.close()
        self._count("oversized", t0, ok, why)

    # -- the clients -------------------------------------------------------------------
    async def client(self, tenant: str, i: int) -> None:
        conn = Conn(self.port)
        tok = TOKENS[tenant]
        sid = await self.new_sandbox(conn, tenant, tok)
        ops = (["info"] * 25 + ["snippet"] * 20 + ["exec"] * 15 + ["run"] * 6
               + ["write-file"] * 6 + ["read-file"] * 6 + ["recreate"] * 3
               + ["stream-cut"] * 3 + ["slow"] * 2 + ["oversized"] * 2 + ["unauth"] * 3
               + ["slowloris"] * 1 + ["past-cap"] * 8)
        rng = random.Random(self.rng.random())
        try:
            while self.left > 0 and time.monotonic() < self.stop:
                self.left -= 1
                op = rng.choice(ops)
                if op in ("exec", "write-file", "read-file", "recreate", "stream-cut") \
                        and sid is None:
                    sid = await self.new_sandbox(conn, tenant, tok)
                    continue
                await self.one(conn, tenant, tok, op, sid, rng)
                if op == "recreate":
                    sid = await self.new_sandbox(conn, tenant, tok)
        finally:
            if sid is not None:
                await self.call(conn, "destroy", "DELETE", f"/v1/sandboxes/{sid}", tok,
                                want=204)
            conn.close()

    async def one(self, conn: Conn, tenant: str, tok: str, op: str, sid: str | None,
                  rng: random.Random) -> None:
        sb = f"/v1/sandboxes/{sid}"
        if op == "info":
            await self.call(conn, op, "GET", "/v1/info", tok,
                            check=lambda b: json.loads(b)["tenant"] == tenant)
        elif op == "snippet":
            await self.call(conn, op, "POST", "/v1/snippets", tok,
                            {"source": "x = sum(range(100))\nx"},
                            check=lambda b: json.loads(b).get("result") == "4950")
        elif op == "exec":
            await self.call(conn, op, "POST", f"{sb}/exec", tok, {"argv": ["/bin/echo", "hi"]},
                            check=lambda b: json.loads(b)["result"]["exit_code"] == 0)
        elif op == "run" and tenant != "tight":
            await self.call(conn, op, "POST", "/v1/runs", tok,
                            {"argv": ["/bin/true"], "level": self.level},
                            check=lambda b: json.loads(b)["result"]["exit_code"] == 0)
        elif op == "write-file":
            await self.call(conn, op, "PUT", f"{sb}/files?path=f{1 + rng.randrange(3)}", tok,
                            raw=bytes(rng.randrange(256) for _ in range(64)) * 1024, want=204)
        elif op == "read-file":
            await self.call(conn, op, "GET", f"{sb}/files?path=f0", tok,
                            check=lambda b: len(b) == 65536)
        elif op == "recreate":
            await self.call(conn, "destroy", "DELETE", sb, tok, want=204)
        elif op == "stream-cut":
            assert sid is not None
            await self.stream_cut(tenant, sid)
        elif op == "slow":
            await self.slow(tenant)
        elif op == "oversized":
            await self.oversized(conn, tenant)
        elif op == "unauth":
            await self.call(conn, op, "POST", "/v1/snippets", None, {"source": "1"}, want=401)
        elif op == "slowloris":
            if len(self.loris) < 100:  # bounded; each waits for its 408 on its own
                self.loris.append(asyncio.ensure_future(self.slowloris()))
        elif op in ("past-cap", "run"):  # tight is at max_sandboxes with its one sandbox
            if tenant == "tight" and sid is not None:
                await self.call(conn, "past-cap", "POST", "/v1/runs", tok,
                                {"argv": ["/bin/true"], "level": self.level}, want=422)
            else:
                await self.call(conn, "info", "GET", "/v1/info", tok)

    async def run(self, clients: int) -> float:
        # one client of "tight" (its one sandbox; its runs and second sandboxes are refused),
        # the others alpha and beta in turn
        names = ["tight"] + [("alpha", "beta")[i % 2] for i in range(clients - 1)]
        t0 = time.monotonic()
        await asyncio.gather(*(self.client(name, i) for i, name in enumerate(names)))
        await asyncio.gather(*self.loris)
        return time.monotonic() - t0


# -- what is left ----------------------------------------------------------------------

def _children_of(pid: int) -> list[tuple[int, str]]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:80]
        except OSError:
            continue
        if int(f[1]) == pid and f[0] not in ("Z", "X"):
            out.append((int(d), cmd))
    return out


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _mounts() -> set[str]:
    with open("/proc/self/mountinfo") as fh:
        return {" ".join(line.split()[3:5]) for line in fh}


def _cgroups_of(pid: int) -> list[str] | None:
    try:
        from corral.providers.linux.host.cgroups import CgroupManager
        m = CgroupManager()
        if m.support.version == "none":
            return None
        return [n for n in m.list_cgroups() if f"-{pid}-" in n]
    except Exception:
        return None


def _metrics(port: int) -> dict[str, float]:
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    finally:
        c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def _start(tmp: Path, cfg: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    (tmp / "serve.toml").write_text(cfg)
    log = tmp / "serve.log"
    tmpdir = tmp / "tmp"
    tmpdir.mkdir()
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "serve", "--config", str(tmp / "serve.toml"),
             "--port", "0"], stderr=err, stdout=subprocess.DEVNULL,
            env={**os.environ, "TMPDIR": str(tmpdir)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("event") == "listening":
                return proc, int(ev["port"]), tmpdir
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise SystemExit(f"the server did not start: {log.read_text()[-2000:]}")


async def _warm(port: int, level: str, clients: int) -> None:
    """Snippets from every client at once, a few rounds: the snippet pool grows its warm
    slots to what the load will keep (they are not leaks), before the figures are taken."""
    soak = Soak(port, level, 0, 10**9, 60)

    async def one(tenant: str) -> None:
        conn = Conn(port)
        for _ in range(4):
            await soak.call(conn, "warm", "POST", "/v1/snippets", TOKENS[tenant],
                            {"source": "1"})
        conn.close()

    await asyncio.gather(*(one(("alpha", "beta", "tight")[i % 3]) for i in range(clients)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=12000, help="requests in all (the bound)")
    ap.add_argument("--seconds", type=float, default=300.0, help="the time bound")
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--level", default="strict", choices=["strict", "context-isolated"])
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    mounts0 = _mounts()
    with tempfile.TemporaryDirectory(prefix="corral-bench-soak-") as d:
        proc, port, tmpdir = _start(Path(d), _config(a.level))
        pid = proc.pid
        try:
            asyncio.run(_warm(port, a.level, a.clients))
            time.sleep(1.0)
            rss0, fds0 = _status_kib(pid, "VmRSS"), _fds(pid)
            procs0 = len(_descendants(pid))
            idle0 = _metrics(port).get('corral_snippet_pool{state="idle"}', 0)
            cg0 = _cgroups_of(pid)
            soak = Soak(port, a.level, a.seed, a.count, a.seconds)
            took = asyncio.run(soak.run(a.clients))
            time.sleep(3.0)  # streams cut mid-run: their commands are being killed
            m = _metrics(port)
            rss1, hwm, fds1 = _status_kib(pid, "VmRSS"), _status_kib(pid, "VmHWM"), _fds(pid)
            procs1 = len(_descendants(pid))
            cg_live = _cgroups_of(pid)
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            proc.wait(30)
            raise
        os.kill(pid, signal.SIGTERM)
        code = proc.wait(120)
        time.sleep(0.5)
        left = _children_of(os.getpid())
        cg_left = _cgroups_of(pid)
        tmp_left = os.listdir(tmpdir)
    mounts_left = _mounts() - mounts0
    for p, _ in left:  # nothing should be here; if something is, do not leave it running
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass

    every = [x for xs in soak.lat.values() for x in xs]
    errors = sum(soak.errors.values())
    print(f"corral serve soak, level {a.level}, {a.clients} clients of 3 tenants, seed "
          f"{a.seed}, {os.cpu_count()} cores (load generator included); load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"requests {soak.done} in {took:.1f} s: {soak.done / took:.1f} req/s, p50 "
          f"{_pct(every, 50):.1f} ms, p99 {_pct(every, 99):.1f} ms, errors {errors}")
    print(f"{'kind':<12}{'requests':>9}{'p50 ms':>9}{'p99 ms':>9}")
    for kind in sorted(soak.lat):
        xs = soak.lat[kind]
        print(f"{kind:<12}{len(xs):>9}{_pct(xs, 50):>9.1f}{_pct(xs, 99):>9.1f}")
    print("errors by kind:" + ("" if soak.errors else " none"))
    for k, n in soak.errors.most_common():
        print(f"  {k}: {n}")
    idle = m.get('corral_snippet_pool{state="idle"}', 0)
    print("after the load (3 s settled):")
    runs = sum(v for k, v in m.items() if k.startswith("corral_runs_in_flight"))
    alive = sum(v for k, v in m.items() if k.startswith("corral_sandboxes_alive"))
    print(f"  runs in flight {runs:.0f}, sandboxes alive {alive:.0f}, body bytes in flight "
          f"{m.get('corral_body_bytes_in_flight', 0):.0f}")
    print(f"  processes under the server: {procs1} (before the load: {procs0}; warm snippet "
          f"slots idle: {idle:.0f}, before: {idle0:.0f})")
    print(f"  server fds: {fds1} (before the load: {fds0})")
    print(f"  server RSS: {rss1 / 1024:.1f} MiB (before the load: {rss0 / 1024:.1f} MiB, "
          f"{(rss1 - rss0) / rss0 * 100:+.1f} %; peak {hwm / 1024:.1f} MiB); goal within 10 %: "
          f"{'met' if abs(rss1 - rss0) <= rss0 * 0.1 else 'NOT met'}")
    print(f"  cgroups of the server: {'n/a' if cg_live is None else len(cg_live)} (before "
          f"the load: {'n/a' if cg0 is None else len(cg0)})")
    closed = {k.split('"')[1]: v for k, v in m.items() if k.startswith("corral_edge_closed")}
    refused = {k.split('"')[1]: v for k, v in m.items() if k.startswith("corral_refused_total")}
    print(f"  edge: connections closed {closed}; cap refusals {refused}")
    print(f"after SIGTERM: exit {code}; processes left {len(left)} {left[:3]}; cgroups left "
          f"{'n/a' if cg_left is None else len(cg_left)}; mounts left {len(mounts_left)}; "
          f"temp dirs left {tmp_left}; snapshot bytes: not reported by the server (none taken)")
    in_flight = sum(v for k, v in m.items() if k.startswith(("corral_runs_in_flight",
                                                              "corral_sandboxes_alive")))
    grown = cg_live is not None and cg0 is not None and len(cg_live) > len(cg0)
    leaks = in_flight > 0 or fds1 > fds0 + 4 or grown or bool(left) or bool(cg_left) \
        or bool(mounts_left) or bool(tmp_left) or code != 0
    print(f"leaks: {'NONE' if not leaks else 'FOUND'}")
    return 0 if not leaks and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
