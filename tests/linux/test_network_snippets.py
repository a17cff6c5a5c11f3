"""The snippet runner with a network policy (issue 13): a strict snippet reaches a
listed loopback test server through its sandbox's egress proxy, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest
from netservers import MapResolver, http_server

from corral.core.errors import ConfigInvalidError, LevelNotSupportedError
from corral.core.spec import NetworkPolicy
from corral.snippets.host.runner import run_snippet
from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS

pytestmark = pytest.mark.linux
IMPORTS = DEFAULT_ALLOWED_IMPORTS | {"urllib.request", "urllib.error"}
CODE = """
import urllib.request, urllib.error
for url in URLS:
    try:
        print(urllib.request.urlopen(url, timeout=5).read().decode())
    except urllib.error.HTTPError as e:
        print("HTTP", e.code)
"""


def test_a_snippet_reaches_only_the_listed_host(linux: Any) -> None:
    with http_server({"*": b"from the host"}) as srv:
        async def test(p: Any) -> None:
            urls = [f"http://api.test:{srv.port}/a", f"http://other.test:{srv.port}/b"]
            policy = NetworkPolicy.allowlist("api.test", f"127.0.0.1/32:{srv.port}")
            t = await run_snippet(f"URLS = {urls!r}\n" + CODE, provider=p, network=policy,
                                  allowed_imports=IMPORTS)
            assert t.ok, t.to_dict()
            assert [line.text for line in t.logs] == ["from the host", "HTTP 403"]
            # no policy: the same snippet gets no connection at all
            t = await run_snippet(f"URLS = {urls[:1]!r}\n" + CODE, provider=p,
                                  allowed_imports=IMPORTS)
            assert not t.ok
            assert srv.connections == 1
            with pytest.raises(LevelNotSupportedError):
                await run_snippet("1", level="context-isolated", network=policy)
            with pytest.raises(ConfigInvalidError):
                await run_snippet("1", network=NetworkPolicy.allowlist("a.test:0"),
                                  provider=p)

        linux(test, egress_resolver=MapResolver({"api.test": ["127.0.0.1"],
                                                 "other.test": ["127.0.0.1"]}))
