"""A gate nothing in a model can turn green (issue #27), through the real command line.

A model's code that exits (``sys.exit``, ``os._exit``), dies (SIGKILL, a segfault) or prints
is that model's failure or noise on stderr, never the run's exit code or a corrupt JSON/SARIF
document; ``-j 2`` gives what ``-j 1`` gives. Every file qlint writes is written whole (a full
disk leaves the old report and the committed baseline as they were, and the error names the
file), output folders are made or refused before the analysis, the cache treats anything
unexpected as a miss, and the smaller edges: SARIF URIs, dict example inputs, blame for an
inline ``--config``, a ``pyproject.toml`` that is a folder or a dangling link.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import CUBIC_MODULE, ROOT

FACTORIES = CUBIC_MODULE + textwrap.dedent(
    '''
    import os
    import signal
    import sys
    import time

    print("models.py prints while it is imported")


    class Linear(nn.Module):
        """x + W x: q = 1, certified."""

        def __init__(self):
            super().__init__()
            self.w = nn.Linear(8, 8)

        def forward(self, x):
            return x + self.w(x)


    class Chatty(Linear):
        def forward(self, x):
            print("the forward prints")
            os.write(1, b"and writes to file descriptor 1\\n")
            return super().forward(x)


    class ExitsInForward(Linear):
        def forward(self, x):
            sys.exit(0)


    def cubic():
        print("the cubic factory prints")
        return Cubic(), (torch.randn(2, 8),)


    def linear():
        return Linear(), (torch.randn(2, 8),)


    def chatty():
        print("the chatty factory prints")
        return Chatty(), (torch.randn(2, 8),)


    def exit0():
        sys.exit(0)


    def exit3():
        sys.exit(3)


    def hard_exit():
        os._exit(0)


    def killed():
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does


    def segfault():
        import ctypes

        ctypes.string_at(0)


    def exits_in_forward():
        return ExitsInForward(), (torch.randn(2, 8),)


    def hangs():
        time.sleep(600)  # a factory that blocks (a lock, a download that never ends)
    '''
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(FACTORIES, encoding="utf-8")
    (tmp_path / "exits_at_import.py").write_text("import sys\n\nsys.exit(0)\n", encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text("[tool.qlint]\n", encoding="utf-8")
    return tmp_path


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update(PYTHONPATH=str(ROOT), QLINT_NO_CACHE="1", **extra)
    return env


def qlint(project: Path, *args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qlint", *args], capture_output=True, text=True, cwd=project,
                          timeout=600, env=env or _env(), **kwargs)


def verdicts(run: subprocess.CompletedProcess) -> dict[str, str]:
    return {m["spec"]: m["verdict"] for m in json.loads(run.stdout)["models"]}


def failure(run: subprocess.CompletedProcess, spec: str) -> str:
    return next(m["failure"] for m in json.loads(run.stdout)["models"] if m["spec"] == spec)


def errors(run: subprocess.CompletedProcess) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.startswith("qlint: error: ")]


# -- 1. model code that exits or dies ------------------------------------------------------------


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sys_exit_0_next_to_a_supercritical_model_exits_1_and_reports_both(project, jobs):
    run = qlint(project, "models.py:exit0", "models.py:cubic", "--format", "json", "-j", jobs)
    assert run.returncode == 1, run.stderr  # the finding fails the run; the exiting model is reported as failed
    assert verdicts(run) == {"models.py:exit0": "failed", "models.py:cubic": "supercritical"}
    assert "called sys.exit(0) while building the model (exit0())" in failure(run, "models.py:exit0")
    assert errors(run) == ["qlint: error: models.py:exit0: the model's code called sys.exit(0) while building the model (exit0())"]
    assert json.loads(run.stdout)["summary"]["failed"] == 1


def test_an_exit_alone_is_exit_2_with_one_line_naming_the_spec_never_the_models_code(project):
    for spec, exit_code, message in [
        ("exits_at_import.py", 0, "exits_at_import.py: the model's code called sys.exit(0) while importing exits_at_import.py"),
        ("models.py:exit3", 3, "models.py:exit3: the model's code called sys.exit(3) while building the model (exit3())"),
        ("models.py:exits_in_forward", 0,
         "models.py:exits_in_forward: the model's code called sys.exit(0) while tracing the model (running its forward)"),
    ]:
        run = qlint(project, spec, "--format", "concise")
        assert run.returncode == 2, (spec, run.stderr)
        assert errors(run) == [f"qlint: error: {message}"], (spec, exit_code, run.stderr)
        assert "Traceback" not in run.stderr


def test_os_exit_in_the_factory_is_the_models_failure(project):
    run = qlint(project, "models.py:hard_exit", "--format", "json")
    assert run.returncode == 2 and verdicts(run) == {"models.py:hard_exit": "failed"}
    assert failure(run, "models.py:hard_exit") == (
        "models.py:hard_exit: the process analysing it exited with status 0 while building the model (hard_exit()), "
        "before reporting a result: the model's code called os._exit(), or the interpreter crashed")
    together = qlint(project, "models.py:hard_exit", "models.py:cubic", "--format", "json")
    assert together.returncode == 1 and verdicts(together) == {"models.py:hard_exit": "failed", "models.py:cubic": "supercritical"}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_model_past_the_timeout_is_stopped_and_costs_only_itself(project, jobs):
    run = qlint(project, "models.py:hangs", "models.py:linear", "--timeout", "20", "--format", "json", "-j", jobs)
    assert run.returncode == 2, run.stderr
    assert verdicts(run) == {"models.py:hangs": "failed", "models.py:linear": "certified"}
    assert failure(run, "models.py:hangs") == (
        "models.py:hangs: it did not finish within 20 s (the per-model timeout: --timeout, or `timeout` in the config) "
        "and was stopped while building the model (hangs())")
    assert errors(run) == ["qlint: error: " + failure(run, "models.py:hangs")] and "Traceback" not in run.stderr


def test_the_timeout_is_a_config_key_too(project):
    (project / "pyproject.toml").write_text("[tool.qlint]\ntimeout = 4\n", encoding="utf-8")
    run = qlint(project, "models.py:hangs", "--format", "json")
    assert run.returncode == 2 and "did not finish within 4 s" in failure(run, "models.py:hangs")
    assert "\ntimeout            4 s per model\n" in qlint(project, "--show-settings", "models.py:linear").stdout


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_worker_killed_with_sigkill_costs_only_its_model(project, jobs):
    specs = ["models.py:killed", "models.py:cubic", "models.py:segfault", "models.py:linear"]
    run = qlint(project, *specs, "--format", "json", "-j", jobs)
    assert run.returncode == 1, run.stderr
    assert verdicts(run) == {"models.py:killed": "failed", "models.py:cubic": "supercritical",
                             "models.py:segfault": "failed", "models.py:linear": "certified"}
    assert failure(run, "models.py:killed") == ("models.py:killed: the process analysing it was killed by SIGKILL while "
                                                "building the model (killed()): killed, e.g. by the out-of-memory killer")
    assert "was killed by SIGSEGV while building the model (segfault()): a segmentation fault" in failure(run, "models.py:segfault")
    assert len(errors(run)) == 2 and "BrokenProcessPool" not in run.stderr and "Traceback" not in run.stderr


def test_jobs_give_what_one_job_gives(project):
    specs = ["models.py:exit0", "models.py:killed", "models.py:cubic", "models.py:chatty", "models.py:linear"]
    one = qlint(project, *specs, "--format", "json", "-j", "1")
    three = qlint(project, *specs, "--format", "json", "-j", "3")
    assert one.returncode == three.returncode == 1
    assert _outcome(one) == _outcome(three)
    assert [m[1] for m in _outcome(one)[0]] == ["failed", "failed", "supercritical", "certified", "certified"]


def _outcome(run: subprocess.CompletedProcess) -> tuple:
    """What a gate decides on: each model's verdict, failure, blocks and findings, and the summary."""
    document = json.loads(run.stdout)
    return ([(m["spec"], m["verdict"], m.get("failure"), m.get("max_q"), [(b["name"], b["q"]) for b in m["blocks"]],
              m["findings"]) for m in document["models"]], document["summary"])


