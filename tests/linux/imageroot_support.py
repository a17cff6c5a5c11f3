"""Images the image-root tests build themselves.

``busybox_layout``: an OCI layout of the host's ``busybox-static`` (a few KiB of
JSON plus the binary), with a config setting ``Env`` and ``WorkingDir``; built per
test in a temp dir, in milliseconds.

``python_numpy_rootfs``: **the one slow build** (about a minute cold, then cached):
a Debian minbase root (``debootstrap --variant=minbase``) with ``python3`` and
``python3-numpy``, from the host's own Debian mirror (a package registry), kept
under ``/var/cache/corral-images-test/<key>/rootfs`` (``$CORRAL_IMAGES_TEST_CACHE``;
a dir the sandbox's own uid can walk to, which ``~root`` is not) where ``key`` hashes every input
of the build (mirror, suite, packages, this recipe's version). A second run, or a
second test, reuses it. Skipped (None) when the host has no ``debootstrap`` or is
not root; built at most once per key (a lock file), into a temp dir renamed when
complete, so a cut-off build is never used.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from typing import Any

CACHE = os.environ.get("CORRAL_IMAGES_TEST_CACHE", "/var/cache/corral-images-test")
SUITE = "bookworm"
PACKAGES = ("python3", "python3-numpy")
RECIPE = "v1 minbase trim-docs"


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(files: dict[str, bytes], links: dict[str, str]) -> tuple[bytes, str]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted({os.path.dirname(p) for p in [*files, *links]} - {""}):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    raw = buf.getvalue()
    return gzip.compress(raw, compresslevel=1, mtime=0), _sha(raw)


def busybox_layout(root: str, config: dict[str, Any] | None = None,
                   extra: dict[str, bytes] | None = None) -> str:
    """An OCI layout at ``root`` holding one image: the host's busybox at /bin/busybox
    with its applets linked in /bin, an /etc/passwd, an /app dir (a file in it), plus
    ``extra`` files; ``config`` is the image config's ``config`` object."""
    bb = shutil.which("busybox")
    assert bb is not None, "busybox-static is needed"
    with open(bb, "rb") as f:
        files = {"bin/busybox": f.read()}
    files["etc/passwd"] = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
    files["etc/group"] = b"root:x:0:\n"
    files["etc/image-marker"] = b"from the image\n"
    files["app/hello.txt"] = b"hello from /app\n"
    files.update(extra or {})
    applets = ("sh", "ls", "cat", "echo", "true", "id", "env", "pwd", "mkdir", "touch", "test",
               "wc", "head", "stat", "sleep", "readlink", "grep", "dd", "rm", "mount")
    links = {f"bin/{a}": "busybox" for a in applets}
    blob, diff_id = _layer(files, links)
    cfg = json.dumps({"architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(
        os.uname().machine, os.uname().machine), "os": "linux", "config": config or {},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _sha(cfg), "size": len(cfg)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _sha(blob), "size": len(blob)}]}).encode()
    blobs = os.path.join(root, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    for data in (cfg, blob, manifest):
        with open(os.path.join(blobs, _sha(data)[7:]), "wb") as f:
            f.write(data)
    with open(os.path.join(root, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": _sha(manifest), "size": len(manifest)}]}, f)
    return root


def _mirror() -> str:
    try:
        with open("/etc/apt/sources.list.d/debian.sources") as f:
            for line in f:
                if line.startswith("URIs:") and line.split()[-1].rstrip("/").endswith("debian"):
                    return line.split()[-1]
    except OSError:
        pass
    return "http://deb.debian.org/debian"


def python_numpy_rootfs() -> str | None:
    """The cached Debian root with python3 and numpy (built on first use; see the
    module docstring), or None where it cannot be built here."""
    return debian_rootfs(PACKAGES, "usr/bin/python3")


#: the Node.js handler image's packages (Debian's node 18: the handler is JavaScript)
NODE_PACKAGES = ("nodejs",)


def node_rootfs() -> str | None:
    """The cached Debian root with Debian's ``nodejs`` (built like the python one, about
    35 s cold), or None where it cannot be built here."""
    return debian_rootfs(NODE_PACKAGES, "usr/bin/node")


def debian_rootfs(packages: tuple[str, ...], probe: str) -> str | None:
    """A cached Debian minbase root with ``packages`` (``probe``: a file it must have)."""
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        return None
    mirror = _mirror()
    key = hashlib.sha256(repr((mirror, SUITE, packages, RECIPE)).encode()).hexdigest()[:16]
    home = os.path.join(CACHE, key)
    rootfs = os.path.join(home, "rootfs")
    os.makedirs(home, mode=0o755, exist_ok=True)
    os.chmod(CACHE, 0o755)
    with open(os.path.join(home, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(os.path.join(rootfs, probe)):
            return rootfs
        build = os.path.join(home, "build")
        shutil.rmtree(build, ignore_errors=True)
        log = os.path.join(home, "debootstrap.log")
        with open(log, "wb") as out:
            done = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
                 SUITE, build, mirror], stdout=out, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            shutil.rmtree(build, ignore_errors=True)
            raise RuntimeError(f"debootstrap failed ({done.returncode}); see {log}")
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                    "usr/share/man", "usr/share/locale", "usr/share/info"):
            shutil.rmtree(os.path.join(build, sub), ignore_errors=True)
        os.chmod(build, 0o755)
        os.rename(build, rootfs)
        return rootfs


def rootfs_layer(rootfs: str) -> tuple[str, str]:
    """A cached gzip layer of the whole tree ``rootfs`` (a :func:`debian_rootfs`), next to
    it: (path of the blob, its diff_id). Device nodes, fifos and sockets are left out;
    written to a temp name and renamed when complete, under the root's build lock."""
    home = os.path.dirname(rootfs)
    blob, did = os.path.join(home, "layer.tar.gz"), os.path.join(home, "layer.diffid")
    with open(os.path.join(home, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(blob) and os.path.isfile(did):
            with open(did) as f:
                return blob, f.read().strip()
        raw = os.path.join(home, ".layer.tar")
        with tarfile.open(raw, "w", format=tarfile.PAX_FORMAT) as tar:
            for top, dirs, names in os.walk(rootfs):
                dirs.sort()
                for name in sorted(dirs) + sorted(names):
                    path = os.path.join(top, name)
                    info = tar.gettarinfo(path, os.path.relpath(path, rootfs))
                    if info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE) or (
                            not info.isreg() and not info.isdir() and not info.issym()
                            and not info.islnk()):
                        continue
                    info.mtime = 0
                    if info.isreg():
                        with open(path, "rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info)
        digest = hashlib.sha256()
        with open(raw, "rb") as src, gzip.GzipFile(blob + ".tmp", "wb", compresslevel=1,
                                                   mtime=0) as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
        os.unlink(raw)
        os.rename(blob + ".tmp", blob)
        with open(did, "w") as f:
            f.write("sha256:" + digest.hexdigest())
        return blob, "sha256:" + digest.hexdigest()
