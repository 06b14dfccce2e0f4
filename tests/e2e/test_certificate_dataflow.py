"""A certificate rests on what the model computes (fixtures/dataflow.py), tried through ``qlint --format json``:

1. residual updates are found by dataflow: a value carrying part of the stream by identity combined
   with a term computed from it is an update in every spelling (slice assignment, ``+=`` on a slice,
   ``narrow().add_``, ``cat`` of an updated slice, ``index_add``, ``index_put``, ``scatter``,
   ``where``), and the norm after it does not hide it; a linear rearrangement of the stream
   (rotate_half, a cat of its own halves) and a broadcast bias are not updates;
2. the graph is checked against eager under every global mode the forward can read and over
   successive calls; a model that cannot run in a mode is not refused for it;
3. floating-point buffers are parameters (a training loop moves them); integer buffers are constants,
   and frozen statistics and spline grids stay certified;
4. max_q covers transitions.

Each mechanism also has a direct test with the input that would break it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, load_module
from qlint.capture.call_state import python_state
from qlint.capture.graph_check import GraphMismatch, compare_with_eager

SPEC = "fixtures/dataflow.py"
dataflow = load_module(ROOT / "fixtures" / "dataflow.py", "dataflow_fixtures")

EXPECTED: dict[str, tuple[str, object]] = {  # factory: (verdict, max q)
    **{f"{s}_square": ("supercritical", 2.0) for s in dataflow.SPELLINGS},
    **{f"{s}_linear": ("certified", 1.0) for s in dataflow.SPELLINGS},
    "slice_assign_before_blocks_square": ("supercritical", 2.0),
    "slice_assign_before_blocks_linear": ("certified", 1.0),
    "normed_head_square": ("supercritical", 2.0),
    "normed_head_linear": ("certified", 1.0),
    "expanding_shortcut_square": ("supercritical", 2.0),
    "expanding_shortcut": ("certified", 1.0),
    "stem_update_square": ("supercritical", 2.0),
    "stem_update_linear": ("certified", 1.0),
    "rotary": ("certified", 0.0),  # the stream of one q 0 block; the certified head (a cat of its halves) is no velocity
    "head_square": ("supercritical", 2.0),
    **{f"reads_{m}": ("supercritical", 2.0) for m in dataflow.GLOBAL_MODES},  # traced in the mode: its graph squares
    "reads_input_dtype": ("failed", None),
    "reads_call_counter": ("failed", None),
    "reads_nothing": ("certified", 1.0),
    "sets_a_flag_once": ("certified", 1.0),
    "no_bfloat16_kernel": ("certified", 1.0),
    "float_buffer_gate": ("supercritical", 2.0),
    "integer_buffer_gate": ("certified", 1.0),
    "annealed_exponent": ("uncertified", None),
    "frozen_statistics": ("certified", 1.0),
    "bool_flag_on": ("supercritical", 2.0),
    "bool_flag_off": ("certified", 1.0),  # where/masked_fill by a constant condition select one value
    "float_flag_off": ("supercritical", 2.0),  # a condition on a float buffer is no constant: both values count
    "one_token_square": ("supercritical", 2.0),
    "batch_of_one_square": ("supercritical", 2.0),
    "example_of_one_token_square": ("supercritical", 2.0),
    "one_token_skips_mixing": ("certified", 1.0),
    **{f"reads_{h}_held_value": ("failed", None) for h in ("float", "closure", "tolist")},
    "reads_integer_held_value": ("certified", 1.0),
    "reads_derived_held_value": ("certified", 1.0),
    "inference_repeated_token_square": ("supercritical", 2.0),
    "inference_fused_mlp": ("certified", 1.0),
    "notices_the_tracer_square": ("supercritical", 2.0),  # symbolic_trace refused, export's graph has the term
    "checks_only_when_not_traced": ("certified", 1.0),
    "non_contiguous_square": ("failed", None),
    "dict_counter_unlock": ("failed", None),
    "length_in_a_dict": ("certified", 1.0),
    "environment_on_square": ("supercritical", 2.0),  # traced with the variable at "1" too
    # a condition qlint cannot try every value of: certified for it only, so not certified (QL109)
    **{name: ("uncertified", 1.0) for name in ("environment_spelled_square", "environment_logged",
                                               "thread_local_square", "thread_local_in_closure_square",
                                               "context_variable_square", "stack_inspection_square",
                                               "clock_square")},
    "unbatched_square": ("supercritical", 2.0),  # traced unbatched too
    "unbatched_same_path": ("certified", 1.0),
    "half_copy_square": ("failed", None),
}
CONDITIONS = {  # what each conditional verdict is for, and the line of fixtures/dataflow.py that reads it
    "environment_on_square": ("the environment variable QLINT_FIXTURE_FAST (unset here)", "os.environ.get"),
    "environment_spelled_square": ("the environment variable QLINT_FIXTURE_MODE (unset here)", "in os.environ"),
    "environment_logged": ("the environment variable QLINT_FIXTURE_LOG (unset here)", "os.getenv"),
    "thread_local_square": ("the thread-local `_FLAGS`", "getattr(_FLAGS"),
    "thread_local_in_closure_square": ("the thread-local `flags`", "getattr(flags"),
    "context_variable_square": ("the context variable `qlint_fixture_serving`", "_SERVING.get()"),
    "stack_inspection_square": ("the call stack (who calls the model)", "inspect.stack(0)"),
    "clock_square": ("the clock (`time.time`)", "time.time()"),
}
REFUSED_BECAUSE = {  # what the one-line reason of each refused model names
    "reads_input_dtype": "bfloat16 inputs",
    "reads_call_counter": "state kept across calls",
    "reads_float_held_value": "reads the value of the buffer `mix` in Python at",
    "reads_tolist_held_value": "reads the value of the buffer `mix` in Python at",
    "reads_closure_held_value": "a float tensor held outside the module's parameters and buffers",
    "non_contiguous_square": "on non-contiguous inputs",
    "dict_counter_unlock": "the forward changes `stats`",
    "half_copy_square": "a float16 copy of the model on inputs of that dtype runs other ops than the model as analysed "
                        "(more: add x2, matmul x2, mul x1; fewer: relu x1)",
}


@pytest.fixture(scope="module")
def report() -> dict[str, dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    specs = [f"{SPEC}:{name}" for name in EXPECTED]
    proc = subprocess.run([sys.executable, "-m", "qlint", *specs, "--format", "json", "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]  # findings (the refused models are in the report as failed)
    return {m["spec"].split(":")[-1]: m for m in json.loads(proc.stdout)["models"]}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_verdict_and_max_q(report, name):
    verdict, max_q = EXPECTED[name]
    assert (report[name]["verdict"], report[name]["max_q"]) == (verdict, max_q)


@pytest.mark.parametrize("name", list(REFUSED_BECAUSE))
def test_a_refusal_names_the_mode_or_state(report, name):
    assert REFUSED_BECAUSE[name] in report[name]["failure"]


@pytest.mark.parametrize("name", list(CONDITIONS))
def test_a_condition_is_named_with_the_line_that_reads_it(report, name):
    what, code = CONDITIONS[name]
    (condition,) = report[name]["conditions"]
    assert condition["what"] == what
    assert condition["file"].endswith("fixtures/dataflow.py")
    assert code in (ROOT / "fixtures" / "dataflow.py").read_text().splitlines()[condition["line"] - 1]
    (finding,) = [f for f in report[name]["findings"] if f["code"] == "QL109"]
    assert finding["severity"] == "error" and what in finding["message"]


def test_an_environment_value_that_changes_the_forward_is_traced_and_analysed(report):
    assert report["environment_on_square"]["modes"].endswith(
        "traced and analysed with the environment variable QLINT_FIXTURE_FAST='1' too (supercritical)")


def test_an_unbatched_input_on_another_path_is_traced_and_analysed(report):
    assert "the graph differs from the model on inputs (3, 8) float32: traced and analysed there too (supercritical)" \
        in report["unbatched_square"]["shapes"]
    assert "the model runs the example's ops on unbatched inputs" in report["unbatched_same_path"]["shapes"]


@pytest.mark.parametrize("spelling", dataflow.SPELLINGS)
def test_the_partial_update_is_its_own_block_before_the_norm(report, spelling):
    blocks = report[f"{spelling}_square"]["blocks"]
    assert [b["q"] for b in blocks] == [0.0, 0.0, 2.0]
    assert blocks[-1]["form"] != "post-norm"  # the final norm is the head's, not the update's
    transitions = report[f"{spelling}_square"]["transitions"]
    assert [(t["kind"], t["q"]) for t in transitions] == [("head", 0.0)]


def test_an_update_on_the_skip_the_blocks_read_is_a_block_of_its_own(report):
    """The update writes the value the first block's skip carries: no block found by form holds it."""
    assert [b["q"] for b in report["slice_assign_before_blocks_square"]["blocks"]] == [2.0, 0.0, 0.0]


