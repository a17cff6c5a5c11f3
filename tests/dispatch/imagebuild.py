"""Build small OCI image layouts and docker-save tars in a temp dir (test helper)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Member", "deep_layer", "docker_archive", "header_bomb", "layer_tar", "oci_archive",
           "oci_layout", "oci_layout_blobs"]


@dataclass(frozen=True)
class Member:
    """One tar member: kind file|dir|symlink|hardlink|fifo."""

    name: str
    kind: str = "file"
    data: bytes = b""
    link: str = ""
    mode: int = 0o644


def layer_tar(members: Sequence[Member]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.mode = m.mode
            if m.kind == "file":
                info.size = len(m.data)
                tar.addfile(info, io.BytesIO(m.data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                         "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[m.kind]
            info.linkname = m.link
            tar.addfile(info)
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _config(layers: Sequence[bytes], config: dict[str, Any] | None) -> bytes:
    doc = {"architecture": "amd64", "os": "linux", "config": config or {},
           "rootfs": {"type": "layers", "diff_ids": [_sha(t) for t in layers]}}
    return json.dumps(doc).encode()


def oci_layout(root: str, layers: Sequence[Sequence[Member]], *, gzip_layers: bool = True,
               config: dict[str, Any] | None = None) -> str:
    """Write an OCI image layout at ``root``; returns ``root``."""
    tars = [layer_tar(m) for m in layers]
    blobs = [(gzip.compress(t, mtime=0) if gzip_layers else t, _sha(t)) for t in tars]
    return oci_layout_blobs(root, blobs, config=config)


def oci_layout_blobs(root: str, layers: Sequence[tuple[bytes, str]], *,
                     config: dict[str, Any] | None = None) -> str:
    """An OCI layout of ready-made layer blobs: (blob bytes, its diff_id) each; a blob
    starting with gzip's magic is labelled ``+gzip``. Returns ``root``."""
    blobs = os.path.join(root, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)

    def put(data: bytes) -> str:
        digest = _sha(data)
        with open(os.path.join(blobs, digest[7:]), "wb") as f:
            f.write(data)
        return digest

    doc = {"architecture": "amd64", "os": "linux", "config": config or {},
           "rootfs": {"type": "layers", "diff_ids": [d for _, d in layers]}}
    cfg = json.dumps(doc).encode()
    layer_descs = []
    for blob, _ in layers:
        gz = blob[:2] == b"\x1f\x8b"
        mt = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gz else "")
        layer_descs.append({"mediaType": mt, "digest": put(blob), "size": len(blob)})
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put(cfg), "size": len(cfg)},
        "layers": layer_descs}).encode()
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": put(manifest), "size": len(manifest)}]}
    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(root, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return root


def header_bomb(kind: str, mib: int) -> tuple[bytes, str]:
    """A gzip layer whose first tar header announces an extended record of ``mib``
    MiB (``kind`` ``pax``: a PAX header, ``longname``: a GNU long name), all zeros,
    then one ordinary file. About 1 KiB per MiB: gzip members of 1 MiB of zeros,
    repeated. Returns (blob, diff_id)."""
    info = tarfile.TarInfo("././@PaxHeader" if kind == "pax" else "././@LongLink")
    info.type = tarfile.XHDTYPE if kind == "pax" else tarfile.GNUTYPE_LONGNAME
    info.size = mib << 20
    head = info.tobuf(tarfile.USTAR_FORMAT)
    tail = layer_tar([Member("after", data=b"x")])
    sha = hashlib.sha256(head)
    zeros = bytes(1 << 20)
    for _ in range(mib):
        sha.update(zeros)
    sha.update(tail)
    blob = gzip.compress(head, mtime=0) + gzip.compress(zeros, mtime=0) * mib + \
        gzip.compress(tail, mtime=0)
    return blob, "sha256:" + sha.hexdigest()


def deep_layer(depth: int, count: int) -> tuple[bytes, str]:
    """A gzip layer of ``count`` files, each ``depth`` directories down the same path
    (every member makes the unpacker walk the whole chain again). Small: the
    headers repeat. Returns (blob, diff_id)."""
    parts = "/".join(["d"] * depth)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(count):
            tar.addfile(tarfile.TarInfo(f"{parts}/f{i}"), io.BytesIO(b""))
    data = buf.getvalue()
    return gzip.compress(data, compresslevel=6, mtime=0), _sha(data)


def _tar_dir(src: str, dest: str) -> str:
    with tarfile.open(dest, "w") as tar:
        for name in sorted(os.listdir(src)):
            tar.add(os.path.join(src, name), arcname=name)
    return dest


def oci_archive(workdir: str, layers: Sequence[Sequence[Member]], **kw: Any) -> str:
    """An OCI layout packed into one tar, as ``skopeo copy ... oci-archive:`` writes it."""
    layout = oci_layout(os.path.join(workdir, "layout-for-archive"), layers, **kw)
    return _tar_dir(layout, os.path.join(workdir, "image.oci.tar"))


def docker_archive(workdir: str, layers: Sequence[Sequence[Member]],
                   config: dict[str, Any] | None = None) -> str:
    """A tar as ``docker save`` (classic layout) writes it."""
    root = os.path.join(workdir, "docker-save")
    os.makedirs(root)
    tars = [layer_tar(m) for m in layers]
    cfg = _config(tars, config)
    cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
    with open(os.path.join(root, cfg_name), "wb") as f:
        f.write(cfg)
    paths = []
    for i, t in enumerate(tars):
        os.makedirs(os.path.join(root, f"l{i}"))
        with open(os.path.join(root, f"l{i}", "layer.tar"), "wb") as f:
            f.write(t)
        paths.append(f"l{i}/layer.tar")
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump([{"Config": cfg_name, "RepoTags": ["t:1"], "Layers": paths}], f)
    return _tar_dir(root, os.path.join(workdir, "image.docker.tar"))
