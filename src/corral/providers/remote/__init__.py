"""The remote provider: the provider contract against a ``corral serve`` server.

``corral.provider("remote", url="http://127.0.0.1:8580", token="...")`` gives a
provider whose sandboxes live on that server; every front door works through it
(``run_strict(provider=...)``, ``run_snippet(provider=...)``, ``invoke``). Needs httpx
(``pip install corral[serve]``), imported when the provider is made. See
docs/service.md.
"""

from __future__ import annotations

from corral.providers.remote._provider import (
    RemoteProcess as RemoteProcess,
    RemoteProvider as RemoteProvider,
    RemoteSandbox as RemoteSandbox,
)

__all__ = ["PROVIDER_CLASS", "RemoteProcess", "RemoteProvider", "RemoteSandbox"]

#: the class the registry (corral.providers) hands out for "remote"
PROVIDER_CLASS = RemoteProvider
