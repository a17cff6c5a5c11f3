"""The tenant build right's configuration and the checks a build request passes before
anything runs (corral.serve.envbuild): no sandbox, no index."""

from __future__ import annotations

import pytest

from corral.core.errors import ConfigInvalidError
from corral.envs.store import valid_name
from corral.serve.config import config_from_dict
from corral.serve.envbuild import (
    MAX_REQUIREMENT_CHARS,
    MAX_REQUIREMENTS,
    EnvBuildRight,
    check_env_name,
    check_requirements,
    parse_env_build,
    store_name,
)

TOKEN = "tenant-token-0123456789abcdef"


def _config(env_build: object) -> object:
    return config_from_dict({"tenants": [{"name": "alice", "token": TOKEN,
                                          "env_build": env_build}]})


def test_the_right_is_read_from_the_tenant_table() -> None:
    cfg = _config({"max_environments": 2, "max_disk_mb": 100, "timeout_s": 60,
                   "allow_hosts": ["10.1.2.3/32:443"]})
    right = cfg.tenants[0].policy.env_build  # type: ignore[attr-defined]
    assert right == EnvBuildRight(max_environments=2, max_disk_mb=100, timeout_s=60,
                                  allow_hosts=("10.1.2.3/32:443",))
    assert right.max_concurrent == 1 and right.build_disk_mb == 2048
    none = config_from_dict({"tenants": [{"name": "bob", "token": TOKEN}]})
    assert none.tenants[0].policy.env_build is None
    assert none.tenants[0].policy.describe()["env_build"] is None


@pytest.mark.parametrize(("doc", "field"), [
    ({"max_builds": 1}, "tenants[0].env_build.max_builds"),
    ({"index": "https://pypi.org/simple/"}, "tenants[0].env_build.index"),
    ({"max_environments": 0}, "tenants[0].env_build.max_environments"),
    ({"max_disk_mb": True}, "tenants[0].env_build.max_disk_mb"),
    ({"timeout_s": 0}, "tenants[0].env_build.timeout_s"),
    ({"timeout_s": 7200}, "tenants[0].env_build.timeout_s"),
    ({"index_url": "ftp://mirror/simple/"}, "tenants[0].env_build.index_url"),
    ({"allow_hosts": "10.0.0.1"}, "tenants[0].env_build.allow_hosts"),
    ({"cert_file": "relative.pem"}, "tenants[0].env_build.cert_file"),
    ({"cert_file": "/nonexistent/ca.pem"}, "tenants[0].env_build.cert_file"),
    ("yes", "tenants[0].env_build"),
])
def test_a_bad_right_is_refused_naming_its_key(doc: object, field: str) -> None:
    with pytest.raises(ConfigInvalidError) as e:
        _config(doc)
    assert e.value.field == field, e.value


@pytest.mark.parametrize("req", [
    "pandas", "numpy>=2,<3", "rich[jupyter]==13.7.1", "scikit-learn ~= 1.5",
    "zope.interface", "a_b-c.d==1.0.post1+local", "pkg[a, b] >= 1 , != 1.2"])
def test_plain_requirements_pass(req: str) -> None:
    assert check_requirements([req])[0] == " ".join(req.split())


@pytest.mark.parametrize("req", [
    "--index-url=https://evil.test/simple", "--extra-index-url x", "-e .", "-r a.txt",
    "-c c.txt", "--hash=sha256:00", "pkg==1 --hash=sha256:00", "./pkg", "../pkg",
    "/tmp/pkg", "pkg @ https://evil.test/pkg.whl", "https://evil.test/pkg.whl",
    "git+https://evil.test/x.git", "file:///etc", "pkg.whl", "pkg-1.0.tar.gz",
    "pkg; os_name == 'posix'", "pkg\n--index-url x", "pkg\x00", "", "   ",
    "x" * (MAX_REQUIREMENT_CHARS + 1), "pkg==", "[extra]", "pkg[", "C:\\pkg"])
def test_anything_else_is_refused_naming_the_line(req: str) -> None:
    with pytest.raises(ConfigInvalidError) as e:
        check_requirements(["six", req])
    assert e.value.field == "requirements[1]", e.value


def test_the_list_itself_is_bounded() -> None:
    assert len(check_requirements(["six"] * MAX_REQUIREMENTS)) == MAX_REQUIREMENTS
    for bad in (["six"] * (MAX_REQUIREMENTS + 1), [], "six", None, [1]):
        with pytest.raises(ConfigInvalidError):
            check_requirements(bad)


def test_names_and_their_place_in_the_shared_store() -> None:
    for good in ("toy", "a", "sci-2.0_x", "x" * 40):
        assert check_env_name(good) == good
        # the store name is a valid store name, distinct per tenant
        assert valid_name(store_name("alice", good))
        assert store_name("alice", good) != store_name("bob", good)
    for bad in ("", "../x", ".x", "a/b", "x" * 41, "a b", None):
        with pytest.raises(ConfigInvalidError):
            check_env_name(bad)


def test_parse_env_build_alone() -> None:
    assert parse_env_build({}, "w") == EnvBuildRight()
    assert parse_env_build({"cert_file": ""}, "w").cert_file is None
