"""Output formats: concise, json, sarif, github, markdown and --statistics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qlint.ci.formats import (
    OUTPUT_FORMATS,
    escape_data,
    escape_property,
    format_q,
    render,
    to_sarif,
    write_output,
)
from qlint.core.results import Block, Finding, ModelReport, Report, Source
from conftest import CUBIC_LINE, CUBIC_MODULE
from qlint.lint.rule import rules as load_all


def make_report(root: Path, line: int = 12) -> Report:
    file = str(root / "pkg" / "model.py")
    poly = ModelReport(
        spec="pkg/model.py:poly",
        tracer="fx",
        mode="eval",
        blocks=[
            Block("layers.0", 0, 3.0, "supercritical", [], source=Source(file, line)),
            Block("layers.1", 1, 0.0, "ok", [], source=Source(file, line + 10)),
        ],
        findings=[
            Finding("QL101", "error", "block layers.0 is supercritical: q = 3 > 1", "layers.0", Source(file, line)),
            Finding("QL104", "info", "layers.1: Post-LN | update", "layers.1", Source(file, line + 10)),
            Finding("QL102", "error", "unknown op torch.special.i0", "layers.1", None),
        ],
    )
    ok = ModelReport(
        spec="pkg/model.py:lipschitz",
        tracer="fx",
        mode="eval",
        blocks=[Block("layers.0", 0, 1.0, "ok", [], source=Source(file, 30))],
    )
    return Report(models=[poly, ok])


def test_format_q():
    assert [format_q(q) for q in (3.0, 0.5, float("inf"), None, 1)] == ["3", "0.5", "∞", "?", "1"]


# -- concise / json -----------------------------------------------------------------


def test_concise_is_one_line_per_finding(repo):
    text = render(make_report(repo), "concise")
    assert text.splitlines() == [
        "pkg/model.py:12: QL101 block layers.0 is supercritical: q = 3 > 1",
        "pkg/model.py:22: QL104 layers.1: Post-LN | update",
        "pkg/model.py:poly: QL102 unknown op torch.special.i0",
        "Found 3 findings (2 errors, 1 info).",
    ]
    assert render(Report(models=[]), "concise") == "All checks passed!\n"


def test_concise_flattens_multiline_messages(repo):
    report = make_report(repo)
    report.models[0].findings[0].message = "first\nsecond"
    assert render(report, "concise").splitlines()[0] == "pkg/model.py:12: QL101 first second"


def test_json_is_the_core_schema(repo):
    report = make_report(repo)
    assert json.loads(render(report, "json")) == report.to_dict()


# -- statistics -------------------------------------------------------------------


def test_statistics_text_and_json(repo):
    report = make_report(repo)
    report.models[1].findings.append(Finding("QL101", "error", "again", "layers.0"))
    text = render(report, "concise", statistics=True)
    assert text.splitlines() == [
        "2\tQL101\tsupercritical-block",
        "1\tQL102\tuncertified-block",
        "1\tQL104\tpost-norm-update",
    ]
    rows = json.loads(render(report, "json", statistics=True))
    assert rows[0] == {"code": "QL101", "name": "supercritical-block", "severity": "error", "count": 2}
    assert render(Report(models=[]), "concise", statistics=True) == ""


# -- github -----------------------------------------------------------------------


def test_escaping_matches_actions_toolkit():
    assert escape_data("100% a\r\nb: c, d") == "100%25 a%0D%0Ab: c, d"
    assert escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"


def test_github_annotations(repo):
    report = make_report(repo)
    report.models[0].findings[0].message = "q = 3 > 1, 100%\nsee: derivation"
    lines = render(report, "github").splitlines()
    assert lines == [
        "::error file=pkg/model.py,line=12,title=QL101::q = 3 > 1, 100%25%0Asee: derivation",
        "::notice file=pkg/model.py,line=22,title=QL104::layers.1: Post-LN | update",
        "::error title=QL102::pkg/model.py:poly: unknown op torch.special.i0",
    ]


def test_github_escapes_odd_file_names(repo):
    odd = repo / "a,b:c.py"
    odd.write_text("x\n")
    model = ModelReport("a,b:c.py:f", "fx", "eval", [], [Finding("QL101", "warning", "m", "b", Source(str(odd), 1))])
    assert render(Report([model]), "github") == "::warning file=a%2Cb%3Ac.py,line=1,title=QL101::m\n"


# -- markdown ---------------------------------------------------------------------


def test_markdown_summary(repo):
    text = render(make_report(repo), "markdown")
    assert "| `pkg/model.py:poly` | ❌ supercritical | 3 | 2 | 2 errors, 1 info |" in text
    assert "| `pkg/model.py:lipschitz` | ✅ certified | 1 | 1 | none |" in text
    row = "| QL104 | info | `pkg/model.py:poly` | `layers.1` | `pkg/model.py:22` | layers.1: Post-LN \\| update |"
    assert row in text
    assert text.rstrip().endswith("**Found 3 findings (2 errors, 1 info).**")
    clean = Report([make_report(repo).models[1]])  # built without the witness: the summary says a check did not run
    assert "### Findings" not in render(clean, "markdown")
    assert "No findings, but not every check ran (see the verdicts)." in render(clean, "markdown")
    clean.models[0].extra["witness"] = "1 certified block(s) on the graph (float64): none refuted"
    assert "All checks passed!" in render(clean, "markdown")


# -- SARIF ------------------------------------------------------------------------


def sarif(report: Report) -> dict:
    return json.loads(render(report, "sarif"))


def test_sarif_has_what_github_code_scanning_requires(repo):
    log = sarif(make_report(repo))
    assert log["version"] == "2.1.0"
    assert log["$schema"].endswith("sarif-2.1.0.json")
    assert len(log["runs"]) == 1
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "qlint" and driver["version"]
    # optional in SARIF: present only where the installed metadata names a home page (no index has torch-qlint)
    assert driver.get("informationUri", "https://").startswith("https://") and "pypi.org" not in str(driver)
    rules = driver["rules"]
    ids = [r["id"] for r in rules]
    assert set(load_all()) <= set(ids) and len(ids) == len(set(ids))
    for rule in rules:
        catalogue = load_all()[rule["id"]]
        assert rule["name"] == catalogue.name
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert rule["help"]["text"] and rule["help"]["markdown"] == catalogue.doc()
        assert rule["defaultConfiguration"]["level"] == {"error": "error", "warning": "warning", "info": "note"}[
            catalogue.severity
        ]
    results = run["results"]
    assert len(results) == 3
    for result in results:
        assert result["ruleId"] in ids
        assert ids[result["ruleIndex"]] == result["ruleId"]
        assert result["level"] in ("error", "warning", "note")
        assert result["message"]["text"]
        assert result["partialFingerprints"]
        (location,) = result["locations"]
        physical = location["physicalLocation"]
        uri = physical["artifactLocation"]["uri"]
        assert uri == "pkg/model.py" and physical["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
        assert isinstance(physical["region"]["startLine"], int) and physical["region"]["startLine"] >= 1
    assert [r["level"] for r in results] == ["error", "note", "error"]
    assert results[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == 12
    # A finding without a source line points at the model's file, line 1.
    assert results[2]["locations"][0]["physicalLocation"]["region"]["startLine"] == 1
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"].endswith("/")


def test_sarif_uri_is_relative_to_the_git_root_not_the_cwd(repo, monkeypatch):
    monkeypatch.chdir(repo / "pkg")
    result = sarif(make_report(repo))["runs"][0]["results"][0]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "pkg/model.py"


def test_sarif_fingerprints_are_stable_across_line_shifts_and_unique(repo):
    before = [r["partialFingerprints"] for r in sarif(make_report(repo, line=12))["runs"][0]["results"]]
    after = [r["partialFingerprints"] for r in sarif(make_report(repo, line=40))["runs"][0]["results"]]
    assert before == after
    report = make_report(repo)
    report.models[0].findings.append(report.models[0].findings[0])
    prints = [r["partialFingerprints"]["qlintFindingHash/v2"] for r in sarif(report)["runs"][0]["results"]]
    assert len(prints) == len(set(prints))


def test_sarif_outside_the_root_uses_an_absolute_uri(repo, tmp_path_factory):
    other = tmp_path_factory.mktemp("elsewhere") / "m.py"
    other.write_text("x\n")
    model = ModelReport("m.py:f", "fx", "eval", [], [Finding("QL101", "error", "m", "b", Source(str(other), 2))])
    location = to_sarif(Report([model]), root=repo)["runs"][0]["results"][0]["locations"][0]
    assert location["physicalLocation"]["artifactLocation"] == {"uri": other.resolve().as_uri()}


def test_sarif_validates_against_the_official_schema(repo):
    """Full validation when the SARIF 2.1.0 schema is at hand (not vendored):
    QLINT_SARIF_SCHEMA=/path/to/sarif-schema-2.1.0.json and jsonschema installed."""
    schema_path = os.environ.get("QLINT_SARIF_SCHEMA")
    if not schema_path or not Path(schema_path).is_file():
        pytest.skip("set QLINT_SARIF_SCHEMA to the official sarif-schema-2.1.0.json to validate")
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(Path(schema_path).read_text())
    jsonschema.Draft4Validator(schema).validate(sarif(make_report(repo)))
    jsonschema.Draft4Validator(schema).validate(sarif(Report(models=[])))


# -- entry points -----------------------------------------------------------------


def test_render_rejects_unknown_formats(repo):
    with pytest.raises(ValueError, match="unknown output format"):
        render(make_report(repo), "xml")
    assert OUTPUT_FORMATS[:8] == ("full", "concise", "json", "sarif", "github", "markdown", "junit", "gitlab")


def test_every_registered_renderer_is_an_output_format():
    """A renderer defined below ``OUTPUT_FORMATS = tuple(_REGISTRY)`` in qlint/ci/formats.py would render
    through the API but be refused by the CLI and the configuration."""
    from qlint.ci import formats

    missing = [name for name in formats._REGISTRY if name not in OUTPUT_FORMATS]
    assert not missing, (f"output formats {missing} are registered after OUTPUT_FORMATS is read off the registry: "
                         "define their renderers above `OUTPUT_FORMATS = tuple(_REGISTRY)` in qlint/ci/formats.py")


def test_write_output_to_file_and_stream(repo, capsys):
    report = make_report(repo)
    write_output(report, "sarif", output_file=repo / "out.sarif")
    assert json.loads((repo / "out.sarif").read_text())["version"] == "2.1.0"
    write_output(report, "concise")
    assert capsys.readouterr().out == render(report, "concise")
    write_output(report, "full", statistics=True)
    assert "QL101" in capsys.readouterr().out
    write_output(report, "full", output_file=repo / "full.txt", show_all_derivations=True)
    text = (repo / "full.txt").read_text()
    assert "QL101" in text and "pkg/model.py:poly" in text and "\x1b[" not in text
    write_output(report, "full")
    assert "pkg/model.py:lipschitz" in capsys.readouterr().out


# -- end to end: the check command's output options ---------------------------------

E2E_MODEL = CUBIC_MODULE + """

