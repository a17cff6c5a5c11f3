"""Conformance checks of the sandbox methods: exec, files, path escapes, isolation,
streaming, kill, timeout, destroy."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
import uuid
from collections.abc import Awaitable

from corral.core.errors import ProviderError, SandboxTimeoutError
from corral.core.result import RunResult
from corral.core.spec import ExecOpts, NetworkPolicy, ProcessOpts
from corral.testing._kit import (
    Kit,
    drain,
    expect,
    expect_config_invalid as _refused,
    read_until,
    within,
)

__all__ = ["check_destroy", "check_exec", "check_files", "check_isolation", "check_kill",
           "check_network_allowlist", "check_path_escape", "check_streaming", "check_timeout"]

# A child that forks a grandchild holding stdout/stderr, then prints ``up`` and sleeps:
# a provider that kills only the direct child never sees EOF on the pipes.
_SLEEPER_TREE = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    time.sleep(30); os._exit(0)\n"
    "sys.stdout.write('up\\n'); sys.stdout.flush()\n"
    "time.sleep(30)\n"
)


def _brief(r: RunResult) -> str:
    return f"exit {r.exit_code}, stdout {r.stdout[:200]!r}, stderr {r.stderr[-300:]!r}"


async def check_exec(k: Kit) -> None:
    """exec gives byte-exact output, exit codes (-9 for SIGKILL), stdin and env."""
    spec = k.spec()
    async with k.sandbox(spec) as sb:
        expect(isinstance(sb.id, str) and sb.id, f"sandbox.id must be a non-empty str: {sb.id!r}")
        expect(sb.spec == spec, "sandbox.spec must be the spec it was created from")
        r = await k.run(sb, "import sys; sys.stdout.buffer.write(b'out\\x00\\xff\\n'); "
                            "sys.stderr.buffer.write(b'err\\x01')")
        expect(isinstance(r, RunResult), f"exec must return RunResult, got {type(r).__name__}")
        expect((r.stdout, r.stderr, r.exit_code) == (b"out\x00\xff\n", b"err\x01", 0),
               f"exec output not byte-exact: {_brief(r)}")
        r = await k.run(sb, "import sys; sys.exit(3)")
        expect(r.exit_code == 3, f"sys.exit(3) must give exit_code 3: {_brief(r)}")
        r = await k.run(sb, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        expect(r.exit_code == -9,
               f"a command killed by SIGKILL must give exit_code -9: {_brief(r)}")
        r = await k.run(sb, "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])",
                        ExecOpts(stdin=b"abc\x00def"))
        expect(r.stdout == b"fed\x00cba", f"ExecOpts.stdin not delivered: {_brief(r)}")
        r = await k.run(sb, "import os; print(os.environ.get('CORRAL_KIT_VAR'))",
                        ExecOpts(env={"CORRAL_KIT_VAR": "v-1"}))
        expect(r.stdout.strip() == b"v-1", f"ExecOpts.env not delivered: {_brief(r)}")


async def check_files(k: Kit) -> None:
    """write_file / read_file round-trip bytes (8 MiB too), replace, UTF-8, FileNotFoundError."""
    async with k.sandbox() as sb:
        small = bytes(range(256))
        await sb.write_file("bin/all.bin", small)
        got = await sb.read_file("bin/all.bin")
        expect(got == small, f"256-byte round trip differs: got {len(got)} bytes")
        big = random.Random(1234).randbytes(8 << 20)
        await within(sb.write_file("big.bin", big), 30.0, "write_file of 8 MiB")
        got = await within(sb.read_file("big.bin"), 30.0, "read_file of 8 MiB")
        if got != big:
            at = next((i for i, (a, b) in enumerate(zip(got, big, strict=False)) if a != b),
                      min(len(got), len(big)))
            raise AssertionError(f"8 MiB round trip differs: {len(got)} bytes, first diff at {at}")
        await sb.write_file("over.txt", b"a long first content")
        await sb.write_file("over.txt", b"short")
        got = await sb.read_file("over.txt")
        expect(got == b"short", f"write_file must replace the file: got {got!r}")
        await sb.write_file("text.txt", "h\u00e9llo")
        got = await sb.read_file("text.txt")
        expect(got == "h\u00e9llo".encode(), f"str data must be written as UTF-8: got {got!r}")
        try:
            await within(sb.read_file("no/such/file.txt"), 10.0, "read_file of a missing file")
        except FileNotFoundError:
            pass
        else:
            raise AssertionError("read_file of a missing file must raise FileNotFoundError")
        if not k.processes:
            return
        r = await k.run(sb, "import hashlib; print(hashlib.sha256(open('big.bin','rb').read())"
                            ".hexdigest(), open('bin/all.bin','rb').read() == bytes(range(256)))")
        want = f"{hashlib.sha256(big).hexdigest()} True".encode()
        expect(r.stdout.strip() == want, f"a written file must be visible to exec: {_brief(r)}")
        r = await k.run(sb, "import os; os.makedirs('out', exist_ok=True); "
                            "open('out/x.bin','wb').write(bytes(range(256))[::-1])")
        expect(r.exit_code == 0, f"exec writing a file failed: {_brief(r)}")
        got = await sb.read_file("out/x.bin")
        expect(got == small[::-1], f"a file written by exec must be readable: got {got[:32]!r}")
        r = await k.run(sb, "print(len(open('all.bin','rb').read()))", ExecOpts(cwd="bin"))
        expect(r.stdout.strip() == b"256", f"ExecOpts.cwd='bin' not honoured: {_brief(r)}")


def _host_state(root: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


async def check_path_escape(k: Kit) -> None:
    """``..``, absolute paths outside and symlinks leading out raise ConfigInvalidError."""
    secret = os.path.join(k.host_dir, "secret")
    with open(secret, "wb") as fh:
        fh.write(b"host secret")
    before = _host_state(k.host_dir)
    u = uuid.uuid4().hex[:8]
    problems: list[str] = []
    async with k.sandbox() as sb:
        await sb.write_file("real/known.txt", b"known")
        reads = ["../x", f"../corral-kit-{u}", "a/../../x", "/etc/passwd", secret, "/", ""]
        writes = [f"../corral-kit-{u}", f"a/../../corral-kit-{u}",
                  os.path.join(k.host_dir, "abs-write"), k.host_dir + "/", ""]
        for p in reads:
            await _refused(f"read_file({p!r})", sb.read_file(p), problems)
        for p in writes:  # never a system path: a broken provider would overwrite it
            await _refused(f"write_file({p!r})", sb.write_file(p, b"escaped"), problems)
        if k.processes:
            code = ("import os\n"
                    f"os.symlink({k.host_dir!r}, 'hostdir'); os.symlink({secret!r}, 'hostfile')\n"
                    "os.symlink('/etc/passwd', 'passwd'); os.symlink('..', 'up')\n"
                    "os.symlink('/', 'root')\n"
                    "print(os.path.basename(os.getcwd()))\n")
            r = await k.run(sb, code)
            expect(r.exit_code == 0, f"exec creating symlinks failed: {_brief(r)}")
            here = r.stdout.decode(errors="replace").strip()
            for p in ["hostfile", "passwd", "hostdir/secret", "root/etc/passwd",
                      *([f"up/{here}/real/known.txt"] if here else [])]:
                await _refused(f"read_file({p!r}) through a symlink made in the sandbox",
                               sb.read_file(p), problems)
            for p in ["hostfile", "hostdir/new.txt", *([f"up/{here}/real/up.txt"] if here else [])]:
                await _refused(f"write_file({p!r}) through a symlink made in the sandbox",
                               sb.write_file(p, b"escaped"), problems)
    after = _host_state(k.host_dir)
    if after != before:
        problems.append(f"files outside the sandbox changed: {sorted(after)} "
                        f"(was {sorted(before)})")
    if problems:
        raise AssertionError(f"{len(problems)} escape(s): " + "; ".join(problems))


async def check_isolation(k: Kit) -> None:
    """Two sandboxes have distinct ids and see none of each other's files."""
    name = f"iso-{uuid.uuid4().hex[:8]}.txt"
    async with k.sandbox() as a, k.sandbox() as b:
        expect(a.id != b.id, f"two sandboxes share the id {a.id!r}")
        await a.write_file(name, b"from a")
        try:
            got = await b.read_file(name)
        except Exception:
            pass
        else:
            raise AssertionError(f"sandbox b read a file written in sandbox a: {got!r}")
        await b.write_file(name, b"from b")
        got = await a.read_file(name)
        expect(got == b"from a", f"sandbox b's write changed sandbox a's file: {got!r}")


