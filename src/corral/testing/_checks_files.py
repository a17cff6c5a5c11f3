"""Conformance check of the file operations (capability ``files``): list_files,
get_info, exists, make_dir, remove; their errors; and that none leaves the sandbox."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Awaitable

from corral.core.errors import ProviderError
from corral.core.spec import Capability
from corral.testing._kit import Kit, expect, expect_config_invalid as _refused, within

__all__ = ["check_file_ops"]


async def _raises(what: str, aw: Awaitable[object], exc: type[BaseException],
                  problems: list[str], *, err: int | None = None) -> None:
    try:
        await within(aw, 10.0, what)
    except exc as e:
        if err is not None and getattr(e, "errno", None) != err:
            problems.append(f"{what}: errno {getattr(e, 'errno', None)}, expected {err}")
    except Exception as e:
        problems.append(f"{what}: expected {exc.__name__}, got {type(e).__name__}: {e}")
    else:
        problems.append(f"{what}: did not raise (expected {exc.__name__})")


def _host_files(root: str) -> list[str]:
    out = []
    for dirpath, dirs, files in os.walk(root):
        out += [os.path.relpath(os.path.join(dirpath, n), root) for n in [*dirs, *files]]
    return sorted(out)


async def check_file_ops(k: Kit) -> None:
    """list_files / get_info / exists / make_dir / remove (capability ``files``): what
    they return, the builtin OSError of each refusal, and no path (``..``, absolute,
    through a symlink made inside) reaching outside; without the capability each
    raises ProviderError."""
    problems: list[str] = []
    async with k.sandbox() as sb:
        if Capability.FILES.value not in k.provider.capabilities:
            for name, aw in (("list_files", sb.list_files("")), ("get_info", sb.get_info("x")),
                             ("make_dir", sb.make_dir("x")), ("remove", sb.remove("x"))):
                await _raises(f"{name} without the 'files' capability", aw, ProviderError,
                              problems)
            if problems:
                raise AssertionError("; ".join(problems))
            return
        expect(await sb.make_dir("d/e") is True, "make_dir('d/e') must return True")
        expect(await sb.make_dir("d/e") is False, "make_dir of an existing dir must return False")
        await _raises("make_dir('x/y', parents=False)", sb.make_dir("x/y", parents=False),
                      FileNotFoundError, problems)
        await sb.write_file("d/e/f.txt", b"abc")
        got = await sb.list_files("d/e")
        expect([(f.name, f.type, f.size) for f in got] == [("f.txt", "file", 3)],
               f"list_files('d/e'): {got}")
        info = await sb.get_info("d/e/f.txt")
        expect(info.type == "file" and info.size == 3 and info.path.endswith("/d/e/f.txt")
               and info.name == "f.txt" and info.mode & 0o400, f"get_info('d/e/f.txt'): {info}")
        expect(info == got[0], f"get_info and list_files disagree: {info} != {got[0]}")
        expect((await sb.get_info("d")).type == "dir", "get_info('d') must say dir")
        expect("d" in [f.name for f in await sb.list_files()], "list_files() must show 'd'")
        expect(await sb.exists("d/e/f.txt") and not await sb.exists("d/nope"), "exists()")
        await _raises("list_files of a file", sb.list_files("d/e/f.txt"), NotADirectoryError,
                      problems)
        await _raises("list_files of nothing", sb.list_files("nope"), FileNotFoundError,
                      problems)
        await _raises("get_info of nothing", sb.get_info("nope"), FileNotFoundError, problems)
        await _raises("make_dir over a file", sb.make_dir("d/e/f.txt"), FileExistsError,
                      problems)
        await _raises("remove of a dir that is not empty", sb.remove("d"), OSError, problems,
                      err=errno.ENOTEMPTY)
        await _raises("remove of nothing", sb.remove("nope"), FileNotFoundError, problems)
        await sb.remove("d/e/f.txt")
        expect(not await sb.exists("d/e/f.txt"), "remove of a file left it")
        await sb.remove("d", recursive=True)
        expect(not await sb.exists("d"), "remove(recursive=True) left the dir")
        # nothing leaves the sandbox
        u = uuid.uuid4().hex[:8]
        outside = ["../x", f"../corral-kit-{u}", "a/../../x", "/etc", k.host_dir,
                   os.path.join(k.host_dir, "secret"), "/"]
        for p in outside:
            await _refused(f"list_files({p!r})", sb.list_files(p), problems)
            await _refused(f"get_info({p!r})", sb.get_info(p), problems)
            await _refused(f"make_dir({p!r})", sb.make_dir(p), problems)
            await _refused(f"remove({p!r})", sb.remove(p, recursive=True), problems)
        await _refused("remove('') (the work dir itself)", sb.remove("", recursive=True),
                       problems)
        if k.processes:
            secret = os.path.join(k.host_dir, "secret")
            with open(secret, "wb") as fh:
                fh.write(b"host secret")
            before = _host_files(k.host_dir)
            r = await k.run(sb, "import os\n"
                                f"os.symlink({k.host_dir!r}, 'hostdir')\n"
                                "os.symlink('..', 'up'); os.symlink('/', 'root')\n"
                                "os.symlink('/etc/passwd', 'passwd')\n")
            expect(r.exit_code == 0, f"exec creating symlinks failed: {r.stderr[-300:]!r}")
            link = await sb.get_info("passwd")
            expect(link.type == "symlink" and link.symlink_target == "/etc/passwd",
                   f"get_info of a symlink must not follow it: {link}")
            for p in ("hostdir", "up", "root"):
                await _refused(f"list_files({p!r}) (a symlink made inside)", sb.list_files(p),
                               problems)
            for p in ("hostdir/secret", "root/etc", "up/x"):
                await _refused(f"get_info({p!r}) through a symlink", sb.get_info(p), problems)
                await _refused(f"make_dir({p!r}/n) through a symlink",
                               sb.make_dir(p + "/n"), problems)
                await _refused(f"remove({p!r}) through a symlink",
                               sb.remove(p, recursive=True), problems)
            await sb.remove("hostdir", recursive=True)  # the link, never what it names
            expect(not await sb.exists("hostdir"), "remove of a symlink left it")
            after = _host_files(k.host_dir)
            if after != before:
                problems.append(f"files outside the sandbox changed: {after} (was {before})")
    if problems:
        raise AssertionError(f"{len(problems)} problem(s): " + "; ".join(problems))
