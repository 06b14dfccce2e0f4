"""Issue 29: a library's source lines are shown relative to its distribution in the text formats.

``…/site-packages/transformers/models/gpt2/modeling_gpt2.py:310`` reads
``transformers/models/gpt2/modeling_gpt2.py:310`` in the full and concise reports (and markdown,
JUnit), also when the virtual environment lies inside the cwd; the user's files stay relative to
the cwd; SARIF keeps its scheme (``%SRCROOT%``-relative inside the repository, a file URI outside).
The finding's ``source.file`` itself is unchanged (noqa, the baseline and linecache read it).
"""

from __future__ import annotations

import io
import os
import site
import sysconfig
from pathlib import Path

import pytest

from qlint.ci.formats import display_path, render, to_sarif, write_output
from qlint.ci.render import library_path
from qlint.core.results import Block, Finding, ModelReport, Report, Source

SITE = Path(sysconfig.get_paths()["purelib"])
LIBRARY_FILE = str(SITE / "transformers" / "models" / "gpt2" / "modeling_gpt2.py")
SHOWN = "transformers/models/gpt2/modeling_gpt2.py"


def test_a_library_file_is_shown_relative_to_its_distribution(repo):
    assert library_path(LIBRARY_FILE) == SHOWN
    assert display_path(LIBRARY_FILE) == SHOWN
    assert display_path(str(repo / "pkg" / "model.py")) == "pkg/model.py"  # the user's file: relative to the cwd
    assert library_path(str(repo / "pkg" / "model.py")) is None
    assert display_path("/nowhere/else/model.py") == "/nowhere/else/model.py"


def test_every_site_folder_counts(repo):
    for folder in [*site.getsitepackages(), site.getusersitepackages()]:
        assert display_path(os.path.join(folder, "timm", "layers", "mlp.py")) == "timm/layers/mlp.py"


def test_a_virtual_environment_inside_the_cwd_is_still_a_library(monkeypatch):
    """The checkout's own .venv: the engine's cwd-relative ``.venv/lib/.../site-packages/...``."""
    monkeypatch.chdir(SITE.parents[2])  # the folder holding lib/pythonX.Y/site-packages
    relative = os.path.relpath(LIBRARY_FILE)
    assert not os.path.isabs(relative) and "site-packages" in relative
    assert display_path(relative) == SHOWN


def _report(repo: Path) -> Report:
    user = str(repo / "pkg" / "model.py")
    model = ModelReport(
        spec="pkg/model.py:gpt2", tracer="export", mode="eval",
        blocks=[Block("h.0:attn", 0, 0.0, "ok", [], source=Source(LIBRARY_FILE, 285))],
        findings=[Finding("QL201", "warning", "attention `h.0.attn`: plain logits", "h.0.attn", Source(LIBRARY_FILE, 213)),
                  Finding("QL203", "warning", "no final norm", "h", Source(user, 7))],
    )
    return Report(models=[model])


def test_the_concise_and_markdown_reports_show_the_distribution_path(repo):
    lines = render(_report(repo), "concise").splitlines()
    assert lines[0] == f"{SHOWN}:213: QL201 attention `h.0.attn`: plain logits"
    assert lines[1] == "pkg/model.py:7: QL203 no final norm"
    markdown = render(_report(repo), "markdown")
    assert f"`{SHOWN}:213`" in markdown and "site-packages" not in markdown


def test_the_full_report_shows_the_distribution_path(repo):
    stream = io.StringIO()
    write_output(_report(repo), "full", stream=stream, color=False, width=200)
    text = stream.getvalue()
    assert f"{SHOWN}:285" in text  # the block table's source column
    assert f"{SHOWN}:213: QL201 attention `h.0.attn`: plain logits" in text
    assert "pkg/model.py:7: QL203 no final norm" in text
    assert "site-packages" not in text


def test_sarif_keeps_its_scheme(repo):
    document = to_sarif(_report(repo))
    locations = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in document["runs"][0]["results"]]
    library, user = locations
    assert user == {"uri": "pkg/model.py", "uriBaseId": "%SRCROOT%"}
    assert library == {"uri": Path(LIBRARY_FILE).resolve().as_uri()}  # outside the repository: an absolute file URI


def test_the_finding_keeps_the_real_file(repo):
    report = _report(repo)
    render(report, "concise")
    assert report.models[0].findings[0].source.file == LIBRARY_FILE
