"""Strip host paths from tracebacks and log lines before they leave the host.

:func:`sanitize_stack` finds path tokens in a text and replaces the part of each
that identifies the host (user names, install locations, temp dirs, sandbox
roots, drive letters, UNC servers) with a placeholder, keeping the part below
it so a traceback stays useful::

    File "/home/alice/proj/app.py", line 3   ->  File "<home>/proj/app.py", line 3
    /srv/venv/lib/python3.11/site-packages/attr/_make.py  ->  <site-packages>/attr/_make.py

Placeholders: ``<sandbox>`` (``extra_paths``), ``<site-packages>``, ``<stdlib>``,
``<python>`` (interpreter prefixes), ``<home>``, ``<tmp>``, ``<app>`` (``/app``,
``/var/task``), ``<drive>`` (``X:``), ``<unc>`` (``\\\\server\\share``).

A path token is the quoted text of a ``File "..."`` line (spaces allowed) or a
run of characters without whitespace, quotes or ``,;()[]{}|=``. In each token the
rule whose match ends last wins and everything before that end is replaced, so
the kept tail contains no recognised path root: the function is idempotent. All
regexes are linear (no nested quantifiers); the function never raises.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import Final

__all__ = ["DEFAULT_PREFIXES", "DEFAULT_TEMP_DIRS", "sanitize_stack"]


def _absolute(path: str) -> bool:
    return len(path) > 1 and (
        path.startswith(("/", "\\\\")) or (path[1] == ":" and path[0].isalpha())
    )


def _usable(paths: Sequence[str]) -> tuple[str, ...]:
    """Absolute paths, without trailing separators, longest first; '/' and '<>' refused."""
    out = {p.rstrip("/\\") for p in paths if isinstance(p, str)}
    return tuple(
        sorted(
            (p for p in out if _absolute(p) and "<" not in p and ">" not in p and "\n" not in p),
            key=len,
            reverse=True,
        )
    )


DEFAULT_PREFIXES: Final[tuple[str, ...]] = _usable(
    [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
)
"""The interpreter's install prefixes, replaced by ``<python>``."""

DEFAULT_TEMP_DIRS: Final[tuple[str, ...]] = _usable([os.environ.get("TMPDIR", "")])
"""Extra temp dirs (``$TMPDIR`` at import), replaced by ``<tmp>`` like ``/tmp``."""

_END: Final = r"(?=[/\\]|\Z)"
# A path token: a File "..." line's quoted text, or a run without delimiters.
_TOKEN: Final = re.compile(r"""(?<=File ")[^"\r\n]+(?=")|[^\s"'`,;()\[\]{}|=]+""")
# Anchored at the token's start (optionally after file:// or a drive letter).
_LEAD: Final = r"\A(?:file:/*)?"
_ANCHORED: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("<home>", re.compile(_LEAD + r"/+root" + _END)),
    ("<tmp>", re.compile(_LEAD + r"/+(?:private/)?var/folders/[^/]+/[^/]+/[^/]+" + _END)),
    ("<tmp>", re.compile(_LEAD + r"/+(?:private/)?(?:var/)?tmp" + _END)),
    ("<tmp>", re.compile(_LEAD + r"/+dev/shm" + _END)),
    ("<app>", re.compile(_LEAD + r"/+(?:app|var/task)" + _END)),
    ("<drive>", re.compile(_LEAD + r"(?:\\\\\?\\)?[A-Za-z]:" + _END)),
    ("<unc>", re.compile(r"\A\\\\[^\\/?]+[\\/][^\\/]+" + _END)),
)
# Found anywhere in a token.
_ANYWHERE: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("<site-packages>", re.compile(r"[/\\](?:site|dist)-packages" + _END)),
    ("<stdlib>", re.compile(r"[/\\](?:lib|lib64|Lib)[/\\]python\d+(?:\.\d+)?t?" + _END)),
    (
        "<home>",
        re.compile(r"[/\\](?:home|Users|Documents and Settings)[/\\][^/\\]+" + _END),
    ),
)


def sanitize_stack(
    text: str,
    *,
    extra_paths: Sequence[str] = (),
    prefixes: Sequence[str] = DEFAULT_PREFIXES,
    temp_dirs: Sequence[str] = DEFAULT_TEMP_DIRS,
) -> str:
    """Return ``text`` with host paths replaced by placeholders (see the module docstring).

    ``extra_paths`` are the sandbox's own roots (replaced by ``<sandbox>``); ``prefixes``
    are interpreter prefixes (``<python>``); ``temp_dirs`` are extra temp roots (``<tmp>``).
    Relative or root-only (``/``) entries are ignored.
    """
    if not isinstance(text, str):
        text = str(text)
    rules = list(_ANCHORED)
    for label, paths in (
        ("<sandbox>", _usable(extra_paths)),
        ("<python>", _usable(prefixes)),
        ("<tmp>", _usable(temp_dirs)),
    ):
        if paths:
            alternatives = "|".join(re.escape(p) for p in paths)
            rules.insert(0, (label, re.compile(_LEAD + f"(?:{alternatives})" + _END)))
    # Sandbox first: on a tie, the earlier rule wins.
    rules.sort(key=lambda rule: rule[0] != "<sandbox>")

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if "/" not in token and "\\" not in token:
            return token
        best_end, best_label = 0, ""
        for label, pattern in rules:
            hit = pattern.match(token)
            if hit is not None and hit.end() > best_end:
                best_end, best_label = hit.end(), label
        for label, pattern in _ANYWHERE:
            for hit in pattern.finditer(token):
                if hit.end() > best_end:
                    best_end, best_label = hit.end(), label
        if not best_label:
            return token
        return best_label + token[best_end:]

    return _TOKEN.sub(replace, text)
