"""``corral doctor`` names each OCI runtime, whether it was found, and what it enforces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys


def _report() -> dict[str, dict[str, object]]:
    out = subprocess.run([sys.executable, "-m", "corral", "doctor", "--json"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return {p["name"]: p for p in json.loads(out)["providers"]}


def test_doctor_rows_for_each_runtime() -> None:
    providers = _report()
    crun, runsc = providers["oci/crun"], providers["oci/runsc"]
    if shutil.which("crun") and shutil.which("catatonit") and os.geteuid() == 0:
        assert crun["usable"] is True, crun
        rows = {r["what"]: r for r in crun["rows"]}  # type: ignore[attr-defined]
        assert rows["network none"]["enforced"] is True
        assert rows["network allowlist / unrestricted"]["enforced"] is False
        assert "crun" in rows["runtime"]["how"]
        assert "seccomp" in rows["syscalls"]["how"]
    else:
        assert crun["usable"] is False and "missing" in str(crun["summary"])
    if shutil.which("runsc") is None:
        assert runsc["usable"] is False and "runsc" in str(runsc["summary"])
        assert runsc["rows"] == []
    text = subprocess.run([sys.executable, "-m", "corral", "doctor"], capture_output=True,
                          text=True, check=True, timeout=120).stdout
    assert "oci/crun (level strict)" in text and "oci/runsc (level strict)" in text
