"""`# qlint: noqa` comments, per-block-ignores, rule selection and QL100 unused-noqa."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from qlint.ci.config import Config, parse_config
from qlint.core.results import Block, Finding, ModelReport, Source
from qlint.lint.rule import rules as load_all
from qlint.ci.suppress import apply_suppressions, parse_noqa, scan_source

MODEL = '''\
import torch


class Net(torch.nn.Module):
    def forward(self, x):
        doc = "x + f(x)  # qlint: noqa: QL101"
        a = x + self.f(x)  # qlint: noqa: QL101
        b = a + self.g(a)  # qlint: noqa: QL104, QL101
        c = b + self.h(b)  # qlint: noqa
        d = c + self.k(
            c
        )  # qlint: noqa:QL101 QL103
        e = d + self.m(d)  # qlint: NOQA: ql101
        f = e + self.n(e)
        return f + self.o(f)  # type: ignore  # qlint: noqa: QL999
'''
# line numbers of the residual adds above
DOC, A, B, C, D, D_END, E, F, RET = 6, 7, 8, 9, 10, 12, 13, 14, 15


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    path = tmp_path / "net.py"
    path.write_text(MODEL, encoding="utf-8")
    return str(path)


def report(file: str, findings: list[tuple[str, str, int]], blocks: list[tuple[str, int]] = ()) -> ModelReport:
    sev = {"QL101": "error", "QL102": "error", "QL103": "error", "QL104": "info"}
    return ModelReport(
        spec=f"{file}:Net",
        tracer="fx",
        mode="eval",
        blocks=[Block(name, i, 1.0, "ok", [], source=Source(file, line)) for i, (name, line) in enumerate(blocks)],
        findings=[Finding(code, sev[code], f"{block}: {code} here", block, Source(file, line))
                  for code, block, line in findings],
    )  # fmt: skip


def codes(model: ModelReport) -> list[tuple[str, int]]:
    return [(f.code, f.source.line if f.source else 0) for f in model.findings]


def test_parse_noqa_forms():
    assert parse_noqa("# qlint: noqa") == (None,)
    assert parse_noqa("# qlint: noqa: QL101") == (("QL101",),)
    assert parse_noqa("#qlint:noqa:QL101,QL104") == (("QL101", "QL104"),)
    assert parse_noqa("# qlint: noqa: QL101, QL104  trailing words") == (("QL101", "QL104"),)
    assert parse_noqa("# qlint: noqa: QL101 QL104") == (("QL101", "QL104"),)
    assert parse_noqa("# QLINT: NOQA: ql101") == (("QL101",),)
    assert parse_noqa("# type: ignore  # qlint: noqa: QL101") == (("QL101",),)
    assert parse_noqa("# noqa: QL101") is None  # flake8/ruff's own noqa is not ours
    assert parse_noqa("# qlint: ignore") is None


def test_scanner_ignores_string_literals_and_spans_logical_lines():
    directives = {d.line: d for d in scan_source(MODEL, "net.py")}
    assert DOC not in directives
    assert directives[A].codes == ("QL101",) and directives[A].span == (A, A)
    assert directives[C].codes is None
    assert directives[D_END].span == (D, D_END) and directives[D_END].codes == ("QL101", "QL103")
    assert directives[RET].codes == ("QL999",)


def test_scanner_survives_invalid_python():
    directives = scan_source("def broken(:\n    x = (1  # qlint: noqa: QL101\n", "bad.py")
    assert [d.line for d in directives] == [2]


def test_noqa_suppresses_exactly_its_codes(model_file):
    model = report(
        model_file,
        [("QL101", "a", A), ("QL104", "a", A), ("QL101", "b", B), ("QL104", "b", B), ("QL102", "c", C),
         ("QL101", "d", D), ("QL101", "e", E), ("QL101", "f", F)],
    )  # fmt: skip
    out = apply_suppressions([model], Config())[0]
    # a: only QL101 suppressed; b: both; c: blanket; d: the comment on the closing line
    # covers the whole statement; e: case-insensitive; f: no comment.
    assert codes(out) == [
        ("QL104", A),
        ("QL101", F),
        ("QL100", D_END),  # QL103 named but not reported at d
    ]
    ql100 = out.findings[-1]
    assert ql100.severity == "warning" and ql100.block == "d"
    assert "unused: QL103" in ql100.message
    assert model.findings[0].code == "QL101"  # the input is not mutated


def test_string_literal_noqa_does_not_count(model_file):
    out = apply_suppressions([report(model_file, [("QL101", "doc", DOC)])], Config())[0]
    assert codes(out) == [("QL101", DOC)]


def test_unused_noqa_on_a_certified_block_line_is_reported(model_file):
    # The block at line A is now certified: its noqa is stale.
    out = apply_suppressions([report(model_file, [], blocks=[("a", A), ("ret", RET)])], Config())[0]
    assert codes(out) == [("QL100", A), ("QL100", RET)]
    assert out.findings[0].block == "a"
    assert out.findings[0].message == "unused `# qlint: noqa` directive (unused: QL101)"
    assert out.findings[1].message == "unused `# qlint: noqa` directive (unknown: QL999)"


def test_blanket_noqa_unused(model_file):
    out = apply_suppressions([report(model_file, [], blocks=[("c", C)])], Config())[0]
    assert [f.message for f in out.findings] == ["unused blanket `# qlint: noqa` directive"]


def test_noqa_on_lines_qlint_did_not_look_at_is_ignored(model_file):
    # Only the block at F was analysed: the comments on other lines belong to
    # other models (or nothing) and are not reported.
    out = apply_suppressions([report(model_file, [("QL101", "f", F)], blocks=[("f", F)])], Config())[0]
    assert codes(out) == [("QL101", F)]


def test_non_enabled_codes_are_labelled(model_file):
    cfg = Config().merge_cli(ignore=["QL104"])
    out = apply_suppressions([report(model_file, [("QL101", "b", B)], blocks=[("b", B)])], cfg)[0]
    assert [f.message for f in out.findings] == ["unused `# qlint: noqa` directive (non-enabled: QL104)"]


def test_ql100_can_be_ignored(model_file):
    cfg = Config().merge_cli(ignore=["QL100"])
    out = apply_suppressions([report(model_file, [], blocks=[("a", A)])], cfg)[0]
    assert out.findings == []


def test_selection_drops_findings_before_suppression(model_file):
    cfg = Config().merge_cli(select=["QL10"], ignore=["QL104"])
    model = report(model_file, [("QL104", "f", F), ("QL101", "f", F), ("QL102", "f", F)])
    assert codes(apply_suppressions([model], cfg)[0]) == [("QL101", F), ("QL102", F)]


def test_per_block_ignores(model_file, tmp_path):
    cfg = parse_config({"per-block-ignores": {"layers.*": ["QL101"], "head": ["QL1"]}}, root=tmp_path)
    model = report(
        model_file,
        [("QL101", "layers.0", F), ("QL102", "layers.0", F), ("QL101", "layers.12", F),
         ("QL104", "head", F), ("QL101", "stem", F)],
    )  # fmt: skip
    out = apply_suppressions([model], cfg)[0]
    assert [(f.code, f.block) for f in out.findings] == [("QL102", "layers.0"), ("QL101", "stem")]
    assert [(f.code, f.block, f.suppression) for f in out.suppressed] == [
        ("QL101", "layers.0", "per-block-ignores"), ("QL101", "layers.12", "per-block-ignores"),
        ("QL104", "head", "per-block-ignores"),
    ]


def test_findings_without_source_and_unreadable_files(tmp_path):
    missing = str(tmp_path / "gone.py")
    model = ModelReport(
        spec="pkg.mod:build",
        tracer="fx",
        mode="eval",
        blocks=[Block("x", 0, 3.0, "supercritical", [], source=Source(missing, 3))],
        findings=[
            Finding("QL101", "error", "no place", "x"),
            Finding("QL101", "error", "gone", "x", Source(missing, 3)),
        ],
    )
    out = apply_suppressions([model], Config())[0]
    assert [f.message for f in out.findings] == ["no place", "gone"]


def test_relative_and_absolute_paths_to_the_same_file_agree(model_file, monkeypatch):
    monkeypatch.chdir(Path(model_file).parent)
    model = report(model_file, [("QL101", "a", A)])
    model.blocks.append(Block("a", 0, 3.0, "supercritical", [], source=Source("net.py", A)))
    out = apply_suppressions([model], Config())[0]
    assert out.findings == []


def test_encoding_cookie_is_honoured(tmp_path):
    path = tmp_path / "latin.py"
    path.write_bytes(
        textwrap.dedent(
            """\
            # -*- coding: latin-1 -*-
            s = "caf\xe9"
            y = x + f(x)  # qlint: noqa: QL101
            """
        ).encode("latin-1")
    )
    out = apply_suppressions([report(str(path), [("QL101", "a", 3)])], Config())[0]
    assert out.findings == []


def test_ql100_is_a_documented_rule():
    rule = load_all()["QL100"]
    assert rule.name == "unused-noqa" and rule.severity == "warning"
    assert "## QL100 unused-noqa (warning)" in rule.doc()


# -- end to end ------------------------------------------------------------------

E2E_MODEL = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.w1, self.w2, self.norm = nn.Linear(8, 8), nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x):
        if self.kind == "cubic":
            return x + self.w2(self.w1(x) ** 3)  # qlint: noqa: QL101
        if self.kind == "cubic_bare":
            return x + self.w2(self.w1(x) ** 3)  # qlint: noqa
        if self.kind == "cubic_plain":
            return x + self.w2(self.w1(x) ** 3)
        return x + self.w2(torch.relu(self.w1(self.norm(x))))  # qlint: noqa: QL101


def build(kind):
    return Net(kind), (torch.randn(2, 4, 8),)


def cubic():
    return build("cubic")


def cubic_bare():
    return build("cubic_bare")


def cubic_plain():
    return build("cubic_plain")


def certified():
    return build("certified")
'''


@pytest.fixture
def e2e(tmp_path, monkeypatch) -> Path:
    (tmp_path / "noqa_model.py").write_text(E2E_MODEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def qlint(*args: str):
    from click.testing import CliRunner

    from qlint.cli import main

    return CliRunner().invoke(main, [*args, "--format", "concise"], catch_exceptions=False)


def test_cli_noqa_suppresses(e2e):
    assert qlint("noqa_model.py:cubic").exit_code == 0
    assert qlint("noqa_model.py:cubic_bare").exit_code == 0
    result = qlint("noqa_model.py:cubic_plain")
    assert result.exit_code == 1 and "noqa_model.py:17: QL101" in result.stdout


def test_cli_stale_noqa_is_ql100(e2e):
    result = qlint("noqa_model.py:certified")
    assert result.exit_code == 0  # a warning does not fail by default
    assert result.stdout.splitlines()[0] == (
        "noqa_model.py:18: QL100 unused `# qlint: noqa` directive (unused: QL101)"
    )
    assert qlint("noqa_model.py:certified", "--fail-on", "warning").exit_code == 1
    assert qlint("noqa_model.py:certified", "--ignore", "QL100").stdout == "All checks passed!\n"


def test_cli_per_block_ignores(e2e):
    (e2e / "pyproject.toml").write_text('[tool.qlint]\nper-block-ignores = { "N*" = ["QL101"] }\n')
    assert qlint("noqa_model.py:cubic_plain").exit_code == 0
