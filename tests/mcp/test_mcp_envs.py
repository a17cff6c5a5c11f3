"""Environments over ``corral mcp`` (HTTP tenants): ``environment_build`` offered only
where the operator grants the right, refused typed to a tenant without it; a granted
tenant builds from a loopback HTTPS index (no PyPI), lists it, and runs a snippet and a
command with it; another tenant cannot name it."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from mcp_support import STRICT, client, doc, http_server

from corral.envs.store import remove_tree

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "linux"))
from netservers import build_wheel, http_server as index_server, make_ca

pytestmark = [STRICT, pytest.mark.slow]
OWNER, OTHER = "env-owner-token-0123456789abc", "env-other-token-0123456789abc"


def _index(name: str, wheel: tuple[str, bytes]) -> dict[str, bytes]:
    import hashlib
    fn, data = wheel
    return {"/simple/": f'<a href="/simple/{name}/">{name}</a>'.encode(),
            f"/simple/{name}/": (f'<a href="/files/{fn}#sha256='
                                 f'{hashlib.sha256(data).hexdigest()}">{fn}</a>').encode(),
            f"/files/{fn}": data}


def _refused(r: Any, field: str) -> dict[str, Any]:
    assert r.is_error, r
    err: dict[str, Any] = r.structured_content["error"]
    assert err["code"] == "config-invalid" and err["field"] == field, err
    return err


def test_a_granted_tenant_builds_and_uses_an_environment_over_mcp(tmp_path: Path) -> None:
    keys = Path(tempfile.mkdtemp(prefix=f"corral-test-ca-{os.getpid()}-"))
    store = tmp_path / "envs"
    try:
        ca = make_ca("127.0.0.1", within=keys)
        with index_server(_index("corraltoy", build_wheel("corraltoy", "1.0", "ANSWER = 7\n")),
                          ca.server_context()) as idx:
            cfg = tmp_path / "serve.toml"
            cfg.write_text(f"""[levels]
strict = "linux"
[provider_options.linux]
env_store_dir = "{store}"

[[tenants]]
name = "owner"
token = "{OWNER}"
[tenants.env_build]
index_url = "https://127.0.0.1:{idx.port}/simple/"
index_hosts = ["127.0.0.1/32:{idx.port}"]
cert_file = "{ca.ca_file}"
timeout_s = 240

[[tenants]]
name = "other"
token = "{OTHER}"
""")
            with http_server("--config", str(cfg), token=None) as (url, _):
                asyncio.run(asyncio.wait_for(_walk(url), 300))
    finally:
        shutil.rmtree(keys, ignore_errors=True)
        remove_tree(store)


async def _walk(url: str) -> None:
    async with client(url, OTHER) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert "environment_build" in tools and tools["environment_build"].output_schema
        r = await c.call_tool("environment_build", {"name": "toy",
                                                    "requirements": ["corraltoy"]})
        _refused(r, "env_build")
    async with client(url, OWNER) as c:
        for bad in ("--index-url=https://evil.test/", "-e .", "./x", "x @ https://e.test/x"):
            r = await c.call_tool("environment_build", {"name": "bad", "requirements": [bad]})
            _refused(r, "requirements[0]")
        r = await c.call_tool("environment_build", {"name": "toy",
                                                    "requirements": ["corraltoy==1.0"],
                                                    "wait_s": 120})
        d = doc(r)
        assert d["state"] == "ready" and d["modules"] == ["corraltoy"], d
        listed = doc(await c.call_tool("environment_list", {}))["environments"]
        assert [e["name"] for e in listed] == ["toy"]
        t = doc(await c.call_tool("run_in_sandbox", {
            "source": "import corraltoy\ncorraltoy.ANSWER", "environment": "toy"}))
        assert t["result"] == "7", t
        r = doc(await c.call_tool("run_command", {
            "argv": [sys.executable, "-c", "import corraltoy; print(corraltoy.ANSWER)"],
            "environment": "toy"}))
        assert r["stdout"] == "7\n", r
        # control: without it the module is not there
        r = doc(await c.call_tool("run_command", {
            "argv": [sys.executable, "-c", "import corraltoy"]}))
        assert r["exit_code"] != 0
        digest = d["digest"]
    async with client(url, OTHER) as c:
        for ref in ("toy", digest):
            _refused(await c.call_tool("run_in_sandbox", {"source": "1",
                                                          "environment": ref}), "environment")
            _refused(await c.call_tool("run_command", {"argv": ["true"],
                                                       "environment": ref}), "environment")
            _refused(await c.call_tool("sandbox_create", {"name": "s", "environment": ref}),
                     "environment")
        assert doc(await c.call_tool("environment_list", {}))["environments"] == []
