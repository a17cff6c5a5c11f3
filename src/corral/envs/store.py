"""The environment store: content-addressed, read-only package trees on the host.

Layout under the store's root (``default_root()``: ``/var/cache/corral/envs`` as
root, ``~/.cache/corral/envs`` otherwise, or ``$CORRAL_ENV_DIR``)::

    objects/<digest>/site/       the installed packages (read-only)
    objects/<digest>/meta.json   what was built, from what, and its top-level modules
    names/<name>.json            {"digest": ...}: a name points at one digest
    used/<digest>                touched on each use (LRU eviction reads its mtime)
    locks/<digest>.lock          flock: one build of a digest at a time
    tmp/                         builds in progress (renamed into objects/ when done)

A digest is the sha256 of the build's inputs (:func:`digest_of`). Publishing is a
rename of a finished tree from ``tmp/`` into ``objects/``; a failed build leaves
nothing (its temp dir is removed).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import sysconfig
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from corral.core.errors import ConfigInvalidError

__all__ = ["ENV_MOUNT", "DEFAULT_MAX_BYTES", "EnvStore", "Environment", "check_root",
           "default_root", "digest_of", "normalize_requirements", "valid_name"]

#: where an environment's packages are seen inside a sandbox (read-only)
ENV_MOUNT: Final = "/opt/corral/env"
#: the store's default size bound (LRU eviction past it)
DEFAULT_MAX_BYTES: Final = 8 * 1024 * 1024 * 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_META_CAP = 4 * 1024 * 1024


def valid_name(name: object) -> str:
    """``name`` if it is a usable environment name (letters, digits, ``._-``)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigInvalidError(
            "environment", f"not an environment name: {name!r} (letters, digits, '._-', "
            "up to 64, starting with a letter or digit)")
    return name


def default_root() -> Path:
    """``$CORRAL_ENV_DIR``, else /var/cache/corral/envs as root, else
    ~/.cache/corral/envs."""
    env = os.environ.get("CORRAL_ENV_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/corral/envs")
    return Path.home() / ".cache" / "corral" / "envs"


def normalize_requirements(lines: Sequence[str] | str) -> tuple[str, ...]:
    """Requirement lines without comments, blank lines or repeated spaces, sorted and
    unique (the order of a requirements file does not change what pip installs).

    Options (``-r``, ``--index-url``, ``-e`` ...) are refused: the index and the
    build's flags are the builder's, part of the digest."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    out: set[str] = set()
    for raw in lines:
        if not isinstance(raw, str):
            raise ConfigInvalidError("requirements", f"not a requirement line: {raw!r}")
        line = raw.split(" #", 1)[0].strip()
        if line.startswith("#") or not line:
            continue
        if line.startswith("-"):
            raise ConfigInvalidError(
                "requirements", f"options are not taken in a requirements list: {line!r} "
                "(the index and build flags are the builder's arguments)")
        if any(c in line for c in "\0\r\n"):
            raise ConfigInvalidError("requirements", f"not a requirement line: {line!r}")
        out.add(" ".join(line.split()))
    if not out:
        raise ConfigInvalidError("requirements", "no requirement given")
    return tuple(sorted(out))


def digest_of(inputs: Mapping[str, Any]) -> str:
    """The sha256 of ``inputs`` as canonical JSON (sorted keys, no spaces)."""
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True, slots=True)
class Environment:
    """A built environment: a read-only package tree on the host.

    Attributes:
        name: the name it was built or looked up under ("" when looked up by digest).
        digest: sha256 of its inputs (interpreter, platform, requirements, index...).
        path: its host directory (``site/`` holds the packages, ``meta.json`` the facts).
        modules: the top-level importable names its packages install.
        requirements: the normalized requirement lines it was built from.
        size_bytes: the size of its packages.
    """

    name: str
    digest: str
    path: Path
    modules: frozenset[str] = frozenset()
    requirements: tuple[str, ...] = ()
    size_bytes: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def site(self) -> Path:
        """The host dir of the packages (what a sandbox sees at :data:`ENV_MOUNT`)."""
        return self.path / "site"

    def sandbox_binds(self) -> list[tuple[str, str]]:
        """(host path, path inside) pairs, each bound read-only into a sandbox."""
        return [(str(self.site), ENV_MOUNT)]

    def allowed_imports(self) -> frozenset[str]:
        """What a snippet's validator allows of it: each top-level module and its
        submodules (``pandas``, ``pandas.*``): a package imports its own submodules
        lazily, through the snippet's import."""
        return frozenset(self.modules) | frozenset(f"{m}.*" for m in self.modules)

    def sandbox_env(self) -> dict[str, str]:
        """The variables every command of a sandbox using it gets (``PYTHONPATH``)."""
        return {"PYTHONPATH": ENV_MOUNT, "CORRAL_ENVIRONMENT": self.digest}

    @property
    def image(self) -> str | None:
        """The digest of the base image it was built on (``sha256:<config digest>``),
        None when built for the host's interpreter."""
        inputs = self.meta.get("inputs")
        got = inputs.get("image") if isinstance(inputs, Mapping) else None
        return got if isinstance(got, str) and got else None


