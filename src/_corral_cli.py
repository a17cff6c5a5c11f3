"""The ``corral`` command's entry point: the one-shot strict path, else the full CLI.

``corral run --level strict [--timeout MS] [--mem-mb N] [--cpu-ms MS] -- /abs/CMD ...``
with its output going to pipes or files (not a terminal: the full CLI sanitizes
that) runs through :mod:`corral.providers.linux.oneshot`: the same sandbox as
``run_strict``, built from this process, without the fork server, asyncio or the
rest of corral. Everything else goes to :func:`corral.cli.main` untouched.

This module sits outside the ``corral`` package on purpose: importing anything
under ``corral`` runs ``corral/__init__.py``, which loads the public API (asyncio
among it). For the one-shot path the packages ``corral`` and
``corral.providers`` are registered as bare namespace-like modules (their
``__init__`` not run) so that only the modules the path needs are loaded; the
process exits when the run ends. If the path cannot be taken after all, they
are removed again and the full CLI is imported normally.
"""

from __future__ import annotations

import os
import sys

__all__ = ["main"]

_BARE = ("corral", "corral.providers", "corral.providers.linux")


def _one_shot_wanted(argv: list[str]) -> bool:
    if len(argv) < 5 or argv[0] != "run" or "--" not in argv or sys.platform != "linux":
        return False
    try:
        return not (os.isatty(1) or os.isatty(2))
    except OSError:
        return False


def _bare_packages() -> None:
    """Register ``corral`` and ``corral.providers`` without running their ``__init__``."""
    # the classes themselves, without importing types and importlib (about 1 ms)
    module_type, spec_type = type(sys), type(sys.__spec__)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corral")
    for name in _BARE:
        path = os.path.join(here, *name.split(".")[1:])
        mod = module_type(name)
        mod.__path__ = [path]
        mod.__file__ = os.path.join(path, "__init__.py")
        mod.__spec__ = spec_type(name, None, is_package=True)
        mod.__spec__.submodule_search_locations = [path]
        sys.modules[name] = mod


def _forget_corral() -> None:
    for name in [n for n in sys.modules if n == "corral" or n.startswith("corral.")]:
        del sys.modules[name]


def _one_shot(args: list[str]) -> int | None:
    """The exit status of the one-shot run, or None when it was not taken (nothing ran)."""
    bare = "corral" not in sys.modules
    if bare:
        _bare_packages()
        import gc
        gc.disable()  # a short-lived process: no collections while the modules load
    done = False
    try:
        from corral.providers.linux import oneshot
        req = oneshot.parse_argv(args)
        report = oneshot.run(req) if req is not None else None
        if report is None:
            return None
        done = True
        return oneshot.finish(report)
    finally:
        if bare and not done:
            _forget_corral()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``corral`` command; returns the exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if _one_shot_wanted(args):
        code = _one_shot(args)
        if code is not None:
            if argv is None:  # the process is ours: skip the interpreter's teardown
                os._exit(code)
            return code
    from corral.cli import main as full_main
    return full_main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
