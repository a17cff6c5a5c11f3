"""sanitize_stack: host paths out, basenames and line numbers kept, idempotent, linear."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from corral.snippets.host.sanitize import DEFAULT_PREFIXES, sanitize_stack

NO_PREFIXES: dict[str, tuple[str, ...]] = {"prefixes": (), "temp_dirs": ()}

CASES = [
    ('File "/home/al/proj/app.py", line 3, in main', 'File "<home>/proj/app.py", line 3, in main'),
    ('File "/root/job.py", line 1', 'File "<home>/job.py", line 1'),
    ('File "/Users/bob/code/x.py", line 9', 'File "<home>/code/x.py", line 9'),
    ('File "/Users/John Smith/x.py", line 2', 'File "<home>/x.py", line 2'),
    (
        "/home/al/.venv/lib/python3.11/site-packages/attr/_make.py:12",
        "<site-packages>/attr/_make.py:12",
    ),
    ("/usr/lib/python3/dist-packages/yaml/__init__.py", "<site-packages>/yaml/__init__.py"),
    ('File "/usr/lib/python3.11/json/x.py", line 3', 'File "<stdlib>/json/x.py", line 3'),
    ("/opt/py/lib64/python3.12t/re/__init__.py", "<stdlib>/re/__init__.py"),
    ("at /tmp/tmpab12/main.py", "at <tmp>/tmpab12/main.py"),
    ("at /var/tmp/x.py", "at <tmp>/x.py"),
    ("/var/folders/zz/abc123/T/tmpx/y.py", "<tmp>/tmpx/y.py"),
    ("/private/var/folders/zz/abc123/T/y.py", "<tmp>/y.py"),
    ('File "/app/server.py", line 4', 'File "<app>/server.py", line 4'),
    ('File "/var/task/handler.py", line 8', 'File "<app>/handler.py", line 8'),
    (r'File "C:\Users\bob\proj\x.py", line 1', r'File "<home>\proj\x.py", line 1'),
    (r"D:\work\proj\x.py:3", r"<drive>\work\proj\x.py:3"),
    (r"\\fileserver\share\team\x.py", r"<unc>\team\x.py"),
    (r"C:\Python311\Lib\site-packages\pkg\m.py", r"<site-packages>\pkg\m.py"),
    ("file:///home/alice/x.py", "<home>/x.py"),
    ("(/home/alice/x.py:12)", "(<home>/x.py:12)"),
    ("PYTHONPATH=/home/alice/lib", "PYTHONPATH=<home>/lib"),
    ('File "<frozen importlib._bootstrap>", line 1', 'File "<frozen importlib._bootstrap>", line 1'),  # noqa: E501
    ('File "<string>", line 1, in <module>', 'File "<string>", line 1, in <module>'),
    ("ZeroDivisionError: division by zero", "ZeroDivisionError: division by zero"),
    ("relative/path/x.py and /opt/tool/x.py", "relative/path/x.py and /opt/tool/x.py"),
    ("", ""),
]


@pytest.mark.parametrize(("raw", "clean"), CASES)
def test_table(raw: str, clean: str) -> None:
    assert sanitize_stack(raw, **NO_PREFIXES) == clean
    assert sanitize_stack(clean, **NO_PREFIXES) == clean


def test_sandbox_paths_win_over_tmp() -> None:
    text = 'File "/tmp/corral-sbx-1/work/main.py", line 2\n  /tmp/other/x.py'
    assert sanitize_stack(text, extra_paths=["/tmp/corral-sbx-1/"], **NO_PREFIXES) == (
        'File "<sandbox>/work/main.py", line 2\n  <tmp>/other/x.py'
    )


def test_interpreter_prefix_and_temp_dirs() -> None:
    out = sanitize_stack(
        "/opt/pyenv/3.11/bin/python and /scratch/me/t.py",
        prefixes=["/opt/pyenv/3.11"],
        temp_dirs=["/scratch/me"],
    )
    assert out == "<python>/bin/python and <tmp>/t.py"


def test_relative_or_root_extra_paths_are_ignored() -> None:
    text = "/etc/hosts <home> home/x"
    assert sanitize_stack(text, extra_paths=["/", "", "home", "<home>"], **NO_PREFIXES) == text


def test_default_prefixes_cover_this_interpreter() -> None:
    import sys

    assert DEFAULT_PREFIXES
    assert sys.prefix not in sanitize_stack(f"{sys.prefix}/bin/python")


def test_real_traceback() -> None:
    import traceback

    def boom() -> None:
        raise ValueError("x")

    try:
        boom()
    except ValueError as exc:
        text = "".join(traceback.format_exception(exc))
    out = sanitize_stack(text, extra_paths=[__file__.rsplit("/", 1)[0]])
    assert "<sandbox>/test_snippet_sanitize.py" in out
    assert "line " in out and "ValueError: x" in out
    assert sanitize_stack(out) == out


@pytest.mark.parametrize(
    "adversarial",
    [
        "/home/" * 40_000,
        "/" * 200_000,
        "a/" * 100_000,
        'File "' + "/x" * 100_000,
        "/lib/python3" * 20_000,
        "\\\\" * 100_000,
        "C:" * 100_000,
        "/var/folders/" * 20_000,
        "/site-packages" * 20_000,
    ],
)
def test_adversarial_inputs_finish(adversarial: str) -> None:
    once = sanitize_stack(adversarial, **NO_PREFIXES)
    assert sanitize_stack(once, **NO_PREFIXES) == once


SEGMENT = st.text(alphabet="abcxyz._- 0123", min_size=1, max_size=8).map(str.strip).filter(bool)
JUNK = st.text(alphabet=st.characters(blacklist_characters="/\\", blacklist_categories=("Cs",)))
DELIM = st.sampled_from([" ", "\n", '"', "'", "(", ",", "=", "\t"])


@st.composite
def home_paths(draw: st.DrawFn) -> str:
    root = draw(st.sampled_from(["/home/", "/root/", "/Users/"]))
    user = draw(SEGMENT).replace(" ", "")
    rest = "/".join(draw(st.lists(SEGMENT.map(lambda s: s.replace(" ", "")), max_size=4)))
    return root + (user if root != "/root/" else "") + "/" + rest


@settings(max_examples=300)
@given(st.text())
def test_never_raises_and_is_idempotent(text: str) -> None:
    once = sanitize_stack(text)
    assert isinstance(once, str)
    assert sanitize_stack(once) == once


@settings(max_examples=300)
@given(
    st.lists(st.tuples(JUNK, DELIM, st.one_of(home_paths(), JUNK), DELIM), min_size=1),
)
@pytest.mark.slow
def test_home_paths_never_survive(parts: list[tuple[str, str, str, str]]) -> None:
    text = "".join(a + b + c + d for a, b, c, d in parts)
    out = sanitize_stack(text)
    assert "/home/" not in out
    assert "/root/" not in out
    assert "/Users/" not in out
    assert sanitize_stack(out) == out