def check_root(env: Environment, image: str | None) -> None:
    """Refuse ``env`` in a sandbox whose root is the image of key ``image`` (None: the
    host's view, with the host's interpreter) unless it was built for that root: its
    packages' compiled parts and paths are for one interpreter (ConfigInvalidError,
    field ``environment``, saying which root it was built for)."""
    built = env.image
    label = env.name or env.digest[:12]
    if built is None and image is None:
        # the host's: but which interpreter? A store is shared by every corral on the
        # host, and a name points at the last build of it, whatever it was built for
        inputs = env.meta.get("inputs")
        interp = inputs.get("interpreter") if isinstance(inputs, Mapping) else None
        here = sysconfig.get_config_var("SOABI") or ""
        if isinstance(interp, Mapping) and here and interp.get("soabi") != here:
            raise ConfigInvalidError(
                "environment", f"environment {label!r} is built for another interpreter "
                f"({interp.get('soabi') or 'unknown'}); this one is {here} (build it again "
                "with this interpreter: corral env build NAME -r ...)")
        return
    if built == image:
        return
    if built is None:
        why = (f"environment {label!r} is built for the host's interpreter; this "
               f"sandbox's root is the image {image} and runs the image's own (build it "
               "on that image: corral env build NAME --image REF, or drop image=)")
    elif image is None:
        why = (f"environment {label!r} is built on the image {built}, for its "
               "interpreter; this sandbox runs the host's (give image= that image)")
    else:
        why = (f"environment {label!r} is built on the image {built}; this sandbox's "
               f"root is another image, {image} (build the environment on it)")
    raise ConfigInvalidError("environment", why)


