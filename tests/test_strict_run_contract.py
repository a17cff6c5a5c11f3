"""run_strict works through the provider contract (issue 11.1): any provider whose levels
include strict serves it, a weaker one is refused before anything runs."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from corral.core.errors import LevelNotSupportedError
from corral.core.result import ExecResult
from corral.core.spec import ExecOpts
from corral.run.bounded import Outcome
from corral.run.strict import run_strict
from corral.testing import FakeProvider


def test_a_weaker_provider_is_refused_before_anything_runs() -> None:
    provider = FakeProvider(levels=["none", "context-isolated"], accept_limits=True)
    with pytest.raises(LevelNotSupportedError) as e:
        run_strict("/bin/true", timeout_ms=1000, provider=provider)
    assert e.value.requested == "strict"
    assert provider.sandboxes == []


def test_any_strict_provider_serves_it_without_streaming_exec() -> None:
    seen: list[bytes] = []

    def answer(argv: Sequence[str], opts: ExecOpts) -> ExecResult:
        assert list(argv) == ["/bin/echo", "hi"] and opts.timeout_ms == 1000
        return ExecResult(stdout=b"hi\n", stderr=b"", exit_code=0)

    provider = FakeProvider(answer, levels=["strict"], accept_limits=True)
    r = run_strict("/bin/echo", ["hi"], timeout_ms=1000, provider=provider,
                   on_stdout=seen.append)
    assert r.outcome is Outcome.EXIT and r.exit_code == 0
    assert r.stdout_text == "hi\n"
    assert seen == [b"hi\n"]  # no streaming-exec: the output comes with the result
    assert [sb.destroyed for sb in provider.sandboxes] == [True]
