"""``corral doctor``: the host report, as text and as JSON, called in-process."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from corral.cli import doctor

pytestmark = pytest.mark.linux


def invoke(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from corral.cli import VERBS
    if "doctor" in VERBS:  # wired into the dispatcher: go through main()
        from corral.cli import main
        code = main(["doctor", *argv])
    else:
        parser = argparse.ArgumentParser(prog="corral")
        doctor.add_parser(parser.add_subparsers(dest="verb", required=True))
        args = parser.parse_args(["doctor", *argv])
        code = args.handler(args)
    return code, capsys.readouterr().out


def test_json_report_matches_the_probe(capsys: pytest.CaptureFixture[str]) -> None:
    from corral.providers.linux.host.hostinfo import probe
    code, out = invoke(["--json"], capsys)
    assert code == 0
    report = json.loads(out)
    info = probe()
    assert [c["name"] for c in report["host"]["checks"]] == [c.name for c in info.checks()]
    assert report["host"]["cgroups"]["version"] == info.cgroups.version
    by_name = {p["name"]: p for p in report["providers"]}
    assert list(by_name) == ["inprocess", "subproc", "linux", "oci/crun", "oci/runsc"]
    assert by_name["linux"]["usable"] == (
        all(c.ok for c in info.namespaces.values()) and info.seccomp.ok)
    for p in report["providers"]:
        assert p["rows"] or not p["usable"]  # an unusable runtime says only what is missing
        assert all(set(r) == {"what", "enforced", "how"} for r in p["rows"])


def test_text_report_is_aligned_and_complete(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = invoke([], capsys)
    assert code == 0
    assert "\x1b[" not in out  # no colour codes
    assert out.startswith("corral doctor: kernel ")
    assert "Host primitives" in out and "Providers" in out
    for name in ("inprocess (level none)", "subproc (level context-isolated)",
                 "linux (level strict)"):
        assert name in out
    # in each table the third column starts at the same offset on every row
    for block in out.split("\n\n"):
        rows = [ln for ln in block.splitlines() if re.match(r"^ +(yes|no) ", ln)]
        starts = {len(m.group(0)) for ln in rows if (m := re.match(r"^ +(yes|no) +\S.*?  +", ln))}
        assert len(starts) <= 1, block


def test_text_says_not_usable_and_why() -> None:
    report = doctor.collect()
    linux = next(p for p in report["providers"] if p["name"] == "linux")
    linux.update(usable=False, summary="strict not usable here: missing net namespace")
    text = doctor.render(report)
    assert "linux (level strict): NOT usable; strict not usable here: missing net namespace" in text
