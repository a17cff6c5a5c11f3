"""corral's strict level against bare, bwrap, nsjail and unshare, side by side.

Usage: .venv/bin/python benchmarks/bench_strict.py [--runs N] [--sandboxes K] [--python PATH]

Method (as shared/research/MEASUREMENTS.md): every variant of one table runs
once per round, interleaved (A B C ..., the order reversed every other round),
N rounds. A row's figure is the median (and p90) of its wall times; "ratio"
is the median of the pairwise ratios against the bare run of the same round,
"+ms" the median of the pairwise differences. The machine is shared: compare
the ratios of one run, not absolute figures across runs.

Tables:
1. cold start: ``python -c pass`` and ``python -I -S -c pass`` (python =
   ``--python``, by default the real interpreter,
   ``os.path.realpath(sys.executable)``) bare
   (subprocess.run), under corral strict (library call with a warm provider,
   i.e. the fork server already running: create + exec + destroy, and
   create + exec with destroy off the clock), under bwrap and nsjail in
   MEASUREMENTS.md §4's configurations, under plain unshare with the same
   namespaces (a floor: no file system set-up), and as a whole
   ``corral run --level strict`` CLI process: the installed ``corral`` script
   (``bin/corral``: ``_corral_cli:main``, which takes the one-shot path of
   ``corral.providers.linux.oneshot`` for this command line) and, for comparison,
   the library path it replaces (``corral.cli:main``, run_strict with its fork
   server; with ``--ro-bind`` for another interpreter). Goal for the CLI: at most
   3x bare and a peak below 10 MiB. Peak memory: the largest resident set of any
   process of the command's tree (GNU time's ``%M``, ``ru_maxrss`` from ``wait4``,
   which covers the waited-for descendants), max of 3 runs after the timed ones,
   for every row that is a process.
   corral's sources are byte-compiled first (as an install does), so no run
   pays for compiling them under ``PYTHONDONTWRITEBYTECODE``.
2. exec into one live sandbox vs the same command run bare.
3. private memory (Private_Clean + Private_Dirty of smaps_rollup) per idle
   sandbox, for K sandboxes alive at once: the agent (pid 1) alone and all
   processes of the sandbox's cgroup.

Side by side with another checkout (``--against PATH``: its installed ``corral``
script, e.g. main's ``.venv/bin/corral``): one more row in both cold tables, that
script running the same command line, interleaved with the others in every round
(the ratios of the two CLI rows then compare the checkouts on the same machine state).

Another interpreter (``--python``): its prefixes outside /usr are bound
read-only into every variant: corral's provider gets ``ro_binds`` when its
default plan does not already show them, bwrap ``--ro-bind`` and nsjail ``-R``.

Peers missing? ``sudo sh benchmarks/install_peers.sh`` installs them.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.core.spec import SandboxSpec
from corral.providers.linux import LinuxProvider

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
INSTALL_HINT = "install with: sudo sh benchmarks/install_peers.sh"
BARE_ENV = {"PATH": "/usr/bin:/bin"}
MERGED = (("usr/bin", "/bin"), ("usr/lib", "/lib"), ("usr/lib64", "/lib64"),
          ("usr/sbin", "/sbin"))

Run = Callable[[], Awaitable[dict[str, float]]]


@dataclass
class Row:
    label: str
    key: str = ""
    times: list[float] = field(default_factory=list)
    goal: str = ""
    skipped: str = ""
    base: list[float] = field(default_factory=list)  # the bare time of the same round

    def median(self) -> float:
        return statistics.median(self.times)

    def p90(self) -> float:
        return statistics.quantiles(self.times, n=10)[-1] if len(self.times) > 1 else self.times[0]

    def ratio(self) -> float:
        return statistics.median(t / b for t, b in zip(self.times, self.base, strict=True))

    def plus(self) -> float:
        return statistics.median(t - b for t, b in zip(self.times, self.base, strict=True))


@dataclass(frozen=True)
class Interp:
    """The interpreter the cold and exec tables run."""

    path: str
    version: str
    #: its real prefixes that /usr does not hold (bound read-only into every sandbox)
    binds: tuple[str, ...]


def probe_interp(path: str) -> Interp:
    """Ask ``path`` for its version and prefixes (with ``site``, as ``python -c`` runs)."""
    code = ("import json, sys; print(json.dumps([sys.version.split()[0], sys.prefix, "
            "sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))")
    out = subprocess.run([path, "-I", "-c", code], capture_output=True, text=True, env=BARE_ENV,
                         timeout=60, check=True).stdout
    ver, *prefixes = json.loads(out)
    binds: list[str] = []
    for pre in sorted({os.path.realpath(p) for p in prefixes}):
        if not _under(pre, "/usr") and not any(_under(pre, b) for b in binds):
            binds.append(pre)
    return Interp(path=path, version=ver, binds=tuple(binds))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def not_shown_by(provider: LinuxProvider, paths: tuple[str, ...]) -> tuple[str, ...]:
    """The paths that no bind of the provider's default plan makes visible."""
    plan = provider.plan(SandboxSpec(tenant_id="bench", run_id="plan"))
    shown = [m.target for m in plan.mounts if m.kind == "bind"]
    return tuple(p for p in paths if not any(_under(p, t) for t in shown))


