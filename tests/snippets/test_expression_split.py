"""The host's split of main.py (``runner.expression_split``) and the worker's compile from
it (``worker._compile_main``, issue 14: no Python AST objects in a forked run) give the
module and the result expression the worker's own parse gives: the same result, the
same line numbers in tracebacks; and a split that does not fit falls back to the parse."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

from corral.snippets.host.runner import expression_split
from corral.snippets.sandbox import worker

SOURCES = [
    "1 + 1",
    "x = sum(range(100))\nx",
    "x = 1",
    "",
    "# only a comment\n",
    '"""doc"""\nimport math\r\nmath.floor(2.5)\n# end\n',
    "x = 3\r\n\r\n(x +\n 1)  # a comment\n\n",
    "def f():\n    return 7\n\nf()",
    "x = 1; x",  # after a ';': the worker parses it
    "if True:\n    y = 2\ny * 21",
    "x = [1,\n     2]\n\\\nx",
    "'only a string'",
]


def _run(source: str, split: Any) -> tuple[Any, dict[str, Any]]:
    code, expr = worker._compile_main(source, split)
    g: dict[str, Any] = {"__name__": "__main__"}
    exec(code, g)
    value = None if expr is None else eval(expr, g)
    return value, {k: v for k, v in g.items() if k not in ("__builtins__", "f")}


@pytest.mark.parametrize("source", SOURCES)
def test_the_split_runs_as_the_parse_does(source: str) -> None:
    split = expression_split(source)
    assert _run(source, None if split is None else list(split)) == _run(source, None)


def test_what_the_host_finds() -> None:
    assert expression_split("1 + 1") == (0, 1)
    assert expression_split("x = 1\r\ny") == (7, 2)
    assert expression_split("x = 1") == (-1, 0)
    assert expression_split("") == (-1, 0)
    assert expression_split("x = 1; x") is None  # not at column 0
    assert expression_split("def f(:\n") is None  # does not parse


@pytest.mark.parametrize(("source", "line"), [
    ("x = 1\n\n1 / 0", 3),
    ("x = 1\n1 / 0\ny = 2", 2),
    ("x = 1\r\n\r\n(1 +\n 1) / 0", 3),
])
def test_tracebacks_keep_their_line_numbers(source: str, line: int) -> None:
    for split in (expression_split(source), None):
        with pytest.raises(ZeroDivisionError) as info:
            _run(source, None if split is None else list(split))
        frames = [f for f in traceback.extract_tb(info.value.__traceback__)
                  if f.filename == "main.py"]
        assert frames and frames[-1].lineno == line


@pytest.mark.parametrize("split", [[3, 1], [100, 1], [-5, 0], [0, 0], [0, 1], ["0", 1],
                                   [1.0, 1], [0, 1, 2], "x", None])
def test_a_split_that_does_not_fit_falls_back_to_the_parse(split: Any) -> None:
    source = "x = 40\nx + 2"  # [3, 1]: "x =" does not compile; [0, 1]: neither does the rest
    assert _run(source, split) == _run(source, None) == (42, {"__name__": "__main__", "x": 40})


def test_a_syntax_error_is_the_parses() -> None:
    with pytest.raises(SyntaxError) as info:
        worker._compile_main("x = (\n", [0, 1])
    assert info.value.lineno == 1


def test_the_host_takes_the_split_from_the_validators_tree(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The source is parsed once on the host: the validator's tree gives the split."""
    import ast

    from corral.snippets.host import runner
    from corral.snippets.validator import DEFAULT_ALLOWED_IMPORTS

    parses: list[str] = []
    real = ast.parse

    def counting(source: Any, *a: Any, **k: Any) -> Any:
        parses.append(source)
        return real(source, *a, **k)

    monkeypatch.setattr(ast, "parse", counting)
    source = "x = 40\nx + 2"
    found, split = runner._ValidationCache().check([("main.py", source)],
                                                   DEFAULT_ALLOWED_IMPORTS, "t")
    assert found == () and split == (7, 2) == expression_split(source)
    assert parses.count(source) == 2  # once in check, once in the direct call above