# -- 2. what a model prints ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "sarif"])
def test_a_printing_model_leaves_machine_readable_stdout_intact(project, fmt):
    run = qlint(project, "models.py:chatty", "models.py:cubic", "--format", fmt)
    assert run.returncode == 1
    document = json.loads(run.stdout)  # nothing the models printed is in it
    assert document["models" if fmt == "json" else "runs"]
    for printed in ("models.py prints while it is imported", "the chatty factory prints", "the forward prints",
                    "and writes to file descriptor 1", "the cubic factory prints"):
        assert printed in run.stderr and printed not in run.stdout


# -- 3. files written whole ------------------------------------------------------------------------


def _tmpfs_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs \"$d\""], capture_output=True, timeout=60)
    return probe.returncode == 0


def _in_a_full_tmpfs(project: Path, qlint_args: str, old: dict[str, str]) -> tuple[str, dict[str, str], list[str]]:
    """Run qlint in a mount namespace where ``project/full`` is a tmpfs holding ``old`` and then
    filled to the last byte; qlint's stderr, the files there afterwards, and the names there."""
    full = project / "full"
    full.mkdir()
    writes = "; ".join(f"printf %s {json.dumps(text)} > {full}/{name}" for name, text in old.items())
    script = textwrap.dedent(f"""\
        mount -t tmpfs -o size=256k tmpfs {full} || exit 99
        {writes}
        dd if=/dev/zero of={full}/filler bs=4096 2>/dev/null
        dd if=/dev/zero of={full}/filler2 bs=1 2>/dev/null
        {sys.executable} -m qlint {qlint_args} 2>{project}/stderr.txt
        echo "$?" > {project}/rc.txt
        for name in {' '.join(old)}; do echo "=== $name"; cat {full}/$name; echo; done
        echo "=== ls"; ls -a {full}
        """)
    run = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], capture_output=True,
                         text=True, cwd=project, timeout=600, env=_env())
    assert run.returncode == 0, run.stderr
    sections = dict(part.split("\n", 1) for part in run.stdout.split("=== ")[1:])
    after = {name: sections[name].rstrip("\n") for name in old}
    names = sections["ls"].split()
    stderr = (project / "stderr.txt").read_text()
    assert (project / "rc.txt").read_text().strip() == "2", stderr
    return stderr, after, names


