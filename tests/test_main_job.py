"""The README's first set-up command, `bash scripts/main.sh`, runs its strict job.

It broke once unseen (a relative interpreter path became a path inside the sandbox's
/work when the CLI learned --copy): nothing ran the script. This runs it against the
checkout's .venv (the install step skipped: CORRAL_MAIN_NO_INSTALL=1) and checks what
the program inside says it could not do."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from strict_tier import host_can_sandbox, needs_strict

ROOT = Path(__file__).resolve().parents[1]


@needs_strict(host_can_sandbox())
def test_main_script_runs_the_strict_job() -> None:
    if not (ROOT / ".venv" / "bin" / "corral").exists():
        pytest.skip("no .venv in the checkout (scripts/test.sh makes it)")
    r = subprocess.run(["bash", "scripts/main.sh"], cwd=ROOT, capture_output=True,
                       timeout=300, check=False,
                       env={**os.environ, "CORRAL_MAIN_NO_INSTALL": "1"})
    out = r.stdout.decode()
    assert r.returncode == 0, (out, r.stderr.decode())
    doctor, job = out.split("--- corral run --level strict", 1)
    # the doctor part ends with the strict provider's verdict, not an empty heading
    assert doctor.rstrip().splitlines()[-1].startswith("Strict level: usable"), doctor
    assert "network interfaces: ['lo']" in job
    assert "capabilities 0000000000000000, no_new_privs 1, seccomp mode 2" in job
    assert "raw socket: refused" in job and "/usr/bin/evil: refused" in job
