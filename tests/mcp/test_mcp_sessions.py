"""Sessions through ``corral mcp``, driven by the MCP SDK's own client: a live
interpreter across calls, PNGs as image content, an interrupt that keeps the state, a
memory kill as a typed tool error; a session's environment only if the tenant lists it;
the issue's pandas walk over HTTP in the environment ``sci`` (marker env_build)."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_support import STRICT, client, doc, http_server, stdio_params

from session_env import CSV, png_size
from strict_tier import cgroup_limits_reason

pytestmark = STRICT

_PNG_3x2 = ("iVBORw0KGgoAAAANSUhEUgAAAAMAAAACCAIAAAASFvFNAAAAEElEQVR4nGP4z8AAQQxwFgBB0gX7h/C5"
            "SAAAAABJRU5ErkJggg==")
MEM_OK = not cgroup_limits_reason()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 240))


def _images(r: Any) -> list[bytes]:
    return [base64.b64decode(c.data) for c in r.content if c.type == "image"]


def test_a_session_over_stdio() -> None:
    async def main() -> None:
        async with Client(stdio_params()) as c:
            r = await c.call_tool("session_create", {"name": "py", "cell_timeout_s": 1.5})
            assert not r.is_error, r
            assert doc(r)["name"] == "py"
            w = await c.call_tool("sandbox_write_file", {"name": "py", "path": "data.csv",
                                                         "content": CSV})
            assert not w.is_error, w
            r = await c.call_tool("session_run", {"name": "py", "code": (
                "rows = open('data.csv').read().split()\nprint(len(rows))")})
            d = doc(r)
            assert d["ok"] and d["stdout"] == "5\n"
            r = await c.call_tool("session_run", {"name": "py", "code": (
                "import base64\nclass P:\n    def _repr_png_(self):\n"
                f"        return base64.b64decode({_PNG_3x2!r})\nP()")})
            [png] = _images(r)
            assert png_size(png) == (3, 2)
            d = json.loads(r.content[0].text)
            assert d["images"] == 1 and d["result"]["data"]["image/png"] == "<image 1>"
            r = await c.call_tool("session_run", {"name": "py", "code": "while True: pass"})
            d = doc(r)
            assert d["timed_out"] and d["error"]["name"] == "KeyboardInterrupt"
            r = await c.call_tool("session_run", {"name": "py", "code": "len(rows)"})
            assert doc(r)["result"]["data"]["text/plain"] == "5"
            r = await c.call_tool("session_close", {"name": "py"})
            assert doc(r) == {"name": "py", "closed": True}
            r = await c.call_tool("session_run", {"name": "py", "code": "1"})
            assert r.is_error and r.structured_content["error"]["code"] == "config-invalid"
    run(main())


@pytest.mark.skipif(not MEM_OK, reason=cgroup_limits_reason() or "-")
def test_a_memory_kill_is_a_typed_tool_error() -> None:
    async def main() -> None:
        async with Client(stdio_params()) as c:
            assert not (await c.call_tool("session_create", {"name": "m", "mem_mb": 128})
                        ).is_error
            await c.call_tool("session_run", {"name": "m", "code": "x = 1"})
            r = await c.call_tool("session_run", {"name": "m", "code": (
                "hog = []\nwhile True:\n    hog.append(bytearray(8 << 20))")})
            assert r.is_error
            err = r.structured_content["error"]
            assert err["code"] == "limits-exceeded" and err["limit"] == "memory"
            assert err["limit_value"] == 128
            listed = doc(await c.call_tool("sandbox_list", {}))
            assert "m" not in listed["sandboxes"]  # the session and its sandbox are gone
    run(main())


def _refused_environment(r: Any, name: str) -> None:
    assert r.is_error, r
    err = r.structured_content["error"]
    assert err["code"] == "config-invalid" and err["field"] == "environment", err
    assert repr(name) in err["message"], err


def test_a_session_names_only_an_environment_the_operator_lists() -> None:
    """As sandbox_create: the stdio client may name only ``--environment`` ones (none
    by default); the refusal is the same typed tool error, and nothing is left."""
    async def main() -> None:
        async with Client(stdio_params()) as c:
            _refused_environment(await c.call_tool(
                "session_create", {"name": "e", "environment": "sci"}), "sci")
            _refused_environment(await c.call_tool(
                "sandbox_create", {"name": "e", "environment": "sci"}), "sci")
            assert doc(await c.call_tool("sandbox_list", {}))["sandboxes"] == []
        async with Client(stdio_params("--environment", "sci")) as c:
            _refused_environment(await c.call_tool(
                "session_create", {"name": "e", "environment": "other"}), "other")
    run(main())


@pytest.mark.env_build
@pytest.mark.skipif(not MEM_OK, reason=cgroup_limits_reason() or "-")
def test_the_agent_walk_over_mcp_http(tmp_path: Path, sci_env: str) -> None:
    """The session runs in ``sci`` (the cached store, found by the server through
    ``CORRAL_ENV_DIR``), which tenant walk lists and tenant other does not."""
    token, other = "session-walk-token-0123456789", "session-other-token-0123456789"
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f'[levels]\nstrict = "linux"\n\n[[tenants]]\nname = "walk"\n'
                   f'token = "{token}"\nlevels = ["strict"]\nenvironments = ["{sci_env}"]\n'
                   f'\n[[tenants]]\nname = "other"\ntoken = "{other}"\n'
                   f'levels = ["strict"]\n')

    async def main(url: str) -> None:
        async with client(url, other) as c:
            _refused_environment(await c.call_tool(
                "session_create", {"name": "nb", "environment": sci_env}), sci_env)
        async with client(url, token) as c:
            r = await c.call_tool("session_create", {"name": "nb", "mem_mb": 400,
                                                     "cell_timeout_s": 2,
                                                     "environment": sci_env})
            assert not r.is_error, r
            await c.call_tool("sandbox_write_file", {"name": "nb", "path": "data.csv",
                                                     "content": CSV})
            r = await c.call_tool("session_run", {"name": "nb", "timeout_s": 60, "code":
                                  "import pandas as pd; df = pd.read_csv('data.csv')"})
            assert doc(r)["ok"], r
            d = doc(await c.call_tool("session_run", {"name": "nb", "code": "df.describe()"}))
            assert "<table" in d["result"]["data"]["text/html"]
            assert "mean" in d["result"]["data"]["text/plain"]
            r = await c.call_tool("session_run", {"name": "nb", "timeout_s": 60, "code": (
                "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(4, 3), "
                "dpi=50)\nax.plot(df.a, df.b)\nplt.show()")})
            [png] = _images(r)
            assert png_size(png) == (200, 150)
            d = doc(await c.call_tool("session_run", {"name": "nb", "code": "while True: pass"}))
            assert d["timed_out"] and d["error"]["name"] == "KeyboardInterrupt"
            d = doc(await c.call_tool("session_run", {"name": "nb", "code": "int(df.b.sum())"}))
            assert d["result"]["data"]["text/plain"] == "24"
            r = await c.call_tool("session_run", {"name": "nb", "timeout_s": 60, "code": (
                "import numpy as np\nbig = np.ones((1 << 30,), dtype=np.uint8)")})
            assert r.is_error and r.structured_content["error"]["limit"] == "memory"

    with http_server("--config", str(cfg), token=None) as (url, _):
        run(main(url))
