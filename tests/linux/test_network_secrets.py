"""Secrets at egress (issue 13): a header the policy carries for one host reaches the
upstream test server, while a probe inside the sandbox searching its environment, the
files it can read and the memory it can read does not find the value.

The upstream is an HTTPS server the test starts on the host's loopback with a
certificate from a test CA; the proxy trusts that CA (``egress_upstream_ssl_context``),
the sandbox trusts the proxy's per-sandbox CA through the bundle and variables the
provider sets. The probe knows only a marker and a hash of the secret, never the value.
"""

from __future__ import annotations

import hashlib
import secrets
import ssl
import sys
from typing import Any

import pytest
from netservers import MapResolver, http_server

from corral.core.spec import ExecOpts, NetworkPolicy, SandboxSpec

pytestmark = pytest.mark.linux
pytest.importorskip("cryptography")
PY = sys.executable
MARKER = "corral-secret-"

FETCH = r"""
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
    print(json.dumps({"status": r.status, "body": r.read().decode()}))
"""

#: inside: look for MARKER followed by the secret's tail (compared by hash) in the env,
#: every file under the given roots it can read, /proc/*/environ|cmdline, and the
#: readable memory of every process it may read (its own at least)
PROBE = r"""
import hashlib, os, re, sys
marker, digest, n = sys.argv[1].encode(), sys.argv[2], int(sys.argv[3])
pat = re.compile(re.escape(marker) + rb"[0-9a-f]{%d}" % n)
found, scanned = [], {"files": 0, "bytes": 0, "regions": 0}
def look(data, where):
    for m in pat.finditer(data):
        if hashlib.sha256(m.group()).hexdigest() == digest:
            found.append(where)
look("\0".join(f"{k}={v}" for k, v in os.environ.items()).encode(), "env")
for root in sys.argv[4:]:
    for d, dirs, files in os.walk(root):
        if d.startswith("/proc/") and d.count("/") > 2 and not d.split("/")[2].isdigit():
            dirs[:] = []
        for f in files:
            p = os.path.join(d, f)
            if d.startswith("/proc") and f not in ("environ", "cmdline"):
                continue
            try:
                with open(p, "rb") as fh:
                    data = fh.read(1 << 24)
            except OSError:
                continue
            scanned["files"] += 1
            look(data, p)
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        continue
    with mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if "r" not in perms:
                continue
            lo, hi = (int(x, 16) for x in addr.split("-"))
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except (OSError, OverflowError, ValueError):
                continue
            scanned["regions"] += 1
            scanned["bytes"] += len(data)
            look(data, f"/proc/{pid}/mem")
print(found, scanned)
"""


def test_a_secret_header_reaches_upstream_and_not_the_sandbox(linux: Any, test_ca: Any) -> None:
    ca = test_ca("api.test")
    secret = MARKER + secrets.token_hex(12)
    digest = hashlib.sha256(secret.encode()).hexdigest()
    upstream_ctx = ssl.create_default_context(cafile=ca.ca_file)
    with http_server({"*": b"upstream ok"}, ca.server_context()) as srv:
        async def test(p: Any) -> None:
            policy = NetworkPolicy(
                kind="allowlist", hosts=("api.test", f"127.0.0.1/32:{srv.port}"),
                secret_headers={"api.test": {"Authorization": f"Bearer {secret}"}})
            assert secret not in repr(policy)
            async with await p.create(SandboxSpec(tenant_id="t", run_id="r",
                                                  network=policy)) as sb:
                # the sandbox's default trust (SSL_CERT_FILE...) includes the proxy's CA
                r = await sb.exec([PY, "-c", FETCH, f"https://api.test:{srv.port}/x"])
                assert r.exit_code == 0, r.stderr_text
                assert '"upstream ok"' in r.stdout_text
                r = await sb.exec([PY, "-c", "import os; print(os.environ['SSL_CERT_FILE'],"
                                   "os.environ['PIP_CERT'], os.environ['REQUESTS_CA_BUNDLE'])"])
                assert r.stdout_text.split() == ["/work/.corral-ca-bundle.pem"] * 3
                r = await sb.exec(
                    [PY, "-c", PROBE, MARKER, digest, str(len(secret) - len(MARKER)),
                     "/work", "/tmp", "/etc", "/proc", "/dev/shm"],
                    ExecOpts(timeout_ms=120_000))
                assert r.exit_code == 0, r.stderr_text
                found, scanned = r.stdout_text.strip().split(" ", 1)
                assert found == "[]", r.stdout_text
                assert "'regions': 0" not in scanned and "'files': 0" not in scanned
                # the probe's control: handed the value, it finds it in env and memory
                r = await sb.exec([PY, "-c", PROBE, MARKER, digest,
                                   str(len(secret) - len(MARKER)), "/work"],
                                  ExecOpts(env={"LEAK": secret}, timeout_ms=120_000))
                assert "'env'" in r.stdout_text and "/mem'" in r.stdout_text, r.stdout_text
                # a restore (here: another sandbox's /work) keeps this sandbox's bundle
                # (while that sandbox lives: its snapshots go with it, docs/snapshots.md)
                async with await p.create(SandboxSpec(tenant_id="t", run_id="r2")) as other:
                    snap = await other.snapshot()
                    await sb.restore(snap)
                r = await sb.exec([PY, "-c", FETCH, f"https://api.test:{srv.port}/y"])
                assert r.exit_code == 0, r.stderr_text
            got = [q[2].get("authorization") for q in srv.requests]
            assert got == [f"Bearer {secret}"] * 2

        linux(test, egress_resolver=MapResolver({"api.test": ["127.0.0.1"]}),
              egress_upstream_ssl_context=upstream_ctx)
