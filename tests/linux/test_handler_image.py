"""Mode ``handler-image`` (issue 28, item 3): ``invoke`` runs the image's OWN entrypoint
(its config's ``Entrypoint`` + ``Cmd``) in the image's own root at strict, speaking
seed 01's JSON-lines frames on stdio, in any language.

Here the language is busybox's ``sh`` (a busybox-static image built per test in
milliseconds, tests/linux/imageroot_support.py): it has no Python and no corral, so
the frames are all the two sides share. The host treats every byte from it as
hostile: a line over the frame cap, garbage, a handler that never answers, one that
answers twice, each ends the call with corral's error and leaves no sandbox. The
image's ``User`` is the handler's uid. JavaScript (Node from the image), Python
without corral and seed 01's example spec through a registry are in
test_handler_image_node.py (cached image builds, marker ``image_build``).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from imageroot_support import busybox_layout

from cgroup_view import mine
from corral.core.errors import ConfigInvalidError, ProviderError, SandboxTimeoutError
from corral.core.spec import HandlerRef, InvocationMode, SandboxInvocationContext, SandboxSpec
from corral.dispatch import HandlerOutput, HandlerSuspended, invoke
from corral.dispatch.reply import ProtocolViolation
from strict_tier import host_can_sandbox, needs_strict

pytestmark = [pytest.mark.linux, needs_strict(host_can_sandbox())]

#: reads the invoke frame and answers with it as the output value, plus who it ran as
ECHO = b"""read -r line
printf '{"v":1,"kind":"output","output":{"frame":%s,"uid":"%s","cwd":"%s","greet":"%s",\
"target":"%s","args":"%s"}}\\n' "$line" "$(id -u)" "$(pwd)" "$GREETING" "$CORRAL_HANDLER" "$*"
"""
SUSPEND = b"""read -r line
echo 'chatter goes to stderr' >&2
printf '{"v":1,"kind":"suspend","tokenId":"tok-7"}\\n'
exit 42
"""
#: hostile handlers
FLOOD = b"""read -r line
head -c 300000 /dev/zero | tr '\\0' 'a'
echo
"""
GARBAGE = b"""printf 'this is not a frame\\n'
"""
SILENT = b"""sleep 30
"""
TWICE = b"""read -r line
printf '{"v":1,"kind":"output","output":1}\\n{"v":1,"kind":"output","output":2}\\n'
"""
FAILS = b"""read -r line
echo 'broken' >&2
exit 3
"""

PASSWD = (b"root:x:0:0:root:/root:/bin/sh\napp:x:1001:1002::/work:/bin/sh\n"
          b"nobody:x:65534:65534::/:/bin/false\n")


@pytest.fixture
def images() -> Iterator[Path]:
    """A dir the sandbox's own uid can walk to (pytest's tmp_path is 0700)."""
    d = tempfile.mkdtemp(prefix="corral-handlerimage-", dir="/var/tmp")
    Path(d).chmod(0o755)
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _layout(images: Path, name: str = "img", **config: Any) -> str:
    cfg = {"Entrypoint": ["/bin/sh"], "Cmd": ["/app/echo.sh"],
           "Env": ["PATH=/bin", "GREETING=from-the-image"], **config}
    scripts = {"app/echo.sh": ECHO, "app/suspend.sh": SUSPEND, "app/flood.sh": FLOOD,
               "app/garbage.sh": GARBAGE, "app/silent.sh": SILENT, "app/twice.sh": TWICE,
               "app/fails.sh": FAILS, "etc/passwd": PASSWD,
               "etc/group": b"root:x:0:\napp:x:1002:\n"}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    return busybox_layout(str(images / name), cfg, extra=scripts)


def _invoke(images: Path, image: str, ref: HandlerRef | None = None, payload: Any = None,
            **kw: Any) -> Any:
    from corral.providers.linux import LinuxProvider

    async def go() -> Any:
        p = LinuxProvider(image_cache_dir=str(images / "cache"))
        try:
            spec = SandboxSpec(tenant_id="acme", run_id="run-7", node_id="summarize",
                               image=image, mode=InvocationMode.HANDLER_IMAGE)
            return await invoke(p, spec, ref or HandlerRef(artifact_id="a", version="1"),
                                payload, timeout_ms=kw.pop("timeout_ms", 20_000), **kw)
        finally:
            spares = await p.wait_spares()  # also finishes removing destroyed ones
            live = len(mine()) - spares
            await p.aclose()
            assert live == 0, "invoke left a live sandbox"
    return asyncio.run(go())


def test_the_images_own_entrypoint_answers_in_frames(images: Path) -> None:
    img = _layout(images, WorkingDir="/app")
    out = _invoke(images, img, payload={"text": "grüße"},
                  ctx=SandboxInvocationContext(dry_run=True, state={"k": 1}))
    assert isinstance(out, HandlerOutput)
    frame = out.value.pop("frame")
    assert frame["kind"] == "invoke" and frame["input"] == {"text": "grüße"}
    assert frame["ctx"]["runId"] == "run-7" and frame["ctx"]["nodeId"] == "summarize"
    assert frame["ctx"]["dryRun"] is True and frame["ctx"]["state"] == {"k": 1}
    # root inside (no User), the image's WorkingDir and Env, no target named
    assert out.value == {"uid": "0", "cwd": "/app", "greet": "from-the-image", "target": "",
                         "args": ""}


def test_entrypoint_path_takes_cmds_place_and_a_module_is_named_in_env(images: Path) -> None:
    img = _layout(images)
    ref = HandlerRef(artifact_id="a", version="1", entrypoint_path="/app/suspend.sh")
    assert _invoke(images, img, ref) == HandlerSuspended(token_id="tok-7")
    ref = HandlerRef(artifact_id="a", version="1", module_path="/app/h.py",
                     attribute="run")
    out = _invoke(images, img, ref)
    assert out.value["target"] == "/app/h.py:run" and out.value["cwd"] == "/work"


def test_the_images_user_runs_the_handler(images: Path) -> None:
    out = _invoke(images, _layout(images, User="app"))
    assert out.value["uid"] == "1001"
    with pytest.raises(ConfigInvalidError, match="does not map") as ei:
        _invoke(images, _layout(images, "nouser", User="ghost"))
    assert ei.value.field == "image"


def test_an_image_without_entrypoint_or_cmd_is_refused(images: Path) -> None:
    img = _layout(images, Entrypoint=None, Cmd=None)
    with pytest.raises(ConfigInvalidError, match="Entrypoint and Cmd") as ei:
        _invoke(images, img)
    assert ei.value.field == "image"
    # an image with an Entrypoint and no Cmd: the ref's entrypoint_path completes it
    img = _layout(images, "entry", Entrypoint=["/bin/sh"], Cmd=None)
    ref = HandlerRef(artifact_id="a", version="1", entrypoint_path="/app/echo.sh")
    assert _invoke(images, img, ref).value["uid"] == "0"


@pytest.mark.parametrize(("script", "kind"), [
    ("/app/flood.sh", "line-too-long"),
    ("/app/garbage.sh", "not-json"),
])
def test_hostile_bytes_are_a_protocol_violation(images: Path, script: str, kind: str) -> None:
    ref = HandlerRef(artifact_id="a", version="1", entrypoint_path=script)
    with pytest.raises(ProviderError) as ei:
        _invoke(images, _layout(images), ref, max_line_bytes=65536)
    cause = ei.value.__cause__
    assert isinstance(cause, ProtocolViolation) and cause.error is not None
    assert cause.error.kind == kind


def test_a_second_result_frame_is_a_violation(images: Path) -> None:
    ref = HandlerRef(artifact_id="a", version="1", entrypoint_path="/app/twice.sh")
    with pytest.raises(ProviderError) as ei:
        _invoke(images, _layout(images), ref)
    assert isinstance(ei.value.__cause__, ProtocolViolation)


def test_a_silent_handler_times_out_and_a_failing_one_is_unhandled(images: Path) -> None:
    from corral.core.errors import UnhandledWorkerError
    img = _layout(images)
    ref = HandlerRef(artifact_id="a", version="1", entrypoint_path="/app/silent.sh")
    with pytest.raises(SandboxTimeoutError):
        _invoke(images, img, ref, timeout_ms=1500)
    ref = HandlerRef(artifact_id="a", version="1", entrypoint_path="/app/fails.sh")
    with pytest.raises(UnhandledWorkerError) as ei:
        _invoke(images, img, ref)
    assert ei.value.exit_code == 3 and "broken" in ei.value.stderr_tail
