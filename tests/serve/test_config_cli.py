"""The config file, the ``serve`` verb, lazy imports, TLS, and snapshot handles that stay
with their tenant."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from servehelp import ALICE, CAROL, Server, config_text, running

import corral
from corral.core.errors import ConfigInvalidError, InvalidSnapshotHandleError
from corral.providers.remote import RemoteProvider
from corral.serve.config import config_from_dict, load_config
from strict_tier import host_can_sandbox, needs_strict


def test_config_file(tmp_path: Path) -> None:
    token = "a-token-long-enough-0123"
    p = tmp_path / "c.toml"
    p.write_text(f'[server]\nport = 9000\n[levels]\nstrict = "linux"\n'
                 f'[[tenants]]\nname = "a"\ntoken_sha256 = '
                 f'"{hashlib.sha256(token.encode()).hexdigest()}"\nmax_runs = 2\n')
    cfg = load_config(str(p))
    assert cfg.host == "127.0.0.1" and cfg.port == 9000 and dict(cfg.levels) == {
        "strict": "linux"}
    assert cfg.tenants[0].matches(token) and not cfg.tenants[0].matches(token + "x")
    assert cfg.tenants[0].max_runs == 2
    # one snippet run more than cores: a run waits on its sandbox for part of its time
    assert cfg.snippet_workers == (os.cpu_count() or 1) + 1
    p.write_text(p.read_text().replace("port = 9000\n", "port = 9000\nsnippet_workers = 1\n"))
    assert load_config(str(p)).snippet_workers == 1


@pytest.mark.parametrize(("doc", "field"), [
    ({}, "tenants"),
    ({"tenants": [{"name": "a", "token": "short"}]}, "tenants[0].token"),
    ({"tenants": [{"name": "a"}]}, "tenants[0]"),
    ({"tenants": [{"name": "a b", "token": "x" * 20}]}, "tenants.name"),
    ({"tenants": [{"name": "a", "token": "x" * 20}, {"name": "b", "token": "x" * 20}]},
     "tenants.token"),
    ({"tenants": [{"name": "a", "token": "x" * 20, "max_runs": 0}]}, "tenants.max_runs"),
    ({"tenants": [{"name": "a", "token": "x" * 20}], "levels": {"weak": "x"}}, "levels.weak"),
    ({"tenants": [{"name": "a", "token": "x" * 20}], "server": {"bogus": 1}},
     "server.bogus"),
    ({"tenants": [{"name": "a", "token": "x" * 20}], "server": {"tls_certfile": "c"}},
     "tls_certfile"),
])
def test_bad_config_is_refused(doc: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigInvalidError) as e:
        config_from_dict(doc)
    assert e.value.field == field


def test_import_corral_loads_no_web_stack() -> None:
    code = ("import sys, corral, corral.providers, corral.cli, corral.serve.config\n"
            "corral.provider\n"
            "bad = [m for m in ('starlette', 'uvicorn', 'httpx') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_serve_verb_help_and_bad_config(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "corral", "serve", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "127.0.0.1" in r.stdout
    r = subprocess.run([sys.executable, "-m", "corral", "serve", "--config",
                        str(tmp_path / "missing.toml")], capture_output=True, text=True)
    assert r.returncode == 64 and "config-invalid" in r.stderr


def test_unreachable_server_is_a_provider_error() -> None:
    from corral.core.errors import ProviderError
    with pytest.raises(ProviderError):
        RemoteProvider("http://127.0.0.1:9", ALICE, timeout_s=2)


def test_wrong_token_is_refused_by_the_remote_provider(server: Server) -> None:
    from corral.core.errors import ProviderError
    with pytest.raises(ProviderError, match="unauthorized"):
        RemoteProvider(server.url, "not-a-token-of-anyone-000")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_when_asked(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    cfg = config_text({"context-isolated": "subproc"},
                      extra=f'tls_certfile = "{cert}"\ntls_keyfile = "{key}"')
    with running(tmp_path, cfg, tls_ca=str(cert)) as s:
        assert s.url.startswith("https://")
        with s.client(ALICE) as c:
            assert c.get("/v1/info").json()["tenant"] == "alice"
        with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port gets nothing
            httpx.get(f"http://127.0.0.1:{s.port}/v1/health", timeout=5)
        p = RemoteProvider(s.url, ALICE, verify=str(cert))
        assert p.levels == {corral.Level.CONTEXT_ISOLATED}


@pytest.mark.linux
@needs_strict(host_can_sandbox())
def test_snapshot_handles_stay_with_their_tenant(tmp_path: Path) -> None:
    from corral.core.spec import SandboxSpec
    with running(tmp_path, config_text({"strict": "linux"})) as server:
        async def go() -> None:
            async with RemoteProvider(server.url, ALICE) as a, \
                    RemoteProvider(server.url, CAROL) as c:
                sa = await a.create(SandboxSpec())
                await sa.write_file("secret.txt", "alice's")
                h = await sa.snapshot()  # type: ignore[attr-defined]
                sc = await c.create(SandboxSpec())
                with pytest.raises(InvalidSnapshotHandleError):
                    await sc.restore(h)  # type: ignore[attr-defined]
                with pytest.raises(FileNotFoundError):
                    await sc.read_file("secret.txt")
                await sa.write_file("secret.txt", "changed")
                await sa.restore(h)  # type: ignore[attr-defined]
                assert await sa.read_file("secret.txt") == b"alice's"
        asyncio.run(go())


def test_serve_without_a_config_takes_the_token_from_the_environment(tmp_path: Path) -> None:
    import json
    import os
    import signal
    import time
    token = "env-token-0123456789abcdef"
    log = tmp_path / "log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "corral", "serve", "--port", "0",
                                 "--no-access-log"], stderr=fh,
                                env={**os.environ, "CORRAL_SERVE_TOKEN": token})
    try:
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            for line in log.read_text().splitlines():
                ev = json.loads(line)
                if ev["event"] == "listening":
                    assert ev["host"] == "127.0.0.1"  # loopback unless asked
                    port = ev["port"]
            time.sleep(0.05)
        assert port is not None, log.read_text()
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/info",
                              headers={"authorization": f"Bearer {token}"})
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert r.json()["tenant"] == "default"
        assert token not in log.read_text()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0


def test_metrics_token_when_configured(tmp_path: Path) -> None:
    token = "metrics-token-0123456789"
    cfg = config_text({"context-isolated": "subproc"}, extra=f'metrics_token = "{token}"')
    with running(tmp_path, cfg) as s:
        assert httpx.get(f"{s.url}/metrics").status_code == 401
        with s.client(ALICE) as c:  # a tenant's token is not the metrics token
            assert c.get("/metrics").status_code == 401
        r = httpx.get(f"{s.url}/metrics", headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 200 and "corral_requests_total" in r.text


def test_a_provider_that_cannot_start_fails_the_server(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(config_text({"context-isolated": "nosuch"}))
    r = subprocess.run([sys.executable, "-m", "corral", "serve", "--config", str(cfg),
                        "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 64 and "unknown provider 'nosuch'" in r.stderr
    cfg.write_text(config_text({"context-isolated": "subproc"}).replace(
        "[provider_options.linux]", "[provider_options.subproc]\nbogus = 1\n"
        "[provider_options.linux]"))
    r = subprocess.run([sys.executable, "-m", "corral", "serve", "--config", str(cfg),
                        "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 70, r.stderr[-2000:]
    assert "startup failed" in r.stderr
