"""docs/rules.md is generated from the rule units and must not drift from them."""


from qlint.lint.rule import rules as load_all

from conftest import ROOT, load_module


def generator():
    return load_module(ROOT / "scripts" / "gen_rules_doc.py", "gen_rules_doc")


def test_docs_rules_md_is_up_to_date():
    assert (ROOT / "docs" / "rules.md").read_text() == generator().render(), "run python scripts/gen_rules_doc.py"


def test_every_rule_is_documented_once_in_code_order():
    text = generator().render()
    codes = sorted(load_all())
    assert {"QL101", "QL201", "QL205", "QL301", "QL305"} <= set(codes)
    headings = [line.split()[1] for line in text.splitlines() if line.startswith("## ")]
    assert headings == codes


def test_check_mode_fails_on_a_stale_file(tmp_path, monkeypatch):
    module = generator()
    monkeypatch.setattr(module, "DOC", tmp_path / "rules.md")
    assert module.main(["--check"]) == 1
    assert module.main([]) == 0
    assert module.main(["--check"]) == 0
