"""Conformance checks of the contract's refusal table (:mod:`corral.core.contract`): a level,
limit or network policy the provider cannot give is refused with LevelNotSupportedError
naming the spec field and what is missing, never run weaker; bad input is ConfigInvalidError.

(The capability row, optional lifecycle methods, is the ``lifecycle`` check.)
"""

from __future__ import annotations

import socket
from typing import Any

from corral.core.errors import ConfigInvalidError, LevelNotSupportedError, LimitsExceededError
from corral.core.spec import ExecOpts, Level, NetworkPolicy, ProcessOpts, SandboxLimits
from corral.testing._kit import Kit, expect, expect_config_invalid, within

__all__ = ["check_bad_input", "check_level", "check_limits", "check_network"]

# Bounded bombs: each stops by itself (N MiB, N forks, N seconds) even if nothing limits it.
_MEM_BOMB = ("b = []\n"
             "for i in range(256):\n    b.append(bytes([i % 251 + 1]) * (1 << 20))\n"
             "print('survived', len(b))\n")
_FORKER = ("import os, time\n"
           "kids = []\n"
           "for i in range(32):\n"
           "    pid = os.fork()\n"
           "    if pid == 0:\n        time.sleep(2); os._exit(0)\n"
           "    kids.append(pid)\n"
           "for pid in kids:\n    os.waitpid(pid, 0)\n"
           "print('survived', len(kids))\n")
_SPINNER = ("import time\n"
            "t = time.monotonic()\n"
            "while time.monotonic() - t < 3.0:\n    pass\n"
            "print('survived')\n")
_DISK_FILLER = ("block = b'x' * (1 << 20)\n"
                "with open('fill.bin', 'wb') as f:\n"
                "    for i in range(64):\n        f.write(block); f.flush()\n"
                "print('survived')\n")

_LIMIT_CASES: tuple[tuple[str, int, str, str], ...] = (
    ("mem_mb", 64, "memory", _MEM_BOMB),
    ("max_processes", 8, "processes", _FORKER),
    ("cpu_ms", 200, "cpu", _SPINNER),
    ("disk_mb", 8, "disk", _DISK_FILLER),
)

# A command that tries the host's loopback: under network 'none' (or an allowlist that
# does not name it) the connection must fail.
_CONNECT = ("import socket, sys\n"
            "try:\n"
            "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3).close()\n"
            "except OSError as e:\n"
            "    print('blocked', type(e).__name__)\n"
            "else:\n"
            "    print('connected')\n")


def refusal_problem(e: Exception, *, field: str, k: Kit) -> str:
    """'' if ``e`` is the refusal the contract's table prescribes for ``field``, else why not.

    A level, limit or network refusal is LevelNotSupportedError with ``field`` set,
    ``requested`` the spec's level and ``missing`` saying what is absent.
    """
    what = f"refusing {field}"
    if not isinstance(e, LevelNotSupportedError):
        return (f"{what}: expected LevelNotSupportedError(field={field!r}) (the contract's "
                f"refusal table), got {type(e).__name__}: {e}")
    if e.field != field:
        return f"{what}: LevelNotSupportedError.field is {e.field!r}, expected {field!r}"
    if field != "level" and e.requested != k.level.value:
        return (f"{what}: LevelNotSupportedError.requested is {e.requested!r}, expected the "
                f"spec's level {k.level.value!r}")
    if field != "level" and not e.missing:
        return f"{what}: LevelNotSupportedError.missing is empty (it must say what is absent)"
    return ""


async def check_level(k: Kit) -> None:
    """A level not in provider.levels is refused with LevelNotSupportedError(field="level")."""
    levels = {Level(lv) for lv in k.provider.levels}
    expect(k.level in levels, f"the kit's level {k.level.value!r} is not in provider.levels")
    async with k.sandbox() as sb:
        expect(sb.spec.level == k.level, f"sandbox.spec.level is {sb.spec.level!r}")
    supported = tuple(sorted(lv.value for lv in levels))
    for lv in Level:
        if lv in levels:
            continue
        try:
            sb = await k.create(k.spec(level=lv))
        except LevelNotSupportedError as e:
            expect(e.requested == lv.value,
                   f"LevelNotSupportedError.requested is {e.requested!r}, not {lv.value!r}")
            expect(e.field == "level",
                   f"LevelNotSupportedError.field is {e.field!r} for a refused level, not 'level'")
            expect(e.supported == supported, f"LevelNotSupportedError.supported is "
                   f"{e.supported!r}, not the provider's levels {supported!r}")
            continue
        except AssertionError:
            raise
        except Exception as e:
            raise AssertionError(f"create(level={lv.value!r}) (not in provider.levels): expected "
                                 f"LevelNotSupportedError, got {type(e).__name__}: {e}") from None
        await within(sb.destroy(), 20.0, "destroy()")
        raise AssertionError(f"create(level={lv.value!r}) succeeded although {lv.value!r} is not "
                             f"in provider.levels: a level must never be downgraded")


