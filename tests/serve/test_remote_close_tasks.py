"""The remote provider closed while work is in flight: a process started in a sandbox it
made and one in a sandbox it connected to (which its aclose leaves alive on the server).
After ``aclose`` no task of the provider is pending (the connected sandbox's output
reader used to run on, owned by nobody) and a ``wait`` on a closed provider's process
raises a typed error, not a bare cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

from servehelp import ALICE, Server

from corral.core.errors import ProviderError
from corral.core.spec import Level, NetworkPolicy, SandboxSpec
from corral.providers.remote import RemoteProvider

SPEC = SandboxSpec(tenant_id="alice", level=Level.CONTEXT_ISOLATED,
                   network=NetworkPolicy.unrestricted())


def test_aclose_ends_the_readers_of_every_process(server: Server) -> None:
    async def main() -> tuple[set[asyncio.Task[Any]], BaseException | None]:
        before = asyncio.all_tasks()
        keeper = RemoteProvider(server.url, ALICE)  # makes the sandbox that outlives
        other = RemoteProvider(server.url, ALICE)
        kept = await keeper.create(SPEC)
        try:
            made = await other.create(SPEC)
            connected = await other.connect(kept.id)
            procs = [await sb.start_process(["sh", "-c", "echo up; exec sleep 300"])
                     for sb in (made, connected)]
            for p in procs:  # each reader has its first chunk
                assert await asyncio.wait_for(anext(aiter(p.stdout)), 10) == b"up\n"
            waiting = asyncio.ensure_future(procs[1].wait())
            await asyncio.sleep(0.05)
            await other.aclose()
            try:
                await asyncio.wait_for(waiting, 10)
                err: BaseException | None = None
            except BaseException as e:  # the test looks at its type
                err = e
            left = {t for t in asyncio.all_tasks() - before if not t.done()}
        finally:
            await keeper.aclose()
        return left, err

    left, err = asyncio.run(main())
    assert left == set()
    assert isinstance(err, ProviderError), repr(err)