def test_a_block_found_by_form_does_not_shadow_an_update_beside_it(report):
    """ReXNet's cat([y[..., :D] + s, y[..., D:]]) is its shortcut's block (exact velocity, additive);
    a (V s)^2 added to the other half makes the whole cat the update, before the norm can hide it."""
    assert [(b["form"], b["q"]) for b in report["expanding_shortcut"]["blocks"]] == [("additive", 1.0)]
    assert [(b["form"], b["q"]) for b in report["expanding_shortcut_square"]["blocks"]] == [("scaled", 2.0)]


def test_an_update_in_the_stem_before_an_embedding_norm_is_a_block(report):
    blocks = report["stem_update_square"]["blocks"]
    assert [b["q"] for b in blocks] == [2.0, 0.0, 0.0]


def test_a_linear_rearrangement_of_the_stream_is_not_an_update(report):
    """rotate_half's cat(-h2, h1) and the cat of the stream's own halves move entries only."""
    assert [b["q"] for b in report["rotary"]["blocks"]] == [0.0]


def test_a_supercritical_head_sets_max_q(report):
    head = report["head_square"]
    assert [b["q"] for b in head["blocks"]] == [0.0]
    assert [t["q"] for t in head["transitions"]] == [2.0]


def test_the_check_names_the_modes_it_ran(report):
    """A symbolic_trace graph is traced again in every mode (cheap); an export graph is compared by
    outputs, and under autocast only where the forward asks about it (bfloat16's rounding is no branch)."""
    check = report["reads_nothing"]["graph_check"]
    for mode in ("in inference mode (traced there)", "float64 as the default dtype (traced there)",
                 "deterministic algorithms (traced there)", "under CPU autocast (bfloat16) (traced there)",
                 "on bfloat16 inputs", "3 successive calls"):
        assert mode in check
    exported = report["one_token_skips_mixing"]["graph_check"]
    assert "in inference mode" in exported and "traced there" not in exported and "CPU autocast" not in exported


