"""Baselines: keyed by (model, code, block, message hash), multiset, no line numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qlint.ci.baseline import BaselineError, filter_new, load_baseline, write_baseline
from qlint.ci.identity import normalize_message
from qlint.core.results import Finding, ModelReport, Report, Source


def finding(code="QL101", block="layers.0", message="block layers.0: q = 3 > 1", line=10, file="pkg/m.py"):
    return Finding(code, "error", message, block, Source(file, line))


def report(*models: tuple[str, list[Finding]]) -> Report:
    return Report([ModelReport(spec, "fx", "eval", [], list(findings)) for spec, findings in models])


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def messages(r: Report) -> list[str]:
    return [f"{f.code} {f.block} {f.message}" for f in r.findings]


def test_round_trip_accepts_everything(tmp_path):
    today = report(("pkg/m.py:build", [finding(), finding("QL104", "layers.1", "post-LN")]))
    assert write_baseline(today, tmp_path / "qlint-baseline.json") == 2
    assert filter_new(today, tmp_path / "qlint-baseline.json").findings == []
    data = json.loads((tmp_path / "qlint-baseline.json").read_text())
    assert data["qlint_baseline"] == 1
    assert [(e["model"], e["code"], e["block"], e["count"]) for e in data["findings"]] == [
        ("pkg/m.py:build", "QL101", "layers.0", 1),
        ("pkg/m.py:build", "QL104", "layers.1", 1),
    ]


def test_line_shifts_do_not_invalidate_entries(tmp_path):
    write_baseline(report(("pkg/m.py:build", [finding(line=10, message="q = 3 at pkg/m.py:10")])), "b.json")
    moved = report(("pkg/m.py:build", [finding(line=42, message="q = 3 at /abs/elsewhere/pkg/m.py:42")]))
    assert filter_new(moved, "b.json").findings == []


def test_new_findings_are_reported(tmp_path):
    write_baseline(report(("pkg/m.py:build", [finding()])), "b.json")
    later = report(
        ("pkg/m.py:build", [finding(), finding(block="layers.5"), finding(message="block layers.0: q = 5 > 1")]),
        ("pkg/other.py:build", [finding()]),  # same finding in another model: new
    )
    new = filter_new(later, "b.json")
    assert messages(new) == [
        "QL101 layers.5 block layers.0: q = 3 > 1",
        "QL101 layers.0 block layers.0: q = 5 > 1",
        "QL101 layers.0 block layers.0: q = 3 > 1",
    ]
    assert [m.spec for m in new.models] == ["pkg/m.py:build", "pkg/other.py:build"]


def test_multiset_semantics(tmp_path):
    write_baseline(report(("pkg/m.py:build", [finding(), finding()])), "b.json")
    assert json.loads(Path("b.json").read_text())["findings"][0]["count"] == 2
    three = report(("pkg/m.py:build", [finding(), finding(), finding()]))
    assert len(filter_new(three, "b.json").findings) == 1
    write_baseline(report(("pkg/m.py:build", [finding()])), "b.json")
    assert len(filter_new(three, "b.json").findings) == 2


def test_rewriting_drops_fixed_findings(tmp_path):
    write_baseline(report(("pkg/m.py:build", [finding(), finding("QL104", "layers.1", "post-LN")])), "b.json")
    write_baseline(report(("pkg/m.py:build", [finding("QL104", "layers.1", "post-LN")])), "b.json")
    entries = json.loads(Path("b.json").read_text())["findings"]
    assert [e["code"] for e in entries] == ["QL104"]
    # The fixed finding coming back is new again.
    assert messages(filter_new(report(("pkg/m.py:build", [finding()])), "b.json")) == [
        "QL101 layers.0 block layers.0: q = 3 > 1"
    ]


def test_model_specs_are_relative_to_the_baseline_file(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    write_baseline(report(("pkg/m.py:build", [finding()])), tmp_path / "b.json")
    monkeypatch.chdir(tmp_path / "sub")  # the same model named from elsewhere
    assert filter_new(report(("../pkg/m.py:build", [finding()])), tmp_path / "b.json").findings == []
    absolute = str(tmp_path / "pkg" / "m.py") + ":build"
    assert filter_new(report((absolute, [finding()])), tmp_path / "b.json").findings == []
    assert json.loads((tmp_path / "b.json").read_text())["findings"][0]["model"] == "pkg/m.py:build"


def test_normalize_message():
    assert normalize_message("x + f(x) at /home/me/pkg/model.py:42:7") == "x + f(x) at model.py"
    assert normalize_message("see line 12 and lines 3-4") == "see line and lines"
    assert normalize_message("  q = 3\n > 1 ") == "q = 3 > 1"


def test_baseline_file_is_deterministic(tmp_path):
    r = report(("b.py:f", [finding("QL104", "z", "m")]), ("a.py:f", [finding()]))
    write_baseline(r, "one.json")
    write_baseline(Report(list(reversed(r.models))), "two.json")
    assert Path("one.json").read_text() == Path("two.json").read_text()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"invalid JSON at line 1"),
        ("[]", r"expected an object with 'qlint_baseline' and 'findings'"),
        ('{"qlint_baseline": 9, "findings": []}', r"unsupported format version 9"),
        ('{"qlint_baseline": 1, "findings": {}}', r"'findings' must be an array"),
        ('{"qlint_baseline": 1, "findings": [3]}', r"findings\[0\] must be an object"),
        ('{"qlint_baseline": 1, "findings": [{"model": "m", "code": "QL101"}]}', r"findings\[0\]\.fingerprint"),
        (
            '{"qlint_baseline": 1, "findings": [{"model": "m", "code": "QL101", "fingerprint": "x", "count": 0}]}',
            r"findings\[0\]\.count must be a positive integer",
        ),
        (
            '{"qlint_baseline": 1, "findings": [{"model": "m", "code": "Q", "fingerprint": "x", "block": 1}]}',
            r"findings\[0\]\.block must be a string or null",
        ),
    ],
)
def test_malformed_baseline_is_a_clear_error(tmp_path, content, message):
    Path("b.json").write_text(content)
    with pytest.raises(BaselineError, match=message) as info:
        filter_new(report(("m.py:f", [finding()])), "b.json")
    assert "b.json" in str(info.value) and "\n" not in str(info.value)


def test_missing_baseline_is_a_clear_error():
    with pytest.raises(BaselineError, match=r"baseline file not found: nope\.json"):
        load_baseline("nope.json")


# -- end to end ------------------------------------------------------------------

E2E_MODEL = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p
        self.w1, self.w2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.w2(self.w1(x) ** self.p)


def cubic():
    return Net(3), (torch.randn(2, 4, 8),)


def quintic():
    return Net(5), (torch.randn(2, 4, 8),)
'''


def qlint(*args: str):
    from click.testing import CliRunner

    from qlint.cli import main

    return CliRunner().invoke(main, [*args], catch_exceptions=False)


def make_project(root: Path, shift: int = 0) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "base_model.py").write_text("\n" * shift + E2E_MODEL)
    (root / "pyproject.toml").write_text('[tool.qlint]\nmodels = ["base_model.py:cubic"]\n')
    return root


def test_cli_write_then_check_baseline(tmp_path, monkeypatch):
    monkeypatch.chdir(make_project(tmp_path / "p1"))
    result = qlint("--write-baseline", "qlint-baseline.json")
    assert result.exit_code == 0 and "wrote 1 finding(s) to qlint-baseline.json" in result.stderr
    assert qlint("--baseline", "qlint-baseline.json").exit_code == 0
    result = qlint("--baseline", "qlint-baseline.json", "base_model.py:cubic", "base_model.py:quintic", "--format", "concise")
    assert result.exit_code == 1
    assert result.stdout.count("QL101") == 1 and "q = 5" in result.stdout

    # The same project, edited so that every line moved: the baseline still holds.
    shifted = make_project(tmp_path / "p2", shift=7)
    (shifted / "qlint-baseline.json").write_text((tmp_path / "p1" / "qlint-baseline.json").read_text())
    monkeypatch.chdir(shifted)
    assert qlint("--baseline", "qlint-baseline.json").exit_code == 0
    # ... and configured in the file instead of on the command line.
    (shifted / "pyproject.toml").write_text(
        '[tool.qlint]\nmodels = ["base_model.py:cubic"]\nbaseline = "qlint-baseline.json"\n'
    )
    assert qlint().exit_code == 0


def test_cli_malformed_or_missing_baseline_exits_2(tmp_path, monkeypatch):
    monkeypatch.chdir(make_project(tmp_path / "p"))
    result = qlint("--baseline", "missing.json")
    assert result.exit_code == 2 and result.stderr == (
        "qlint: error: baseline file not found: missing.json (create it with --write-baseline)\n"
    )
    Path("bad.json").write_text("{")
    result = qlint("--baseline", "bad.json")
    assert result.exit_code == 2 and result.stderr.startswith("qlint: error: malformed baseline bad.json")
