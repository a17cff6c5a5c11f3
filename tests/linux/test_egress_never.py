"""NeverReach: destinations the egress proxy refuses whatever the policy lists (the Ray
node actor fills it with the cluster's services; issue 23 item 2). Without a sandbox: a
proxy on a unix socket, an echo server on the host's loopback that must see nothing."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

import pytest
from test_egress import FakeResolver, echo_server, run

from corral.providers.linux.host.egress import EgressPolicy, EgressProxy, NeverReach


async def _connect(path: str, target: str) -> bytes:
    r, w = await asyncio.open_unix_connection(path)
    w.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    line = await r.readline()
    w.close()
    return line


@pytest.mark.parametrize("policy", [EgressPolicy.unrestricted("127.0.0.0/8"),
                                    EgressPolicy.allowlist("127.0.0.0/8", "svc.test")])
def test_never_wins_over_any_listing(policy: EgressPolicy) -> None:
    async def go() -> None:
        async with echo_server() as (port, conns), echo_server() as (other, other_conns):
            never = NeverReach(local_ports=[port], what="a cluster service")
            d = tempfile.mkdtemp(prefix="egress-never-", dir="/tmp")
            path = os.path.join(d, "p.sock")
            proxy = EgressProxy(policy, resolver=FakeResolver({"svc.test": ["127.0.0.1"]}),
                                never=never)
            await proxy.start(path)
            try:
                for target in (f"127.0.0.1:{port}", f"127.0.0.9:{port}", f"0.0.0.0:{port}",
                               f"[::ffff:127.0.0.1]:{port}", f"svc.test:{port}"):
                    line = await _connect(path, target)
                    assert line.startswith(b"HTTP/1.1 403"), (target, line)
                assert conns == []  # nothing reached the protected service
                # the control: another port of the same address is listed and works
                assert (await _connect(path, f"127.0.0.1:{other}")).startswith(b"HTTP/1.1 200")
                # a whole address, every port; updates reach a running proxy
                never.update(["127.0.0.1"], [])
                line = await _connect(path, f"127.0.0.1:{other}")
                assert line.startswith(b"HTTP/1.1 403"), line
                assert any("a cluster service" in d.reason for d in proxy.denials())
                assert proxy.internal_errors == 0
            finally:
                await proxy.aclose()
                shutil.rmtree(d, ignore_errors=True)
            await asyncio.sleep(0.05)
            assert len(other_conns) == 1
    run(go)
