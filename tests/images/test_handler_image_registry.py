"""Handler images as seed 01 means them (issue 28, item 3, "Must show"): ``invoke`` with
mode ``handler-image`` runs the image's OWN entrypoint, in the image's own root at
strict, speaking the JSON-lines frames on stdio:

- a handler written in **JavaScript**, run by the image's Node (Debian's ``nodejs``;
  the host's interpreter and corral are not in the view);
- a handler written in **Python** in an image **without corral** (the Debian
  python3-numpy root: its own python3, stdlib ``json`` for the frames);
- **seed 01's example spec**: a registry reference (``acme/summarize:1.4.0`` pushed to
  the loopback registry this module starts, pulled through the operator's allowlist),
  ``mode: 'handler-image'``, limits ``memMB 256, cpuMs 10_000``, level strict, network
  allowlisted to ``api.acme.example``, served by the test on loopback.

The images are the suite's cached builds (marker ``image_build``): Debian minbase roots
debootstrapped from the host's mirror on first use (tests/linux/imageroot_support.py),
their whole tree one cached gzip layer; each test adds a small layer with its handler
and a config, pushes the image to the loopback registry and lets the provider pull it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import regsupport as rs

from cgroup_view import mine
from corral.core.spec import (
    HandlerRef,
    InvocationMode,
    Level,
    NetworkPolicy,
    SandboxInvocationContext,
    SandboxLimits,
    SandboxSpec,
)
from corral.dispatch import HandlerOutput, invoke
from strict_tier import host_can_sandbox, needs_strict, unavailable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linux"))

import imageroot_support as irs
from netservers import MapResolver, http_server

pytestmark = [pytest.mark.linux, pytest.mark.image_build, needs_strict(host_can_sandbox())]

#: the JavaScript handler (the seed's summarize node): one invoke frame in, one output
#: frame out; the API is reached through the egress proxy the sandbox's env names
#: (Node 18's http module has no proxy support of its own: a plain-HTTP proxy request)
SUMMARIZE_JS = r"""
const http = require('http');
const readline = require('readline');
const rl = readline.createInterface({ input: process.stdin });
let done = false;
function reply(frame) {
  if (done) return;
  done = true;
  const code = frame.kind === 'error' ? 1 : 0;
  process.stdout.write(JSON.stringify(frame) + '\n', () => process.exit(code));
}
function callApi(text, cb) {
  const api = process.env.ACME_API;
  if (!api) return cb(null, null);
  const proxy = new URL(process.env.HTTP_PROXY);
  const target = new URL('/summarize?words=' + text.split(/\s+/).length, api);
  const req = http.request({ host: proxy.hostname, port: proxy.port, method: 'GET',
                             path: target.href, headers: { Host: target.host } }, (res) => {
    let body = '';
    res.on('data', (c) => body += c);
    res.on('end', () => cb(null, { status: res.statusCode, body }));
  });
  req.on('error', (e) => cb(e));
  req.end();
}
rl.once('line', (line) => {
  rl.close();
  let frame;
  try { frame = JSON.parse(line); } catch (e) {
    return reply({ v: 1, kind: 'error', error: { code: 'config-invalid', message: 'bad stdin' } });
  }
  const text = String(frame.input.text);
  callApi(text, (err, api) => {
    if (err) {
      return reply({ v: 1, kind: 'error',
                     error: { code: 'unhandled-worker', message: String(err) } });
    }
    reply({ v: 1, kind: 'output', output: {
      summary: text.split(/\s+/).slice(0, 3).join(' '), api,
      runtime: 'node ' + process.version, uid: process.getuid(), node: frame.ctx.nodeId,
      runId: frame.ctx.runId, dryRun: frame.ctx.dryRun,
      hasCorral: require('fs').existsSync('/usr/lib/python3') } });
  });
});
"""

#: the Python handler, in an image without corral: the frames by hand, stdlib json
HANDLER_PY = r"""
import importlib.util, json, os, sys
frame = json.loads(sys.stdin.readline())
import numpy
out = {"total": float(numpy.array(frame["input"]["xs"]).sum()),
       "corral": importlib.util.find_spec("corral") is not None,
       "python": sys.executable, "prefix": sys.prefix, "uid": os.getuid(),
       "state": frame["ctx"]["state"]}
