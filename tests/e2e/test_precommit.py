"""qlint as a pre-commit hook and in a GitHub Actions workflow."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / ".pre-commit-hooks.yaml"
WORKFLOW = ROOT / "examples" / "github-workflow.yml"

REQUIRED = {"id", "name", "entry", "language"}


def hooks() -> dict[str, dict]:
    data = yaml.safe_load(HOOKS.read_text())
    assert isinstance(data, list)
    return {hook["id"]: hook for hook in data}


def test_hooks_manifest_has_both_hooks():
    found = hooks()
    assert set(found) == {"qlint", "qlint-system"}
    for hook in found.values():
        assert REQUIRED <= set(hook)
        assert hook["entry"] == "qlint"
        assert hook["pass_filenames"] is False
        assert hook["require_serial"] is True
        assert set(hook["types_or"]) == {"python", "toml"}
    assert found["qlint"]["language"] == "python"
    assert found["qlint-system"]["language"] == "system"
    import re

    pattern = re.compile(found["qlint"]["files"])
    for name in ("pkg/model.py", "pyproject.toml", "qlint.toml", ".qlint.toml"):
        assert pattern.search(name), name
    for name in ("README.md", "setup.cfg", "model.pyc"):
        assert not pattern.search(name), name


def test_hooks_manifest_passes_pre_commit_validation():
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-manifest", str(HOOKS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflow_example_uses_the_action():
    data = yaml.safe_load(WORKFLOW.read_text())
    triggers = data.get("on", data.get(True))  # YAML 1.1 reads a bare `on` as True
    assert "pull_request" in triggers
    job = data["jobs"]["qlint"]
    assert job["permissions"]["security-events"] == "write"
    steps = job["steps"]
    assert steps[0]["uses"] == "actions/checkout@v5"
    step = next(s for s in steps if s.get("id") == "qlint")
    assert step["uses"].startswith("<owner>/qlint@")  # placeholders the reader fills: no tag is published
    assert step["with"]["args"] == "--baseline qlint-baseline.json" and step["with"]["torch-version"]


def test_action_installs_cpu_torch_uploads_sarif_and_spares_forks():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    assert set(action["inputs"]) >= {"models", "args", "sarif", "torch-version", "python-version", "install"}
    steps = action["runs"]["steps"]
    assert steps[0]["uses"] == "actions/setup-python@v6"
    install = next(s for s in steps if "pip install" in s.get("run", "") and "torch" in s["run"])
    assert "/whl/cpu" in install["run"] and '"$ACTION_PATH"' in install["run"]
    run = next(s for s in steps if s.get("id") == "qlint")
    assert "--output sarif:qlint.sarif" in run["run"] and 'echo "exit-code=$code"' in run["run"]
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("github/codeql-action/upload-sarif@"))
    assert upload["uses"].endswith("@v4") and upload["with"]["sarif_file"] == "qlint.sarif"
    assert upload["continue-on-error"] is True
    assert "github.event.pull_request.head.repo.full_name == github.repository" in upload["if"]  # forks: no upload
    fail = steps[-1]
    assert fail["if"] == "steps.qlint.outputs.exit-code != '0'" and "exit 1" in fail["run"]
    assert steps.index(upload) > steps.index(run) and steps.index(fail) > steps.index(upload)


def test_action_uploads_the_html_report_and_links_it_from_the_pr_comment():
    steps = yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"]
    run = next(s for s in steps if s.get("id") == "qlint")
    assert "--output html:qlint-report.html" in run["run"] and "--output markdown:qlint-summary.md" in run["run"]
    artifact = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
    assert artifact["id"] == "report" and artifact["with"]["path"] == "qlint-report.html"
    comment = next(s for s in steps if s.get("name") == "Summary and pull-request comment")
    assert comment["env"]["REPORT_URL"] == "${{ steps.report.outputs.artifact-url }}"
    assert '"$REPORT_URL" >> qlint-summary.md' in comment["run"]  # the link goes into the comment's body
    assert comment["continue-on-error"] is True  # a fork's token cannot comment: the verdict stands
    order = [steps.index(s) for s in (run, artifact, comment, steps[-1])]
    assert order == sorted(order)


# -- a real pre-commit run --------------------------------------------------------

MODEL = '''\
import torch
from torch import nn


class Cubic(nn.Module):
    """x + W2 (W1 x)**3: q = 3, supercritical."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.w1 = nn.Linear(d, d)
        self.w2 = nn.Linear(d, d)

    def forward(self, x):
        return x + self.w2(self.w1(x) ** 3)


class PreNorm(nn.Module):
    """x + W2 relu(W1 LN(x)): q = 0, certified."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.w1 = nn.Linear(d, d)
        self.w2 = nn.Linear(d, d)

    def forward(self, x):
        return x + self.w2(torch.relu(self.w1(self.norm(x))))


def supercritical():
    return Cubic(), (torch.randn(2, 4, 8),)


def certified():
    return PreNorm(), (torch.randn(2, 4, 8),)
'''


def core_ready() -> bool:
    return importlib.util.find_spec("qlint.cli.check") is not None


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.skipif(not core_ready(), reason="the check command is not available yet")
def test_pre_commit_hook_fails_on_supercritical_and_passes_on_certified(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "model.py").write_text(MODEL)

    hook = dict(hooks()["qlint-system"])
    hook["entry"] = f"{shlex.quote(sys.executable)} -m qlint"
    config = {"repos": [{"repo": "local", "hooks": [hook]}]}
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "NO_COLOR": "1",
    }
    env.pop("PRE_COMMIT", None)

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, timeout=60)

    def pre_commit(models: list[str]) -> subprocess.CompletedProcess:
        (repo / "pyproject.toml").write_text(
            textwrap.dedent(
                f"""\
                [project]
                name = "toy"
                version = "0"

                [tool.qlint]
                models = {models!r}
                """
            ).replace("'", '"')
        )
        git("add", "-A")
        return subprocess.run(
            [sys.executable, "-m", "pre_commit", "run", "--all-files", "--color", "never"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    git("init", "-q")
    bad = pre_commit(["model.py:supercritical"])
    output = bad.stdout + bad.stderr
    assert bad.returncode == 1, output
    assert "qlint (system)" in output and "Failed" in output
    assert "QL101" in output

    good = pre_commit(["model.py:certified"])
    output = good.stdout + good.stderr
    assert good.returncode == 0, output
    assert "Passed" in output
