"""Conformance checks of the life cycle: create cancellation rolling back, optional
lifecycle methods consistent with capabilities (the refusal table's capability row)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from corral.core.cancel import CancelToken
from corral.core.contract import Sandbox, pause, restore, resume, snapshot
from corral.core.errors import (
    CreateCancelledError,
    InvalidSnapshotHandleError,
    PauseNotSupportedError,
    RestoreNotSupportedError,
    SnapshotNotSupportedError,
)
from corral.core.spec import ProcessOpts, SnapshotHandle
from corral.testing._kit import Kit, expect, read_until, within

__all__ = ["check_cancel", "check_lifecycle"]


async def _destroy(sb: Sandbox) -> None:
    await within(sb.destroy(), 20.0, "destroy()")


async def _cancel_task_at(k: Kit, delay: float | None) -> None:
    task = asyncio.ensure_future(k.provider.create(k.spec()))
    if delay is not None:
        await asyncio.sleep(delay)
    task.cancel()
    try:
        sb = await within(asyncio.shield(task), 30.0, "a cancelled create task")
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            raise
        return
    except CreateCancelledError:
        raise AssertionError("asyncio cancellation of create raised CreateCancelledError; "
                             "it must propagate CancelledError untouched") from None
    await _destroy(sb)  # create finished before the cancel landed


async def check_cancel(k: Kit) -> None:
    """A cancel token (before or during create) gives CreateCancelledError and rolls back;
    an asyncio cancellation propagates CancelledError untouched."""
    tok = CancelToken()
    tok.cancel("cancelled by the conformance kit")
    try:
        sb = await within(k.provider.create(k.spec(), cancel=tok), 30.0,
                          "create with a cancelled token")
    except CreateCancelledError:
        pass
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"create with an already cancelled token: expected "
                             f"CreateCancelledError, got {type(e).__name__}: {e}") from None
    else:
        await _destroy(sb)
        raise AssertionError("create with an already cancelled token returned a sandbox")
    loop = asyncio.get_running_loop()
    for delay in (0.0, 0.002, 0.02):
        tok = CancelToken()
        handle = loop.call_later(delay, tok.cancel, "kit")
        try:
            sb = await within(k.provider.create(k.spec(), cancel=tok), 30.0,
                              "create with a token cancelled during it")
        except CreateCancelledError:
            continue
        except AssertionError:
            raise
        except Exception as e:
            raise AssertionError(f"create with a token cancelled after {delay} s: expected a "
                                 f"sandbox or CreateCancelledError, got {type(e).__name__}: {e}"
                                 ) from None
        finally:
            handle.cancel()
        await _destroy(sb)
    for at in (None, 0.0, 0.002, 0.02):
        await _cancel_task_at(k, at)
    await k.check_leaks("cancelled creates")


def _tamper(doc: Any) -> tuple[Any, bool]:
    """A copy of ``doc`` with one leaf changed (first str/bytes/int found)."""
    if isinstance(doc, str) and doc:
        return doc[:-1] + chr(ord(doc[-1]) ^ 1), True
    if isinstance(doc, bytes | bytearray) and doc:
        return bytes(doc[:-1]) + bytes([doc[-1] ^ 1]), True
    if isinstance(doc, int) and not isinstance(doc, bool):
        return doc + 1, True
    if isinstance(doc, dict):
        out = dict(doc)
        for key in sorted(out, key=str):
            out[key], done = _tamper(out[key])
            if done:
                return out, True
        return out, False
    if isinstance(doc, list | tuple):
        items = list(doc)
        for i, item in enumerate(items):
            items[i], done = _tamper(item)
            if done:
                return type(doc)(items), True
        return doc, False
    return doc, False


async def _expect_invalid(sb: Sandbox, h: SnapshotHandle, what: str) -> None:
    try:
        await within(restore(sb, h), 30.0, f"restore of {what}")
    except InvalidSnapshotHandleError:
        return
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"restore of {what}: expected InvalidSnapshotHandleError, got "
                             f"{type(e).__name__}: {e}") from None
    raise AssertionError(f"restore of {what} succeeded (expected InvalidSnapshotHandleError)")


async def _check_pause(k: Kit, sb: Sandbox) -> None:
    code = ("import sys, time\n"
            "for i in range(3000):\n"
            "    sys.stdout.write(f'{i}\\n'); sys.stdout.flush(); time.sleep(0.01)\n")
    p = await within(sb.start_process(k.py(code), ProcessOpts(stdin=False)), 20.0,
                     "start_process")
    got = bytearray(await read_until(p.stdout, b"\n", 20.0, "counter start"))

    async def reader() -> None:
        async for chunk in p.stdout:
            got.extend(chunk)

    task = asyncio.ensure_future(reader())
    try:
        await within(pause(sb), 20.0, "pause()")
        await asyncio.sleep(0.3)  # let output already in flight arrive
        seen = len(got)
        await asyncio.sleep(0.5)
        expect(len(got) == seen, "the sandbox kept producing output while paused")
        await within(resume(sb), 20.0, "resume()")
        await within(_grows(got, seen), 10.0, "output after resume()")
    finally:
        await within(p.kill(), 10.0, "kill()")
        await within(p.wait(), 10.0, "wait()")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


async def _grows(buf: bytearray, n: int) -> None:
    while len(buf) <= n:
        await asyncio.sleep(0.02)


async def check_lifecycle(k: Kit) -> None:
    """snapshot/restore/pause/resume exist exactly when advertised and work; absent, they
    raise the matching *NotSupportedError; a tampered or foreign handle is refused."""
    caps = k.provider.capabilities
    async with k.sandbox() as sb:
        for meth, cap in (("snapshot", "snapshot"), ("restore", "restore"), ("pause", "pause"),
                          ("resume", "pause")):
            has = callable(getattr(sb, meth, None))
            expect(has == (cap in caps), f"sandbox has {meth}(): {has}, but capability {cap!r} "
                   f"advertised: {cap in caps} (they must agree)")
        if "pause" in caps:
            if k.processes:
                await _check_pause(k, sb)
        else:
            for fn in (pause, resume):
                try:
                    await fn(sb)
                except PauseNotSupportedError:
                    continue
                raise AssertionError(f"{fn.__name__}() without the capability must raise "
                                     "PauseNotSupportedError")
        if "snapshot" not in caps:
            try:
                await snapshot(sb)
            except SnapshotNotSupportedError:
                pass
            else:
                raise AssertionError("snapshot() must raise SnapshotNotSupportedError")
        if "restore" not in caps:
            try:
                await restore(sb, SnapshotHandle(adapter_id="corral-kit", doc={}))
            except RestoreNotSupportedError:
                pass
            else:
                raise AssertionError("restore() must raise RestoreNotSupportedError")
        if "snapshot" in caps:
            await sb.write_file("snap.txt", b"old content")
            h = await within(snapshot(sb), 60.0, "snapshot()")
            expect(isinstance(h, SnapshotHandle) and h.v == 1 and h.adapter_id,
                   f"snapshot() must return a SnapshotHandle with v=1 and an adapter_id: {h!r}")
            if "restore" in caps:
                await sb.write_file("snap.txt", b"new content, longer")
                await within(restore(sb, h), 60.0, "restore()")
                got = await sb.read_file("snap.txt")
                expect(got == b"old content", f"after restore() snap.txt is {got!r}")
                doc, changed = _tamper(copy.deepcopy(dict(h.doc)))
                if not changed:
                    doc = {**dict(h.doc), "corral-kit-tamper": 1}
                await _expect_invalid(sb, SnapshotHandle(adapter_id=h.adapter_id, doc=doc),
                                      "a handle with a changed doc")
                await _expect_invalid(
                    sb, SnapshotHandle(adapter_id=h.adapter_id + "-other", doc=h.doc),
                    "a handle with another adapter_id")
