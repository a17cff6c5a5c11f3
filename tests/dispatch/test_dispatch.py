"""The same handler behaviour through every provider and mode that supports it."""

from __future__ import annotations

import pytest
from dispatch_support import Via

from corral.core.errors import (
    ConfigInvalidError,
    LimitsExceededError,
    ProviderError,
    SandboxTimeoutError,
    UnhandledWorkerError,
)
from corral.core.spec import ResumeInfo, SandboxInvocationContext
from corral.dispatch import HandlerOutput, HandlerSuspended

ECHO = '''
def handler(payload, ctx):
    print("chatter on stdout must not break the frames")
    return {"input": payload, "run": ctx.run_id, "tenant": ctx.tenant_id, "node": ctx.node_id,
            "dry": ctx.dry_run, "state": ctx.state, "outs": ctx.node_outputs,
            "resume": None if ctx.resume is None else [ctx.resume.token_id, ctx.resume.value],
            "tokens": ctx.resumed_tokens}
'''

ASYNC = '''
import asyncio
async def handler(payload, ctx):
    await asyncio.sleep(0)
    return payload * 2
'''

APPROVAL = '''
def handler(payload, ctx):
    approved = ctx.wait_token("approve-" + payload["doc"])
    return {"doc": payload["doc"], "approved": approved, "state": ctx.state}
'''

RAISES = '''
from corral.core.errors import ConfigInvalidError
def bad_field(payload, ctx):
    raise ConfigInvalidError("doc.title", "must not be empty")
def plain(payload, ctx):
    raise ValueError("boom " + str(payload))
def returns_set(payload, ctx):
    return {1, 2}
def sleeps(payload, ctx):
    import time
    time.sleep(3)
'''


def test_output_reaches_the_caller_with_ctx_unchanged(via: Via) -> None:
    ctx = SandboxInvocationContext(dry_run=True, state={"n": 1, "nested": {"ü": [1, None]}},
                                   node_outputs={"fetch": "ok"})
    out = via.run(ECHO, {"text": "grüße"}, ctx)
    assert out == HandlerOutput(value={
        "input": {"text": "grüße"}, "run": "run-1", "tenant": "acme", "node": "n1",
        "dry": True, "state": {"n": 1, "nested": {"ü": [1, None]}}, "outs": {"fetch": "ok"},
        "resume": None, "tokens": {}})
    assert out.kind == "output"


def test_async_handler(via: Via) -> None:
    assert via.run(ASYNC, 21) == HandlerOutput(value=42)


def test_suspend_then_resume_across_two_sandboxes(via: Via) -> None:
    first = via.run(APPROVAL, {"doc": "d7"}, SandboxInvocationContext(state={"step": 1}))
    assert first == HandlerSuspended(token_id="approve-d7")
    assert first.kind == "suspended"
    # a fresh sandbox: the token value and the state travel only in the frames
    second = via.run(APPROVAL, {"doc": "d7"}, SandboxInvocationContext(state={"step": 1}),
                     resumed={first.token_id: {"by": "ana"}}, run_id="run-1")
    assert second == HandlerOutput(value={"doc": "d7", "approved": {"by": "ana"},
                                          "state": {"step": 1}})


def test_ctx_resume_alone_also_resumes(via: Via) -> None:
    ctx = SandboxInvocationContext(resume=ResumeInfo(token_id="approve-x", value=False))
    assert via.run(APPROVAL, {"doc": "x"}, ctx).value["approved"] is False  # type: ignore[union-attr]
    echo = via.run(ECHO, None, ctx, resumed={"other": 1})
    assert echo.value["resume"] == ["approve-x", False]  # type: ignore[union-attr]
    assert echo.value["tokens"] == {"other": 1, "approve-x": False}  # type: ignore[union-attr]


def test_a_corral_error_keeps_its_code_and_facts(via: Via) -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        via.run(RAISES, None, attribute="bad_field")
    assert (ei.value.field, ei.value.reason) == ("doc.title", "must not be empty")


def test_a_plain_exception_is_unhandled_worker(via: Via) -> None:
    with pytest.raises(UnhandledWorkerError, match="ValueError: boom 3") as ei:
        via.run(RAISES, 3, attribute="plain")
    if via.process:
        assert ei.value.exit_code == 1
        assert "ValueError: boom 3" in ei.value.stderr_tail  # the traceback went to stderr


def test_an_unserialisable_result_is_config_invalid(via: Via) -> None:
    with pytest.raises(ConfigInvalidError) as ei:
        via.run(RAISES, None, attribute="returns_set")
    assert ei.value.field == "output"


def test_a_missing_handler_is_config_invalid(via: Via) -> None:
    with pytest.raises(ConfigInvalidError, match="no attribute 'nope'"):
        via.run(ECHO, None, attribute="nope")


def test_past_the_deadline_is_timeout(via: Via) -> None:
    with pytest.raises(SandboxTimeoutError) as ei:
        via.run(RAISES, None, attribute="sleeps", timeout_ms=300)
    assert ei.value.timeout_ms == 300


