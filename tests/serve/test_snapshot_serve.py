"""Snapshots through a real ``corral serve`` (strict: the linux provider on the server;
issue 23 item 7). Before: twenty snapshots of a sandbox holding a 60 MiB file took the
host process from 25 to 1226 MiB, kept after the sandbox's DELETE. Now the server's RSS
stays within a small bound, the archives are nameless files the server holds (seen in
its /proc/PID/fd), and they are gone once the sandbox is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from servehelp import ALICE, config_text, metric, running

from strict_tier import host_can_sandbox, needs_strict

pytestmark = [pytest.mark.slow, pytest.mark.linux]


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _files_held(pid: int, directory: str) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(directory + "/"):
                n += 1
        except OSError:
            pass
    return n


@needs_strict(host_can_sandbox())
def test_twenty_60mib_snapshots_over_serve(tmp_path: Path) -> None:
    store = tmp_path / "snaps"
    store.mkdir(mode=0o700)
    cfg = config_text({"strict": "linux"}).replace(
        "[[tenants]]", f'[provider_options.linux.snapshots]\ndir = "{store}"\n'
        "max_bytes = 1610612736\ntenant_max_bytes = 1610612736\ntenant_max_count = 32\n\n"
        "[[tenants]]", 1)
    with running(tmp_path / "srv", cfg) as server, server.client(ALICE) as c:
        r = c.post("/v1/sandboxes", json={"spec": {"level": "strict"}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={
            "argv": ["/bin/sh", "-c", "head -c 62914560 /dev/zero > big"]})
        assert r.status_code == 200 and r.json()["result"]["exit_code"] == 0, r.text
        handles = [c.post(f"/v1/sandboxes/{sid}/snapshot").json()["handle"]]
        before = _rss_mib(server.pid)
        for _ in range(19):
            r = c.post(f"/v1/sandboxes/{sid}/snapshot")
            assert r.status_code == 200, r.text
            handles.append(r.json()["handle"])
        after = _rss_mib(server.pid)
        print(f"server RSS around 19 snapshots of 60 MiB: {before:.0f} -> {after:.0f} MiB")
        assert after - before < 200, (before, after)
        assert _files_held(server.pid, str(store)) == 20 and os.listdir(store) == []
        held = metric(server, 'corral_snapshot_bytes{tenant="alice"}')
        assert held is not None and 20 * 60 * 2**20 <= held <= 20 * 61 * 2**20, held
        r = c.post(f"/v1/sandboxes/{sid}/restore", json={"handle": handles[3]})
        assert r.status_code == 204, r.text
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        assert _files_held(server.pid, str(store)) == 0  # gone with their sandbox
        assert metric(server, 'corral_snapshot_bytes{tenant="alice"}') == 0
    assert os.listdir(store) == []
