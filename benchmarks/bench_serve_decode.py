"""Request-body decoding of ``corral serve``: the typed msgspec models
(:mod:`corral.serve.models`) beside the hand checks they replaced (``json.loads`` and
the ``*_from_json`` functions of :mod:`corral.providers.remote.wire`), on the bodies of
the hot routes, interleaved, best of ``--repeat`` rounds. Prints microseconds per body
and the ratio. Pure CPU, no server.

    .venv/bin/python benchmarks/bench_serve_decode.py [--n 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import msgspec

from corral.core.spec import Level, NetworkPolicy, SandboxLimits
from corral.providers.remote import wire
from corral.serve import models as m

EXEC = json.dumps({"argv": ["/usr/bin/python3", "-c", "print(6 * 7)"],
                   "opts": {"timeout_ms": 5000, "env": {"LANG": "C.UTF-8"},
                            "stdin_b64": "aGVsbG8="}}).encode()
RUN = json.dumps({"argv": ["/bin/true"], "level": "strict", "limits": {"mem_mb": 256},
                  "network": {"kind": "allowlist", "hosts": ["example.org:443"]},
                  "opts": {"timeout_ms": 2000}, "files": {"a.txt": "hi", "b.bin": {
                      "b64": "AAEC"}}}).encode()
CREATE = json.dumps({"spec": {"level": "strict", "limits": {"mem_mb": 256, "cpu_ms": 5000},
                              "network": {"kind": "none", "hosts": []}, "run_id": "r1",
                              "node_id": None, "image": None, "mode": None,
                              "invocation": None, "tenant_id": "x"},
                     "id": "rc-0123456789abcdef0123"}).encode()


def _doc(body: bytes) -> dict[str, Any]:
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError("body")
    return doc


def old_exec(body: bytes) -> Any:
    d = _doc(body)
    return wire.argv_from_json(d.get("argv")), wire.exec_opts_from_json(d.get("opts"))


def old_run(body: bytes) -> Any:
    d = _doc(body)
    files = {p: v.encode() if isinstance(v, str) else wire.unb64(v["b64"], p)
             for p, v in (d.get("files") or {}).items()}
    return (wire.argv_from_json(d.get("argv")), Level(d.get("level") or "strict"),
            SandboxLimits(**(d.get("limits") or {})), NetworkPolicy(**d["network"]),
            wire.exec_opts_from_json(d.get("opts")), files)


def old_create(body: bytes) -> Any:
    d = _doc(body)
    return wire.spec_from_json(d.get("spec") or {}, tenant_id="t"), d.get("id")


_EXEC, _RUN, _CREATE = (msgspec.json.Decoder(t) for t in (m.ExecRequest, m.RunRequest,
                                                          m.CreateSandboxRequest))


def new_exec(body: bytes) -> Any:
    r = m.decode(_EXEC, body)
    return r.argv, r.opts.to_core()


def new_run(body: bytes) -> Any:
    r = m.decode(_RUN, body)
    return (r.argv, Level(r.level), r.limits.to_core(), r.network.to_core(),
            r.opts.to_core(), m.files_to_core(r.files))


def new_create(body: bytes) -> Any:
    r = m.decode(_CREATE, body, optional=True)
    return r.spec.to_core("t"), r.id


def _time(fn: Callable[[bytes], Any], body: bytes, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn(body)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    print(f"{'body':<8} {'hand us':>9} {'msgspec us':>11} {'hand/msgspec':>13}")
    for name, old, new, body in (("exec", old_exec, new_exec, EXEC),
                                 ("run", old_run, new_run, RUN),
                                 ("create", old_create, new_create, CREATE)):
        assert repr(old(body)) == repr(new(body)), name  # the same values out
        olds, news = [], []
        for _ in range(a.repeat):  # interleaved: old, new, old, new ...
            olds.append(_time(old, body, a.n))
            news.append(_time(new, body, a.n))
        o, n = min(olds), min(news)
        print(f"{name:<8} {o:>9.2f} {n:>11.2f} {o / n:>12.2f}x")


if __name__ == "__main__":
    main()