@pytest.mark.parametrize("mode, what", [("inference_mode", "in inference mode"), ("grad_disabled", "with gradients off"),
                                        ("autocast", "under CPU autocast (bfloat16)"),
                                        ("default_dtype", "with float64 as the default dtype"),
                                        ("deterministic", "with deterministic algorithms")])
def test_a_branch_on_a_mode_is_analysed_in_that_mode_with_the_line_that_asks(report, mode, what):
    modes = report[f"reads_{mode}"]["modes"]
    assert "fixtures/dataflow.py:" in modes and f"traced and analysed {what} too (supercritical)" in modes


def test_a_size_1_branch_is_traced_and_analysed_there(report):
    """export assumes every dynamic axis >= 2, so a branch on ``x.shape[1] == 1`` leaves no guard: the
    graph runs at size 1 and differs from the model there, and the model traced there is analysed."""
    for name, shape in (("one_token_square", "(2, 1, 8)"), ("batch_of_one_square", "(1, 3, 8)"),
                        ("example_of_one_token_square", "(2, 2, 8)")):
        assert f"the graph differs from the model on inputs {shape} float32: traced and analysed there too " \
               "(supercritical)" in report[name]["shapes"], name
    assert "(2, 1, 8) float32: traced and analysed there too (certified)" in report["one_token_skips_mixing"]["shapes"]


def test_a_read_line_is_named(report):
    assert "fixtures/dataflow.py:" in report["reads_float_held_value"]["failure"]
    assert "`return float(self.mix) != 0`" in report["reads_float_held_value"]["failure"]


def test_a_mode_the_forward_asks_about_is_traced_and_analysed_there(report):
    """The repeated-token term is 0 on random inputs, so the outputs agree in inference mode; the graph
    traced in the mode holds it. The fused MLP is another graph with the same exponent."""
    for name, verdict in (("inference_repeated_token_square", "supercritical"), ("inference_fused_mlp", "certified")):
        assert "`if not torch.is_inference_mode_enabled():`: traced and analysed in inference mode too " \
               f"({verdict})" in report[name]["modes"]
    assert "modes" not in report["reads_nothing"]  # asks about no mode: nothing traced again


