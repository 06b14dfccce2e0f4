"""Files written whole (qlint.ci.files): a write that fails leaves the old file and no temporary
file, names the file, keeps permissions and writes through a symbolic link; the baseline, the
reports and the verify tables all go through it; the in-process guard of ``qlint.check`` (the
API's ``jobs=1``) and ``qlint coverage`` keep a model's ``sys.exit()`` and prints to that model."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import CUBIC_MODULE, ROOT
from qlint.ci import files
from qlint.ci.files import WriteError, prepare_output, write_text


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_failed_write_keeps_the_old_file_and_names_it(tmp_path, monkeypatch):
    target = tmp_path / "report.sarif"
    target.write_text("old")
    monkeypatch.setattr(files.os, "fsync", _no_space)  # the disk fills up as the data reaches it
    with pytest.raises(WriteError) as caught:
        write_text(target, "new" * 1000, what="the sarif report")
    assert str(caught.value) == f"cannot write the sarif report {target}: No space left on device"
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["report.sarif"]


def test_a_write_keeps_permissions_and_writes_through_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(real.name)
    write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new" and stat.S_IMODE(real.stat().st_mode) == 0o640
    fresh = tmp_path / "fresh.json"
    write_text(fresh, "{}")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~mask


def test_prepare_output_makes_folders_and_refuses_what_cannot_be_written(tmp_path):
    assert prepare_output(tmp_path / "a" / "b" / "out.json") and (tmp_path / "a" / "b").is_dir()
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the probe file is gone
    with pytest.raises(WriteError, match="it is a folder"):
        prepare_output(tmp_path / "a")
    (tmp_path / "file").write_text("")
    with pytest.raises(WriteError, match="is not a folder"):
        prepare_output(tmp_path / "file" / "out.json")


def test_the_baseline_and_the_verify_tables_are_written_whole(tmp_path, monkeypatch):
    from qlint.ci.baseline import BaselineError, write_baseline
    from qlint.core.results import Report
    from qlint.verify import tables

    baseline = tmp_path / "qlint-baseline.json"
    baseline.write_text("committed")
    (tmp_path / "table2.md").write_text("old table")
    monkeypatch.setattr(files.os, "fsync", _no_space)
    with pytest.raises(BaselineError, match=f"cannot write baseline {baseline}: No space left on device"):
        write_baseline(Report([]), baseline)
    with pytest.raises(WriteError, match="No space left on device"):
        tables.write_tables(tmp_path)
    assert baseline.read_text() == "committed" and (tmp_path / "table2.md").read_text() == "old table"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".qlint-tmp-")]
    monkeypatch.undo()
    tables.write_tables(tmp_path)
    assert (tmp_path / "table2.md").read_text().startswith("# Table 2")


MODELS = CUBIC_MODULE + textwrap.dedent(
    '''

    import sys


    def cubic():
        print("cubic prints")
        return Cubic(), (torch.randn(2, 8),)


    def leaves():
        print("leaves prints")
        sys.exit(0)
    '''
)


def test_the_in_process_api_keeps_sys_exit_and_prints_to_the_model(tmp_path, monkeypatch, capfd):
    import qlint

    (tmp_path / "models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    report = qlint.check(["models.py:leaves", "models.py:cubic"], isolated=True, no_cache=True)
    assert [m.verdict for m in report.models] == ["failed", "supercritical"]
    assert report.models[0].failure == "models.py:leaves: the model's code called sys.exit(0) while building the model (leaves())"
    out, err = capfd.readouterr()
    assert "prints" not in out and "leaves prints" in err and "cubic prints" in err


def test_coverage_reports_an_exiting_model_in_one_line(tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "qlint", "coverage", "models.py:leaves", "--format", "json", "--isolated"],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines()[-1] == ("qlint: error: models.py:leaves: the model's code called sys.exit(0) "
                                           "while building the model (leaves())")
    covered = subprocess.run([sys.executable, "-m", "qlint", "coverage", "models.py:cubic", "--format", "json", "--isolated"],
                             cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert json.loads(covered.stdout)["models"] and "cubic prints" in covered.stderr