class EnvStore:
    """The environments under ``root`` (see the module doc for the layout)."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ConfigInvalidError("max_bytes", f"must be a positive integer, got {max_bytes!r}")
        self.root = Path(root) if root is not None else default_root()
        self.max_bytes = max_bytes

    # -- layout --------------------------------------------------------------------
    def _dir(self, part: str) -> Path:
        d = self.root / part
        d.mkdir(parents=True, exist_ok=True)
        # the sandbox's user (a uid of its own) walks to the packages: 0755 all the way
        for p in (self.root, d):
            with contextlib.suppress(OSError):
                if stat.S_IMODE(p.stat().st_mode) != 0o755 and p.stat().st_uid == os.geteuid():
                    os.chmod(p, 0o755)
        return d

    def object_dir(self, digest: str) -> Path:
        return self.root / "objects" / digest

    # -- lookups -------------------------------------------------------------------
    def get(self, name_or_digest: str) -> Environment:
        """The environment named ``name_or_digest`` (a name, a full digest, or
        ``sha256:<digest>``); ConfigInvalidError (field ``environment``) if none."""
        if not isinstance(name_or_digest, str) or not name_or_digest:
            raise ConfigInvalidError("environment", "must be a non-empty string")
        ref = name_or_digest.removeprefix("sha256:")
        name = ""
        if _DIGEST.match(ref):
            digest = ref
        else:
            name = valid_name(name_or_digest)
            digest = self._name_digest(name) or ""
            if not digest:
                raise ConfigInvalidError(
                    "environment", f"no environment named {name!r} in {self.root} "
                    f"(build it: corral env build {name} -r requirements.txt)")
        env = self._load(digest, name)
        if env is None:
            raise ConfigInvalidError(
                "environment", f"environment {name_or_digest!r} is not in {self.root} "
                "(evicted or removed: build it again)")
        self.touch(digest)
        return env

    def find(self, digest: str, name: str = "") -> Environment | None:
        """The environment of ``digest`` if it is built (a cache hit), else None."""
        return self._load(digest, name)

    def _name_digest(self, name: str) -> str | None:
        try:
            doc = json.loads((self.root / "names" / f"{name}.json").read_text())
        except (OSError, ValueError):
            return None
        d = doc.get("digest") if isinstance(doc, dict) else None
        return d if isinstance(d, str) and _DIGEST.match(d) else None

    def _load(self, digest: str, name: str) -> Environment | None:
        if not _DIGEST.match(digest):
            return None
        obj = self.object_dir(digest)
        try:
            with open(obj / "meta.json", "rb") as f:
                meta = json.loads(f.read(_META_CAP))
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("digest") != digest:
            return None
        return Environment(
            name=name, digest=digest, path=obj,
            modules=frozenset(str(m) for m in meta.get("modules", [])),
            requirements=tuple(str(r) for r in meta.get("requirements", [])),
            size_bytes=int(meta.get("size_bytes", 0)), meta=meta)

    def names(self) -> dict[str, str]:
        """name -> digest, for every name in the store."""
        out = {}
        d = self.root / "names"
        if d.is_dir():
            for p in sorted(d.glob("*.json")):
                digest = self._name_digest(p.stem)
                if digest:
                    out[p.stem] = digest
        return out

    def all(self) -> list[Environment]:
        """Every built environment (named ones under their first name)."""
        by_digest: dict[str, str] = {}
        for n, d in self.names().items():
            by_digest.setdefault(d, n)
        out = []
        objs = self.root / "objects"
        if objs.is_dir():
            for p in sorted(objs.iterdir()):
                env = self._load(p.name, by_digest.get(p.name, ""))
                if env is not None:
                    out.append(env)
        return out

    def image_facts(self, image: str) -> dict[str, Any] | None:
        """What was read inside the base image of key ``image`` (its interpreter:
        :func:`corral.envs.build.probe_image`), if it was, else None."""
        hexd = image.removeprefix("sha256:")
        if not _DIGEST.match(hexd):
            return None
        try:
            with open(self.root / "images" / f"{hexd}.json", "rb") as f:
                doc = json.loads(f.read(65536))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and doc.get("image") == image else None

    def set_image_facts(self, image: str, facts: Mapping[str, Any]) -> None:
        """Record ``facts`` of the base image ``image`` (atomically; a function of the
        image's content, so never stale)."""
        hexd = image.removeprefix("sha256:")
        if not _DIGEST.match(hexd):
            return
        d = self._dir("images")
        tmp = d / f".{hexd}.{uuid.uuid4().hex}"
        tmp.write_text(json.dumps({**facts, "image": image}, sort_keys=True))
        os.chmod(tmp, 0o644)
        os.replace(tmp, d / f"{hexd}.json")

    # -- writes --------------------------------------------------------------------
    def touch(self, digest: str) -> None:
        """Mark ``digest`` used now (LRU)."""
        with contextlib.suppress(OSError):
            p = self._dir("used") / digest
            p.touch()
            os.utime(p)

    def last_used(self, digest: str) -> float:
        try:
            return (self.root / "used" / digest).stat().st_mtime
        except OSError:
            try:
                return self.object_dir(digest).stat().st_mtime
            except OSError:
                return 0.0

    def set_name(self, name: str, digest: str) -> None:
        """Point ``name`` at ``digest`` (atomically)."""
        valid_name(name)
        d = self._dir("names")
        tmp = d / f".{name}.{uuid.uuid4().hex}"
        tmp.write_text(json.dumps({"digest": digest}))
        os.chmod(tmp, 0o644)
        os.replace(tmp, d / f"{name}.json")

    # -- users ---------------------------------------------------------------------
    def _use_file(self, digest: str) -> int:
        return os.open(self._dir("locks") / f"{digest}.use",
                       os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def hold(self, digest: str) -> int:
        """Mark ``digest`` in use until the returned fd is closed (a shared flock on
        ``locks/<digest>.use``): :meth:`evict` passes it by and :meth:`remove` refuses
        it meanwhile, so no file goes from under a live sandbox. ConfigInvalidError
        (field ``environment``) when it is being removed or gone."""
        if not _DIGEST.match(digest):
            raise ConfigInvalidError("environment", f"not a digest: {digest!r}")
        fd = self._use_file(digest)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigInvalidError("environment", f"environment {digest[:12]} is being "
                                     "removed (build it again)") from None
        if not (self.object_dir(digest) / "meta.json").exists():
            os.close(fd)
            raise ConfigInvalidError("environment", f"environment {digest[:12]} is not in "
                                     f"{self.root} (evicted or removed: build it again)")
        return fd

    @contextlib.contextmanager
    def _unused(self, digest: str) -> Iterator[bool]:
        """Whether nobody holds ``digest`` (see :meth:`hold`); while True, nobody can
        start to (an exclusive flock on its use file, held for the block)."""
        fd = self._use_file(digest)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def lock(self, digest: str) -> Iterator[None]:
        """Hold the build lock of ``digest`` (blocks while another build holds it)."""
        path = self._dir("locks") / f"{digest}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def new_temp(self) -> Path:
        """A fresh dir under ``tmp/`` for a build in progress."""
        d = self._dir("tmp") / f"{uuid.uuid4().hex}"
        d.mkdir(mode=0o755)
        os.chmod(d, 0o755)
        return d

    def publish(self, temp: Path, digest: str) -> Environment:
        """Move the finished tree ``temp`` (``site/`` and ``meta.json``) to
        ``objects/<digest>``, read-only; the caller holds ``lock(digest)``."""
        self._dir("objects")
        make_read_only(temp)
        dst = self.object_dir(digest)
        if dst.exists():  # a leftover without meta (a crash between rename and use)
            self._drop(dst)
        os.rename(temp, dst)
        self.touch(digest)
        env = self._load(digest, "")
        if env is None:
            raise ConfigInvalidError("environment", f"published {digest} has no usable meta")
        return env

    def remove(self, name_or_digest: str) -> list[str]:
        """Remove a name (and its environment when no other name points at it), or a
        digest and every name pointing at it. Returns the digests removed."""
        ref = name_or_digest.removeprefix("sha256:")
        names = self.names()
        if _DIGEST.match(ref):
            digest, drop = ref, [n for n, d in names.items() if d == ref]
        else:
            valid_name(name_or_digest)
            if name_or_digest not in names:
                raise ConfigInvalidError("environment",
                                         f"no environment named {name_or_digest!r}")
            digest, drop = names[name_or_digest], [name_or_digest]
        def unname() -> None:
            for n in drop:
                with contextlib.suppress(FileNotFoundError):
                    (self.root / "names" / f"{n}.json").unlink()
        if (any(d == digest for n, d in names.items() if n not in drop)
                or not self.object_dir(digest).exists()):
            unname()  # another name keeps the tree (or there is none)
            return []
        with self.lock(digest), self._unused(digest) as unused:
            if not unused:  # refused whole: the names stay too
                raise ConfigInvalidError(
                    "environment", f"environment {name_or_digest!r} is in use by a live "
                    "sandbox (destroy it first)")
            unname()
            self._drop(self.object_dir(digest))
        with contextlib.suppress(FileNotFoundError):
            (self.root / "used" / digest).unlink()
        return [digest]

    def _drop(self, path: Path) -> None:
        """Remove a (read-only) tree: renamed aside first, so no reader sees half."""
        aside = self._dir("tmp") / f"gone-{uuid.uuid4().hex}"
        os.rename(path, aside)
        remove_tree(aside)

    def total_bytes(self) -> int:
        return sum(e.size_bytes for e in self.all())

    def evict(self, *, keep: Sequence[str] = ()) -> list[str]:
        """Remove least-recently-used environments until the store is within
        ``max_bytes`` (never one in ``keep``). Returns the digests removed."""
        envs = self.all()
        total = sum(e.size_bytes for e in envs)
        gone: list[str] = []
        for env in sorted(envs, key=lambda e: self.last_used(e.digest)):
            if total <= self.max_bytes:
                break
            if env.digest in keep:
                continue
            with self.lock(env.digest), self._unused(env.digest) as unused:
                if not unused:  # a live sandbox has it: never from under it
                    continue
                for n, d in self.names().items():
                    if d == env.digest:
                        with contextlib.suppress(FileNotFoundError):
                            (self.root / "names" / f"{n}.json").unlink()
                if self.object_dir(env.digest).exists():
                    self._drop(self.object_dir(env.digest))
            with contextlib.suppress(FileNotFoundError):
                (self.root / "used" / env.digest).unlink()
            total -= env.size_bytes
            gone.append(env.digest)
        return gone

    def clean_temp(self, older_than_s: float = 3600.0) -> None:
        """Remove build dirs left by a crashed builder (older than ``older_than_s``)."""
        d = self.root / "tmp"
        if not d.is_dir():
            return
        now = time.time()
        for p in d.iterdir():
            with contextlib.suppress(OSError):
                if now - p.lstat().st_mtime > older_than_s:
                    remove_tree(p)


def make_read_only(root: Path) -> None:
    """Every dir 0555, every file 0444 (0555 if it was executable); symlinks are not
    followed (they resolve inside the sandbox that reads the tree)."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for n in filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                os.chmod(p, 0o555 if st.st_mode & 0o100 else 0o444)
        for n in dirnames:
            p = os.path.join(dirpath, n)
            if stat.S_ISDIR(os.lstat(p).st_mode):
                os.chmod(p, 0o555)
    os.chmod(root, 0o555)


def remove_tree(path: Path) -> None:
    """Remove ``path``, a tree that may be read-only."""
    if not path.is_symlink() and path.is_dir():
        for dirpath, dirnames, _f in os.walk(path):
            for n in dirnames:
                with contextlib.suppress(OSError):
                    if not os.path.islink(os.path.join(dirpath, n)):
                        os.chmod(os.path.join(dirpath, n), 0o755)
        with contextlib.suppress(OSError):
            os.chmod(path, 0o755)
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
