"""Reading and unpacking an image in a bounded child process (:func:`unpack_bounded`).

Everything that parses the image (an outer tar, the manifests, the config, the
layers) runs in a child, never in the host process: CPython's ``tarfile`` and
``gzip`` hold what a crafted header asks for in memory (a PAX or GNU long-name
record of hundreds of MiB of zeros costs the reader three times that) and
spend CPU on whatever a layer nests. The child is the real interpreter
(``realpath(sys.executable) -I -S -B -X utf8``, corral's import root passed on
its command line, an empty environment). Before it opens the image it asks for
SIGKILL should its parent thread die and lowers its own limits: ``RLIMIT_AS``
(memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` (one file), ``RLIMIT_NOFILE`` and
``RLIMIT_CORE=0``. The host waits with a wall-clock deadline and SIGKILLs it
past that; the extraction inside is :mod:`._image_extract`'s, path-safe and
capped in file bytes, members and decompressed bytes.

The child answers with one JSON document on its stdout (a file in the temp
dir). Every way it can fail ends as ``ConfigInvalidError("image", ...)``
naming the cap that was hit (memory, CPU, wall clock, file size, bytes,
members) or the refusal; only the cache's own I/O (an ``OSError`` outside the
image's reading) is ``ProviderError``. Used by :mod:`.images`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Final, final

from corral.core.errors import ConfigInvalidError, ProviderError
from corral.images.layers import ImageConfig, bad

__all__ = ["DEFAULT_MAX_CPU_S", "DEFAULT_MAX_MEMORY", "DEFAULT_MAX_WALL_S", "ChildResult",
           "UnpackCaps", "main", "parse_answer", "unpack_bounded"]

#: address space of the unpacking child (RLIMIT_AS)
DEFAULT_MAX_MEMORY: Final = 512 << 20
#: CPU seconds of the unpacking child (RLIMIT_CPU)
DEFAULT_MAX_CPU_S: Final = 120
#: wall-clock seconds before the host kills the unpacking child
DEFAULT_MAX_WALL_S: Final = 300.0

_EXIT_MEMORY: Final = 3    # the child ran out of its address space
_EXIT_ORPHAN: Final = 4    # its parent was gone before it started
_OUT_CAP: Final = 1 << 20  # the most of the child's answer the host reads
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_SOURCES: Final = ("oci-layout", "oci-archive", "docker-archive")
# corral's import root: .../<root>/corral/images/child.py
_IMPORT_ROOT: Final = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# The child imports corral's modules without running the packages' __init__s
# (the top-level one loads the whole public API: half the child's start-up).
_BOOT: Final = "\n".join((
    "import sys, types",
    "for name in ('corral', 'corral.core', 'corral.images', 'corral.providers',"
    " 'corral.providers.linux'):",
    "    sys.modules[name] = pkg = types.ModuleType(name)",
    "    pkg.__path__ = [sys.argv[1] + '/' + name.replace('.', '/')]",
    "from corral.images.child import main",
    "main(sys.argv[2])"))


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class UnpackCaps:
    """Limits of one unpacking child: address space (bytes), CPU and wall-clock
    seconds, the largest file it may write (bytes)."""

    memory: int = DEFAULT_MAX_MEMORY
    cpu_s: int = DEFAULT_MAX_CPU_S
    wall_s: float = DEFAULT_MAX_WALL_S
    file_bytes: int = 1 << 30


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ChildResult:
    """What the child found: ``size`` is the unpacked tree's disk usage in bytes,
    None when the cache had the entry already (nothing was unpacked)."""

    digest: str
    config: ImageConfig
    source: str
    size: int | None


def unpack_bounded(image: str, tmp: str, *, cache_root: str | None, max_bytes: int,
                   max_members: int, caps: UnpackCaps, ref: str | None = None) -> ChildResult:
    """Read ``image`` (the image in it ``ref`` names, when given) in a bounded child
    and, unless ``cache_root`` already holds its entry, unpack it into ``tmp``/rootfs.
    ``tmp`` is an empty dir the caller owns and removes; the child is reaped before
    this returns or raises."""
    exe = os.path.realpath(sys.executable) if sys.executable else ""
    if not exe or not os.access(exe, os.X_OK):
        raise ProviderError(f"no interpreter to unpack images with ({sys.executable!r})")
    req = {"image": image, "ref": ref, "tmp": tmp, "root": cache_root, "max_bytes": max_bytes,
           "max_members": max_members, "memory": caps.memory, "cpu_s": caps.cpu_s,
           "file_bytes": caps.file_bytes, "ppid": os.getpid()}
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    out = os.open(os.path.join(tmp, ".out"), flags, 0o600)
    try:
        err = os.open(os.path.join(tmp, ".err"), flags, 0o600)
        try:
            rc = _run([exe, "-I", "-S", "-B", "-X", "utf8", "-c", _BOOT, _IMPORT_ROOT,
                       json.dumps(req)], out, err, caps)
            answer, tail = os.pread(out, _OUT_CAP, 0), _tail(err, 4096)
        finally:
            os.close(err)
    finally:
        os.close(out)
    return _result(rc, answer, tail, caps)


def _run(argv: list[str], out: int, err: int, caps: UnpackCaps) -> int | None:
    """The child's exit status (negative: its signal), None when the host killed it
    at the wall-clock cap."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                            close_fds=True, env={}, cwd="/")
    try:
        return proc.wait() if _exits_within(proc, caps.wall_s) else None
    finally:
        if proc.returncode is None:  # the deadline, or the waiting thread interrupted
            proc.kill()
            proc.wait()


