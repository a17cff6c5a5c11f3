"""The wire protocol: exact bytes both ways, an accept/reject corpus, the decoder."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import ConfigInvalidError
from corral.core.spec import ResumeInfo, SandboxInvocationContext as Ctx
from corral.wire import protocol as p
from corral.wire.protocol import (
    DEFAULT_MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    SUSPEND_EXIT_CODE,
    ErrorBody,
    ErrorFrame,
    FrameDecoder,
    FrameErr,
    FrameOk,
    InvokeFrame,
    OutputFrame,
    ParseResult,
    ProtocolErrorKind,
    ResumeFrame,
    SandboxSuspensionRequest,
    SuspendFrame,
    WireFrame,
    encode_frame,
    parse_frame,
    parse_frames,
)

CTX_MIN = Ctx(run_id="r1", tenant_id="t1")
CTX_MIN_WIRE = b'{"runId":"r1","tenantId":"t1","dryRun":false,"state":{},"nodeOutputs":{}}'

# (frame, the exact bytes encode_frame gives and parse_frame takes back)
TABLE: list[tuple[WireFrame, bytes]] = [
    (
        InvokeFrame(input=None, ctx=CTX_MIN),
        b'{"v":1,"kind":"invoke","input":null,"ctx":' + CTX_MIN_WIRE + b"}\n",
    ),
    (
        InvokeFrame(
            input={"text": "grüße, 世界 🎉", "n": [1, 2.5, -3]},
            ctx=Ctx(
                run_id="run-7",
                tenant_id="acme",
                node_id="summarize",
                dry_run=True,
                state={"k": {"nested": [None, True]}},
                node_outputs={"fetch": "ok"},
            ),
        ),
        '{"v":1,"kind":"invoke","input":{"text":"grüße, 世界 🎉","n":[1,2.5,-3]},'
        '"ctx":{"runId":"run-7","tenantId":"acme","nodeId":"summarize","dryRun":true,'
        '"state":{"k":{"nested":[null,true]}},"nodeOutputs":{"fetch":"ok"}}}\n'.encode(),
    ),
    (
        InvokeFrame(
            input="x",
            ctx=Ctx(
                run_id="r1", tenant_id="t1", resume=ResumeInfo(token_id="tok-1", value={"ok": 1})
            ),
        ),
        b'{"v":1,"kind":"invoke","input":"x","ctx":{"runId":"r1","tenantId":"t1",'
        b'"dryRun":false,"state":{},"nodeOutputs":{},"resume":{"tokenId":"tok-1","value":{"ok":1}}}}\n',
    ),
    (
        ResumeFrame(token_id="tok-1", value={"approved": True}),
        b'{"v":1,"kind":"resume","tokenId":"tok-1","value":{"approved":true}}\n',
    ),
    (
        ResumeFrame(token_id="t", value=None),
        b'{"v":1,"kind":"resume","tokenId":"t","value":null}\n',
    ),
    (OutputFrame(output=42), b'{"v":1,"kind":"output","output":42}\n'),
    (
        OutputFrame(output='line1\nline2 "q" \\ \u2028 é'),
        '{"v":1,"kind":"output","output":"line1\\nline2 \\"q\\" \\\\ \u2028 é"}\n'.encode(),
    ),
    (OutputFrame(output=[]), b'{"v":1,"kind":"output","output":[]}\n'),
    (
        ErrorFrame(error=ErrorBody(code="bad-input", message="no «x» field")),
        '{"v":1,"kind":"error","error":{"code":"bad-input","message":"no «x» field"}}\n'.encode(),
    ),
    (
        ErrorFrame(error=ErrorBody(code="E", message="", details={"line": 3})),
        b'{"v":1,"kind":"error","error":{"code":"E","message":"","details":{"line":3}}}\n',
    ),
    (SuspendFrame(token_id="wait-ü"), '{"v":1,"kind":"suspend","tokenId":"wait-ü"}\n'.encode()),
]


@pytest.mark.parametrize(
    ("frame", "wire"), TABLE, ids=[f"{f.kind}-{i}" for i, (f, _) in enumerate(TABLE)]
)
def test_table_encode_and_parse(frame: WireFrame, wire: bytes) -> None:
    assert encode_frame(frame) == wire
    assert parse_frame(wire) == FrameOk(frame=frame)
    assert parse_frame(wire.decode()) == FrameOk(frame=frame)
    assert parse_frame(wire[:-1] + b"\r\n") == FrameOk(frame=frame)


def test_constants_and_tags() -> None:
    assert PROTOCOL_VERSION == 1
    assert SUSPEND_EXIT_CODE == 42
    assert DEFAULT_MAX_LINE_BYTES == 16 * 1024 * 1024
    assert {f.v for f, _ in TABLE} == {1}
    assert {f.kind for f, _ in TABLE} == {"invoke", "resume", "output", "error", "suspend"}


def test_seed_handler_lines_parse_unchanged() -> None:
    # What the seed's TypeScript side writes with JSON.stringify (key order may differ).
    line = (
        b'{"kind":"invoke","v":1,"input":{"q":1},"ctx":{"tenantId":"t","runId":"r",'
        b'"nodeId":"summarize","dryRun":false,"state":{},"nodeOutputs":{}}}'
    )
    res = parse_frame(line)
    assert isinstance(res, FrameOk)
    assert res.frame == InvokeFrame(
        input={"q": 1}, ctx=Ctx(run_id="r", tenant_id="t", node_id="summarize")
    )
    err = parse_frame(b'{"v":1,"kind":"error","error":{"code":"x","message":"m","details":{}}}')
    assert err == FrameOk(frame=ErrorFrame(error=ErrorBody(code="x", message="m", details={})))


def test_unknown_fields_are_ignored() -> None:
    line = b'{"v":1,"kind":"suspend","tokenId":"t","extra":[1],"ctx":{"whatever":1}}'
    assert parse_frame(line) == FrameOk(frame=SuspendFrame(token_id="t"))
    res = parse_frame(_ctx(future="true"))
    assert isinstance(res, FrameOk)
    assert res.frame == InvokeFrame(input=1, ctx=Ctx(run_id="r", tenant_id="t"))


def test_null_node_id_and_resume_mean_absent() -> None:
    res = parse_frame(_ctx(nodeId="null", resume="null"))
    assert res == FrameOk(
        frame=InvokeFrame(input=1, ctx=Ctx(run_id="r", tenant_id="t"))
    )


def _ctx(**over: Any) -> str:
    base: dict[str, str] = {
        "runId": '"r"',
        "tenantId": '"t"',
        "dryRun": "false",
        "state": "{}",
        "nodeOutputs": "{}",
    }
    base.update(over)
    body = ",".join(f'"{k}":{v}' for k, v in base.items() if v is not None)
    return f'{{"v":1,"kind":"invoke","input":1,"ctx":{{{body}}}}}'


K = ProtocolErrorKind
# (line, expected error kind, expected path)
REJECTS: list[tuple[bytes | str, ProtocolErrorKind, str | None]] = [
    (b"hello", K.NOT_JSON, None),
    (b"{", K.NOT_JSON, None),
    (b'{"v":1,"kind":"output","output":1} trailing', K.NOT_JSON, None),
    (b"[1,2]", K.NOT_OBJECT, None),
    (b"42", K.NOT_OBJECT, None),
    (b'"a string"', K.NOT_OBJECT, None),
    (b"null", K.NOT_OBJECT, None),
    (b'{"kind":"output","output":1}', K.MISSING_FIELD, "v"),
    (b'{"v":0,"kind":"output","output":1}', K.BAD_VERSION, "v"),
    (b'{"v":2,"kind":"output","output":1}', K.BAD_VERSION, "v"),
    (b'{"v":"1","kind":"output","output":1}', K.BAD_VERSION, "v"),
    (b'{"v":true,"kind":"output","output":1}', K.BAD_VERSION, "v"),
    (b'{"v":1.0,"kind":"output","output":1}', K.BAD_VERSION, "v"),
    (b'{"v":null,"kind":"output","output":1}', K.BAD_VERSION, "v"),
    (b'{"v":1}', K.MISSING_FIELD, "kind"),
    (b'{"v":1,"kind":"shutdown"}', K.UNKNOWN_KIND, "kind"),
    (b'{"v":1,"kind":"OUTPUT","output":1}', K.UNKNOWN_KIND, "kind"),
    (b'{"v":1,"kind":["output"],"output":1}', K.UNKNOWN_KIND, "kind"),
    (b'{"v":1,"kind":"output"}', K.MISSING_FIELD, "output"),
    (b'{"v":1,"kind":"invoke","ctx":{}}', K.MISSING_FIELD, "input"),
    (b'{"v":1,"kind":"invoke","input":1}', K.MISSING_FIELD, "ctx"),
    (b'{"v":1,"kind":"invoke","input":1,"ctx":[]}', K.BAD_FIELD, "ctx"),
    (_ctx(runId=None), K.MISSING_FIELD, "ctx.runId"),
    (_ctx(runId='""'), K.BAD_FIELD, "ctx.runId"),
    (_ctx(runId="7"), K.BAD_FIELD, "ctx.runId"),
    (_ctx(tenantId=None), K.MISSING_FIELD, "ctx.tenantId"),
    (_ctx(tenantId="null"), K.BAD_FIELD, "ctx.tenantId"),
    (_ctx(nodeId="1"), K.BAD_FIELD, "ctx.nodeId"),
    (_ctx(nodeId='""'), K.BAD_FIELD, "ctx.nodeId"),
    (_ctx(dryRun=None), K.MISSING_FIELD, "ctx.dryRun"),
    (_ctx(dryRun="0"), K.BAD_FIELD, "ctx.dryRun"),
    (_ctx(dryRun='"false"'), K.BAD_FIELD, "ctx.dryRun"),
    (_ctx(state="[]"), K.BAD_FIELD, "ctx.state"),
    (_ctx(state=None), K.MISSING_FIELD, "ctx.state"),
    (_ctx(nodeOutputs="null"), K.BAD_FIELD, "ctx.nodeOutputs"),
    (_ctx(resume='"tok"'), K.BAD_FIELD, "ctx.resume"),
    (_ctx(resume='{"value":1}'), K.MISSING_FIELD, "ctx.resume.tokenId"),
    (_ctx(resume='{"tokenId":"t"}'), K.MISSING_FIELD, "ctx.resume.value"),
    (b'{"v":1,"kind":"resume","value":1}', K.MISSING_FIELD, "tokenId"),
    (b'{"v":1,"kind":"resume","tokenId":"t"}', K.MISSING_FIELD, "value"),
    (b'{"v":1,"kind":"resume","tokenId":5,"value":1}', K.BAD_FIELD, "tokenId"),
    (b'{"v":1,"kind":"suspend","tokenId":""}', K.BAD_FIELD, "tokenId"),
    (b'{"v":1,"kind":"suspend"}', K.MISSING_FIELD, "tokenId"),
    (b'{"v":1,"kind":"error"}', K.MISSING_FIELD, "error"),
    (b'{"v":1,"kind":"error","error":"boom"}', K.BAD_FIELD, "error"),
    (b'{"v":1,"kind":"error","error":{"message":"m"}}', K.MISSING_FIELD, "error.code"),
    (b'{"v":1,"kind":"error","error":{"code":1,"message":"m"}}', K.BAD_FIELD, "error.code"),
    (b'{"v":1,"kind":"error","error":{"code":"c"}}', K.MISSING_FIELD, "error.message"),
    (
        b'{"v":1,"kind":"error","error":{"code":"c","message":"m","details":[]}}',
        K.BAD_FIELD,
        "error.details",
    ),
    (b'{"v":1,"kind":"output","output":NaN}', K.NOT_JSON, None),
    (b'{"v":1,"kind":"output","output":-Infinity}', K.NOT_JSON, None),
    (b'{"v":1,"kind":"output","output":1e400}', K.NOT_JSON, None),
    (b'{"v":1,"kind":"output","output":1,"output":2}', K.NOT_JSON, None),
    (b'{"v":1,"kind":"output","output":{"a":1,"a":1}}', K.NOT_JSON, None),
    (b'{"v":1,"kind":"output","output":"\xff"}', K.BAD_UTF8, None),
    (b'{"v":1,"kind":"output","output":"\xed\xa0\x80"}', K.BAD_UTF8, None),  # encoded surrogate
    (b'\xef\xbb\xbf{"v":1,"kind":"output","output":1}', K.NOT_JSON, None),  # UTF-8 BOM
    ("\ud800", K.BAD_UTF8, None),  # lone surrogate in a str line
    (b"[" * 200_000, K.NOT_JSON, None),
    (b"9" * 5000, K.NOT_JSON, None),  # beyond int digit limit
]


@pytest.mark.parametrize(("line", "kind", "path"), REJECTS)
def test_reject_corpus(line: bytes | str, kind: ProtocolErrorKind, path: str | None) -> None:
    res = parse_frame(line)
    assert isinstance(res, FrameErr), res
    assert res.kind == "err"
    assert res.error.kind is kind, res.error
    assert res.error.path == path
    assert res.error.message
    raw = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
    assert res.error.excerpt == raw[:200]


ACCEPTS: list[bytes] = [
    b'{"v":1,"kind":"output","output":1}',
    b' {"v":1,"kind":"output","output":1} ',
    b'{"v":1,"kind":"output","output":1}\n',
    b'{"v":1,"kind":"output","output":1}\r\n',
    b'{\t"v" : 1 , "kind":"output","output":1}',
    b'{"v":1,"kind":"\\u006futput","output":1}',  # escaped kind is the same string
]


@pytest.mark.parametrize("line", ACCEPTS)
def test_accept_corpus(line: bytes) -> None:
    assert parse_frame(line) == FrameOk(frame=OutputFrame(output=1))


def test_payloads_are_not_validated() -> None:
    for payload in (b"null", b'""', b"[[]]", b'{"":{}}', b"-0.5e-3", b"12345678901234567890"):
        res = parse_frame(b'{"v":1,"kind":"output","output":' + payload + b"}")
        assert isinstance(res, FrameOk), payload


def test_parse_frame_line_cap() -> None:
    line = b'{"v":1,"kind":"output","output":"' + b"x" * 100 + b'"}'
    assert isinstance(parse_frame(line, max_line_bytes=len(line)), FrameOk)
    assert isinstance(parse_frame(line + b"\n", max_line_bytes=len(line)), FrameOk)
    res = parse_frame(line, max_line_bytes=len(line) - 1)
    assert isinstance(res, FrameErr)
    assert res.error.kind is K.LINE_TOO_LONG
    assert res.error.excerpt == line[: len(line)]


def test_excerpt_is_bounded() -> None:
    res = parse_frame(b"x" * 10_000)
    assert isinstance(res, FrameErr)
    assert len(res.error.excerpt) == 200


# ---------------------------------------------------------------- encode errors


class Opaque:
    pass


NOT_BOOL: Any = 1
NOT_DICT: Any = []


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        (OutputFrame(output=Opaque()), "output"),
        (OutputFrame(output={"x": float("nan")}), "output"),
        (OutputFrame(output="\ud800"), "output"),
        (ResumeFrame(token_id="t", value={1j}), "value"),
        (InvokeFrame(input=[Opaque()], ctx=CTX_MIN), "input"),
        (
            InvokeFrame(
                input=1, ctx=Ctx(run_id="r", tenant_id="t", state={"a": Opaque()})
            ),
            "ctx.state",
        ),
        (
            InvokeFrame(
                input=1,
                ctx=Ctx(run_id="r", tenant_id="t", node_outputs={"a": float("inf")}),
            ),
            "ctx.nodeOutputs",
        ),
        (
            InvokeFrame(
                input=1,
                ctx=Ctx(
                    run_id="r", tenant_id="t", resume=ResumeInfo(token_id="k", value=Opaque())
                ),
            ),
            "ctx.resume.value",
        ),
        (
            ErrorFrame(error=ErrorBody(code="c", message="m", details={"d": Opaque()})),
            "error.details",
        ),
        (InvokeFrame(input=1, ctx=Ctx(run_id="", tenant_id="t")), "ctx.runId"),
        (
            InvokeFrame(input=1, ctx=Ctx(run_id="r", tenant_id="t", node_id="")),
            "ctx.nodeId",
        ),
        (
            InvokeFrame(input=1, ctx=Ctx(run_id="r", tenant_id="t", dry_run=NOT_BOOL)),
            "ctx.dryRun",
        ),
        (
            InvokeFrame(input=1, ctx=Ctx(run_id="r", tenant_id="t", state=NOT_DICT)),
            "ctx.state",
        ),
        (InvokeFrame(input=1, ctx={"runId": "r"}), "ctx"),  # type: ignore[arg-type]
        (SuspendFrame(token_id=""), "tokenId"),
        (ResumeFrame(token_id=None, value=1), "tokenId"),  # type: ignore[arg-type]
        (ErrorFrame(error=ErrorBody(code=3, message="m")), "error.code"),  # type: ignore[arg-type]
        (ErrorFrame(error={"code": "c"}), "error"),  # type: ignore[arg-type]
        ("not a frame", "frame"),
    ],
)
def test_encode_rejects_with_field(frame: Any, field: str) -> None:
    with pytest.raises(ConfigInvalidError) as info:
        encode_frame(frame)
    assert info.value.field == field


def test_suspension_request() -> None:
    exc = SandboxSuspensionRequest("tok-9")
    assert isinstance(exc, Exception)
    assert exc.token_id == "tok-9"
    assert "tok-9" in str(exc)
    with pytest.raises(ConfigInvalidError):
        SandboxSuspensionRequest("")


# ---------------------------------------------------------------- decoder

GOOD = encode_frame(OutputFrame(output="ok"))
GOOD_FRAME = FrameOk(frame=OutputFrame(output="ok"))


def kinds(results: list[ParseResult]) -> list[str]:
    return [r.error.kind if isinstance(r, FrameErr) else r.frame.kind for r in results]


def test_stream_goes_on_after_a_bad_line() -> None:
    dec = FrameDecoder()
    out = dec.feed(b"garbage\n" + GOOD + b'{"v":9}\n' + GOOD)
    assert kinds(out) == ["not-json", "output", "bad-version", "output"]
    assert out[1] == GOOD_FRAME
    assert dec.close() == []


def test_empty_lines_and_crlf_are_skipped() -> None:
    dec = FrameDecoder()
    out = dec.feed(b"\n\r\n\n" + GOOD[:-1] + b"\r\n\r\n")
    assert out == [GOOD_FRAME]
    assert dec.close() == []


def test_unterminated_last_line_is_parsed_at_close() -> None:
    dec = FrameDecoder()
    assert dec.feed(GOOD[:-1]) == []
    assert dec.buffered_bytes == len(GOOD) - 1
    assert dec.close() == [GOOD_FRAME]
    assert dec.buffered_bytes == 0
    assert dec.close() == []
    dec.feed(b'{"v":1,"kind":"out')
    assert kinds(dec.close()) == ["not-json"]


def test_over_cap_line_reported_once_then_next_line() -> None:
    cap = 64
    dec = FrameDecoder(max_line_bytes=cap)
    results: list[ParseResult] = []
    for _ in range(100):  # one 1000-byte line, 10 bytes at a time
        results += dec.feed(b"y" * 10)
        assert dec.buffered_bytes <= cap
    assert kinds(results) == ["line-too-long"]
    assert isinstance(results[0], FrameErr)
    assert results[0].error.excerpt == b"y" * (cap + 1)
    results += dec.feed(b"tail\n" + GOOD)
    assert kinds(results) == ["line-too-long", "output"]
    assert dec.close() == []


def test_cap_is_inclusive_and_counts_cr() -> None:
    line = GOOD[:-1]
    assert FrameDecoder(len(line)).feed(GOOD) == [GOOD_FRAME]
    assert kinds(FrameDecoder(len(line)).feed(line + b"\r\n")) == ["line-too-long"]
    assert FrameDecoder(len(line) + 1).feed(line + b"\r\n") == [GOOD_FRAME]


def test_over_cap_unterminated_line_at_close() -> None:
    dec = FrameDecoder(max_line_bytes=8)
    assert kinds(dec.feed(b"x" * 20)) == ["line-too-long"]
    assert dec.close() == []
    assert kinds(dec.feed(b"[]\n")) == ["not-object"]


def test_decoder_rejects_bad_cap() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigInvalidError):
            FrameDecoder(max_line_bytes=bad)  # type: ignore[arg-type]


def test_parse_frames_async() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        data = b"junk\n" + GOOD + encode_frame(SuspendFrame(token_id="t"))[:-1]
        for i in range(0, len(data), 7):
            yield data[i : i + 7]

    async def collect() -> list[ParseResult]:
        return [r async for r in parse_frames(chunks(), max_line_bytes=1000)]

    out = asyncio.run(collect())
    assert kinds(out) == ["not-json", "output", "suspend"]


# ---------------------------------------------------------------- purity

FORBIDDEN = {"os", "subprocess", "asyncio", "socket", "threading"}


def test_protocol_module_imports_no_io() -> None:
    assert p.__file__ is not None
    tree = ast.parse(Path(p.__file__).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            assert name not in FORBIDDEN | {"__import__", "import_module"}, name
    assert not imported & (FORBIDDEN | {"importlib"}), imported
    assert imported <= {
        "__future__",
        "collections",
        "corral",  # its pure core only: tests/test_pure_core.py checks which
        "dataclasses",
        "enum",
        "json",
        "math",
        "typing",
    }


def test_doc_examples_are_exact_bytes() -> None:
    doc = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
    examples = [
        line.encode() + b"\n"
        for line in doc.read_text(encoding="utf-8").splitlines()
        if line.startswith('{"v":1,')
    ]
    assert len(examples) >= 7
    for wire in examples:
        res = parse_frame(wire)
        assert isinstance(res, FrameOk), (wire, res)
        assert encode_frame(res.frame) == wire