# -- commands --------------------------------------------------------------------------
def bwrap_argv(bwrap: str, cmd: list[str], binds: tuple[str, ...]) -> list[str]:
    """MEASUREMENTS.md §4 'bwrap 0.8' (with --cap-drop ALL, uid/gid 65534: §5 item 7)."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", "65534", "--gid", "65534", "--clearenv", "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr"]
    for target, link in MERGED:
        argv += ["--symlink", target, link]
    argv += ["--ro-bind", "/etc", "/etc"]
    for pre in binds:
        argv += ["--ro-bind", pre, pre]
    return [*argv, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp",
            *cmd]


def nsjail_argv(nsjail: str, cmd: list[str], binds: tuple[str, ...]) -> list[str]:
    """MEASUREMENTS.md §4 'nsjail' (explicit rlimit MB values: §5 item 4)."""
    argv = [nsjail, "-Mo", "-Q", "-u", "65534", "-g", "65534", "--hostname", "sandbox",
            "--cwd", "/tmp", "--time_limit", "0", "--rlimit_as", "4096", "--rlimit_fsize", "64",
            "--rlimit_nofile", "1024", "-R", "/usr"]
    for target, link in MERGED:
        argv += ["-s", f"{target}:{link}"]
    argv += ["-R", "/etc"]
    for pre in binds:
        argv += ["-R", pre]
    return [*argv, "-T", "/tmp", "-T", "/dev", "-R", "/dev/null", "-R", "/dev/urandom", "--",
            *cmd]


def unshare_argv(cmd: list[str]) -> list[str]:
    """corral's seven namespaces with util-linux unshare, no file system set-up (a floor)."""
    return ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--net",
            "--mount", "--ipc", "--uts", "--cgroup", "--mount-proc", "--", *cmd]


def find_nsjail() -> str | None:
    local = HERE / ".peers" / "nsjail"
    return str(local) if os.access(local, os.X_OK) else shutil.which("nsjail")


def _proc(argv: list[str], env: dict[str, str] | None = None) -> Run:
    async def run() -> dict[str, float]:
        t = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, env=env,
                           timeout=60, check=False)
        ms = (time.perf_counter() - t) * 1000
        if r.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {r.returncode}: {r.stderr[-400:]!r}")
        return {"": ms}
    return run


def peak_mib(argv: list[str], env: dict[str, str] | None, runs: int = 3) -> float | None:
    """The largest resident set of any process of ``argv``'s tree (MiB, max of
    ``runs``), as GNU time reports it (``%M``: ``ru_maxrss`` from wait4, which covers
    the waited-for descendants; time itself is small, so the maxrss a child inherits
    at fork is not ours). None without /usr/bin/time."""
    if not os.access("/usr/bin/time", os.X_OK):
        return None
    best = 0
    for _ in range(runs):
        r = subprocess.run(["/usr/bin/time", "-f", "corral-peak %M", *argv],
                           capture_output=True, stdin=subprocess.DEVNULL, env=env, timeout=60,
                           check=False)
        lines = [x for x in r.stderr.decode(errors="replace").splitlines()
                 if x.startswith("corral-peak ")]
        if r.returncode != 0 or not lines:
            return None
        best = max(best, int(lines[-1].split()[1]))
    return best / 1024


def _probe(argv: list[str]) -> str:
    """'' if the command works, else why not (for a skipped row)."""
    try:
        r = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=60,
                           check=False)
    except OSError as e:
        return str(e)
    if r.returncode == 0:
        return ""
    tail = r.stderr.decode(errors="replace").strip().splitlines()
    return f"exit {r.returncode}: {tail[-1] if tail else ''}"