def _exits_within(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for ``proc`` to exit (not reaping it) at most ``timeout`` seconds; a
    pidfd wakes us as it exits (``Popen.wait``'s polling would add up to 50 ms)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # no pidfds on this kernel
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        return bool(poll.poll(max(0, int(timeout * 1000))))
    finally:
        os.close(fd)


def _tail(fd: int, cap: int) -> bytes:
    return os.pread(fd, cap, max(0, os.fstat(fd).st_size - cap))


def _result(rc: int | None, answer: bytes, tail: bytes, caps: UnpackCaps) -> ChildResult:
    if rc is None:
        raise bad(f"unpacking took longer than {caps.wall_s:g} s (the unpack wall-clock cap)")
    if rc == -signal.SIGXCPU:
        raise bad(f"unpacking used more than {caps.cpu_s} s of CPU (the unpack CPU cap)")
    if rc == _EXIT_MEMORY or (rc != 0 and b"MemoryError" in tail):
        raise bad(f"unpacking needed more than {caps.memory} bytes of memory "
                  "(the unpack memory cap)")
    last = tail.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    if rc != 0:
        how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
        raise bad(f"the unpacking process failed ({how}): {last[0][:300]}")
    try:
        doc = json.loads(answer)
    except ValueError:
        raise bad("the unpacking process gave no answer") from None
    if not isinstance(doc, dict):
        raise bad("the unpacking process gave a malformed answer")
    if isinstance(doc.get("refused"), str):
        raise bad(doc["refused"])
    oserr = doc.get("oserror")
    if isinstance(oserr, list) and len(oserr) == 2 and isinstance(oserr[1], str):
        cause = OSError(oserr[0] if isinstance(oserr[0], int) else 0, oserr[1])
        raise ProviderError(f"cannot unpack into the image cache: {oserr[1]}", cause)
    return parse_answer(doc.get("ok"))


def parse_answer(ok: Any) -> ChildResult:
    """The child's answer, every field checked (it read hostile bytes); ``ValueError``
    (``ConfigInvalidError``) if malformed."""
    def strings(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise bad("the unpacking process gave a malformed answer")
        return tuple(v)
    if not isinstance(ok, dict) or not isinstance(ok.get("digest"), str) \
            or not _HEX64.fullmatch(ok["digest"]) or ok.get("source") not in _SOURCES \
            or not isinstance(ok.get("working_dir"), str) \
            or not isinstance(ok.get("user", ""), str):
        raise bad("the unpacking process gave a malformed answer")
    size = ok.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise bad("the unpacking process gave a malformed answer")
    config = ImageConfig(entrypoint=strings(ok.get("entrypoint")), cmd=strings(ok.get("cmd")),
                         env=strings(ok.get("env")), working_dir=ok["working_dir"],
                         user=ok.get("user", ""))
    return ChildResult(digest=ok["digest"], config=config, source=ok["source"], size=size)


# ---------------------------------------------------------------- in the child


def _confine(req: dict[str, Any]) -> None:
    import resource

    from corral.providers.linux import _sys_unsafe as su
    su.set_pdeathsig(signal.SIGKILL)  # die with the thread that waits for us
    if os.getppid() != req["ppid"]:
        os._exit(_EXIT_ORPHAN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails with EFBIG
    cpu = int(req["cpu_s"])
    for res, soft, hard in ((resource.RLIMIT_AS, req["memory"], req["memory"]),
                            (resource.RLIMIT_CPU, cpu, cpu + 1),
                            (resource.RLIMIT_FSIZE, req["file_bytes"], req["file_bytes"]),
                            (resource.RLIMIT_NOFILE, 64, 64),
                            (resource.RLIMIT_CORE, 0, 0)):
        _soft, cur = resource.getrlimit(res)
        if cur != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur), min(hard, cur)
        resource.setrlimit(res, (soft, hard))


def _work(req: dict[str, Any]) -> dict[str, Any]:
    import hashlib

    from corral.images.extract import disk_usage, extract_layers
    from corral.images.layers import Source, image_manifest, parse_config
    src = Source(req["image"])
    try:
        source, config_path, layers = image_manifest(src, req.get("ref"))
        raw = src.read(config_path)
        digest = hashlib.sha256(raw).hexdigest()
        if config_path.startswith("blobs/sha256/") and config_path[13:] != digest:
            raise bad(f"config blob {config_path!r} does not match its digest")
        config, diff_ids = parse_config(raw)
        if len(diff_ids) != len(layers):
            raise bad(f"{len(layers)} layers but {len(diff_ids)} diff_ids in the config")
        doc: dict[str, Any] = {"digest": digest, "source": source, "size": None,
                               "entrypoint": list(config.entrypoint), "cmd": list(config.cmd),
                               "env": list(config.env), "working_dir": config.working_dir,
                               "user": config.user}
        root = req["root"]
        if root is not None and os.path.isdir(os.path.join(root, digest, "rootfs")):
            return doc
        rootfs = os.path.join(req["tmp"], "rootfs")
        extract_layers(src, layers, diff_ids, rootfs, max_bytes=req["max_bytes"],
                       max_members=req["max_members"])
        doc["size"] = disk_usage(rootfs)
        return doc
    finally:
        src.close()


def main(request: str) -> None:
    """The child's entry point: ``request`` is the JSON :func:`unpack_bounded` sent."""
    req = json.loads(request)
    _confine(req)
    try:
        doc: dict[str, Any] = {"ok": _work(req)}
    except MemoryError:
        os._exit(_EXIT_MEMORY)
    except ConfigInvalidError as e:
        doc = {"refused": e.reason}
    except RecursionError:
        doc = {"refused": "the image nests too deep to read"}
    except OSError as e:  # the cache's own I/O: the image's reads are refusals above
        doc = {"oserror": [e.errno or 0, str(e)]}
    except Exception as e:  # a reader's unexpected failure on hostile bytes
        doc = {"refused": f"unreadable image ({type(e).__name__}: {str(e)[:200]})"}
    data = json.dumps(doc).encode()
    with contextlib.suppress(MemoryError):
        while data:
            data = data[os.write(1, data):]
        os._exit(0)
    os._exit(_EXIT_MEMORY)