@pytest.mark.skipif(not _tmpfs_available(), reason="no tmpfs can be mounted here (the RLIMIT_FSIZE test covers the write error)")
def test_a_full_disk_leaves_the_old_report_and_the_baseline_and_names_the_file(project):
    full = project / "full"
    stderr, after, names = _in_a_full_tmpfs(
        project, f"models.py:cubic --format sarif -o {full}/qlint.sarif --output json:{full}/report.json",
        {"qlint.sarif": "the old SARIF", "report.json": "the old JSON"})
    assert f"qlint: error: cannot write the sarif report {full}/qlint.sarif: No space left on device" in stderr
    assert after == {"qlint.sarif": "the old SARIF", "report.json": "the old JSON"}
    assert not [n for n in names if n.startswith(".qlint-tmp-")]
    shutil.rmtree(full)
    baseline = json.dumps({"qlint_baseline": 2, "qlint_version": "0", "findings": []})
    stderr, after, names = _in_a_full_tmpfs(project, f"models.py:cubic --write-baseline {full}/qlint-baseline.json",
                                            {"qlint-baseline.json": baseline})
    assert f"qlint: error: cannot write baseline {full}/qlint-baseline.json: No space left on device" in stderr
    assert after == {"qlint-baseline.json": baseline}  # the committed baseline is not destroyed
    assert not [n for n in names if n.startswith(".qlint-tmp-")]


