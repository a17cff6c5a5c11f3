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

__all__ = ["Member", "docker_archive", "layer_tar", "oci_archive", "oci_layout"]


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
    blobs = os.path.join(root, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)

    def put(data: bytes) -> str:
        digest = _sha(data)
        with open(os.path.join(blobs, digest[7:]), "wb") as f:
            f.write(data)
        return digest

    tars = [layer_tar(m) for m in layers]
    cfg = _config(tars, config)
    layer_descs = []
    for t in tars:
        blob = gzip.compress(t, mtime=0) if gzip_layers else t
        mt = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gzip_layers else "")
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