def cubic():
    return Cubic(), (torch.randn(2, 4, 8),)
"""
# the tests below are about the output options, shown on the cubic block's QL101: they select it
# (as ruff's CLI tests select the rules they show), so a new default-on rule leaves their output alone
E2E_CONFIG = '[tool.qlint]\nmodels = ["toymodel.py:cubic"]\nselect = ["QL101"]\n'


@pytest.fixture
def e2e(repo: Path) -> Path:
    (repo / "toymodel.py").write_text(E2E_MODEL)
    (repo / "pyproject.toml").write_text(E2E_CONFIG)
    return repo


def qlint(*args: str):
    from click.testing import CliRunner

    from qlint.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_cli_sarif_to_file(e2e):
    result = qlint("--output-format", "sarif", "-o", "qlint.sarif")
    assert result.exit_code == 1 and result.stdout == ""
    log = json.loads((e2e / "qlint.sarif").read_text())
    (res,) = log["runs"][0]["results"]
    assert res["ruleId"] == "QL101" and res["level"] == "error"
    location = res["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "toymodel.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"]["startLine"] == CUBIC_LINE


@pytest.mark.parametrize("flag", ["--format", "--output-format"])
def test_cli_json_and_alias(e2e, flag):
    result = qlint(flag, "json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["summary"]["errors"] == 1 and data["models"][0]["max_q"] == 3


def test_cli_concise_github_markdown(e2e):
    assert qlint("--output-format", "concise").stdout.splitlines()[0].startswith(f"toymodel.py:{CUBIC_LINE}: QL101 ")
    assert qlint("--output-format", "github").stdout.startswith(
        f"::error file=toymodel.py,line={CUBIC_LINE},title=QL101::"
    )
    markdown = qlint("--output-format", "markdown").stdout
    assert "| `toymodel.py:cubic` | ❌ supercritical | 3 | 1 | 1 error |" in markdown


def test_cli_output_format_from_config(e2e):
    (e2e / "pyproject.toml").write_text(E2E_CONFIG + 'output-format = "concise"\n')
    assert qlint().stdout.startswith(f"toymodel.py:{CUBIC_LINE}: QL101")
    assert json.loads(qlint("--format", "json").stdout)["summary"]["errors"] == 1  # the CLI wins


def test_cli_statistics_and_exit_zero(e2e):
    result = qlint("--statistics")
    assert result.exit_code == 1 and result.stdout == "1\tQL101\tsupercritical-block\n"
    result = qlint("--exit-zero", "--format", "concise")
    assert result.exit_code == 0 and "QL101" in result.stdout


def test_cli_full_report_to_file_is_plain_text(e2e):
    result = qlint("-o", "report.txt")
    assert result.exit_code == 1
    text = (e2e / "report.txt").read_text()
    assert "QL101" in text and "\x1b[" not in text


def test_cli_output_file_in_a_missing_folder_creates_it_and_a_file_in_the_way_exits_2(e2e):
    result = qlint("--format", "json", "-o", "no/such/dir/out.json")  # as ruff: the folders are made
    assert result.exit_code == 1 and json.loads((e2e / "no/such/dir/out.json").read_text())["models"]
    (e2e / "blocker").write_text("a file, not a folder\n")
    result = qlint("--format", "json", "-o", "blocker/out.json")
    assert result.exit_code == 2
    assert result.stderr.startswith("qlint: error: cannot write the json report blocker/out.json")
    assert result.stderr.count("\n") == 1


def test_cli_exit_2_on_bad_spec_even_with_exit_zero(e2e):
    result = qlint("--exit-zero", "toymodel.py:missing")
    assert result.exit_code == 2 and "has no attribute" in result.stderr and "Traceback" not in result.stderr
