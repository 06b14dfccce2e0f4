"""qlint as a pull-request gate, through the real command line: one failing model does not
hide the others, several outputs from one run, suppressions that are per model and
placeable, and suppressed findings that stay visible (SARIF ``suppressions``)."""

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import CUBIC_MODULE, ROOT

MODELS = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class Power(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.p = p
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            h = self.lin(x) ** self.p
            return x + h  # qlint: noqa: QL101


    class Above(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            # qlint: noqa: QL101
            return x + self.lin(x) ** 2


    class AtTheDominantOp(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            h = self.lin(x) ** 3  # qlint: noqa: QL101
            return x + h


    def quadratic():
        return nn.Sequential(Power(2), nn.LayerNorm(8)), (torch.randn(2, 8),)


    def linear():
        return nn.Sequential(Power(1), nn.LayerNorm(8)), (torch.randn(2, 8),)


    def above():
        return nn.Sequential(Above(), nn.LayerNorm(8)), (torch.randn(2, 8),)


    def dominant():
        return nn.Sequential(AtTheDominantOp(), nn.LayerNorm(8)), (torch.randn(2, 8),)


    def broken():
        raise RuntimeError("this factory is broken")
    """
)
ADD_LINE, ABOVE_COMMENT, ABOVE_ADD = 13, 22, 23


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(MODELS, encoding="utf-8")
    # the rules these tests are about: a new default-on rule must not change their counts
    (tmp_path / "pyproject.toml").write_text('[tool.qlint]\nselect = ["QL100", "QL101"]\n', encoding="utf-8")
    return tmp_path


def qlint(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qlint", *args], capture_output=True, text=True, cwd=project,
                          timeout=300, env={**_env(), "PYTHONPATH": str(ROOT)})


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "COLUMNS"}


def test_a_failing_model_does_not_hide_the_others(project):
    run = qlint(project, "models.py:broken", "models.py:quadratic", "--format", "json",
                "--output", "sarif:out.sarif")
    assert run.returncode == 2, run.stderr
    doc = json.loads(run.stdout)
    verdicts = {m["spec"]: m["verdict"] for m in doc["models"]}
    assert verdicts == {"models.py:broken": "failed", "models.py:quadratic": "supercritical"}  # its QL101 is noqa-accepted
    assert "this factory is broken" in doc["models"][0]["failure"] and doc["summary"]["failed"] == 1
    assert "qlint: error: " in run.stderr and "this factory is broken" in run.stderr
    sarif = json.loads((project / "out.sarif").read_text())
    invocation = sarif["runs"][0]["invocations"][0]
    assert invocation["executionSuccessful"] is False
    [note] = invocation["toolExecutionNotifications"]
    assert note["level"] == "error" and "models.py:broken" in note["message"]["text"]
    assert note["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "models.py", "uriBaseId": "%SRCROOT%"}


def test_a_failing_model_writes_no_baseline(project):
    run = qlint(project, "models.py:broken", "models.py:above", "--write-baseline", "base.json")
    assert run.returncode == 2
    assert "base.json not written" in run.stderr and not (project / "base.json").exists()


def test_a_report_written_to_a_file_still_leaves_a_line_in_the_log(project):
    run = qlint(project, "models.py:above", "--format", "sarif", "-o", "qlint.sarif")
    assert run.returncode == 1 and run.stdout == ""
    assert "Found 2 findings (1 error, 1 warning). Wrote sarif to qlint.sarif." in run.stderr
    assert json.loads((project / "qlint.sarif").read_text())["runs"][0]["invocations"][0]["executionSuccessful"] is True


def test_bad_output_argument_is_a_usage_error(project):
    run = qlint(project, "models.py:above", "--output", "xml:out.xml")
    assert run.returncode == 2 and "expected FORMAT:PATH" in run.stderr and "Traceback" not in run.stderr


def test_noqa_shared_by_two_models_counts_for_the_model_it_suppresses_in(project):
    # Power's add line is read by both models; only `quadratic` has a QL101 there.
    run = qlint(project, "models.py:quadratic", "models.py:linear", "--format", "json", "--fail-on", "warning")
    assert run.returncode == 0, run.stdout
    doc = json.loads(run.stdout)
    assert [f["code"] for m in doc["models"] for f in m["findings"]] == []
    assert [(f["code"], f["suppression"]) for f in doc["models"][0]["suppressed"]] == [("QL101", "noqa")]
    alone = json.loads(qlint(project, "models.py:linear", "--format", "json").stdout)
    assert [(f["code"], f["source"]["line"]) for f in alone["models"][0]["findings"]] == [("QL100", ADD_LINE)]


def test_noqa_on_the_line_above_says_where_it_must_go(project):
    doc = json.loads(qlint(project, "models.py:above", "--format", "json").stdout)
    findings = {f["code"]: f for f in doc["models"][0]["findings"]}
    assert set(findings) == {"QL101", "QL100"}
    assert findings["QL100"]["source"]["line"] == ABOVE_COMMENT
    assert f"move it to line {ABOVE_ADD}" in findings["QL100"]["message"]


def test_noqa_on_the_dominant_op_line_named_by_the_message_is_accepted(project):
    doc = json.loads(qlint(project, "models.py:dominant", "--format", "json").stdout)
    [model] = doc["models"]
    assert model["findings"] == [] and model["verdict"] == "supercritical"
    [accepted] = model["suppressed"]
    assert accepted["code"] == "QL101" and accepted["related"][0]["line"] == accepted["source"]["line"] - 1


def test_suppressed_and_baselined_findings_stay_visible(project):
    sarif = json.loads(qlint(project, "models.py:quadratic", "--format", "sarif").stdout)
    [result] = sarif["runs"][0]["results"]
    assert result["ruleId"] == "QL101" and result["suppressions"] == [{"kind": "inSource", "justification": "noqa"}]
    markdown = qlint(project, "models.py:quadratic", "--format", "markdown").stdout
    assert "❌ supercritical, accepted" in markdown and "none (1 suppressed)" in markdown

    assert qlint(project, "models.py:above", "--write-baseline", "base.json").returncode == 0
    run = qlint(project, "models.py:above", "--baseline", "base.json", "--format", "sarif")
    assert run.returncode == 0
    states = sorted(r["baselineState"] for r in json.loads(run.stdout)["runs"][0]["results"])
    assert states == ["unchanged", "unchanged"]
    full = qlint(project, "models.py:above", "--baseline", "base.json")
    assert "2 finding(s) suppressed (baseline)" in full.stdout and "All checks passed (0 info, 2 suppressed)." in full.stdout


# -- the ruff-style conveniences, each through the command line ---------------------


def test_show_settings_prints_the_effective_configuration_without_tracing(project):
    (project / "pyproject.toml").write_text('[tool.qlint]\nmodels = ["models.py:above"]\nfail-on = "warning"\n')
    (project / "sub").mkdir()
    (project / "sub" / "pyproject.toml").write_text('[tool.qlint]\nextend = "../pyproject.toml"\nignore = ["QL2"]\n')
    run = qlint(project / "sub", "--show-settings")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"config file        {project / 'sub' / 'pyproject.toml'}")
    assert f"{project / 'models.py'}:above" in run.stdout  # the base's model, resolved in the base's folder
    assert "fail-on            warning" in run.stdout and "QL201" not in run.stdout and "QL101" in run.stdout


def test_extend_cycle_is_a_config_error(project):
    (project / "pyproject.toml").write_text('[tool.qlint]\nextend = "other/pyproject.toml"\n')
    (project / "other").mkdir()
    (project / "other" / "pyproject.toml").write_text('[tool.qlint]\nextend = "../pyproject.toml"\n')
    run = qlint(project, "--show-settings")
    assert run.returncode == 2 and "(a cycle)" in run.stderr and "Traceback" not in run.stderr


def test_quiet_prints_only_findings_and_verbose_names_the_tracer(project):
    quiet = qlint(project, "models.py:above", "-q")
    assert quiet.returncode == 1
    assert [line.split(": ")[1].split()[0] for line in quiet.stdout.splitlines()] == ["QL101", "QL100"]
    assert "Found" not in quiet.stdout and "derivation" not in quiet.stdout
    clean = qlint(project, "models.py:linear", "-q", "--ignore", "QL100")
    assert clean.returncode == 0 and clean.stdout == ""
    verbose = qlint(project, "models.py:above", "-v", "--format", "json")
    assert "models.py:above: tracer symbolic_trace" in verbose.stderr and "graph matches the eager model" in verbose.stderr


def test_color_always_never_and_no_color(project):
    assert "\x1b[" in qlint(project, "models.py:above", "--color", "always").stdout
    assert "\x1b[" not in qlint(project, "models.py:above", "--color", "never").stdout
    no_color = subprocess.run([sys.executable, "-m", "qlint", "models.py:above", "--color", "auto"], capture_output=True,
                              text=True, cwd=project, timeout=300, env={**_env(), "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "FORCE_COLOR": "1"})
    assert "\x1b[" not in no_color.stdout and "QL101" in no_color.stdout


def test_output_format_from_the_environment(project):
    run = subprocess.run([sys.executable, "-m", "qlint", "models.py:above"], capture_output=True, text=True, cwd=project,
                         timeout=300, env={**_env(), "PYTHONPATH": str(ROOT), "QLINT_OUTPUT_FORMAT": "json"})
    assert json.loads(run.stdout)["models"][0]["verdict"] == "supercritical"


def test_junit_and_gitlab_reports(project):
    from xml.etree import ElementTree as ET

    run = qlint(project, "models.py:above", "models.py:broken", "--format", "junit", "--output", "gitlab:quality.json")
    assert run.returncode == 1  # above's QL101 fails the run; broken is reported as failed beside it
    suites = ET.fromstring(run.stdout)
    above, broken = suites.findall("testsuite")
    assert above.get("name") == "models.py:above" and above.get("failures") == "1" and broken.get("errors") == "1"
    assert [f.get("message").split()[0] for f in above.iter("failure")] == ["QL101", "QL100"]
    issues = json.loads((project / "quality.json").read_text())
    assert [i["check_name"] for i in issues] == ["QL101", "QL100", "qlint-failed"]
    assert issues[0]["location"] == {"path": "models.py", "lines": {"begin": ABOVE_ADD}} and issues[0]["severity"] == "major"
    assert len({i["fingerprint"] for i in issues}) == 3


def test_add_noqa_suppresses_every_finding_in_place(project):
    before = (project / "models.py").read_text()
    run = qlint(project, "models.py:above", "models.py:quadratic", "--add-noqa")
    assert run.returncode == 0 and "added a noqa to 1 line(s) in 1 file(s)" in run.stderr
    after = (project / "models.py").read_text().splitlines()
    assert after[ABOVE_ADD - 1].endswith("return x + self.lin(x) ** 2  # qlint: noqa: QL101")
    assert len(after) == len(before.splitlines())
    assert qlint(project, "models.py:above", "models.py:quadratic").returncode == 0
    assert qlint(project, "models.py:above", "--add-noqa").stderr.count("added a noqa to 0 line(s)") == 1  # idempotent


def test_subcommands_complete():
    import os

    env = {**os.environ, "_QLINT_COMPLETE": "bash_complete", "COMP_WORDS": "qlint ex", "COMP_CWORD": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "qlint"], capture_output=True, text=True, env=env, timeout=120)
    assert run.stdout.split() == ["plain,explain"]
    env.update(COMP_WORDS="qlint check --fail", COMP_CWORD="2")
    assert "plain,--fail-on" in subprocess.run([sys.executable, "-m", "qlint"], capture_output=True, text=True, env=env, timeout=120).stdout


LIBRARY = CUBIC_MODULE + """

def build():
    return nn.Sequential(Cubic(), nn.LayerNorm(8)), (torch.randn(2, 8),)
"""


@pytest.fixture
def library_user(tmp_path: Path) -> Path:
    """A repository whose model comes from an installed library outside it."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "vendored_models.py").write_text(LIBRARY)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[tool.qlint]\nmodels = ["train.py:model"]\n')
    (repo / "train.py").write_text("import vendored_models\n\n\ndef model():\n    return vendored_models.build()\n")
    return repo


def _library_run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**_env(), "PYTHONPATH": f"{ROOT}:{repo.parent / 'site'}"}
    return subprocess.run([sys.executable, "-m", "qlint", *args], capture_output=True, text=True, cwd=repo, timeout=300, env=env)


def test_a_finding_in_library_code_lands_on_the_users_factory_line(library_user):
    sarif = json.loads(_library_run(library_user, "--format", "sarif").stdout)
    [result] = [r for r in sarif["runs"][0]["results"] if r["ruleId"] == "QL101"]
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "train.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"]["startLine"] == 4  # def model():
    related = result["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert related.startswith("file://") and related.endswith("site/vendored_models.py")
    github = _library_run(library_user, "--format", "github").stdout
    assert "::error file=train.py,line=4,title=QL101::" in github


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the [zoo] extra (transformers)")
def test_a_finding_in_an_installed_library_lands_on_the_factory_line_even_with_the_venv_in_the_repository():
    """transformers installed in a virtual environment inside the repository (make test's .venv) is a library."""
    github = subprocess.run([sys.executable, "-m", "qlint", "fixtures/hf.py:mamba_without_norm", "--format", "github"],
                            capture_output=True, text=True, cwd=ROOT, timeout=600, env=_env()).stdout
    lines = [line for line in github.splitlines() if "title=QL101" in line]
    factory = next(i for i, line in enumerate((ROOT / "fixtures" / "hf.py").read_text().splitlines(), 1)
                   if line.startswith("def mamba_without_norm("))
    assert lines and all(line.startswith(f"::error file=fixtures/hf.py,line={factory},") for line in lines), github
    assert all("(in " in line and "transformers/models/mamba/modeling_mamba.py:" in line for line in lines)


def test_library_findings_are_suppressed_on_the_factory_line_or_per_model(library_user):
    train = library_user / "train.py"
    train.write_text(train.read_text().replace("def model():", "def model():  # qlint: noqa: QL101"))
    assert _library_run(library_user).returncode == 0
    train.write_text(train.read_text().replace("  # qlint: noqa: QL101", ""))
    assert _library_run(library_user).returncode == 1
    (library_user / "pyproject.toml").write_text(
        '[tool.qlint]\nmodels = ["train.py:model"]\n[tool.qlint.per-model-ignores]\n"train.py:model" = ["QL101"]\n'
    )
    doc = json.loads(_library_run(library_user, "--format", "json").stdout)
    assert doc["models"][0]["findings"] == [] and doc["models"][0]["suppressed"][0]["suppression"] == "per-model-ignores"
    (library_user / "pyproject.toml").write_text(
        '[tool.qlint]\nmodels = ["train.py:model"]\n[tool.qlint.per-model-ignores]\n"train.py:modle" = ["QL101"]\n'
    )
    typo = _library_run(library_user)
    assert typo.returncode == 2 and "did you mean 'train.py:model'?" in typo.stderr
