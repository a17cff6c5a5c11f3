"""The validator's accept/reject corpus: every file under corpus/ is one standalone script.

Allowed files must validate clean. Each rejected file starts with ``# expect: code[, code]``
naming exactly the set of violation codes it must produce. Every audit finding becomes a
permanent rejected case.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.snippets.validator import ViolationCode, validate_source

CORPUS = Path(__file__).parent / "corpus"
ALLOWED = sorted((CORPUS / "allowed").glob("*.py"))
REJECTED = sorted((CORPUS / "rejected").glob("*.py"))
# Codes that need inputs too big or too odd for a corpus file; tested in test_snippet_validate.
TESTED_ELSEWHERE = {ViolationCode.SOURCE_TOO_LARGE, ViolationCode.INVALID_PATH}


def expected_codes(path: Path) -> set[str]:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: missing '# expect:' header"
    return {c.strip() for c in first.removeprefix("# expect: ").split(",")}


def test_corpus_sizes() -> None:
    assert len(ALLOWED) >= 25
    assert len(REJECTED) >= 40


@pytest.mark.parametrize("path", ALLOWED, ids=lambda p: p.name)
def test_allowed_snippet_is_clean(path: Path) -> None:
    assert validate_source(path.read_text(encoding="utf-8")) == ()


@pytest.mark.parametrize("path", REJECTED, ids=lambda p: p.name)
def test_rejected_snippet_reports_exactly_its_codes(path: Path) -> None:
    violations = validate_source(path.read_text(encoding="utf-8"))
    assert {v.code.value for v in violations} == expected_codes(path)
    for v in violations:
        assert v.path == "main.py"
        assert v.line >= 0 and v.column >= 0
        assert v.message


def test_every_rule_has_a_rejected_case() -> None:
    covered = set().union(*(expected_codes(p) for p in REJECTED))
    missing = {c.value for c in ViolationCode} - covered - {c.value for c in TESTED_ELSEWHERE}
    assert not missing
    assert covered <= {c.value for c in ViolationCode}


@pytest.mark.parametrize("path", ALLOWED + REJECTED, ids=lambda p: p.name)
def test_corpus_files_are_standalone_scripts(path: Path) -> None:
    """A later strict-sandbox test runs each file as a script: no payload-relative imports
    except the one case that is about them."""
    text = path.read_text(encoding="utf-8")
    assert "from ." not in text or path.name == "relative_missing.py"
