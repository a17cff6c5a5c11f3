"""``corral doctor --ray ADDRESS`` reports every node of the cluster (head and workers),
each with its strict capabilities as its node actor sees them."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def test_doctor_ray(ray_cluster: Any) -> None:
    env = {**ray_cluster.env, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-m", "corral", "doctor", "--ray",
                          ray_cluster.address, "--json"], capture_output=True, text=True,
                         env=env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    addrs = {r["address"] for r in rep["nodes"]}
    assert addrs == {"127.0.0.2", *(w.ip for w in ray_cluster.workers)}, rep["nodes"]
    for r in rep["nodes"]:
        assert r["strict"] is True, r
        assert set(r["limits"]) >= {"disk_mb"}, r
        assert r["doctor"]["providers"], r
    text = subprocess.run([sys.executable, "-m", "corral", "doctor", "--ray",
                           ray_cluster.address], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert text.returncode == 0, text.stderr[-2000:]
    assert "3 node(s), 3 can enforce strict" in text.stdout, text.stdout
