"""The ``corral`` command's entry point: the one-shot strict path, else the full CLI.

``corral run [--level strict] [--timeout MS] [--mem-mb N] [--cpu-ms MS] [--image REF] -- CMD``
(strict is the default level) with its output going to pipes or files (not a terminal:
the full CLI sanitizes that) runs through :mod:`corral.providers.linux.oneshot`: the same sandbox as
``run_strict``, built from this process, without the fork server, asyncio or the
rest of corral. Everything else goes to :func:`corral.cli.main` untouched.

Importing ``corral``, ``corral.providers`` and ``corral.providers.linux`` runs no
other module (their public names load on first use), so the one-shot path loads
only the modules it runs; the process exits when the run ends.
"""

import os
import sys

__all__ = ["main"]


def _one_shot_wanted(argv: list[str]) -> bool:
    if len(argv) < 3 or argv[0] != "run" or "--" not in argv or sys.platform != "linux":
        return False
    try:
        return not (os.isatty(1) or os.isatty(2))
    except OSError:
        return False


def _one_shot(args: list[str]) -> int | None:
    """The exit status of the one-shot run, or None when it was not taken (nothing ran)."""
    import gc
    gc.disable()  # a short-lived process: no collections while the modules load
    try:
        from corral.providers.linux import oneshot
        req = oneshot.parse_argv(args)
        report = oneshot.run(req) if req is not None else None
        return None if report is None else oneshot.finish(report)
    finally:
        gc.enable()


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
