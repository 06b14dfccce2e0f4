"""Given inputs and tracers are always used (issue 13, item 5); output fit for CI logs (item 6)."""

import io
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from qlint.analysis import Options, load_model
from qlint.ci.render import make_console
from qlint.cli import main
from qlint.capture.pipeline import capture
from qlint.capture.trace import TraceFailure
from conftest import ROOT

TOY = "fixtures/toy.py:lipschitz_mlp"
MISMATCH = (
    "qlint: error: fixtures/toy.py:lipschitz_mlp: LipschitzMLP does not run on its example inputs (2, 4, 99) float32: "
    f"`w1` (Linear) at {ROOT}/qlint/zoo/toy.py:30 `return self.w2(self.act(self.w1(x)))` raised RuntimeError: "
    "mat1 and mat2 shapes cannot be multiplied (8x99 and 8x8); "
    "give inputs the model accepts (--input-shape, or the factory's example inputs)"
)


def qlint_process(*args, env=None):
    environment = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "PYTHONWARNINGS")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "qlint", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env=environment)


# --- item 5: the inputs and the tracer the user gives are the ones used ---------------------------


def test_given_input_shape_replaces_the_factory_inputs():
    loaded = load_model(TOY, Options(input_shapes=["3,5,8"]))
    assert [tuple(x.shape) for x in loaded.inputs] == [(3, 5, 8)]
    assert [tuple(x.shape) for x in load_model(TOY, Options()).inputs] == [(2, 4, 8)]


@pytest.mark.parametrize("tracer", [None, "symbolic_trace", "export", "make_fx"])
def test_inputs_the_model_cannot_run_are_exit_2_naming_the_submodule_and_shapes(tracer):
    completed = qlint_process(TOY, "--input-shape", "2,4,99", "--isolated", *(["--tracer", tracer] if tracer else []))
    assert completed.returncode == 2
    assert completed.stderr.strip() == MISMATCH
    assert completed.stdout == ""


def test_inputs_a_meta_model_cannot_run_are_exit_2_naming_the_submodule_and_shapes():
    """On meta tensors the model has no values to run on; export's fake forward names the failure."""
    completed = qlint_process(TOY, "--input-shape", "2,4,99", "--isolated", "--device", "meta")
    assert completed.returncode == 2
    [line] = completed.stderr.strip().splitlines()
    assert line.startswith(f"qlint: error: {TOY}: could not trace LipschitzMLP: `w1` (Linear) at {ROOT}/qlint/zoo/toy.py:30 ")
    assert line.endswith("(export); check that the model runs on its example inputs (2, 4, 99) float32 (--traceback shows where)")


def test_inputs_the_model_runs_on_are_analysed():
    completed = qlint_process(TOY, "--input-shape", "3,5,8", "--isolated", "--format", "json")
    assert completed.returncode == 0, completed.stderr


def test_a_requested_tracer_that_fails_is_exit_2_not_replaced():
    spec = "fixtures/inputs.py:export_cannot_trace"
    default = qlint_process(spec, "--isolated", "--format", "json")
    assert default.returncode == 1 and '"tracer": "symbolic_trace"' in default.stdout  # the wrapped call is opaque: QL102
    asked = qlint_process(spec, "--isolated", "--tracer", "export")
    assert asked.returncode == 2 and asked.stdout == ""
    [line] = asked.stderr.strip().splitlines()
    assert line.startswith(f"qlint: error: {spec}: could not trace PeakNormalised: its forward at {ROOT}/fixtures/inputs.py:10 "
                           "`return x / float(x.abs().max())` uses a tensor's value in Python")
    assert line.endswith("; export was asked for (--tracer / tracer = ...), so no other tracer was tried")
    assert qlint_process(spec, "--isolated", "--tracer", "symbolic_trace").returncode == 1


def test_a_requested_tracer_is_the_only_one_tried():
    model, inputs = torch.nn.Linear(4, 4), (torch.randn(2, 4),)
    assert capture(model, inputs, prefer="make_fx").attempts == []
    with pytest.raises(TraceFailure, match=r"^the tracer export was asked for \(--tracer / tracer = \.\.\.\) and needs example inputs"):
        capture(model, None, prefer="export")


def test_traceback_shows_the_users_frame_and_keeps_exit_2():
    completed = qlint_process(TOY, "--input-shape", "2,4,99", "--isolated", "--traceback")
    assert completed.returncode == 2
    assert f'File "{ROOT}/qlint/zoo/toy.py", line 30, in branch' in completed.stderr
    assert "The above exception was the direct cause of the following exception" in completed.stderr
    assert completed.stderr.strip().splitlines()[-1] == MISMATCH


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["probe", "fixtures"], "qlint: error: fixtures is a folder; give a Python file or module and its factory, e.g. fixtures/model.py:build_model"),
        (["probe", "nope.py:f"], "qlint: error: nope.py:f: no such file: nope.py"),
        (["probe", TOY, "--input-shape", "2,x"], "qlint: error: invalid --input-shape '2,x'; expected comma-separated positive integers like 2,96,7"),
        (["probe", TOY, "--input-dtype", "int8"], "qlint: error: --input-dtype: invalid value 'int8' (did you mean 'int64'? expected one of: float32, float64, float16, bfloat16, int64, int32)"),
        (["coverage", "fixtures"], "qlint: error: fixtures is a folder; give a Python file or module and its factory, e.g. fixtures/model.py:build_model"),
        (["coverage", "nope.py:f"], "qlint: error: nope.py:f: no such file: nope.py"),
        (["nope.py:f"], "qlint: error: nope.py:f: no such file: nope.py"),
    ],
)
def test_spec_and_option_errors_come_before_torch_is_imported(args, message):
    completed = subprocess.run([sys.executable, "-X", "importtime", "-m", "qlint", *args, "--isolated"],
                               capture_output=True, text=True, cwd=ROOT, timeout=300)
    imported = [line.rsplit("|", 1)[-1].strip() for line in completed.stderr.splitlines() if line.startswith("import time:")]
    assert completed.returncode == 2
    assert "torch" not in imported
    assert [line for line in completed.stderr.splitlines() if not line.startswith("import time:")] == [message]


