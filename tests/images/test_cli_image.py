"""``corral image pull / ls / inspect / rm`` against the loopback registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import regsupport as rs

from corral.cli import main


def test_pull_ls_inspect_rm(tmp_path: Path, plain_registry: rs.Registry,
                            monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    img = rs.busybox_image({"app/hello.txt": "cli"})
    plain_registry.push("corral/cli", "1", img)
    host = plain_registry.host
    ref = f"{host}/corral/cli:1"
    cache = ["image", "--cache-dir", str(tmp_path / "cache")]
    monkeypatch.setenv("CORRAL_REGISTRIES", "registry.example")
    assert main([*cache, "pull", ref]) == 64  # config-invalid: not allowed
    assert "not one the operator allows" in capsys.readouterr().err
    monkeypatch.setenv("CORRAL_REGISTRIES", f"http://{host}")
    assert main([*cache, "pull", ref]) == 0
    assert img.digest in capsys.readouterr().out
    assert main([*cache, "ls"]) == 0
    out = capsys.readouterr().out
    assert ref in out and "cache " in out
    assert main([*cache, "ls", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [i["reference"] for i in doc["images"]] == [ref] and doc["usage"] > 0
    assert main([*cache, "inspect", ref]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["manifest_digest"] == img.digest
    assert doc["config"]["Entrypoint"] == ["/bin/sh"]
    assert doc["platform"] == {"os": "linux", "architecture": rs.ARCH}
    assert main([*cache, "rm", ref]) == 0
    assert main([*cache, "inspect", ref]) == 64
    assert "no pulled image" in capsys.readouterr().err
    assert main([*cache, "ls", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == []
