"""Baselines: keyed by (model, code, structural position), multiset, no lines, indices or message text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qlint.ci.baseline import BaselineError, filter_new, load_baseline, prune_baseline, write_baseline
from qlint.ci.identity import normalize_message
from qlint.core.results import Block, Finding, ModelReport, Report, Source


def finding(code="QL101", block="layers.0", message="block layers.0: q = 3 > 1", line=10, file="pkg/m.py"):
    return Finding(code, "error", message, block, Source(file, line))


def report(*models: tuple[str, list[Finding]], q: float = 3.0, anchors: dict | None = None) -> Report:
    """Models whose findings' blocks exist, each with exponent ``q`` decided by x^p."""
    def blocks(findings):
        names = dict.fromkeys(f.block for f in findings if f.block)
        return [Block(name, i, q, "supercritical", [], dominant="x^p") for i, name in enumerate(names)]

    return Report([ModelReport(spec, "fx", "eval", blocks(found), list(found), anchors=dict(anchors or {}))
                   for spec, found in models])


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def messages(r: Report) -> list[str]:
    return [f"{f.code} {f.block} {f.message}" for f in r.findings]


def test_round_trip_accepts_everything(tmp_path):
    today = report(("pkg/m.py:build", [finding(), finding("QL104", "layers.1", "post-LN")]))
    assert write_baseline(today, tmp_path / "qlint-baseline.json") == 2
    accepted = filter_new(today, tmp_path / "qlint-baseline.json")
    assert accepted.findings == [] and [f.suppression for f in accepted.suppressed] == ["baseline", "baseline"]
    data = json.loads((tmp_path / "qlint-baseline.json").read_text())
    assert data["qlint_baseline"] == 2
    assert sorted((e["model"], e["code"], e["block"], e["anchor"], e["role"], e["primitive"], e["q"], e["count"])
                  for e in data["findings"]) == [
        ("pkg/m.py:build", "QL101", "layers.0", "layers.*", "block", "x^p", "3", 1),
        ("pkg/m.py:build", "QL104", "layers.1", "layers.*", "block", "x^p", "3", 1),
    ]


def test_moved_lines_and_reworded_messages_keep_matching(tmp_path):
    write_baseline(report(("pkg/m.py:build", [finding(line=10, message="q = 3 at pkg/m.py:10")])), "b.json")
    moved = report(("pkg/m.py:build", [finding(line=42, message="a new qlint words it differently")]))
    assert filter_new(moved, "b.json").findings == []


def test_a_changed_exponent_code_or_model_is_new(tmp_path):
    write_baseline(report(("pkg/m.py:build", [finding()])), "b.json")
    assert messages(filter_new(report(("pkg/m.py:build", [finding()]), q=5.0), "b.json")) == [
        "QL101 layers.0 block layers.0: q = 3 > 1"
    ]
    later = report(("pkg/m.py:build", [finding(), finding("QL103")]), ("pkg/other.py:build", [finding()]))
    new = filter_new(later, "b.json")
    assert [(m.spec, f.code) for m in new.models for f in m.findings] == [
        ("pkg/m.py:build", "QL103"), ("pkg/other.py:build", "QL101")
    ]


def test_inserted_layers_and_renamed_attributes_keep_matching(tmp_path):
    path = {"layers.0": "Net>ModuleList>Block"}
    write_baseline(report(("pkg/m.py:build", [finding(block="layers.0")]), anchors=path), "b.json")
    # a layer inserted in front: the same block is now layers.1 (indices never count)
    assert filter_new(report(("pkg/m.py:build", [finding(block="layers.1")])), "b.json").findings != []  # no anchors
    inserted = report(("pkg/m.py:build", [finding(block="layers.1")]), anchors={"layers.1": "Net>ModuleList>Block"})
    assert filter_new(inserted, "b.json").findings == []
    renamed = report(("pkg/m.py:build", [finding(block="blocks.0")]), anchors={"blocks.0": "Net>ModuleList>Block"})
    assert filter_new(renamed, "b.json").findings == []
    other_class = report(("pkg/m.py:build", [finding(block="layers.0")]), anchors={"layers.0": "Net>ModuleList>Mixer"})
    assert len(filter_new(other_class, "b.json").findings) == 1


def test_a_renamed_spec_is_rematched_by_model_class(tmp_path):
    write_baseline(report(("pkg/m.py:build", [finding()]), anchors={"": "Net"}), "b.json")
    renamed = report(("pkg/model.py:make", [finding()]), anchors={"": "Net"})
    assert filter_new(renamed, "b.json").findings == []
    assert len(filter_new(report(("pkg/model.py:make", [finding()]), anchors={"": "Other"}), "b.json").findings) == 1
    # not while the old spec is still checked: its entries are its own
    both = report(("pkg/m.py:build", []), ("pkg/model.py:make", [finding()]), anchors={"": "Net"})
    assert len(filter_new(both, "b.json").findings) == 1


def test_stale_entries_are_reported_and_pruned(tmp_path):
    write_baseline(report(("pkg/m.py:build", [finding(), finding("QL104", "layers.1", "post-LN")])), "b.json")
    fixed = filter_new(report(("pkg/m.py:build", [finding()])), "b.json")
    assert [(e["code"], e["count"]) for e in fixed.stale_baseline] == [("QL104", 1)]
    assert fixed.to_dict()["summary"]["stale_baseline"] == 1
    assert prune_baseline(fixed, "b.json") == 1
    assert [e["code"] for e in json.loads(Path("b.json").read_text())["findings"]] == ["QL101"]
    assert filter_new(report(("pkg/m.py:build", [finding()])), "b.json").stale_baseline == []


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
        ('{"qlint_baseline": 1, "findings": []}', r"unsupported format version 1 \(this qlint reads 2; rewrite it"),
        ('{"qlint_baseline": 2, "findings": {}}', r"'findings' must be an array"),
        ('{"qlint_baseline": 2, "findings": [3]}', r"findings\[0\] must be an object"),
        ('{"qlint_baseline": 2, "findings": [{"model": "m", "code": "QL101"}]}', r"findings\[0\]\.fingerprint"),
        (
            '{"qlint_baseline": 2, "findings": [{"model": "m", "code": "QL101", "fingerprint": "x", "count": 0}]}',
            r"findings\[0\]\.count must be a positive integer",
        ),
        (
            '{"qlint_baseline": 2, "findings": [{"model": "m", "code": "Q", "fingerprint": "x", "model_class": 1}]}',
            r"findings\[0\]\.model_class must be a string",
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

STACK = '''\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p
        self.w1, self.w2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.w2(self.w1(x) ** self.p)


class Net(nn.Module):
    def __init__(self, powers):
        super().__init__()
        self.layers = nn.ModuleList(Block(p) for p in powers)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def cubic():
    return Net([3]), (torch.randn(2, 4, 8),)


def quintic():
    return Net([5]), (torch.randn(2, 4, 8),)
'''


def qlint(*args: str):
    from click.testing import CliRunner

    from qlint.cli import main

    return CliRunner().invoke(main, [*args], catch_exceptions=False)


def make_project(root: Path, shift: int = 0) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "base_model.py").write_text("\n" * shift + STACK)
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


# -- each ordinary edit, through the command line ---------------------------------

EDITS = {
    "renamed file": lambda text, names: (text, {**names, "file": "stack_model.py"}),
    "renamed factory": lambda text, names: (text.replace("def cubic", "def build_cubic"), {**names, "factory": "build_cubic"}),
    "renamed self.layers": lambda text, names: (text.replace("self.layers", "self.blocks"), names),
    "layer inserted in front": lambda text, names: (text.replace("Net([3])", "Net([1, 3])"), names),
    "dominant op moved into a helper": lambda text, names: (
        text.replace("self.w2(self.w1(x) ** self.p)", "self.w2(power(self.w1(x), self.p))")
        + "\n\ndef power(h, p):\n    return h ** p\n",
        names,
    ),
    "lines moved": lambda text, names: ("\n\n\n" + text, names),
}


def stack_project(root: Path, text: str, file: str, factory: str) -> Path:
    root.mkdir(parents=True)
    (root / file).write_text(text)
    (root / "pyproject.toml").write_text(f'[tool.qlint]\nmodels = ["{file}:{factory}"]\n')
    return root


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_ordinary_edit_keeps_the_baseline(tmp_path, monkeypatch, edit):
    monkeypatch.chdir(stack_project(tmp_path / "before", STACK, "base_model.py", "cubic"))
    assert qlint().exit_code == 1
    assert qlint("--write-baseline", "qlint-baseline.json").exit_code == 0
    text, names = EDITS[edit](STACK, {"file": "base_model.py", "factory": "cubic"})
    after = stack_project(tmp_path / "after", text, names["file"], names["factory"])
    shutil.copy(tmp_path / "before" / "qlint-baseline.json", after)
    monkeypatch.chdir(after)
    assert qlint().exit_code == 1  # the edit did not fix the block
    result = qlint("--baseline", "qlint-baseline.json")
    assert result.exit_code == 0, result.output
    assert "match no finding" not in result.stderr


def test_a_fixed_finding_leaves_a_stale_entry_until_pruned(tmp_path, monkeypatch):
    monkeypatch.chdir(stack_project(tmp_path / "p", STACK, "base_model.py", "cubic"))
    assert qlint("--write-baseline", "b.json").exit_code == 0
    Path("base_model.py").write_text(STACK.replace("Net([3])", "Net([1])"))
    Path("other.py").write_text(STACK.replace("Net([3])", "Net([1])"))
    result = qlint("--baseline", "b.json", "other.py:cubic")  # a fresh module: the edit is seen
    assert result.exit_code == 0
    assert "warning: 1 baseline entry in b.json match no finding" in result.stderr
    result = qlint("--baseline", "b.json", "other.py:cubic", "--prune-baseline")
    assert result.exit_code == 0 and "pruned 1 stale entry from b.json" in result.stderr
    assert json.loads(Path("b.json").read_text())["findings"] == []
    assert qlint("--prune-baseline").exit_code == 2  # no baseline to prune