# --- item 6: output fit for CI logs ---------------------------------------------------------------

FINDING = ("qlint/zoo/toy.py:27: QL102 block `UnknownOpBlock` is uncertified: `torch.special.i0` has no polynomial bound "
           "(exponential growth)")


def _table_columns(text: str) -> list[str]:
    """Each column of the first table's body in ``text``, its lines joined (a folded cell whole again)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        rows.append([cell.strip() for cell in line.strip("│").split("│")])
    return ["".join(column) for column in zip(*rows)]


@pytest.mark.parametrize("columns", ["", "80", "50"])
def test_piped_output_never_wraps_a_message(columns):
    completed = qlint_process("fixtures/toy.py:unknown_op", "--isolated", env={"COLUMNS": columns} if columns else {})
    assert completed.returncode == 1
    lines = completed.stdout.splitlines()
    assert FINDING in lines
    assert "fixtures/toy.py:unknown_op: uncertified, max q = ? over 1 blocks, share of q = 1 blocks 0%" in lines
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert max(map(len, table)) <= int(columns or 200)
    assert _table_columns(completed.stdout)[:3] == ["UnknownOpBlock", "?", "uncertified"]


def test_width_wraps_messages_and_keeps_every_table_column():
    completed = qlint_process("fixtures/toy.py:unknown_op", "--isolated", "--width", "60")
    assert completed.returncode == 1
    lines = completed.stdout.splitlines()
    assert max(map(len, lines)) <= 60 and FINDING not in lines
    assert " ".join(completed.stdout.split()).count("QL102 block `UnknownOpBlock` is uncertified") == 1
    columns = _table_columns(completed.stdout)
    assert len(columns) == 5 and columns[:3] == ["UnknownOpBlock", "?", "uncertified"]


def test_probe_table_keeps_every_column_at_80():
    from qlint import api
    from qlint.probe.measure import ProbeSettings
    from qlint.probe.report import print_probe

    [result] = api.probe([TOY], isolated=True, settings=ProbeSettings(random_directions=1, power_iterations=2, perturb=False))
    stream = io.StringIO()
    print_probe([result], make_console(stream, width=80))
    text = stream.getvalue()
    columns = _table_columns(text)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines() if line[:1] in "┏┃┡│└") <= 80
    assert len(columns) == 9
    assert columns[:3] == ["LipschitzMLP", "1", "1.000"]  # the static q: the column rich used to shrink to nothing


def test_third_party_warnings_stay_out_of_the_output():
    """torch warns "Failed to initialize NumPy" on import where numpy is missing (blocked here);
    the CLI silences the libraries' own warnings."""
    blocked = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['numpy'] = None; from qlint.cli import main; main()",
         TOY, "--isolated"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"},
    )
    assert blocked.returncode == 0, blocked.stderr
    assert "Warning" not in blocked.stderr and "Warning" not in blocked.stdout
    bare = subprocess.run([sys.executable, "-c", "import sys; sys.modules['numpy'] = None; import torch"],
                          capture_output=True, text=True, timeout=300)
    assert "Failed to initialize NumPy" in bare.stderr  # the warning the CLI silences does occur


def test_probe_prints_no_warning():
    completed = qlint_process("probe", TOY, "--isolated", "--directions", "1", "--iterations", "2", "--no-perturb", "--threads", "1")
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == ""


def test_check_on_nan_weights_is_one_line_and_exit_2(tmp_path):
    """The graph check compares the graph with the model's outputs: with a NaN weight there is nothing to compare."""
    module = tmp_path / "nan_check.py"
    module.write_text(
        "import torch\nfrom qlint.zoo import toy\n"
        "def build_model():\n    torch.manual_seed(0)\n    m = toy.LipschitzMLP(8)\n"
        "    with torch.no_grad():\n        m.w1.weight[0, 0] = float('nan')\n    return m, (torch.randn(2, 4, 8),)\n")
    result = CliRunner().invoke(main, [f"{module}:build_model", "--isolated"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"qlint: error: {module}:build_model: the parameter `w1.weight` holds inf or nan, so the "
                                     "graph cannot be checked against the model's outputs; analyse the model with finite "
                                     "weights (a fresh init, or --device meta)")