async def check_streaming(k: Kit) -> None:
    """start_process streams stdout (before stdin is closed, with ``streaming``), stdin, exit."""
    code = ("import sys\n"
            "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
            "line = sys.stdin.readline()\n"
            "sys.stdout.write('echo:' + line); sys.stdout.flush()\n"
            "sys.stderr.write('done\\n'); sys.exit(7)\n")
    async with k.sandbox() as sb:
        p = await within(sb.start_process(k.py(code), ProcessOpts(stdin=True)), 20.0,
                         "start_process")
        first = b""
        if "streaming" in k.provider.capabilities:
            first = await read_until(p.stdout, b"ready\n", 20.0,
                                     "first stdout chunk before any stdin was written")
        await within(p.stdin.write(b"hello\n"), 10.0, "stdin.write")
        await within(p.stdin.close(), 10.0, "stdin.close")
        await within(p.stdin.close(), 10.0, "second stdin.close (must be idempotent)")
        out, err = await within(asyncio.gather(drain(p.stdout), drain(p.stderr)), 20.0,
                                "reading stdout/stderr to EOF")
        st = await within(p.wait(), 10.0, "wait()")
        expect(first + out == b"ready\necho:hello\n", f"stdout was {first + out!r}")
        expect(err == b"done\n", f"stderr was {err!r}")
        expect(st.exit_code == 7, f"wait() gave exit_code {st.exit_code}, expected 7")


