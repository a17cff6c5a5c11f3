"""Issue 23 item 2, the Ray part: the cluster's own services (Ray's GCS, the node
actor's data channel; Ray has no authentication: ShadowRay, CVE-2023-48022) are never
reachable from a sandbox, whatever its policy lists. Each probe runs inside a strict
sandbox on a worker node and asks the sandbox's egress proxy for a tunnel (CONNECT);
the control: the same ports answer from the host, and a listed loopback service that is
not Ray's answers from inside."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
from typing import Any

from raysupport import no_leaks, provider

from corral.core.spec import NetworkPolicy, SandboxSpec
from corral.providers.ray import _wire

_PROBE = r"""
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    out[target] = s.recv(200).split(b"\r\n")[0].decode()
    s.close()
print(json.dumps(out))
"""


def _listener() -> tuple[socket.socket, threading.Thread]:
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            c.close()
    t = threading.Thread(target=loop, daemon=True)
    t.stop = stop  # type: ignore[attr-defined]
    t.start()
    return srv, t


def _reachable_from_host(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return True
    except OSError:
        return False


def test_cluster_services_never_reachable_whatever_the_policy(ray_cluster: Any) -> None:
    gcs_host, _, gcs_port = ray_cluster.address.rpartition(":")
    srv, thread = _listener()
    control = f"127.0.0.1:{srv.getsockname()[1]}"

    async def go() -> None:
        p = provider()
        try:
            for policy in (NetworkPolicy.unrestricted("127.0.0.0/8"),
                           NetworkPolicy.allowlist("127.0.0.0/8")):
                async with await p.create(SandboxSpec(tenant_id="t", network=policy)) as sb:
                    node = next(n for n in await p.refresh(force=True)
                                if n.address == sb.node.address)
                    chan_host, chan_port, _secret = _wire.unwrap(
                        await node.actor.channel.remote())
                    targets = [f"{gcs_host}:{gcs_port}", f"127.0.0.1:{gcs_port}",
                               f"{chan_host}:{chan_port}",
                               f"[::ffff:{gcs_host}]:{gcs_port}", control]
                    # the control: each answers a client on the host (the GCS listens on
                    # every address, the channel on the node's)
                    for t in targets[:3]:
                        h, _, port = t.rpartition(":")
                        assert _reachable_from_host(h, int(port)), t
                    r = await sb.exec([sys.executable, "-c", _PROBE, *targets])
                    assert r.exit_code == 0, r
                    got = json.loads(r.stdout)
                    assert got[control].startswith("HTTP/1.1 200"), (policy, got)
                    for t in targets[:-1]:
                        assert got[t].startswith("HTTP/1.1 403"), (policy, t, got)
                    reasons = [d.reason for d in r.denials]
                    assert any("Ray cluster" in why for why in reasons), reasons
            await no_leaks(p)
        finally:
            await p.aclose()

    try:
        asyncio.run(go())
    finally:
        thread.stop.set()  # type: ignore[attr-defined]
        srv.close()
        thread.join(5)