# ---------------------------------------------------------------- hostile processes

def _evil(body: str, tmp: str = "") -> dict[str, str]:
    """An 'entrypoint' that ignores the protocol and does ``body`` instead."""
    head = "import os, sys, time, json\nout = sys.stdout\n"
    if tmp:
        head += f"open({tmp!r} + '/pid', 'w').write(str(os.getpid()))\n"
    return {"evil.py": head + body}


def _run_evil(via: Via, body: str, **kw: object) -> object:
    return via.run("", None, entry="evil.py", files=_evil(body), **kw)  # type: ignore[arg-type]


def _cause_kind(err: BaseException) -> str | None:
    from corral.dispatch import ProtocolViolation
    cause = err.__cause__
    assert isinstance(cause, ProtocolViolation)
    return None if cause.error is None else str(cause.error.kind)


def test_garbage_on_stdout_is_provider_error(proc_via: Via) -> None:
    with pytest.raises(ProviderError, match="malformed frame") as ei:
        _run_evil(proc_via, "out.write('hello, not a frame\\n')")
    assert _cause_kind(ei.value) == "not-json"


def test_a_line_over_the_cap_is_provider_error(proc_via: Via) -> None:
    body = "for _ in range(64):\n    out.write('x' * 65536); out.flush()\ntime.sleep(30)"
    with pytest.raises(ProviderError) as ei:
        _run_evil(proc_via, body, max_line_bytes=1024, timeout_ms=20_000)
    assert _cause_kind(ei.value) == "line-too-long"


def test_two_output_frames_are_provider_error(proc_via: Via) -> None:
    frame = '{"v":1,"kind":"output","output":1}\\n'
    with pytest.raises(ProviderError, match="second result frame") as ei:
        _run_evil(proc_via, f"out.write('{frame}' * 2)")
    assert _cause_kind(ei.value) is None


def test_a_host_bound_frame_of_the_wrong_direction_is_provider_error(proc_via: Via) -> None:
    frame = '{"v":1,"kind":"resume","tokenId":"t","value":1}\\n'
    with pytest.raises(ProviderError, match="host-to-handler 'resume'"):
        _run_evil(proc_via, f"out.write('{frame}')")


def test_exit_42_without_a_suspend_frame_is_unhandled_worker(proc_via: Via) -> None:
    with pytest.raises(UnhandledWorkerError, match="without a suspend frame") as ei:
        _run_evil(proc_via, "sys.stderr.write('pretending to suspend'); sys.exit(42)")
    assert ei.value.exit_code == 42
    assert ei.value.stderr_tail == "pretending to suspend"


def test_a_suspend_frame_then_exit_0_is_unhandled_worker(proc_via: Via) -> None:
    frame = '{"v":1,"kind":"suspend","tokenId":"t"}\\n'
    with pytest.raises(UnhandledWorkerError, match="exited with code 0, not 42"):
        _run_evil(proc_via, f"out.write('{frame}')")


def test_exit_without_a_frame_keeps_code_and_stderr_tail(proc_via: Via) -> None:
    body = "sys.stderr.write('x' * 20000 + 'last words'); sys.exit(3)"
    with pytest.raises(UnhandledWorkerError) as ei:
        _run_evil(proc_via, body, stderr_tail_bytes=100)
    assert ei.value.exit_code == 3
    assert ei.value.stderr_tail.endswith("last words") and len(ei.value.stderr_tail) == 100


def test_unknown_handler_error_codes_become_provider_error(proc_via: Via) -> None:
    frame = '{"v":1,"kind":"error","error":{"code":"bad-input","message":"no x"}}\\n'
    with pytest.raises(ProviderError, match="'bad-input': no x"):
        _run_evil(proc_via, f"out.write('{frame}'); sys.exit(1)")


def test_known_codes_rebuild_their_class_with_facts(proc_via: Via) -> None:
    frame = ('{"v":1,"kind":"error","error":{"code":"limits-exceeded","message":"m",'
             '"details":{"limit":"memory","limit_value":64,"observed":70}}}\\n')
    with pytest.raises(LimitsExceededError) as ei:
        _run_evil(proc_via, f"out.write('{frame}')")
    assert (ei.value.limit, ei.value.limit_value, ei.value.observed) == ("memory", 64, 70)


@pytest.mark.slow
def test_a_handler_that_never_exits_times_out_and_is_killed(proc_via: Via, tmp_path: object
                                                            ) -> None:
    import os
    import time
    tmp = str(tmp_path)
    files = _evil("time.sleep(60)", "" if proc_via.name.startswith("linux") else tmp)
    with pytest.raises(SandboxTimeoutError):
        proc_via.run("", None, entry="evil.py", files=files, timeout_ms=1500)
    if proc_via.name.startswith("linux"):
        return  # the pid namespace died with the sandbox (the provider's own tests show it)
    with open(os.path.join(tmp, "pid")) as f:
        pid = int(f.read())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        pytest.fail(f"the handler process {pid} is still alive")
