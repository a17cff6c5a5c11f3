"""hostinfo: each primitive is tested for real and agrees with an independent check."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corral.providers.linux.host import hostinfo
from corral.providers.linux.host.cgroups import detect
from corral.providers.linux.host.hostinfo import Check, probe, providers_report
from strict_tier import unavailable

pytestmark = pytest.mark.linux
SRC = str(Path(__file__).resolve().parents[2] / "src")
UNSHARE_OPT = {"user": "-U", "mount": "-m", "pid": "-p", "net": "-n", "ipc": "-i", "uts": "-u",
               "cgroup": "-C"}


def run_probe_json(*prelude: str, py: str = sys.executable, src: str = SRC,
                   **kw: object) -> dict[str, object]:
    """probe() in a fresh interpreter (optionally after ``prelude``), as JSON."""
    code = "\n".join([f"import sys; sys.path.insert(0, {src!r})", *prelude,
                      "import json",
                      "from corral.providers.linux.host import hostinfo",
                      "print(json.dumps(hostinfo.probe().to_dict()))"])
    r = subprocess.run([py, "-I", "-c", code], capture_output=True, timeout=60,
                       check=True, **kw)  # type: ignore[call-overload]
    out: dict[str, object] = json.loads(r.stdout)
    return out


def checks_of(d: dict[str, object]) -> dict[str, dict[str, object]]:
    return {c["name"]: c for c in d["checks"]}  # type: ignore[attr-defined, index]


def test_probe_is_cached_and_complete() -> None:
    info = probe()
    assert probe() is info
    assert probe(refresh=True) is not info
    assert set(info.namespaces) == set(UNSHARE_OPT)
    assert info.kernel == os.uname().release
    assert info.is_root == (os.geteuid() == 0)
    json.dumps(info.to_dict())
    for c in info.checks():
        assert c.detail, c


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare not installed")
@pytest.mark.parametrize("kind", sorted(UNSHARE_OPT))
def test_namespace_verdict_agrees_with_util_linux(kind: str) -> None:
    opts = [UNSHARE_OPT[kind]] if os.geteuid() == 0 else ["-U", UNSHARE_OPT[kind]]
    control = subprocess.run(["unshare", *opts, "true"], capture_output=True, timeout=30)
    assert probe().namespaces[kind].ok == (control.returncode == 0), control.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to uid 65534 from root")
def test_unprivileged_view_agrees_with_util_linux(nobody_python: tuple[str, str]) -> None:
    as_nobody = {"user": 65534, "group": 65534, "extra_groups": []}
    py, src = nobody_python
    d = run_probe_json(py=py, src=src, **as_nobody)
    assert d["is_root"] is False and d["uid"] == 65534
    control = subprocess.run(["unshare", "-U", "true"], capture_output=True, timeout=30,
                             **as_nobody)  # type: ignore[call-overload]
    checks = checks_of(d)
    assert checks["user namespace"]["ok"] == (control.returncode == 0)
    assert checks["user namespace (unprivileged)"]["ok"] == probe().userns_unprivileged.ok
    # without a delegated cgroup, nobody can write limits, and says why
    assert checks["cgroup memory"]["ok"] is False
    assert "not writable by uid 65534" in str(checks["cgroup memory"]["detail"])


def test_failures_are_reported_with_the_reason() -> None:
    if importlib.util.find_spec("corral.providers.linux.policy.seccomp") is None:
        unavailable("seccomp module not written yet")
    if not probe().seccomp.ok:
        unavailable(f"seccomp not usable here: {probe().seccomp.detail}")
    # Inside corral's own seccomp filter unshare is denied: the probe must say so.
    d = run_probe_json(
        "from corral.providers.linux import _sys_unsafe as su\n"
        "from corral.providers.linux.policy import seccomp",
        "su.set_no_new_privs()",
        "su.seccomp_install(seccomp.build_filter(su.machine_arch()))")
    checks = checks_of(d)
    for kind in UNSHARE_OPT:
        c = checks[f"{kind} namespace"]
        assert c["ok"] is False, c
        assert "failed: Operation not permitted" in str(c["detail"]), c
        # the cause is named: a seccomp filter on the process (as docker's default profile)
        assert "Seccomp: 2" in str(c["detail"]) and "seccomp=unconfined" in str(c["detail"]), c


def test_seccomp_and_landlock_verdicts() -> None:
    info = probe()
    status = Path("/proc/self/status").read_text()
    if "Seccomp:" not in status:
        assert not info.seccomp.ok
    elif info.seccomp.ok:
        assert "installs" in info.seccomp.detail
    assert info.landlock.ok == (info.landlock_abi > 0)


def test_providers_report_follows_the_facts() -> None:
    info = probe()
    reports = {r.name: r for r in providers_report(info)}
    assert list(reports) == ["inprocess", "subproc", "linux"]
    assert reports["inprocess"].level == "none"
    assert reports["subproc"].level == "context-isolated"
    sub = {r.what: r.enforced for r in reports["subproc"].rows}
    assert sub["network"] is False and sub["filesystem"] is False and sub["environment"] is True
    linux = reports["linux"]
    assert linux.level == "strict"
    assert linux.usable == (all(c.ok for c in info.namespaces.values()) and info.seccomp.ok)
    json.dumps([r.to_dict() for r in reports.values()])

    # The same host with no cgroups and no net namespace: limits refused, strict unusable.
    broken = dataclasses.replace(
        info, cgroups=detect(root={"pids": "/nonexistent/pids"}),
        namespaces={**info.namespaces,
                    "net": Check(name="net namespace", ok=False, detail="unshare failed: EPERM")})
    rep = {r.name: r for r in providers_report(broken)}["linux"]
    assert not rep.usable and "net namespace" in rep.summary
    rows = {r.what: r for r in rep.rows}
    assert not rows["mem_mb (memory plus swap)"].enforced
    assert "cgroup memory" in rows["mem_mb (memory plus swap)"].how
    assert not rows["network none (loopback only)"].enforced
    assert rows["network none (loopback only)"].how == "unshare failed: EPERM"


def test_hostinfo_imports_no_ctypes() -> None:
    assert "ctypes" not in Path(hostinfo.__file__).read_text()


def fake_host(tmp_path: Path, *, sysctls: dict[str, str] | None = None, seccomp: str = "0",
              label: str | None = "unconfined") -> dict[str, str]:
    """A fake /proc/sys tree, /proc/self/status and AppArmor label, for userns_blocker."""
    root = tmp_path / "sys"
    for name, value in (sysctls or {}).items():
        f = root / name.replace(".", "/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(value + "\n")
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "status").write_text(f"Name:\tpython3\nNoNewPrivs:\t0\nSeccomp:\t{seccomp}\n")
    if label is not None:
        (tmp_path / "label").write_text(label + "\n")
    return {"sysctl_root": str(root), "status": str(tmp_path / "status"),
            "apparmor_label": str(tmp_path / "label")}


def test_userns_blocker_names_the_cause_and_the_fix(tmp_path: Path) -> None:
    import errno

    from corral.providers.linux.host.hostinfo import userns_blocker
    assert userns_blocker(0, **fake_host(tmp_path / "clean")) == ""
    assert userns_blocker(errno.EPERM, **fake_host(tmp_path / "clean2")) == ""
    # Ubuntu 24.04: AppArmor restricts unconfined processes, even where unshare works
    ubuntu = fake_host(tmp_path / "ubuntu",
                       sysctls={"kernel.apparmor_restrict_unprivileged_userns": "1",
                                "kernel.unprivileged_userns_clone": "1"})
    why = userns_blocker(0, **ubuntu)
    assert "kernel.apparmor_restrict_unprivileged_userns=1" in why
    assert "userns," in why and "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in why
    # a process under an AppArmor profile: the profile decides, not reported as blocked
    confined = fake_host(tmp_path / "confined", label="corral (unconfined)",
                         sysctls={"kernel.apparmor_restrict_unprivileged_userns": "1"})
    assert userns_blocker(0, **confined) == ""
    old = fake_host(tmp_path / "old", sysctls={"kernel.unprivileged_userns_clone": "0"})
    assert "sysctl -w kernel.unprivileged_userns_clone=1" in userns_blocker(errno.EPERM, **old)
    capped = fake_host(tmp_path / "capped", sysctls={"user.max_user_namespaces": "0"})
    assert "user.max_user_namespaces=15000" in userns_blocker(errno.ENOSPC, **capped)
    # docker's default seccomp profile: EPERM under a filter
    docker = fake_host(tmp_path / "docker", seccomp="2")
    why = userns_blocker(errno.EPERM, **docker)
    assert "Seccomp: 2" in why and "--security-opt seccomp=unconfined" in why
    assert userns_blocker(0, **docker) == ""  # a filter that let unshare through is fine


def test_userns_check_reports_apparmor_even_when_unshare_works(tmp_path: Path) -> None:
    from corral.providers.linux.host.hostinfo import _probe_userns_unprivileged
    ubuntu = fake_host(tmp_path, sysctls={"kernel.apparmor_restrict_unprivileged_userns": "1"})
    c = _probe_userns_unprivileged(False, True, **ubuntu)
    assert not c.ok and "no capabilities" in c.detail and "apparmor" in c.detail, c
    info = dataclasses.replace(probe(), is_root=False, uid=1000, userns_unprivileged=c)
    rep = {r.name: r for r in providers_report(info)}["linux"]
    assert not rep.usable and "unprivileged user namespaces" in rep.summary
    assert "apparmor_restrict_unprivileged_userns=0" in {r.what: r for r in rep.rows}[
        "user namespace"].how
    clean = _probe_userns_unprivileged(False, True, **fake_host(tmp_path / "clean"))
    assert clean.ok, clean
