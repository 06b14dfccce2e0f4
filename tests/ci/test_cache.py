"""The result cache (qlint.ci.cache): a hit replays the report without torch; anything the
analysis read that changed (an imported helper, a data file, an option) is a miss; rule
selection is applied afresh; failures are never stored; --jobs merges in order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qlint.ci.cache import FileState, ResultCache

MODEL = """\
import json
import torch
from torch import nn
from helper import Branch


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.branch = Branch(width)

    def forward(self, x):
        return x + self.branch(x)


def build_model():
    with open("width.json") as handle:  # a data file the factory reads
        width = json.load(handle)["width"]
    return nn.Sequential(Block(width), Block(width)), (torch.randn(2, width),)


def broken():
    raise RuntimeError("no such checkpoint")
"""
HELPER = """\
from torch import nn


class Branch(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return self.fc(x) + 0
"""


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "helper.py").write_text(HELPER)
    (tmp_path / "width.json").write_text('{"width": 8}')
    return tmp_path


def qlint(project: Path, *args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("QLINT_NO_CACHE", "QLINT_CACHE_DIR")}
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "qlint", *args]
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=300)


def check(project: Path, *args: str, **kw) -> tuple[subprocess.CompletedProcess, bool, dict]:
    """One `qlint check model.py -v --format json` run: the process, whether it replayed, the JSON."""
    result = qlint(project, "model.py", "-v", "--format", "json", *args, **kw)
    assert result.returncode in (0, 1), result.stderr
    return result, "replayed from the result cache" in result.stderr, json.loads(result.stdout)


def imported(stderr: str) -> set[str]:
    """The modules `python -X importtime` reports."""
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_a_second_run_replays_the_report_without_importing_torch(project):
    first, replayed, report = check(project)
    assert not replayed and first.returncode == 0
    assert report["models"][0]["verdict"] == "certified" and [b["q"] for b in report["models"][0]["blocks"]] == [1, 1]
    second, replayed, again = check(project, importtime=True)
    assert replayed and second.returncode == 0
    assert "torch" not in imported(second.stderr) and "qlint.ci.cache" in imported(second.stderr)
    assert again == report
    sarif = qlint(project, "model.py", "--format", "sarif", importtime=True)  # every format replays
    assert sarif.returncode == 0 and json.loads(sarif.stdout)["runs"][0]["results"] == []
    assert "torch" not in imported(sarif.stderr)
    entries = list((project / ".qlint_cache" / "entries").glob("*.pickle"))
    assert len(entries) == 1 and (project / ".qlint_cache" / ".gitignore").read_text().endswith("*\n")


def test_editing_an_imported_helper_module_invalidates_the_entry(project):
    check(project)
    assert check(project)[1]
    (project / "helper.py").write_text(HELPER.replace("self.fc(x) + 0", "self.fc(x) ** 3"))
    result, replayed, report = check(project)
    assert not replayed and result.returncode == 1
    assert [b["q"] for b in report["models"][0]["blocks"]] == [3, 3]


def test_a_same_size_edit_that_keeps_the_mtime_is_caught_by_its_change_time_and_content(tmp_path):
    """An edit that restores size and mtime still moves the change time (no tool can set it),
    so the content decides, racy or not; the same content written back is unchanged."""
    helper = tmp_path / "helper.py"
    helper.write_text(HELPER)
    state = FileState.now("file", str(helper))
    stat = helper.stat()
    helper.write_text(HELPER.replace("self.fc(x) + 0", "self.fc(x) * x"))  # same size
    os.utime(helper, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    mtime = stat.st_mtime_ns / 1e9
    assert not state.unchanged(written_at=mtime + 1.0)  # racy
    assert not state.unchanged(written_at=mtime + 10.0)  # old: the change time differs, the content decides
    helper.write_text(HELPER)
    os.utime(helper, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert state.unchanged(written_at=mtime + 10.0)


def test_a_data_file_the_factory_opened_invalidates_the_entry(project):
    check(project)
    (project / "width.json").write_text('{"width": 16}')
    _, replayed, report = check(project)
    assert not replayed and report["models"][0]["verdict"] == "certified"
    assert check(project)[1]


def test_options_are_part_of_the_key_and_selection_is_applied_afresh(project):
    (project / "helper.py").write_text(HELPER.replace("self.fc(x) + 0", "self.fc(x) ** 3"))
    result, _, report = check(project)
    assert result.returncode == 1 and {f["code"] for f in report["models"][0]["findings"]} == {"QL101"}
    ignored, replayed, report = check(project, "--ignore", "QL101")
    assert replayed and ignored.returncode == 0 and report["models"][0]["findings"] == []
    raised, replayed, report = check(project, "--threshold", "3")
    assert not replayed and raised.returncode == 0 and report["models"][0]["verdict"] == "certified"
    assert check(project, "--threshold", "3")[1] and check(project)[1]


def test_a_failure_is_never_stored(project):
    for _ in range(2):
        result = qlint(project, "model.py:broken", "-v")
        assert result.returncode == 2 and "no such checkpoint" in result.stderr and "replayed" not in result.stderr
    assert not list((project / ".qlint_cache").glob("entries/*.pickle"))


def test_no_cache_writes_nothing_and_clean_removes_the_cache(project):
    assert qlint(project, "model.py", "--no-cache").returncode == 0
    assert not (project / ".qlint_cache").exists()
    assert qlint(project, "model.py", "--cache-dir", "elsewhere").returncode == 0
    assert list((project / "elsewhere" / "entries").glob("*.pickle"))
    cleaned = qlint(project, "clean", "--cache-dir", "elsewhere")
    assert cleaned.returncode == 0 and "removed" in cleaned.stdout and "(1 entry)" in cleaned.stdout
    assert not (project / "elsewhere").exists()
    (project / "pyproject.toml").write_text('[tool.qlint]\ncache-dir = "build/qlint"\n')
    assert qlint(project, "model.py").returncode == 0 and (project / "build" / "qlint" / "entries").is_dir()
    assert "removed" in qlint(project, "clean").stdout and not (project / "build" / "qlint").exists()


def test_jobs_lints_several_models_in_workers_and_merges_them_in_order(project):
    (project / "cubic.py").write_text(MODEL.replace("from helper import Branch", "from helper import Branch as Linear")
                                      .replace("self.branch = Branch(width)", "self.branch = Linear(width)")
                                      .replace("x + self.branch(x)", "x + self.branch(x) ** 2"))
    specs = ["cubic.py", "model.py:broken", "model.py"]
    serial = qlint(project, *specs, "--no-cache", "--format", "json")
    parallel = qlint(project, *specs, "--no-cache", "--format", "json", "--jobs", "2", "--traceback")
    assert serial.returncode == parallel.returncode == 1  # a finding fails the run; the failed model is reported too
    assert json.loads(parallel.stdout) == json.loads(serial.stdout)
    assert [m["verdict"] for m in json.loads(parallel.stdout)["models"]] == ["supercritical", "failed", "certified"]
    assert "RuntimeError: no such checkpoint" in parallel.stderr and "Traceback" in parallel.stderr  # the worker's trace


def test_file_state_is_a_miss_for_a_file_that_appears_or_vanishes(tmp_path):
    absent, present = tmp_path / "absent.json", tmp_path / "present.json"
    present.write_text("{}")
    states = FileState.now("file", str(absent)), FileState.now("file", str(present))
    written_at = time.time() + 10  # both recorded "just now": racy, so checked by content
    assert all(state.unchanged(written_at) for state in states)
    absent.write_text("{}")
    present.unlink()
    assert not any(state.unchanged(written_at) for state in states)


def test_an_unreadable_entry_is_a_miss(tmp_path):
    cache = ResultCache(tmp_path / "cache")
    key = cache.key("model.py", {})
    (tmp_path / "cache" / "entries").mkdir(parents=True)
    (tmp_path / "cache" / "entries" / f"{key}.pickle").write_bytes(b"not a pickle")
    assert cache.lookup(key) is None and cache.misses == 1


def test_a_new_module_in_an_import_folder_invalidates_the_entry_and_other_files_do_not(project):
    """The model's folder is searched by imports: a new module there might shadow one the
    model imports, so the entry is not trusted; a new data or report file is no module."""
    check(project)
    (project / "notes.txt").write_text("not importable")
    assert check(project)[1]
    (project / "torch_helpers.py").write_text("# a module that might shadow an import\n")
    assert not check(project)[1]
    assert check(project)[1]
    (project / "helper").mkdir()  # a package folder now shadows helper.py
    assert not check(project)[1]


def test_a_folder_the_factory_lists_is_checked_by_every_name(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "a.pt").write_text("")
    listed = FileState.now("folder", str(tmp_path / "checkpoints"))
    searched = FileState.now("modules", str(tmp_path / "checkpoints"))
    (tmp_path / "checkpoints" / "b.pt").write_text("")
    assert not listed.unchanged(0.0) and searched.unchanged(0.0)


def test_a_baseline_is_written_and_applied_afresh_on_replayed_reports(project):
    (project / "helper.py").write_text(HELPER.replace("self.fc(x) + 0", "self.fc(x) ** 3"))
    assert check(project)[0].returncode == 1
    written = qlint(project, "model.py", "-v", "--write-baseline", "baseline.json")
    assert written.returncode == 0 and "replayed from the result cache" in written.stderr
    assert "2 finding(s)" in written.stderr
    applied, replayed, report = check(project, "--baseline", "baseline.json")
    assert replayed and applied.returncode == 0 and report["models"][0]["findings"] == []
    assert {f["suppression"] for f in report["models"][0]["suppressed"]} == {"baseline"}


def test_every_model_of_a_run_replays_and_a_file_read_at_import_counts_for_all(project):
    """Keys are taken before any model loads (loading one extends sys.path), and a file a
    shared module reads when first imported belongs to every model of the run."""
    (project / "shared.py").write_text('import json\nPOWER = json.load(open("power.json"))["power"]\n')
    (project / "power.json").write_text('{"power": 1}')
    (project / "two.py").write_text(MODEL.replace("return x + self.branch(x)", "import shared\n        return x + self.branch(x) ** shared.POWER")
                                    .replace("def build_model():", "import shared\n\n\ndef first():\n    return build_model()\n\n\ndef build_model():"))
    first = qlint(project, "two.py:first", "two.py:build_model", "-v", "--format", "json")
    assert first.returncode == 0, first.stderr
    again = qlint(project, "two.py:first", "two.py:build_model", "-v", "--format", "json")
    assert again.stderr.count("replayed from the result cache") == 2
    (project / "power.json").write_text('{"power": 3}')
    changed = qlint(project, "two.py:first", "two.py:build_model", "-v", "--format", "json")
    assert "replayed" not in changed.stderr and changed.returncode == 1


def test_clean_and_the_cache_leave_folders_that_are_not_qlint_caches_alone(project):
    (project / "src").mkdir()
    (project / "src" / "keep.py").write_text("x = 1\n")
    refused = qlint(project, "clean", "--cache-dir", "src")
    assert refused.returncode == 2 and "not a qlint cache" in refused.stderr and (project / "src" / "keep.py").exists()
    assert qlint(project, "model.py", "--cache-dir", "src").returncode == 0
    assert sorted(p.name for p in (project / "src").iterdir()) == ["keep.py"]  # no .gitignore, no entries


def test_a_cache_dir_that_prefixes_a_read_file_still_tracks_it(project):
    (project / "model.py").write_text(MODEL.replace('open("width.json")', 'open("w.json")'))
    (project / "w.json").write_text('{"width": 8}')
    check(project, "--cache-dir", "w")
    (project / "w.json").write_text('{"width": 16}')
    assert not check(project, "--cache-dir", "w")[1]


def test_a_large_file_replaced_with_a_same_size_one_keeping_its_mtime_is_a_miss(tmp_path):
    """cp -p / rsync -a keep size and mtime; the inode and change time still differ."""
    big = tmp_path / "ckpt.pt"
    big.write_bytes(b"a" * (2 << 20))
    state = FileState.now("file", str(big))
    stat = big.stat()
    other = tmp_path / "other.pt"
    other.write_bytes(b"b" * (2 << 20))
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(other, big)
    assert big.stat().st_size == stat.st_size and big.stat().st_mtime_ns == stat.st_mtime_ns
    assert not state.unchanged(written_at=time.time() + 10)


def test_a_file_edited_while_the_model_is_analysed_keeps_the_entry_out(project):
    """The factory reads width.json, then the file changes (here the factory itself touches it)
    before the analysis ends: what was analysed may not be what is on disk, so nothing is stored."""
    (project / "model.py").write_text(MODEL.replace(
        'width = json.load(handle)["width"]',
        'width = json.load(handle)["width"]\n    open("width.json", "a").write(" ")'))
    assert qlint(project, "model.py").returncode == 0
    assert not list((project / ".qlint_cache").glob("entries/*.pickle"))


def test_weight_files_beside_an_opened_file_are_tracked(tmp_path):
    """from_pretrained opens config.json and maps model.safetensors without `open`."""
    from qlint.ci.cache import read_files

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    (tmp_path / "notes.txt").write_text("")
    with open(tmp_path / "config.json") as handle:
        handle.read()
    files = read_files()
    assert ("file", str(tmp_path / "model.safetensors")) in files
    assert ("file", str(tmp_path / "notes.txt")) not in files
