"""plan.build_plan: pure spec -> plan, and one specific refusal per impossible combination."""

from __future__ import annotations

import json

import pytest

from corral.core.errors import ConfigInvalidError, LevelNotSupportedError
from corral.core.spec import InvocationMode, NetworkPolicy, SandboxLimits, SandboxSpec
from corral.providers.linux import _sys_unsafe as su
from corral.providers.linux.policy.plan import (
    DEFAULT_LIMITS,
    ENV_BASE,
    PER_SANDBOX_ID,
    USER_SYSCTLS,
    HostLayout,
    LinuxOptions,
    MountStep,
    SandboxPlan,
    build_plan,
)

ROOT_HOST = HostLayout(
    euid=0, egid=0, system_dirs=("/usr",),
    system_links=(("/bin", "usr/bin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64")),
    etc_files=("/etc/ld.so.cache",),
    prefixes=("/opt/venv", "/usr", "/usr/bin"),
    package_root="/srv/corral/src",
)
USER_HOST = HostLayout(euid=1000, egid=1000, prefixes=("/home/u/venv",))


def spec(**kw: object) -> SandboxSpec:
    return SandboxSpec(tenant_id="t", run_id="r", **kw)  # type: ignore[arg-type]


def plan(s: SandboxSpec | None = None, host: HostLayout = ROOT_HOST, **opts: object) -> SandboxPlan:
    return build_plan(s or spec(), options=LinuxOptions(**opts),  # type: ignore[arg-type]
                      host=host)


def targets(p: SandboxPlan, kind: str) -> list[str]:
    return [m.target for m in p.mounts if m.kind == kind]


def test_default_plan_has_every_namespace_and_the_boundary_mounts() -> None:
    p = plan()
    for flag in (su.CLONE_NEWUSER, su.CLONE_NEWNS, su.CLONE_NEWPID, su.CLONE_NEWNET,
                 su.CLONE_NEWIPC, su.CLONE_NEWUTS, su.CLONE_NEWCGROUP):
        assert p.namespaces & flag
    assert p.hostname == "sandbox"
    assert p.work_dir == "/work"
    assert "/usr" in targets(p, "bind")
    assert ("/bin", "usr/bin") in [(m.target, m.source) for m in p.mounts if m.kind == "symlink"]
    assert targets(p, "proc") == ["/proc"]
    assert targets(p, "area_bind") == ["/work", "/tmp"]
    assert "/dev/null" in targets(p, "bind")
    # nothing from the host home or /tmp
    assert not any(m.source.startswith(("/home", "/tmp", "/root")) for m in p.mounts
                   if m.kind == "bind")


def test_every_host_bind_is_read_only_except_device_nodes() -> None:
    for m in plan().mounts:
        if m.kind == "bind" and not m.target.startswith("/dev/"):
            assert m.readonly, m


def test_root_maps_inside_root_to_a_uid_of_the_sandbox_s_own_by_default() -> None:
    p = plan()
    assert p.uid_map == (0, PER_SANDBOX_ID, 1)  # the fork server picks it per sandbox
    assert p.gid_map == (0, PER_SANDBOX_ID, 1)
    assert plan(outside_uid=1234, outside_gid=1235).uid_map == (0, 1234, 1)
    assert plan(outside_uid=1234, outside_gid=1235).gid_map == (0, 1235, 1)
    assert plan(outside_uid=1234).gid_map == (0, PER_SANDBOX_ID, 1)


def test_per_user_quotas_are_capped() -> None:
    p = plan()
    assert ("RLIMIT_SIGPENDING", 1024, 1024) in p.rlimits
    assert ("RLIMIT_MSGQUEUE", 819200, 819200) in p.rlimits
    sysctls = dict(p.user_sysctls)
    assert sysctls["max_inotify_instances"] == 128
    assert sysctls["max_user_namespaces"] == 0
    assert p.to_wire()["user_sysctls"] == [list(x) for x in USER_SYSCTLS]


def test_dev_is_a_read_only_tmpfs() -> None:
    (dev,) = [m for m in plan().mounts if m.kind == "tmpfs"]
    assert dev.target == "/dev" and dev.readonly


def test_unprivileged_maps_inside_root_to_itself() -> None:
    p = plan(host=USER_HOST)
    assert p.uid_map == (0, 1000, 1)
    assert p.gid_map == (0, 1000, 1)
    with pytest.raises(ConfigInvalidError, match="outside_uid"):
        plan(host=USER_HOST, outside_uid=0)


def test_prefixes_under_system_dirs_are_not_bound_twice() -> None:
    binds = targets(plan(), "bind")
    assert "/opt/venv" in binds
    assert binds.count("/usr") == 1
    assert "/usr/bin" not in binds


def test_prefix_under_work_is_bound_after_the_work_dir() -> None:
    host = HostLayout(euid=0, egid=0, prefixes=("/work/main/.venv",))
    names = [(m.kind, m.target) for m in plan(host=host).mounts]
    assert names.index(("bind", "/work/main/.venv")) > names.index(("area_bind", "/work"))


def test_prefix_that_would_hide_a_sandbox_dir_is_refused() -> None:
    for bad in ("/work", "/proc/x", "/"):
        host = HostLayout(euid=0, egid=0, prefixes=(bad,))
        with pytest.raises(ConfigInvalidError, match="ro_binds"):
            plan(host=host)


