"""Issue 23.1: a level that is not a security boundary is offered to a tenant only when
the operator names it for that tenant.

The attack (old main): with ``context-isolated`` in ``[levels]`` (the default), every
tenant's ``POST /v1/runs {"level": "context-isolated"}`` ran as the server's user and
read what only that user may read. Here the file is one the test makes, mode 0600, in
a temp dir (never a system file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from servehelp import ALICE, BOB, running

#: the config an operator of old main would write: both levels, tenants without a word
#: about levels; bob is given context-isolated by name (the new key)
CONFIG = f"""
[server]
snippet_workers = 1

[levels]
context-isolated = "subproc"
strict = "linux"

[provider_options.linux]
spares = 0

[[tenants]]
name = "alice"
token = "{ALICE}"

[[tenants]]
name = "bob"
token = "{BOB}"
{{bob}}
"""


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file only its owner (the user running the tests and the server) may read."""
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    f = d / "only-the-servers-user.txt"
    f.write_text("the server user's secret\n")
    f.chmod(0o600)
    return f


def _run_cat(server: object, token: str, path: Path) -> tuple[int, dict[str, object]]:
    with server.client(token) as c:  # type: ignore[attr-defined]
        r = c.post("/v1/runs", json={"argv": ["/bin/cat", str(path)],
                                     "level": "context-isolated"})
        return r.status_code, r.json()


@pytest.mark.linux
def test_a_tenant_not_given_context_isolated_cannot_run_as_the_servers_user(
        tmp_path: Path, secret: Path) -> None:
    # the control: the file is readable by the user the server runs as
    assert secret.read_text().startswith("the server user's")
    with running(tmp_path / "srv", CONFIG.format(bob="")) as server:
        status, doc = _run_cat(server, ALICE, secret)
        assert status == 501, doc  # on old main: 200 and the file's content
        err = doc["error"]
        assert isinstance(err, dict)
        assert err["code"] == "level-not-supported" and err["field"] == "level"
        assert err["supported"] == ["strict"]
        assert "secret" not in json.dumps(doc)
        with server.client(ALICE) as c:
            info = c.get("/v1/info").json()
            assert info["levels"] == ["strict"] and info["not_boundaries"] == []
            # every door takes the level from the tenant's ceiling
            r = c.post("/v1/sandboxes", json={"spec": {"level": "context-isolated",
                                                       "network": {"kind": "unrestricted"}}})
            assert r.status_code == 501 and r.json()["error"]["code"] == "level-not-supported"
            r = c.post("/v1/snippets", json={"source": "1", "level": "context-isolated"})
            assert r.status_code == 501
            r = c.post("/v1/invoke", json={
                "spec": {"level": "context-isolated", "network": {"kind": "unrestricted"},
                         "mode": "json-stdio", "image": "/nonexistent"},
                "handler": {"artifact_id": "a", "version": "1", "module_path": "h.py"},
                "input": 1})
            assert r.status_code == 501, r.text
        listening = next(e for e in server.logs() if e["event"] == "listening")
        assert listening["not_boundaries"] == {}


@pytest.mark.linux
def test_a_tenant_given_context_isolated_by_name_gets_it_and_it_is_said(
        tmp_path: Path, secret: Path) -> None:
    with running(tmp_path / "srv",
                 CONFIG.format(bob='levels = ["strict", "context-isolated"]')) as server:
        status, doc = _run_cat(server, BOB, secret)
        assert status == 200, doc
        result = doc["result"]
        assert isinstance(result, dict)
        assert result["exit_code"] == 0  # what naming it means: the server's own user
        status, doc = _run_cat(server, ALICE, secret)
        assert status == 501
        with server.client(BOB) as c:
            info = c.get("/v1/info").json()
            assert info["levels"] == ["context-isolated", "strict"]
            assert info["not_boundaries"] == ["context-isolated"]
            assert info["ceiling"]["not_boundaries"] == ["context-isolated"]
        logs = server.logs()
        listening = next(e for e in logs if e["event"] == "listening")
        assert listening["not_boundaries"] == {"bob": ["context-isolated"]}
        warning = next(e for e in logs if e["event"] == "not-a-boundary")
        assert warning["tenants"] == {"bob": ["context-isolated"]}


def test_the_default_config_offers_strict_only() -> None:
    from corral.serve.config import DEFAULT_LEVELS, config_from_dict
    assert dict(DEFAULT_LEVELS) == {"strict": "linux"}
    cfg = config_from_dict({"tenants": [{"name": "a", "token": "x" * 20}]})
    assert {lv.value for lv in cfg.tenants[0].policy.levels} == {"strict"}
    # a level a tenant is given must be one the server offers
    from corral.core.errors import ConfigInvalidError
    with pytest.raises(ConfigInvalidError) as ei:
        config_from_dict({"tenants": [{"name": "a", "token": "x" * 20,
                                       "levels": ["context-isolated"]}]})
    assert ei.value.field == "tenants[0].levels"
    # a server offering only context-isolated must name it for each tenant
    with pytest.raises(ConfigInvalidError, match="offered no level"):
        config_from_dict({"levels": {"context-isolated": "subproc"},
                          "tenants": [{"name": "a", "token": "x" * 20}]})
    assert os.sep == "/"