# -- measuring -------------------------------------------------------------------------
async def measure(variants: dict[str, Run], rounds: int) -> dict[str, list[float]]:
    """Run the variants interleaved; keys of the result are 'variant' + sub-label."""
    out: dict[str, list[float]] = {}
    names = list(variants)
    for name in names:  # warm-up
        await variants[name]()
    for i in range(rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            for sub, ms in (await variants[name]()).items():
                out.setdefault(name + sub, []).append(ms)
    return out


def _strict_cold(provider: LinuxProvider, cmd: list[str], settle: bool = True) -> Run:
    settle = settle and getattr(provider, "spares", 0) > 0
    n = 0

    async def run() -> dict[str, float]:
        nonlocal n
        n += 1
        t = time.perf_counter()
        sb = await provider.create(SandboxSpec(tenant_id="bench", run_id=f"cold-{n}"))
        tc = time.perf_counter()
        r = await sb.exec(cmd)
        t1 = time.perf_counter()
        await sb.destroy()
        t2 = time.perf_counter()
        if settle:  # let the spare refill finish off the clock, not during the next run
            await provider.wait_spares()
        if r.exit_code != 0:
            raise RuntimeError(f"strict exec exited {r.exit_code}: {r.stderr[-400:]!r}")
        return {"": (t2 - t) * 1000, " (create+exec)": (t1 - t) * 1000,
                " (create)": (tc - t) * 1000, " (destroy)": (t2 - t1) * 1000}
    return run


def _strict_twice(provider: LinuxProvider, cmd: list[str]) -> Run:
    """Two create+exec+destroy back to back; the second one's time (no refill gap)."""
    first, second = _strict_cold(provider, cmd, settle=False), _strict_cold(provider, cmd)

    async def run() -> dict[str, float]:
        await first()
        return {"": (await second())[""]}
    return run


def _in_sandbox(sb: Any, cmd: list[str]) -> Run:
    async def run() -> dict[str, float]:
        t = time.perf_counter()
        r = await sb.exec(cmd)
        ms = (time.perf_counter() - t) * 1000
        if r.exit_code != 0:
            raise RuntimeError(f"exec exited {r.exit_code}: {r.stderr[-400:]!r}")
        return {"": ms}
    return run


def _rows(times: dict[str, list[float]], labels: dict[str, str]) -> list[Row]:
    base = times["bare"]
    return [Row(label, key, times[key], base=base) for key, label in labels.items()
            if key in times]


# -- the tables ------------------------------------------------------------------------
async def cold_table(provider: LinuxProvider, cold: LinuxProvider | None, rounds: int,
                     py: Interp, args: list[str], cli_binds: tuple[str, ...]) -> list[Row]:
    cmd = [py.path, *args, "-c", "pass"]
    variants: dict[str, Run] = {"bare": _proc(cmd, BARE_ENV),
                                "strict": _strict_cold(provider, cmd)}
    if cold is not None:
        variants["strict2"] = _strict_twice(provider, cmd)
        variants["strict0"] = _strict_cold(cold, cmd)
    skipped: list[Row] = []
    argvs: dict[str, list[str]] = {"bare": cmd}
    bwrap = shutil.which("bwrap")
    nsjail = find_nsjail()
    binds = [f"--ro-bind={p}" for p in cli_binds]
    peers: list[tuple[str, str | None, Callable[[str], list[str]]]] = [
        ("bwrap", bwrap, lambda b: bwrap_argv(b, cmd, py.binds)),
        ("nsjail", nsjail, lambda b: nsjail_argv(b, cmd, py.binds)),
        ("unshare", shutil.which("unshare"), lambda _b: unshare_argv(cmd)),
        ("cli", cli_entry(), lambda b: [*b.split("\0"), "run", "--level", "strict", *binds,
                                        "--", *cmd]),
        ("clidef", cli_entry(), lambda b: [*b.split("\0"), "run", *binds, "--", *cmd]),
        *([("cliref", AGAINST[0], lambda b: [b, "run", "--level", "strict", *binds, "--",
                                             *cmd])] if AGAINST else []),
        ("clilib", "\0".join(_script_argv("corral.cli")),
         lambda b: [*b.split("\0"), "run", "--level", "strict", *binds, "--", *cmd]),
    ]
    for key, binary, build in peers:
        if binary is None:
            why = INSTALL_HINT if key in ("bwrap", "nsjail") else f"{key} not found"
            skipped.append(Row(LABELS[key], key, goal="peer", skipped=f"missing: {why}"))
            continue
        argv = build(binary)
        why = _probe(argv)
        if why and key == "cli":
            why = f"the CLI cannot do it yet ({why})"
        if why:
            if key in ("bwrap", "nsjail"):
                why += f" ({INSTALL_HINT})"
            skipped.append(Row(LABELS[key], key, skipped=why))
            continue
        variants[key] = _proc(argv, BARE_ENV if key == "unshare" else None)
        argvs[key] = argv
    times = await measure(variants, rounds)
    if "cli" in argvs:  # which path the timed rounds took (the trace of one more run)
        CLI_PATH[0] = cli_path(argvs["cli"])
    PEAK_MIB.clear()
    for key, argv in argvs.items():
        peak = peak_mib(argv, BARE_ENV if key in ("bare", "unshare") else None)
        if peak is not None:
            PEAK_MIB[key] = peak
    return _rows(times, LABELS) + skipped


#: --against: another checkout's corral script, run beside this one's (the cliref row)
AGAINST: list[str] = []
#: variant key -> peak MiB of its process tree (peak_mib), for the last cold table
PEAK_MIB: dict[str, float] = {}
#: the path the CLI row took, for the last cold table (cli_path)
CLI_PATH: list[str] = [""]


def cli_path(argv: list[str]) -> str:
    """Which path ``corral run`` takes for ``argv`` now (after the timed rounds, as
    they ran): one-shot with its plan from the cache, one-shot computing it, or the
    library path; from ``CORRAL_CLI_TRACE=1``."""
    r = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=60,
                       check=False, env={**os.environ, "CORRAL_CLI_TRACE": "1"})
    if b"trace: one-shot path" not in r.stderr:
        return "library path"
    return ("one-shot, plan from the cache" if b"plan from the cache" in r.stderr
            else "one-shot, plan computed")


