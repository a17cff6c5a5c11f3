"""``pip install`` inside a strict sandbox whose only allowed host is a package index.

The index is a PEP 503 simple index the test serves over HTTPS on the host's loopback
(a certificate from a CA the test makes; pip trusts it through ``--cert``), with one
wheel the test builds. The sandbox's network policy lists the index's name (mapped to
127.0.0.1 by the test's resolver) and that one loopback port; pip reaches it through
the sandbox's egress proxy (HTTPS_PROXY, CONNECT), as it would reach PyPI.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
from netservers import MapResolver, build_wheel, http_server, simple_index

from corral.core.spec import ExecOpts, NetworkPolicy, SandboxSpec

pytestmark = pytest.mark.linux
PY = sys.executable


def test_pip_install_from_an_https_index_allowed_by_name(
        linux: Any, test_ca: Callable[..., Any]) -> None:
    ca = test_ca("pypi.test")  # removed, private key and all, when the test ends
    wheel_name, wheel = build_wheel("corraltoy", "1.0", "ANSWER = 42\n")
    with http_server(simple_index("corraltoy", wheel_name, wheel),
                     ca.server_context()) as index:
        async def test(p: Any) -> None:
            policy = NetworkPolicy.allowlist(f"pypi.test:{index.port}",
                                             f"127.0.0.1/32:{index.port}")
            spec = SandboxSpec(tenant_id="t", run_id="r", network=policy)
            async with await p.create(spec) as sb:
                await sb.write_file("ca.pem", ca.ca_pem)
                r = await sb.exec(
                    [PY, "-m", "pip", "install", "--no-cache-dir", "--no-input",
                     "--disable-pip-version-check", "--target", "/work/site",
                     "--index-url", f"https://pypi.test:{index.port}/simple/",
                     "--cert", "/work/ca.pem", "corraltoy"],
                    ExecOpts(timeout_ms=120_000))
                assert r.exit_code == 0, r.stdout_text + r.stderr_text
                assert r.denials == ()
                r = await sb.exec([PY, "-c", "import corraltoy; print(corraltoy.ANSWER)"],
                                  ExecOpts(env={"PYTHONPATH": "/work/site"}))
                assert r.stdout_text.strip() == "42", r.stderr_text
                # the same pip, pointed at an index the policy does not list, gets nothing
                # (--cert again: without it a Debian-built pip looks for the host's CA
                # bundle, which the sandbox does not show, and fails before it connects)
                r = await sb.exec(
                    [PY, "-m", "pip", "download", "--no-cache-dir", "--no-input",
                     "--disable-pip-version-check", "--retries", "0", "--timeout", "5",
                     "-d", "/work/dl", "--index-url",
                     f"https://other.test:{index.port}/simple/", "--cert", "/work/ca.pem",
                     "corraltoy"],
                    ExecOpts(timeout_ms=120_000))
                assert r.exit_code != 0
                assert {(d.host, d.kind) for d in r.denials} == {("other.test", "not-allowed")}
            paths = [q[1] for q in index.requests]
            assert "/simple/corraltoy/" in paths and f"/files/{wheel_name}" in paths

        linux(test, egress_resolver=MapResolver({"pypi.test": ["127.0.0.1"],
                                                 "other.test": ["127.0.0.1"]}))