async def check_kill(k: Kit) -> None:
    """kill() ends the process and what it started; idempotent; the sandbox stays usable."""
    async with k.sandbox() as sb:
        p = await within(sb.start_process(k.py(_SLEEPER_TREE), ProcessOpts(stdin=False)),
                         20.0, "start_process")
        await read_until(p.stdout, b"up\n", 20.0, "process start")
        await within(p.kill(), 10.0, "kill()")
        st = await within(p.wait(), 5.0, "wait() after kill()")
        expect(st.exit_code != 0, f"a killed process must not report exit_code 0 ({st})")
        await within(p.kill(), 10.0, "second kill() (must be idempotent)")
        await within(asyncio.gather(drain(p.stdout), drain(p.stderr)), 5.0,
                     "stdout/stderr EOF after kill() (a grandchild still holds them: "
                     "kill must end what the process started)")
        r = await k.run(sb, "print('alive')")
        expect(r.stdout == b"alive\n", f"the sandbox must stay usable after kill(): {_brief(r)}")


async def check_timeout(k: Kit) -> None:
    """exec past timeout_ms raises SandboxTimeoutError with the partial output."""
    code = ("import os, sys, time\n"
            "sys.stdout.write('partial-out\\n'); sys.stdout.flush()\n"
            "sys.stderr.write('partial-err\\n'); sys.stderr.flush()\n"
            "if os.fork() == 0:\n    time.sleep(30); os._exit(0)\n"
            "time.sleep(30)\n")
    async with k.sandbox() as sb:
        t0 = time.monotonic()
        try:
            r = await within(sb.exec(k.py(code), ExecOpts(timeout_ms=300)), 8.0,
                             "exec with timeout_ms=300 of a 30 s sleeper (with a grandchild)")
        except SandboxTimeoutError as e:
            elapsed = time.monotonic() - t0
            expect(elapsed < 8.0, f"SandboxTimeoutError came after {elapsed:.1f} s")
            expect(e.timeout_ms == 300, f"SandboxTimeoutError.timeout_ms is {e.timeout_ms}")
            expect(b"partial-out" in e.stdout,
                   f"partial stdout missing from SandboxTimeoutError: {e.stdout!r}")
            expect(b"partial-err" in e.stderr,
                   f"partial stderr missing from SandboxTimeoutError: {e.stderr!r}")
        else:
            raise AssertionError(f"exec past timeout_ms returned instead of raising "
                                 f"SandboxTimeoutError: {_brief(r)}")
        r = await k.run(sb, "print('alive')")
        expect(r.stdout == b"alive\n", f"the sandbox must stay usable after a timeout: {_brief(r)}")
        p = await within(sb.start_process(k.py("import time; time.sleep(30)"),
                                          ProcessOpts(stdin=False, timeout_ms=300)),
                         20.0, "start_process")
        st = await within(p.wait(), 8.0, "wait() of a process started with timeout_ms=300")
        expect(st.exit_code != 0, f"a process killed by its timeout_ms reported {st}")