async def check_limits(k: Kit) -> None:
    """Each limit is enforced (exec raises LimitsExceededError of its kind) or refused with
    LevelNotSupportedError(field="limits.<name>")."""
    problems: list[str] = []
    for field, value, kind, code in _LIMIT_CASES:
        try:
            sb = await k.create(k.spec(limits=SandboxLimits(**{field: value})))
        except AssertionError:
            raise
        except Exception as e:
            if isinstance(e, LevelNotSupportedError | ConfigInvalidError) \
                    and field in k.supports_limits:
                problems.append(f"{field}={value}: refused ({e}) although supports_limits "
                                f"lists it")
            elif bad := refusal_problem(e, field=f"limits.{field}", k=k):
                problems.append(f"{field}={value}: {bad}")
            continue
        try:
            if not k.processes:
                problems.append(f"{field}={value}: accepted, but processes=False cannot check it")
                continue
            try:
                r = await k.run(sb, code, seconds=30.0)
            except LimitsExceededError as e:
                if e.limit != kind:
                    problems.append(f"{field}={value}: LimitsExceededError.limit is {e.limit!r}, "
                                    f"expected {kind!r}")
            except Exception as e:
                problems.append(f"{field}={value}: exec raised {type(e).__name__}: {e} "
                                f"(expected LimitsExceededError({kind!r}))")
            else:
                problems.append(
                    f"{field}={value}: accepted, and the bounded {kind} bomb ran and ended with "
                    f"exit {r.exit_code} (stdout {r.stdout[-80:]!r}, stderr {r.stderr[-200:]!r}) "
                    f"instead of exec raising LimitsExceededError({kind!r}): a limit that is set "
                    "must be enforced or refused at create")
        finally:
            await within(sb.destroy(), 20.0, "destroy()")
    if problems:
        raise AssertionError("; ".join(problems))


async def check_network(k: Kit) -> None:
    """Each network policy is enforced or refused with LevelNotSupportedError(field="network");
    under an accepted ``none`` or allowlist, a command cannot reach the host's loopback."""
    problems: list[str] = []
    policies = (NetworkPolicy.none(), NetworkPolicy.allowlist("corral-kit.invalid"),
                NetworkPolicy.unrestricted())
    accepted = []
    for policy in policies:
        try:
            sb = await k.create(k.spec(network=policy))
        except AssertionError:
            raise
        except Exception as e:
            if bad := refusal_problem(e, field="network", k=k):
                problems.append(f"network {policy.kind!r}: {bad}")
            continue
        accepted.append(policy.kind)
        try:
            if policy.kind != "unrestricted" and k.processes:
                with socket.socket() as listener:  # on the host's loopback; never accepted
                    listener.bind(("127.0.0.1", 0))
                    listener.listen(4)
                    port = listener.getsockname()[1]
                    r = await within(sb.exec([*k.py(_CONNECT), str(port)]), 20.0,
                                     "exec of a connect to the host's loopback")
                if b"connected" in r.stdout:
                    problems.append(f"network {policy.kind!r}: accepted, but a command reached "
                                    f"a listener on the host's 127.0.0.1:{port}")
        finally:
            await within(sb.destroy(), 20.0, "destroy()")
    expect(not problems, "; ".join(problems))
    expect(accepted, "every network policy was refused: a provider accepts at least one")


async def check_bad_input(k: Kit) -> None:
    """Malformed input (a spec that is not a SandboxSpec, empty or NUL-holding argv, a cwd
    outside the work dir, a NUL in a path) is refused with ConfigInvalidError."""
    problems: list[str] = []
    not_a_spec: Any = {"tenant_id": k.tenant_id, "run_id": "not-a-spec", "level": k.level.value}
    try:
        sb = await k.create(not_a_spec)
    except ConfigInvalidError:
        pass
    except AssertionError:
        raise
    except Exception as e:
        problems.append(f"create(a dict, not a SandboxSpec): expected ConfigInvalidError, got "
                        f"{type(e).__name__}: {e}")
    else:
        await within(sb.destroy(), 20.0, "destroy()")
        problems.append("create(a dict, not a SandboxSpec) returned a sandbox "
                        "(expected ConfigInvalidError)")
    ok = k.py("pass")
    async with k.sandbox() as sb:
        for argv, what in (([], "[]"), ([""], "['']"), ([k.python, "-c", "pass\0"], "a NUL")):
            await expect_config_invalid(f"exec(argv {what})", sb.exec(argv), problems)
            await expect_config_invalid(f"start_process(argv {what})", sb.start_process(argv),
                                        problems)
        for cwd in ("../..", k.host_dir):
            await expect_config_invalid(f"exec(cwd={cwd!r})", sb.exec(ok, ExecOpts(cwd=cwd)),
                                        problems)
            await expect_config_invalid(f"start_process(cwd={cwd!r})",
                                        sb.start_process(ok, ProcessOpts(cwd=cwd)), problems)
        await expect_config_invalid("read_file('a\\0b')", sb.read_file("a\0b"), problems)
        await expect_config_invalid("write_file('a\\0b')", sb.write_file("a\0b", b"x"), problems)
    if problems:
        raise AssertionError(f"{len(problems)} bad input(s) not refused as the contract says: "
                             + "; ".join(problems))