def test_a_path_left_out_while_traced_shows_in_the_ops_the_model_runs(report):
    """The padding term is 0 on every input compared; the eager model runs its ops and symbolic_trace's
    graph does not, so that graph is refused and export (which fx's flag does not stop) traces the term."""
    model = report["notices_the_tracer_square"]
    assert model["tracer"] == "export"
    assert any(a.startswith("symbolic_trace: GraphMismatch: the model runs ops on the example that the graph does "
                            "not (`add` x4, `bitwise_and` x1, `eq` x1, `matmul` x3") for a in model["trace_attempts"])  # 3 biases
    # a check read into Python reaches no output: not a path the graph must hold
    assert report["checks_only_when_not_traced"]["tracer"] == "symbolic_trace"


def test_tracing_leaves_no_proxy_in_a_dict_the_forward_writes():
    """symbolic_trace writes a Proxy into ``stats``; the next trace (a mode's) would read it."""
    model, inputs = dataflow.length_in_a_dict()
    import qlint

    assert qlint.analyze(model, inputs).verdict == "certified"
    assert model.stats == {"calls": 0, "length": 0}


# --- the inputs that would break each mechanism ---------------------------------------------------


def test_a_held_read_is_followed_through_ops_and_not_confused_with_literals_or_inputs():
    """The read of (config["aux"] * 2 + 1) is traced back through two ops to the held tensor; a literal
    built in the forward (torch.tensor(0.5)) and a value of the input are not held tensors (the tracers see
    an input's reads themselves)."""
    from qlint.capture.eager_record import record

    class Reads(torch.nn.Module):
        def __init__(self, what):
            super().__init__()
            self.what, self.scale = what, torch.tensor(3.0)

        def forward(self, x):
            if self.what == "literal":
                return x * float(torch.tensor(0.5) * 2)
            if self.what == "input":
                return x * float(x.sum() > 0)
            return x * float(self.scale.exp())  # a plain tensor attribute

    x = (torch.randn(2, 3),)
    assert record(Reads("literal"), x).read is None
    assert record(Reads("input"), x).read is None
    read = record(Reads("attribute"), x).read
    assert read is not None and read.what.startswith("a float tensor held outside")
    assert "float(self.scale.exp())" in read.where


def test_a_mode_query_from_inside_torch_is_not_the_models():
    """torch.autocast's own checks and a factory's default dtype ask torch too: only the forward's
    questions count, each with its line."""
    from qlint.capture.graph_check import asked_modes

    class Quiet(torch.nn.Module):
        def forward(self, x):
            with torch.autocast("cpu", enabled=False):
                return x + torch.zeros(3)

    class Asks(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.is_inference() else x

    x = (torch.randn(2, 3),)
    assert asked_modes(Quiet(), x) == {}
    asked = asked_modes(Asks(), x)
    assert list(asked) == ["inference"] and "x.is_inference()" in asked["inference"]
    assert "is_inference" not in vars(torch.Tensor)  # the query is put back as it was




def test_checking_leaves_the_models_python_state_as_it_was():
    """The check calls the forward many times: a counter it moves is put back."""
    from qlint.capture.pipeline import capture
    from qlint.capture.trace import TraceFailure

    model, inputs = dataflow.reads_call_counter()
    before = python_state(model)
    with pytest.raises(TraceFailure, match="state kept across calls"):
        capture(model, inputs)
    assert python_state(model) == before


def test_a_python_counter_that_does_not_change_the_output_yet_is_refused():
    """A depth unlocked after many calls: the outputs of three calls agree, the counter moved."""
    model, inputs = dataflow.reads_call_counter()
    model.calls = -1000
    traced = torch.fx.symbolic_trace(model)
    with pytest.raises(GraphMismatch, match="changes `calls`"):
        compare_with_eager(model, traced, inputs)


def test_tracing_leaves_nothing_in_the_users_module():
    """A forward that stores an intermediate (``self.last = h``): symbolic_trace would leave an fx Proxy
    there, the checks a tensor of their own; the attribute is as the user left it (absent)."""
    import qlint

    class Remembers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(dataflow.D, dataflow.D)

        def forward(self, x):
            self.last = self.fc(x)
            return x + torch.relu(self.last)

    model = Remembers()
    report = qlint.analyze(model, (torch.randn(2, 3, dataflow.D),))
    assert report.verdict == "certified"
    assert "last" not in vars(model)