def _file_size_limit(limit: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: a write fails EFBIG

    return apply


def test_a_failed_write_leaves_the_old_files_names_them_and_leaves_no_temporary(project):
    """The same without a tmpfs: a file size limit makes the write fail (EFBIG) where a full disk would."""
    (project / "qlint.sarif").write_text("the old SARIF")
    run = qlint(project, "models.py:cubic", "--format", "sarif", "-o", "qlint.sarif", preexec_fn=_file_size_limit(1000))
    assert run.returncode == 2
    assert errors(run) == ["qlint: error: cannot write the sarif report qlint.sarif: File too large"]
    assert (project / "qlint.sarif").read_text() == "the old SARIF"
    written = qlint(project, "models.py:cubic", "--write-baseline", "qlint-baseline.json")
    assert written.returncode == 0
    committed = (project / "qlint-baseline.json").read_text()
    (project / "models.py").write_text(FACTORIES.replace("** 3", "** 2") + "\n\ndef also():\n    return Cubic(), (torch.randn(2, 8),)\n")
    rewrite = qlint(project, "models.py:cubic", "models.py:also", "--write-baseline", "qlint-baseline.json",
                    preexec_fn=_file_size_limit(len(committed) + 10))
    assert rewrite.returncode == 2
    assert errors(rewrite) == ["qlint: error: cannot write baseline qlint-baseline.json: File too large"]
    assert (project / "qlint-baseline.json").read_text() == committed
    assert not list(project.glob(".qlint-tmp-*"))


def test_output_folders_are_made_or_refused_before_the_analysis(project):
    run = qlint(project, "models.py:cubic", "--format", "sarif", "-o", "reports/ci/qlint.sarif",
                "--output", "json:reports/json/out.json", "--write-baseline", "baselines/qlint.json")
    assert run.returncode == 0, run.stderr  # --write-baseline exits 0
    assert json.loads((project / "reports/ci/qlint.sarif").read_text())["runs"]
    assert json.loads((project / "reports/json/out.json").read_text())["models"]
    assert json.loads((project / "baselines/qlint.json").read_text())["findings"]
    (project / "blocker").write_text("a file where a folder would go\n")
    refused = qlint(project, "models.py:cubic", "--output", "sarif:blocker/qlint.sarif")
    assert refused.returncode == 2
    assert errors(refused) == ["qlint: error: cannot write the sarif report blocker/qlint.sarif: blocker is not a folder"]
    assert "the cubic factory prints" not in refused.stderr  # refused before any model ran
    (project / "a-folder").mkdir()
    refused = qlint(project, "models.py:cubic", "--output", "json:a-folder")
    assert refused.returncode == 2 and errors(refused) == ["qlint: error: cannot write the json report a-folder: it is a folder"]


# -- 4. the cache validates what it loads ------------------------------------------------------------


def test_a_cache_entry_of_another_type_is_a_miss_and_verbose_says_so(project):
    env = _env()
    env.pop("QLINT_NO_CACHE")
    first = qlint(project, "models.py:cubic", "--format", "json", env=env)
    assert first.returncode == 1
    entries = list((project / ".qlint_cache" / "entries").glob("*.pickle"))
    assert len(entries) == 1
    entries[0].write_bytes(pickle.dumps(["not", "a", "cache", "entry"]))
    again = qlint(project, "models.py:cubic", "--format", "json", "-v", env=env)
    assert again.returncode == 1 and json.loads(again.stdout) == json.loads(first.stdout)
    assert "ignored (it holds list, not a cache entry), analysing again" in again.stderr
    entries[0].write_bytes(pickle.dumps({"format": 3, "written_at": 0.0, "files": [], "report": "a string"}))
    again = qlint(project, "models.py:cubic", "--format", "json", "-v", env=env)
    assert again.returncode == 1 and "ignored (it holds str, not a model report)" in again.stderr
    entries[0].write_bytes(entries[0].read_bytes()[:7])  # truncated
    again = qlint(project, "models.py:cubic", "--format", "json", "-v", env=env)
    assert again.returncode == 1 and "unreadable" in again.stderr and "replayed" not in again.stderr


def test_a_damaged_cachedir_tag_is_repaired_and_a_foreign_folder_is_announced(project):
    env = _env()
    env.pop("QLINT_NO_CACHE")
    cache = project / ".qlint_cache"
    assert qlint(project, "models.py:cubic", env=env).returncode == 1
    tag = (cache / "CACHEDIR.TAG").read_text()
    (cache / "CACHEDIR.TAG").write_text(tag[:20])  # truncated
    for entry in (cache / "entries").glob("*.pickle"):
        entry.unlink()
    stored = qlint(project, "models.py:cubic", "-v", env=env)
    assert stored.returncode == 1 and "warning" not in stored.stderr
    assert (cache / "CACHEDIR.TAG").read_text() == tag and len(list((cache / "entries").glob("*.pickle"))) == 1
    replayed = qlint(project, "models.py:cubic", "-v", env=env)
    assert "replayed from the result cache" in replayed.stderr
    (project / "src").mkdir()
    (project / "src" / "keep.py").write_text("# not a cache\n")
    foreign = qlint(project, "models.py:cubic", "--cache-dir", "src", env=env)
    assert foreign.returncode == 1
    assert "qlint: warning: results are not cached: " in foreign.stderr and "is not a qlint cache" in foreign.stderr
    assert sorted(p.name for p in (project / "src").iterdir()) == ["keep.py"]


# -- 5. the smaller edges ------------------------------------------------------------------------------


def test_sarif_artifact_uris_are_uri_references(project):
    folder = project / "my models"
    folder.mkdir()
    (folder / "ünï #1.py").write_text(CUBIC_MODULE + "\n\ndef build_model():\n    return Cubic(), (torch.randn(2, 8),)\n")
    run = qlint(project, "my models/ünï #1.py", "--format", "sarif")
    assert run.returncode == 1
    result = json.loads(run.stdout)["runs"][0]["results"][0]
    uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "my%20models/%C3%BCn%C3%AF%20%231.py" and unquote(uri) == "my models/ünï #1.py"
    assert re.fullmatch(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/%]+", uri)  # RFC 3986 characters only


def test_dict_example_inputs_are_keyword_arguments(project):
    (project / "kw.py").write_text(textwrap.dedent(
        '''
        import torch
        from torch import nn


        class Biased(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Linear(8, 8)

            def forward(self, x, mask=None, bias=None):
                assert isinstance(x, torch.Tensor) and mask is None, "x must be the tensor, not the dict"
                return x + self.w(x) + bias


        def build_model():
            return Biased(), {"bias": torch.zeros(8), "x": torch.randn(2, 8)}  # mask skipped: its default


        def unknown_name():
            return Biased(), {"x": torch.randn(2, 8), "gain": torch.ones(8)}
        '''
    ))
    run = qlint(project, "kw.py", "--format", "json")
    assert run.returncode == 0, run.stderr
    [model] = json.loads(run.stdout)["models"]
    assert model["verdict"] == "certified" and [b["q"] for b in model["blocks"]] == [1.0]
    bad = qlint(project, "kw.py:unknown_name", "--format", "json")
    assert bad.returncode == 2
    assert "example input 'gain' (a dict key) cannot be passed to Biased.forward, which has no such parameter" in errors(bad)[0]


def test_an_inline_config_error_is_blamed_on_the_override(project):
    (project / "pyproject.toml").write_text("[tool.qlint]\nfail-on = \"error\"\n")
    run = qlint(project, "models.py:cubic", "--config", "fail-on = 'bogus'")
    assert run.returncode == 2
    assert errors(run) == ["qlint: error: --config \"fail-on = 'bogus'\": 'fail-on': invalid value 'bogus' "
                           "(expected one of: info, warning, error)"]
    assert "pyproject.toml" not in run.stderr


@pytest.mark.parametrize("kind", ["folder", "dangling link"])
def test_a_pyproject_toml_that_is_no_file_is_an_error(project, kind):
    sub = project / "sub"
    sub.mkdir()
    if kind == "folder":
        (sub / "pyproject.toml").mkdir()
        expected = f"{sub / 'pyproject.toml'} is a folder, not a configuration file"
    else:
        (sub / "pyproject.toml").symlink_to("missing.toml")
        expected = f"{sub / 'pyproject.toml'} is a broken symbolic link (to missing.toml)"
    run = qlint(sub, "../models.py:linear")
    assert run.returncode == 2 and len(errors(run)) == 1 and errors(run)[0].startswith(f"qlint: error: {expected}")
    assert qlint(sub, "../models.py:linear", "--isolated").returncode == 0  # --isolated reads no file


def test_ctrl_c_and_sigterm_stop_the_workers(project):
    """The supervising process owns its workers: interrupted or terminated, it leaves none behind."""
    (project / "waits.py").write_text(textwrap.dedent(
        '''
        import os
        import time


        def build_model():
            with open("ready.fifo", "w") as fifo:  # tell the test which process holds the model
                fifo.write(str(os.getpid()))
            while True:
                time.sleep(0.05)
        '''
    ))
    fifo = project / "ready.fifo"
    for sent, expected in [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)]:
        os.mkfifo(fifo)
        process = subprocess.Popen([sys.executable, "-m", "qlint", "waits.py"], cwd=project, env=_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with open(fifo) as ready:  # blocks until the worker runs the factory
            worker = int(ready.read())
        assert worker != process.pid and process.poll() is None
        process.send_signal(sent)
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == expected, stderr
        if sent == signal.SIGINT:
            assert stderr.strip() == "qlint: interrupted"
        _wait_gone(worker)
        fifo.unlink()


def _wait_gone(pid: int) -> None:
    """The worker ends once its supervisor is gone: killed by it, or on seeing its pipe close."""
    import time

    for _ in range(1200):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return  # gone (and reaped)
        if state in ("Z", "X"):  # ended, not yet reaped by its new parent
            return
        time.sleep(0.1)
    raise AssertionError(f"worker {pid} is still running after its supervisor ended")