LABELS = {
    "bare": "bare subprocess.run",
    "strict": "corral strict create+exec+destroy",
    "strict (create+exec)": "corral strict create+exec (destroy off clock)",
    "strict (create)": "  of which create alone",
    "strict (destroy)": "  destroy alone (after the exec)",
    "strict2": "strict, 2nd of 2 back to back (no refill gap)",
    "strict0": "strict, spares=0: create+exec+destroy",
    "strict0 (create+exec)": "strict, spares=0: create+exec",
    "strict0 (create)": "  of which create alone",
    "strict0 (destroy)": "  destroy alone (after the exec)",
    "bwrap": "bwrap (MEASUREMENTS §4)",
    "nsjail": "nsjail (MEASUREMENTS §4)",
    "unshare": "unshare, same 7 namespaces (floor)",
    "cli": "corral run --level strict (whole CLI)",
    "clidef": "corral run, no --level (default: strict)",
    "clilib": "corral run, library path (corral.cli:main)",
    "cliref": "corral run --level strict, --against script",
}


def _script_argv(module: str) -> list[str]:
    """What a console script ``module:main`` runs (pip's wrapper, in this interpreter)."""
    return [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())"]


def cli_entry() -> str:
    """The ``corral`` console script when it runs the one-shot entry, else the same entry
    run as the script would (an editable install made before the entry existed); the
    argv joined with NULs."""
    script = Path(sys.prefix) / "bin" / "corral"
    try:
        if "_corral_cli" in script.read_text():
            return str(script)
    except OSError:
        pass
    return "\0".join(_script_argv("_corral_cli"))


def compile_sources() -> None:
    """Byte-compile corral (and the entry module) as an install does."""
    import corral
    root = Path(corral.__file__).resolve().parent
    compileall.compile_dir(str(root), quiet=1, force=True)  # an mtime check alone misses
    # a file rewritten within the second its .pyc was written (then every run compiles it)
    entry = root.parent / "_corral_cli.py"
    if entry.exists():
        compileall.compile_file(str(entry), quiet=1, force=True)


async def exec_table(provider: LinuxProvider, rounds: int, py: Interp) -> list[Row]:
    sb = await provider.create(SandboxSpec(tenant_id="bench", run_id="exec"))
    rows: list[Row] = []
    try:
        for title, cmd in (("/bin/true", ["/bin/true"]),
                           ("python -I -S -c pass", [py.path, "-I", "-S", "-c", "pass"])):
            times = await measure({"bare": _proc(cmd, BARE_ENV),
                                   "exec": _in_sandbox(sb, cmd)}, rounds)
            rows += _rows(times, {"bare": f"bare {title}",
                                  "exec": f"sb.exec {title} (live sandbox)"})
    finally:
        await sb.destroy()
    return rows


