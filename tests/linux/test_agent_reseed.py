"""A ``fork_call`` child is forked bare (no at-fork hooks), so the agent does what
``random``'s hook would: a fresh state from the OS in every child."""

from __future__ import annotations

import os
import random

from corral.providers.linux import _sys_unsafe as su
from corral.providers.linux.init import agent


def test_a_bare_fork_child_reseeds_random_as_the_hook_would() -> None:
    random.seed(1234)
    random.gauss(0, 1)  # leaves gauss_next set
    seen = set()
    for _ in range(3):
        r, w = os.pipe()
        pid = su.fork_bare()
        if pid == 0:
            try:
                agent._reseed_random()
                fresh = random._inst.gauss_next is None  # type: ignore[attr-defined]
                os.write(w, f"{random.getrandbits(64)} {fresh}".encode())
            finally:
                os._exit(0)
        os.close(w)
        value, ok = os.read(r, 100).decode().split()
        os.close(r)
        os.waitpid(pid, 0)
        assert ok == "True"
        seen.add(value)
    random.seed(1234)
    random.gauss(0, 1)
    seen.add(str(random.getrandbits(64)))  # what a child would draw without the reseed
    assert len(seen) == 4