async def _provider_error(what: str, aw: Awaitable[object]) -> None:
    try:
        await within(aw, 10.0, what)
    except ProviderError:
        return
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"{what} after destroy(): expected ProviderError, got "
                             f"{type(e).__name__}: {e}") from None
    raise AssertionError(f"{what} after destroy() succeeded (expected ProviderError)")


async def check_destroy(k: Kit) -> None:
    """destroy() kills every process, is idempotent; then every method raises ProviderError."""
    sb = await k.create()
    try:
        await sb.write_file("f.txt", b"x")
        p = None
        if k.processes:
            p = await within(sb.start_process(k.py(_SLEEPER_TREE), ProcessOpts(stdin=True)),
                             20.0, "start_process")
            await read_until(p.stdout, b"up\n", 20.0, "process start")
    finally:
        await within(sb.destroy(), 20.0, "destroy()")
    try:
        await within(sb.destroy(), 20.0, "second destroy()")
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"second destroy() raised {type(e).__name__}: {e} "
                             "(destroy must be idempotent)") from None
    if p is not None:
        st = await within(p.wait(), 5.0, "wait() of a process started before destroy()")
        expect(st.exit_code != 0, f"a process ended by destroy() reported {st}")
        await within(asyncio.gather(drain(p.stdout), drain(p.stderr)), 5.0,
                     "stdout/stderr EOF after destroy() (the process tree must be dead)")
    await _provider_error("read_file", sb.read_file("f.txt"))
    await _provider_error("write_file", sb.write_file("g.txt", b"x"))
    if k.processes:
        await _provider_error("exec", sb.exec(k.py("pass")))
        await _provider_error("start_process", sb.start_process(k.py("pass")))
    async with await k.create() as sb2:
        await sb2.write_file("f.txt", b"x")
    await _provider_error("read_file (after `async with`)", sb2.read_file("f.txt"))
    await k.check_leaks("destroy")



# Inside the sandbox: GET argv[1] with urllib and the standard proxy variables (NO_PROXY
# dropped: the URL means the host's loopback, which a provider lists as its own);
# prints the body, or how it was refused.
_PROXIED_GET = (
    "import os, sys, urllib.request, urllib.error\n"
    "for name in ('NO_PROXY', 'no_proxy'):\n    os.environ.pop(name, None)\n"
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n"
    "except urllib.error.HTTPError as e:\n    print('refused', e.code)\n"
    "except OSError as e:\n    print('blocked', type(e).__name__)\n")
