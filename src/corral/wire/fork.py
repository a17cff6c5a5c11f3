"""Wire 2, host <-> fork server ("zygote"), and the zygote <-> template messages: sans-I/O.

The host and the zygote speak wire 1's frames (:mod:`corral.wire.agent`) without
payloads; this module names the three ops and checks the replies the host reads
(hostile: the fork server runs next to every sandbox). The zygote trusts the host.

======== ============================================== ===============================
op       request                                        reply
======== ============================================== ===============================
init     ``seccomp`` (base64 BPF), no ``id``            none
preload  ``modules``, ``entries`` (lists of str)        ``ok``, ``missing`` (list)
create   ``plan``, ``cgroup_procs``; 1 descriptor       ``ok``, ``pid``, ``nfds`` 1 and
                                                        a pidfd; or ``ok`` false, ``error``
======== ============================================== ===============================

Inside the fork server, the zygote asks its template to clone a pid 1 over a
``SOCK_SEQPACKET`` pair: ``G<uid> <gid>`` with one descriptor, answered by
``<pid>`` (decimal) with the pidfd, or ``E<errno>``. Both ends trust each other;
the codec is here so both import the same bytes.

Stdlib and :mod:`corral.wire.agent` only (imported by the fork server).
"""

from __future__ import annotations

import base64
import errno as _errno
from collections.abc import Mapping, Sequence
from typing import Any, Final

from corral.wire import agent as _frames

__all__ = ["CreateFailed", "clone_failed", "cloned", "create_failed", "create_ok",
           "create_request", "decode_clone", "decode_cloned", "decode_create_reply",
           "decode_preload_reply", "encode_clone", "init_frame", "preload_reply",
           "preload_request", "seccomp_of"]

#: error text of a failed create the host keeps (it names a host-side failure)
MAX_ERROR_CHARS: Final = 500


class CreateFailed(Exception):
    """The fork server could not create the sandbox; ``reason`` is its word (cut)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- host -> zygote ---------------------------------------------------------------------
def init_frame(seccomp_prog: bytes) -> bytes:
    """The one-way first frame: the BPF program every sandbox installs."""
    return _frames.encode({"op": "init", "seccomp": base64.b64encode(seccomp_prog).decode()})


def preload_request(modules: Sequence[str], entries: Sequence[str]) -> dict[str, Any]:
    """A preload request's header (the channel adds ``id``)."""
    return {"op": "preload", "modules": list(modules), "entries": list(entries)}


def create_request(plan: Mapping[str, Any], cgroup_procs: Sequence[str]) -> dict[str, Any]:
    """A create request's header (the channel adds ``id``; the agent socket rides along)."""
    return {"op": "create", "plan": dict(plan), "cgroup_procs": list(cgroup_procs)}


def seccomp_of(request: Mapping[str, Any]) -> bytes | None:
    """The BPF program a request sets, if it carries one (zygote side)."""
    prog = request.get("seccomp")
    return None if prog is None else base64.b64decode(prog)


# -- zygote -> host ---------------------------------------------------------------------
def preload_reply(rid: object, missing: Sequence[str]) -> bytes:
    return _frames.encode({"id": rid, "ok": True, "missing": list(missing)})


def create_ok(rid: object, pid: int) -> bytes:
    """A create reply that carries one descriptor (the pidfd) beside it."""
    return _frames.encode({"ok": True, "pid": pid, "id": rid, "nfds": 1})


def create_failed(rid: object, error: str) -> bytes:
    return _frames.encode({"ok": False, "error": error, "id": rid})


def decode_create_reply(header: Mapping[str, Any], nfds: int) -> int:
    """The pid of the sandbox's pid 1 from a create reply (with ``nfds`` descriptors),
    or :class:`CreateFailed`."""
    pid = header.get("pid")
    if not header.get("ok") or nfds != 1 or type(pid) is not int:
        raise CreateFailed(str(header.get("error", "no pidfd"))[:MAX_ERROR_CHARS])
    return pid


def decode_preload_reply(header: Mapping[str, Any], asked: Sequence[str]) -> list[str]:
    """The names a preload could not load (all it ``asked`` for when the reply is
    malformed)."""
    missing = header.get("missing", ())
    return [str(m) for m in missing] if isinstance(missing, list) else list(asked)


# -- zygote <-> template ------------------------------------------------------------------
def encode_clone(uid: int, gid: int) -> bytes:
    return b"G%d %d" % (uid, gid)


def decode_clone(data: bytes) -> tuple[int, int]:
    """(uid, gid) of a clone message; ValueError if it is not one."""
    uid, _, gid = data[1:].partition(b" ")
    return int(uid), int(gid)


def cloned(pid: int) -> bytes:
    return b"%d" % pid


def clone_failed(errno: int) -> bytes:
    return b"E%d" % errno


def decode_cloned(data: bytes) -> int:
    """The pid of a clone; OSError (the template's errno) when it failed."""
    if data[:1] == b"E":
        code = int(data[1:] or 0)
        raise OSError(code, f"clone: {_errno.errorcode.get(code, f'errno {code}')}")
    return int(data)