def private_kib(pid: int) -> int:
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


async def memory_table(provider: LinuxProvider, k: int) -> tuple[list[int], list[int], int]:
    """Per sandbox: agent private KiB, all-process private KiB; and the max process count."""
    sbs: list[Any] = []
    try:
        for i in range(k):
            sbs.append(await provider.create(SandboxSpec(tenant_id="bench", run_id=f"mem-{i}")))
        agent = [0] * k
        whole = [0] * k
        nprocs = 0
        for _ in range(2):  # right after creation and once settled: keep the peak
            for i, sb in enumerate(sbs):
                pids = sb.host_pids()  # the agent first
                pid = pids[0]
                nprocs = max(nprocs, len(pids))
                agent[i] = max(agent[i], private_kib(pid))
                whole[i] = max(whole[i], sum(private_kib(p) for p in pids))
            await asyncio.sleep(0.5)
        return agent, whole, nprocs
    finally:
        for sb in sbs:
            await sb.destroy()


# -- report ----------------------------------------------------------------------------
def _fmt_row(r: Row) -> str:
    if r.skipped:
        return f"  {r.label:<46} {'skipped':>8}  {r.skipped}"
    if r.label.startswith("  "):  # a part of the row above: no pairing with bare
        return f"  {r.label:<46} {r.median():8.2f} {r.p90():8.2f} {'-':>7} {'-':>7}  {r.goal}"
    return (f"  {r.label:<46} {r.median():8.2f} {r.p90():8.2f} {r.plus():+7.2f} "
            f"{r.ratio():6.2f}x  {r.goal}")


def _judge_cold(rows: list[Row], full_goal: bool) -> None:
    by = {r.label: r for r in rows}
    peers = [by[LABELS[k]] for k in ("bwrap", "nsjail")]
    keys = {r.key for r in rows if not r.skipped}
    for key in ("strict", "strict (create+exec)", "strict2", "strict0", "strict0 (create+exec)"):
        if key not in keys:
            continue
        r = next(x for x in rows if x.key == key)
        parts: list[str] = []
        ok = True
        if full_goal:
            plus_ok, ratio_ok = r.plus() <= 5.0, r.ratio() <= 1.10
            ok &= plus_ok and ratio_ok
            parts.append(f"<=+5ms: {'yes' if plus_ok else 'no'}; "
                         f"<=1.10x: {'yes' if ratio_ok else 'no'}")
        for p in peers:
            if p.skipped:
                parts.append(f"vs {p.label.split()[0]}: unchecked (skipped)")
                ok = False
            else:
                ahead = r.ratio() < p.ratio()
                ok &= ahead
                parts.append(f"ahead of {p.label.split()[0]}: {'yes' if ahead else 'no'}")
        tag = "MET" if ok else "NOT MET"
        info = "" if key == "strict" else " [info]"
        if key.startswith("strict0"):
            info = " [cold path]"
        elif key == "strict2":
            info = " [burst]"
        r.goal = f"{tag}{info} ({'; '.join(parts)})"
    for r in rows:
        if r.key == "cli" and not r.skipped:
            peak = PEAK_MIB.get("cli", float("nan"))
            ok = r.ratio() <= 3.0 and peak < 10.0
            r.goal = (f"{'MET' if ok else 'NOT MET'} (<=3x bare: {r.ratio():.2f}x; "
                      f"peak < 10 MiB: {peak:.2f} MiB; {CLI_PATH[0]})")
        if not r.goal and not r.skipped:
            r.goal = ("baseline" if r.key == "bare" else
                      "part of the row above" if r.label.startswith("  ") else
                      "info: the CLI before the one-shot path" if r.key == "clilib"
                      else f"reference: {AGAINST[0]}" if r.key == "cliref"
                      else "peer")


