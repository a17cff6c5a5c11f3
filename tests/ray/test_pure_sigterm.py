"""``ray.init`` replaces the process's SIGTERM handler with one that raises SystemExit
wherever the main thread is; the Ray provider puts a handler its host installed back
(``corral serve`` drains on SIGTERM), and keeps Ray's where the host had none."""

from __future__ import annotations

import signal
from types import FrameType

import pytest

pytest.importorskip("ray")

from corral.providers.ray.provider import _keep_sigterm_handler


def _ray_like_init() -> None:
    def sigterm_handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(signum)
    signal.signal(signal.SIGTERM, sigterm_handler)


def test_a_host_handler_is_put_back() -> None:
    def host(signum: int, frame: FrameType | None) -> None:
        pass
    old = signal.signal(signal.SIGTERM, host)
    try:
        with _keep_sigterm_handler():
            _ray_like_init()
        assert signal.getsignal(signal.SIGTERM) is host
    finally:
        signal.signal(signal.SIGTERM, old)


def test_no_host_handler_keeps_rays() -> None:
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with _keep_sigterm_handler():
            _ray_like_init()
        h = signal.getsignal(signal.SIGTERM)
        assert callable(h) and h.__name__ == "sigterm_handler"
    finally:
        signal.signal(signal.SIGTERM, old)
