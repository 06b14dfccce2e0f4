"""The GitHub Action (action.yml) and its example workflow: the YAML parses, every embedded shell
script parses, the pull-request comment is qlint's own (found by its hidden marker, never
`--edit-last`), fork pull requests get annotations instead of a comment, pip and .qlint_cache
are cached, and the torch it installs is the one this repository's CI runs.

The comment step runs for real under bash, with `gh` replaced by a recording stub."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
WORKFLOW = ROOT / "examples" / "github-workflow.yml"


def steps() -> list[dict]:
    return yaml.safe_load(ACTION.read_text())["runs"]["steps"]


def step(name: str) -> dict:
    return next(s for s in steps() if s.get("name") == name or s.get("id") == name)


def without_expressions(script: str) -> str:
    """The script as the runner hands it to bash: `${{ ... }}` is substituted before bash sees it."""
    return re.sub(r"\$\{\{.*?\}\}", "EXPR", script)


def test_the_yaml_parses_and_every_run_script_passes_bash_n():
    action = yaml.safe_load(ACTION.read_text())
    assert action["runs"]["using"] == "composite"
    workflow = yaml.safe_load(WORKFLOW.read_text())
    scripts = [s["run"] for s in action["runs"]["steps"] if "run" in s]
    scripts += [s["run"] for job in workflow["jobs"].values() for s in job["steps"] if "run" in s]
    assert len(scripts) >= 5
    assert all(s.get("shell") == "bash" for s in action["runs"]["steps"] if "run" in s)
    for script in scripts:
        proc = subprocess.run(["bash", "-n"], input=without_expressions(script), capture_output=True, text=True)
        assert proc.returncode == 0, f"{proc.stderr}\n{script}"


def test_the_comment_is_found_by_a_marker_never_by_edit_last():
    text = ACTION.read_text()
    assert "--edit-last" not in text and "gh pr comment" not in text
    comment = step("Summary and pull-request comment")
    assert "<!-- ${COMMENT_KEY} -->" in comment["run"]
    assert yaml.safe_load(text)["inputs"]["comment-key"]["default"] == "qlint-report"


def test_forks_get_annotations_where_sarif_is_not_uploaded():
    run = step("qlint")["run"]
    assert "--output github:qlint-annotations.txt" in run and "--output sarif:qlint.sarif" in run
    upload = step("upload")
    assert "github.event.pull_request.head.repo.full_name == github.repository" in upload["if"]
    annotate = step("Findings as annotations (no code scanning upload)")
    assert "steps.upload.outcome != 'success'" in annotate["if"]  # skipped (fork, sarif off) or failed
    assert "cat qlint-annotations.txt" in annotate["run"]
    names = [s.get("id") or s.get("name") for s in steps()]
    assert names.index("upload") < names.index(annotate["name"])


def test_pip_and_the_result_cache_are_cached():
    caches = [s for s in steps() if str(s.get("uses", "")).startswith("actions/cache@")]
    paths = {s["with"]["path"] for s in caches}
    assert "${{ steps.keys.outputs.pip-dir }}" in paths and "${{ github.workspace }}/.qlint_cache" in paths
    assert all(s["if"] == "inputs.cache == 'true'" for s in caches)
    assert 'QLINT_CACHE_DIR="$WORKSPACE/.qlint_cache"' in step("qlint")["run"]
    names = [s.get("id") or s.get("name") for s in steps()]
    assert all(names.index(s["name"]) < names.index("qlint") for s in caches)


def test_the_torch_it_recommends_is_the_one_ci_runs():
    """The default is the Makefile's pin; the description names both versions CI tests: the pin and the
    lowest pyproject.toml accepts, which .ci/run gives the wheel check."""
    pin = re.search(r"^TORCH_PIN := torch==(\S+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    action = yaml.safe_load(ACTION.read_text())
    assert action["inputs"]["torch-version"]["default"] == pin
    lowest = re.search(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    description = action["inputs"]["torch-version"]["description"]
    assert f"CI tests {pin} and {lowest}" in description and "lowest" in description
    ci = (ROOT / ".ci" / "run").read_text()
    assert """for torch_spec in "" "torch==$lowest.*"; do""" in ci and "TORCH=$torch_spec bash .ci/wheel_check" in ci
    workflow = yaml.safe_load(WORKFLOW.read_text())
    qlint = next(s for s in workflow["jobs"]["qlint"]["steps"] if s.get("id") == "qlint")
    assert qlint["with"]["torch-version"] == pin


def test_the_example_pins_no_tag_that_does_not_exist():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    qlint = next(s for s in workflow["jobs"]["qlint"]["steps"] if s.get("id") == "qlint")
    ref = qlint["uses"].rpartition("@")[2]
    tags = subprocess.run(["git", "tag", "--list"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert ref.startswith("<") or re.fullmatch(r"[0-9a-f]{40}", ref) or ref in tags, ref


# -- the comment step, run ------------------------------------------------------------------------

GH_STUB = r'''#!PYTHON
"""gh, recording each call; `gh api GET ... --jq F` answers the canned comments through jq."""
import json, os, subprocess, sys

args = sys.argv[1:]
record = {"args": args}
if "-F" in args:
    field = args[args.index("-F") + 1]
    name, _, value = field.partition("=")
    record["field"] = name
    record["value"] = open(value[1:], encoding="utf-8").read() if value.startswith("@") else value
with open(os.environ["GH_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps(record) + "\n")
if "--method" not in args:
    comments = open(os.environ["GH_COMMENTS"], encoding="utf-8").read()
    jq = args[args.index("--jq") + 1]
    sys.stdout.write(subprocess.run(["jq", "-r", jq], input=comments, capture_output=True, text=True,
                                    check=True).stdout)
'''


def run_comment_step(tmp_path: Path, comments: list[dict], **env: str) -> tuple[list[dict], str]:
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed (the stub gh filters with it, as gh --jq does)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    gh.write_text(GH_STUB.replace("PYTHON", sys.executable))
    gh.chmod(0o755)
    (tmp_path / "comments.json").write_text(json.dumps(comments))
    (tmp_path / "qlint-summary.md").write_text("## qlint\n\n1 error\n")
    summary = tmp_path / "step-summary.md"
    values = {"REPORT_URL": "https://example.invalid/artifact/1", "COMMENT": "true", "COMMENT_KEY": "qlint-report",
              "PR": "7", "FORK": "false", "REPO": "o/r", "GH_TOKEN": "t"}
    values.update(env)
    full_env = {**os.environ, **values, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                "GH_LOG": str(tmp_path / "gh.log"), "GH_COMMENTS": str(tmp_path / "comments.json"),
                "GITHUB_STEP_SUMMARY": str(summary)}
    script = step("Summary and pull-request comment")["run"]
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=tmp_path,
                          env=full_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / "gh.log"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return calls, summary.read_text()


def test_an_existing_marked_comment_is_edited_and_no_other(tmp_path):
    comments = [{"id": 11, "body": "another bot's report"},
                {"id": 42, "body": "<!-- qlint-report -->\n## qlint\nold"},
                {"id": 43, "body": "<!-- qlint-other-job -->\nanother qlint job"}]
    calls, summary = run_comment_step(tmp_path, comments)
    assert calls[0]["args"][:3] == ["api", "--paginate", "repos/o/r/issues/7/comments"]
    (edit,) = calls[1:]
    assert edit["args"][:4] == ["api", "--method", "PATCH", "repos/o/r/issues/comments/42"]
    assert edit["field"] == "body" and edit["value"].startswith("<!-- qlint-report -->\n## qlint")
    assert "https://example.invalid/artifact/1" in edit["value"] and "1 error" in summary


def test_without_a_marked_comment_one_is_created(tmp_path):
    calls, _ = run_comment_step(tmp_path, [{"id": 11, "body": "another bot's report"}])
    (create,) = calls[1:]
    assert create["args"][:4] == ["api", "--method", "POST", "repos/o/r/issues/7/comments"]
    assert create["value"].startswith("<!-- qlint-report -->\n")


def test_a_fork_gets_no_comment_and_is_told_why(tmp_path):
    calls, summary = run_comment_step(tmp_path, [], FORK="true")
    assert calls == [] and "annotations" in summary


def test_no_comment_when_turned_off_or_not_a_pull_request(tmp_path):
    for name, env in (("off", {"COMMENT": "false"}), ("push", {"PR": ""})):
        folder = tmp_path / name
        folder.mkdir()
        calls, summary = run_comment_step(folder, [], **env)
        assert calls == [] and "## qlint" in summary