# Inside the sandbox: a TCP connect straight to 127.0.0.1:argv[1], no proxy.
_DIRECT = ("import socket, sys\n"
           "try:\n"
           "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3).close()\n"
           "except OSError as e:\n    print('blocked', type(e).__name__)\n"
           "else:\n    print('connected')\n")


class _KitServer:
    """An HTTP/1.0 server on the host's 127.0.0.1 that answers every request with a
    token and counts its connections (the check's own; never reachable otherwise)."""

    def __init__(self) -> None:
        self.token = f"kit-ok-{uuid.uuid4().hex[:12]}"
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> _KitServer:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                async with asyncio.timeout(10):
                    await r.readuntil(b"\r\n\r\n")
                w.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(self.token), self.token.encode()))
                await w.drain()
            except (OSError, TimeoutError, asyncio.IncompleteReadError,
                    asyncio.LimitOverrunError):
                pass
            finally:
                w.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def check_network_allowlist(k: Kit) -> None:
    """A provider advertising ``network-allowlist`` lets a command reach a listed host
    (a loopback server the check starts, listed as ``127.0.0.1/32:PORT``) with an HTTP
    client that honours the standard proxy variables, refuses an unlisted one (another
    loopback server: no connection reaches it) and lists that refusal in the run's
    ``denials``; a command that ignores the proxy does not reach the unlisted one. With
    ``network-unrestricted`` too, that policy still refuses the host's loopback."""
    caps = k.provider.capabilities
    if "network-allowlist" not in caps:
        return
    async with _KitServer() as listed, _KitServer() as unlisted:
        policy = NetworkPolicy.allowlist(f"127.0.0.1/32:{listed.port}")
        async with k.sandbox(k.spec(network=policy)) as sb:
            r = await within(
                sb.exec([*k.py(_PROXIED_GET), f"http://127.0.0.1:{listed.port}/"]), 30.0,
                "exec of a GET of a listed host")
            expect(listed.token in r.stdout_text,
                   f"a GET of the listed 127.0.0.1:{listed.port} did not get the server's "
                   f"answer: {_brief(r)}")
            r = await within(
                sb.exec([*k.py(_PROXIED_GET), f"http://127.0.0.1:{unlisted.port}/"]), 30.0,
                "exec of a GET of an unlisted host")
            expect(unlisted.token not in r.stdout_text and unlisted.connections == 0,
                   f"a GET of the unlisted 127.0.0.1:{unlisted.port} reached it: {_brief(r)}")
            expect(any(d.port == unlisted.port for d in r.denials),
                   f"the refusal of 127.0.0.1:{unlisted.port} is not in the run's denials "
                   f"({r.denials!r})")
            # a command ignoring the proxy variables gets no way around the policy: a
            # direct connect to the unlisted server reaches nothing (the listed one may
            # answer it: a provider may relay a listed host-loopback port into the
            # sandbox through its policy check, as the linux provider does, issue 27)
            r = await within(sb.exec([*k.py(_DIRECT), str(unlisted.port)]), 20.0,
                             "exec of a direct connect")
            expect("connected" not in r.stdout_text and unlisted.connections == 0,
                   "a command ignoring the proxy variables connected straight to an "
                   f"unlisted host's 127.0.0.1:{unlisted.port}")
        if "network-unrestricted" in caps:
            before = listed.connections
            async with k.sandbox(k.spec(network=NetworkPolicy.unrestricted())) as sb:
                r = await within(
                    sb.exec([*k.py(_PROXIED_GET), f"http://127.0.0.1:{listed.port}/"]), 30.0,
                    "exec of a GET of the host's loopback under unrestricted")
            expect(listed.connections == before and listed.token not in r.stdout_text,
                   "network 'unrestricted' let a command reach the host's loopback "
                   f"(127.0.0.1:{listed.port}, not listed): {_brief(r)}")