def test_package_root_only_for_handler_runs() -> None:
    assert "/srv/corral/src" not in targets(plan(), "bind")
    p = plan(spec(mode=InvocationMode.IN_CONTEXT))
    assert "/srv/corral/src" in targets(p, "bind")


def test_defaults_fill_unset_limits_and_disk_sizes_the_rw_area() -> None:
    p = plan(spec(limits=SandboxLimits(mem_mb=64)))
    assert p.limits.mem_mb == 64
    assert p.limits.max_processes == DEFAULT_LIMITS.max_processes
    assert p.limits.disk_mb == DEFAULT_LIMITS.disk_mb
    area = [m for m in p.mounts if m.kind == "area"]
    assert area[0].size_bytes == 256 * 1024 * 1024
    p2 = plan(spec(limits=SandboxLimits(disk_mb=8)))
    assert next(m for m in p2.mounts if m.kind == "area").size_bytes == 8 * 1024 * 1024
    assert ("RLIMIT_FSIZE", 8 << 20, 8 << 20) in p2.rlimits
    assert ("RLIMIT_CORE", 0, 0) in p2.rlimits


def test_cpu_rlimit_is_a_backstop_above_the_cap() -> None:
    assert plan().cpu_rlimit_s is None
    assert plan(spec(limits=SandboxLimits(cpu_ms=1500))).cpu_rlimit_s == 3


def test_level_below_strict_is_refused() -> None:
    for level in ("none", "context-isolated"):
        with pytest.raises(LevelNotSupportedError) as ei:
            plan(spec(level=level))
        assert ei.value.supported == ("strict",)
        assert ei.value.field == "level"


@pytest.mark.parametrize("policy", [NetworkPolicy.allowlist("example.org"),
                                    NetworkPolicy.unrestricted()])
def test_network_allowlist_and_unrestricted_are_planned(policy: NetworkPolicy) -> None:
    # the namespace stays loopback-only; the egress proxy is the way out (issue 13)
    assert plan(spec(network=policy)).network == policy.kind


def test_network_entry_the_proxy_cannot_read_is_config_invalid() -> None:
    from corral.providers.linux.host.netrelay import check_entries
    check_entries(NetworkPolicy.allowlist("example.org:443", "10.0.0.0/8"))
    with pytest.raises(ConfigInvalidError) as ei:
        check_entries(NetworkPolicy.allowlist("example.org:99999"))
    assert ei.value.field == "network.hosts"


def test_image_without_a_handler_mode_is_refused() -> None:
    with pytest.raises(ConfigInvalidError, match="image") as ei:
        plan(spec(image="python:3.11"))
    assert ei.value.field == "image"


def test_too_small_limits_are_config_invalid() -> None:
    with pytest.raises(ConfigInvalidError, match=r"limits\.mem_mb"):
        plan(spec(limits=SandboxLimits(mem_mb=4)))
    with pytest.raises(ConfigInvalidError, match=r"limits\.max_processes"):
        plan(spec(limits=SandboxLimits(max_processes=1)))


def test_bad_options_are_config_invalid() -> None:
    with pytest.raises(ConfigInvalidError, match="hostname"):
        LinuxOptions(hostname="bad host")
    with pytest.raises(ConfigInvalidError, match="outside_uid"):
        LinuxOptions(outside_uid=-1)


def test_env_base_is_the_minimal_allowlist() -> None:
    assert dict(plan().env_base) == {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work",
                                     "TMPDIR": "/tmp"} == dict(ENV_BASE)


def test_env_vars_go_over_the_env_base_in_the_plan_and_its_wire_form() -> None:
    """An environment's PYTHONPATH is part of the plan as built (one place), over the
    base, in the wire form pid 1 receives; a plan without it has the base alone."""
    p = build_plan(spec(), options=LinuxOptions(), host=ROOT_HOST,
                   env_vars={"PYTHONPATH": "/opt/corral-env", "HOME": "/tmp"})
    assert dict(p.env_base) == {**ENV_BASE, "PYTHONPATH": "/opt/corral-env", "HOME": "/tmp"}
    assert p.to_wire()["env_base"]["PYTHONPATH"] == "/opt/corral-env"
    assert "PYTHONPATH" not in plan().env_base


def test_plan_is_frozen_and_wire_safe() -> None:
    p = plan()
    with pytest.raises(AttributeError):
        p.hostname = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        p.mounts[0].target = "/x"  # type: ignore[misc]
    wire = json.loads(json.dumps(p.to_wire()))
    assert wire["uid_map"] == [0, PER_SANDBOX_ID, 1]
    assert len(wire["mounts"]) == len(p.mounts)
    assert isinstance(p.mounts[0], MountStep)


def test_plan_namespace_bits_are_the_kernels() -> None:
    """The pure plan spells the CLONE_NEW* bits itself; they must match the raw ones."""
    from corral.providers.linux import _sys_unsafe as su
    from corral.providers.linux.policy.plan import NAMESPACES

    assert NAMESPACES == (su.CLONE_NEWUSER | su.CLONE_NEWNS | su.CLONE_NEWPID | su.CLONE_NEWNET
                          | su.CLONE_NEWIPC | su.CLONE_NEWUTS | su.CLONE_NEWCGROUP)