sys.stdout.write(json.dumps({"v": 1, "kind": "output", "output": out}) + "\n")
"""


def _base(build: Any, what: str) -> tuple[bytes, str]:
    try:
        root = build()
    except RuntimeError as e:
        unavailable(f"the {what} test image could not be built: {e}")
    if root is None:
        unavailable(f"the {what} test image needs root and debootstrap")
    path, diff_id = irs.rootfs_layer(root)
    with open(path, "rb") as f:
        return f.read(), diff_id


@pytest.fixture(scope="module")
def node_base() -> tuple[bytes, str]:
    return _base(irs.node_rootfs, "nodejs")


@pytest.fixture(scope="module")
def python_base() -> tuple[bytes, str]:
    return _base(irs.python_numpy_rootfs, "python3-numpy")


@pytest.fixture
def cache() -> Iterator[str]:
    """The provider's image cache: a dir the sandbox's own uid can walk to."""
    d = tempfile.mkdtemp(prefix="corral-handler-image-", dir="/var/tmp")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _invoke(spec: SandboxSpec, cache: str, payload: Any, *,
            ctx: SandboxInvocationContext | None = None, **kw: Any) -> Any:
    from corral.providers.linux import LinuxProvider

    async def go() -> Any:
        p = LinuxProvider(image_cache_dir=cache, **kw)
        try:
            ref = HandlerRef(artifact_id="summarize", version="1.4.0")
            return await invoke(p, spec, ref, payload, ctx, timeout_ms=120_000)
        finally:
            spares = await p.wait_spares()  # also finishes removing destroyed ones
            live = len(mine()) - spares
            await p.aclose()
            assert live == 0, "invoke left a live sandbox"
    return asyncio.run(go())


def _allow(monkeypatch: pytest.MonkeyPatch, reg: rs.Registry) -> None:
    monkeypatch.setenv("CORRAL_REGISTRIES", f"http://{reg.host}")


def test_a_javascript_handler_runs_on_the_images_node(
        plain_registry: rs.Registry, node_base: tuple[bytes, str], cache: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    img = rs.image([node_base, rs.layer({"app/summarize.js": SUMMARIZE_JS})],
                   {"Entrypoint": ["/usr/bin/node"], "Cmd": ["/app/summarize.js"],
                    "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "User": "1000"})
    plain_registry.push("acme/summarize-js", "1", img)
    _allow(monkeypatch, plain_registry)
    spec = SandboxSpec(tenant_id="acme", run_id="run-1", node_id="summarize",
                       image=f"{plain_registry.host}/acme/summarize-js:1",
                       mode=InvocationMode.HANDLER_IMAGE)
    out = _invoke(spec, cache, {"text": "one two three four five"},
                  ctx=SandboxInvocationContext(dry_run=True))
    assert isinstance(out, HandlerOutput)
    runtime = out.value.pop("runtime")
    assert runtime.startswith("node v18.")  # Debian bookworm's (the host's is another)
    assert out.value == {"summary": "one two three", "api": None, "uid": 1000,
                         "node": "summarize", "runId": "run-1", "dryRun": True,
                         "hasCorral": False}


def test_a_python_handler_in_an_image_without_corral(
        plain_registry: rs.Registry, python_base: tuple[bytes, str], cache: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    img = rs.image([python_base, rs.layer({"app/handler.py": HANDLER_PY})],
                   {"Entrypoint": ["/usr/bin/python3", "/app/handler.py"],
                    "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]})
    digest = plain_registry.push("acme/numpy-handler", "1", img)
    _allow(monkeypatch, plain_registry)
    spec = SandboxSpec(tenant_id="acme", run_id="run-2",
                       image=f"{plain_registry.host}/acme/numpy-handler@{digest}",
                       mode=InvocationMode.HANDLER_IMAGE)
    out = _invoke(spec, cache, {"xs": [1, 2, 3.5]},
                  ctx=SandboxInvocationContext(state={"step": 2}))
    assert out == HandlerOutput(value={"total": 6.5, "corral": False,
                                       "python": "/usr/bin/python3", "prefix": "/usr",
                                       "uid": 0, "state": {"step": 2}})


def test_seed_01s_example_spec_runs_through_invoke(
        plain_registry: rs.Registry, node_base: tuple[bytes, str], cache: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _allow(monkeypatch, plain_registry)
    with http_server({"/summarize?words=5": b'{"ok":true,"words":5}'}) as api:
        # the API's URL is the image's own configuration (its Env)
        img = rs.image([node_base, rs.layer({"app/summarize.js": SUMMARIZE_JS})],
                       {"Entrypoint": ["/usr/bin/node", "/app/summarize.js"],
                        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin",
                                f"ACME_API=http://api.acme.example:{api.port}"]})
        plain_registry.push("acme/summarize", "1.4.0", img)
        # the seed's spec, field for field (its registry.example.com is the loopback
        # registry). The test's resolver maps api.acme.example to 127.0.0.1, which the
        # egress proxy refuses for any name unless that address is listed too (its
        # DNS-rebinding guard, docs/network.md): that entry is the one addition
        spec = SandboxSpec(
            tenant_id="acme", run_id="run-7", node_id="summarize",
            image=f"{plain_registry.host}/acme/summarize:1.4.0",
            limits=SandboxLimits(mem_mb=256, cpu_ms=10_000),
            network=NetworkPolicy.allowlist("api.acme.example", f"127.0.0.1/32:{api.port}"),
            level=Level.STRICT, mode=InvocationMode.HANDLER_IMAGE)
        resolver = MapResolver({"api.acme.example": ["127.0.0.1"]})
        out = _invoke(spec, cache, {"text": "one two three four five"},
                      egress_resolver=resolver)
        requests = list(api.requests)
    assert isinstance(out, HandlerOutput), out
    assert out.value["summary"] == "one two three"
    assert out.value["api"] == {"status": 200, "body": '{"ok":true,"words":5}'}
    assert out.value["runId"] == "run-7" and out.value["node"] == "summarize"
    assert [r[1] for r in requests] == ["/summarize?words=5"]
    assert requests[0][2]["host"] == f"api.acme.example:{api.port}"
    assert resolver.asked == ["api.acme.example"]