async def run(rounds: int, k: int, python: str) -> None:
    compile_sources()
    load0 = os.getloadavg()[0]
    py = probe_interp(python)
    provider = LinuxProvider()
    ro_binds = not_shown_by(provider, py.binds)
    if ro_binds:
        await provider.aclose()
        provider = LinuxProvider(ro_binds=ro_binds)
    spares = getattr(provider, "spares", 0)
    cold: LinuxProvider | None = None
    if spares:  # the same, building every sandbox on request: the cold path
        cold = LinuxProvider(spares=0, ro_binds=ro_binds)
    try:
        for prov in (provider, cold):
            if prov is not None:  # the fork server is running from here on
                warm = await prov.create(SandboxSpec(tenant_id="bench", run_id="warm"))
                await warm.destroy()
        now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
        print(f"corral strict benchmark, {now}; {rounds} interleaved rounds; "
              f"python {py.path} ({py.version}); load {load0:.2f}")
        print("ms per run: median, p90; +ms and ratio: median of pairwise differences/ratios "
              "against bare in the same round")
        made = f"LinuxProvider(ro_binds={ro_binds!r})" if ro_binds else "LinuxProvider()"
        print(f"corral strict = {made} (spares={spares}: a pre-warmed sandbox; its "
              "background refill is awaited off the clock after each run)" if spares else
              f"corral strict = {made} (no spares: every create is cold)")
        if py.binds:
            print(f"bound read-only for bwrap and nsjail: {', '.join(py.binds)}")
        print()
        head = f"  {'':<46} {'median':>8} {'p90':>8} {'+ms':>7} {'ratio':>7}  goal"
        for title, args, full in (("cold `python -c pass`", [], True),
                                  ("cold `python -I -S -c pass`", ["-I", "-S"], False)):
            rows = await cold_table(provider, cold, rounds, py, args, cli_binds=ro_binds)
            _judge_cold(rows, full)
            print(title + ("  (goal: within +5 ms and <= 1.10x of bare, ahead of bwrap "
                           "and nsjail)" if full else "  (goal: ahead of bwrap and nsjail)"))
            print(head)
            for r in rows:
                print(_fmt_row(r))
            print("  peak RSS of the largest process of each tree (GNU time %M, max of 3 runs): "
                  + ", ".join(f"{k} {v:.1f} MiB" for k, v in PEAK_MIB.items()))
            print()
        rows = await exec_table(provider, rounds, py)
        for bare, ex in zip(rows[::2], rows[1::2], strict=True):
            bare.goal = "baseline"
            ex.goal = (f"{'MET' if ex.plus() <= 2.0 else 'NOT MET'} "
                       f"(within 2 ms of bare: {ex.plus():+.2f} ms)")
        print("exec into one live sandbox  (goal: within 2 ms of the bare command)")
        print(head)
        for r in rows:
            print(_fmt_row(r))
        print()
        agent, whole, nprocs = await memory_table(provider, k)
        worst = max(whole) / 1024
        print(f"private memory per idle sandbox, {k} alive at once  (goal: <= 4 MiB)")
        print(f"  agent (pid 1) alone:     median {statistics.median(agent) / 1024:.2f} MiB, "
              f"max {max(agent) / 1024:.2f} MiB")
        print(f"  all cgroup processes:    median {statistics.median(whole) / 1024:.2f} MiB, "
              f"max {worst:.2f} MiB ({nprocs} process(es) per sandbox)")
        print(f"  {'MET' if worst <= 4.0 else 'NOT MET'} (max {worst:.2f} MiB vs 4 MiB)")
        if spares:
            print(f"  (besides: the provider's {spares} idle spare(s), one agent each)")
        print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    finally:
        await provider.aclose()
        if cold is not None:
            await cold.aclose()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=20, help="interleaved rounds (default 20)")
    ap.add_argument("--sandboxes", type=int, default=10,
                    help="idle sandboxes for the memory figure (default 10)")
    ap.add_argument("--python", default=os.path.realpath(sys.executable), metavar="PATH",
                    help="the interpreter to start (default: the real file behind "
                    "sys.executable, %(default)s)")
    ap.add_argument("--against", metavar="PATH", help="another checkout's corral script "
                    "(e.g. main's .venv/bin/corral): a row of its own, interleaved")
    ns = ap.parse_args(argv)
    if ns.runs < 2 or ns.sandboxes < 1:
        ap.error("--runs must be >= 2 and --sandboxes >= 1")
    if not os.access(ns.python, os.X_OK):
        ap.error(f"--python {ns.python!r} is not an executable file")
    if ns.against is not None:
        if not os.access(ns.against, os.X_OK):
            ap.error(f"--against {ns.against!r} is not an executable file")
        AGAINST[:] = [os.path.abspath(ns.against)]
    asyncio.run(run(ns.runs, ns.sandboxes, ns.python))


if __name__ == "__main__":
    main()
