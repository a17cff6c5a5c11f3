"""The strict tier: a test that needs the strict provider is skipped where it cannot run,
and fails with the same reason under CORRAL_REQUIRE_STRICT=1 (run in a child pytest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).parent
_SAMPLE = '''
from strict_tier import needs_strict, unavailable

@needs_strict("simulated: no user namespaces")
def test_marked():
    pass

def test_found_out_late():
    unavailable("simulated: seccomp not usable")

@needs_strict("")
def test_runs_where_strict_works():
    pass
'''


def _run(tmp: Path, require: str | None) -> tuple[int, str]:
    (tmp / "test_sample.py").write_text(_SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_REQUIRE_STRICT"}
    env["PYTHONPATH"] = os.pathsep.join([str(_TESTS), env.get("PYTHONPATH", "")])
    if require is not None:
        env["CORRAL_REQUIRE_STRICT"] = require
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "strict_tier",
                        "-p", "no:cacheprovider", "--rootdir", str(tmp), str(tmp)],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("require", [None, "0", ""])
def test_without_the_variable_they_skip_with_the_reason(tmp_path: Path,
                                                        require: str | None) -> None:
    code, out = _run(tmp_path, require)
    assert code == 0, out
    assert "1 passed, 2 skipped" in out, out
    assert "simulated: no user namespaces" in out and "simulated: seccomp not usable" in out


def test_with_corral_require_strict_they_fail_with_the_reason(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "1")
    assert code == 1, out
    assert "skipped" not in out, out
    assert ("1 passed" in out and "2 failed" in out) or "1 failed, 1 passed, 1 error" in out, out
    for reason in ("simulated: no user namespaces", "simulated: seccomp not usable"):
        assert f"CORRAL_REQUIRE_STRICT=1 but the strict tier cannot run here: {reason}" in out
