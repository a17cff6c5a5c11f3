"""Look for unix sockets under a host path before it is bound into sandboxes.

A read-only bind does not stop ``connect()``: the kernel refuses writes to
regular files, directories and symlinks on a read-only mount, but a socket
inode is only checked against its permission bits. So a bound ``/run`` would
hand every sandbox ``docker.sock``. :func:`find_unix_socket` walks the tree a
bind would show (``MS_REC``: submounts included) without following symlinks
(a link inside the bind resolves in the sandbox's own view, not the host's)
and reports the first socket, or why the tree cannot be checked: a directory
it cannot list (a socket in it could still be reached by name) or more than
:data:`SCAN_LIMIT` entries (the walk is bounded, so a huge tree is refused
rather than scanned for minutes).

It is a check at the time it runs: a socket created under the path later is
reachable. Bind only trees whose contents you control.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["SCAN_LIMIT", "UncheckableError", "find_unix_socket"]

#: entries walked per path before giving up (for scale: /usr on Debian 12 with a
#: toolchain, 137,736 entries, 0.1 s warm, 1.3 s cold)
SCAN_LIMIT = 200_000


class UncheckableError(Exception):
    """The tree could not be checked (too big, or a directory we cannot list)."""


def find_unix_socket(path: str) -> str | None:
    """The first unix socket at or under ``path`` (its symlinks not followed, the
    path itself resolved as a bind resolves it), or None.

    Raises:
        UncheckableError: more than :data:`SCAN_LIMIT` entries, or a directory
            that cannot be listed.
    """
    top = os.path.realpath(path)
    st = os.stat(top)
    if stat.S_ISSOCK(st.st_mode):
        return top
    if not stat.S_ISDIR(st.st_mode):
        return None
    limit = SCAN_LIMIT
    seen = 0
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except FileNotFoundError:
            continue  # removed while we walk: nothing to bind there
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                continue
            raise UncheckableError(f"cannot list {d!r} ({e.strerror})") from None
        with it:
            for entry in it:
                seen += 1
                if seen > limit:
                    raise UncheckableError(f"more than {limit} entries")
                # d_type answers these without a stat; only the rest can be a socket
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                    continue
                else:
                    try:
                        mode = entry.stat(follow_symlinks=False).st_mode
                    except FileNotFoundError:
                        continue
                    if stat.S_ISSOCK(mode):
                        return entry.path
    return None
