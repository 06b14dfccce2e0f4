"""Issue 29: forwards that read a tensor's value in Python are traced on the example's values when
that is sound, and refused with the line and the remedy when it is not (fixtures/value_reads.py).

Sound: a value read that depends only on shapes, literals and buffers (EnCodec's padding) is a
constant; one that depends on an integer input (a Conformer's ``lengths``) fixes the graph to the
example's values, and the report says the certificate is for them. Refused: a read of a float
input (a branch on the input's size) or of a parameter (a learned gate), a loop over the experts
the tokens were routed to, and an in-place write that an older alias reads afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import ROOT, fixture_spec


def _cli(spec: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qlint", fixture_spec(spec), "--format", "json", "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_an_integer_input_read_with_item_is_specialised_and_the_report_names_its_values(lint):
    report = lint("value_reads.py:conformer")
    assert (report.verdict, report.tracer) == ("certified", "make_fx")
    assert {b.name: (b.q, b.form) for b in report.blocks if not b.name.endswith("ffn2")} == {
        f"layers.{i}:{part}": (0.0, "additive") for i in range(2) for part in ("ffn1", "attention", "conv")}
    assert {b.name: b.form for b in report.blocks if b.name.endswith("ffn2")} == {  # LN(x + ffn2(x)): Post-LN
        "layers.0:ffn2": "post-norm", "layers.1:ffn2": "post-norm"}
    specialised = report.extra["specialised"]
    assert "lengths = [16, 12]" in specialised and "value_reads.py:75" in specialised
    assert specialised.endswith("the certificate is for those values")


def test_the_specialisation_is_printed_under_the_table():
    run = subprocess.run([sys.executable, "-m", "qlint", fixture_spec("value_reads.py:conformer"), "--no-cache"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    assert "specialised: the graph holds for the example's lengths = [16, 12]" in run.stdout


def test_values_read_from_buffers_and_shapes_are_constants_and_not_reported(lint):
    report = lint("value_reads.py:buffer_padding")
    assert (report.verdict, report.tracer, report.max_q) == ("certified", "make_fx", 1.0)
    assert "specialised" not in report.extra


@pytest.mark.parametrize("factory, says, line", [
    ("value_branch", "reads the value of the input `x`", "`if x.abs().max() > 1e9:"),
    ("parameter_branch", "reads the value of the parameter `gate`", "self.gate.item() > 0"),
    ("routed_experts", "reads the value of the input `x`", "torch.unique(choice).tolist()"),
    ("aliased_write_view_first", "writes in place (`aten.add_.Tensor`)", "`h.add_(h * h)`"),
    ("layer_drop", "reads a random draw (`aten.rand.default`)", "torch.rand(()) < 0.5"),
])
def test_a_read_that_scales_with_the_input_or_training_is_refused_with_its_line(factory, says, line):
    run = _cli(f"value_reads.py:{factory}")
    assert run.returncode == 2, run.stdout
    (message,) = [ln for ln in run.stderr.splitlines() if ln.startswith("qlint: error:")]
    assert says in message and line in message and "value_reads.py:" in message


def test_a_write_whose_alias_is_taken_from_its_result_is_analysed():
    """The precision twin of ``aliased_write_view_first``: the view is computed from the write's result."""
    run = _cli("value_reads.py:aliased_write_view_after")
    assert run.returncode == 1, run.stderr
    (model,) = json.loads(run.stdout)["models"]
    assert (model["verdict"], model["tracer"]) == ("supercritical", "make_fx")
    assert [b["q"] for b in model["blocks"]] == [2.0]


needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")


@needs_transformers
@pytest.mark.zoo
@pytest.mark.parametrize("factory, blocks, max_q", [
    ("encodec", {"encoder.layers.7": 0.0, "decoder.layers.1": 0.0}, 0.0),
    ("mimi", None, 1.0),
])
def test_speech_codecs_with_padding_computed_by_tensor_ops_are_certified(lint, factory, blocks, max_q):
    """EnCodec and Mimi compute their padding from buffers with tensor ops and compare it in Python
    (``if length <= max_pad``, ``q_length > 1``): export and fake make_fx stop; the values read are
    constants. LSTM updates are q 0, SEANet's identity residual units q 1, the transformers Pre-LN q 0."""
    report = lint(f"zoo3.py:{factory}")
    assert (report.verdict, report.tracer, report.max_q) == ("certified", "make_fx", max_q)
    assert "specialised" not in report.extra
    if blocks is not None:
        assert {b.name: b.q for b in report.blocks} == blocks
    else:
        assert len(report.blocks) == 12 and all(b.status == "ok" for b in report.blocks)
        assert sorted({b.q for b in report.blocks}) == [0.0, 1.0]


@needs_transformers
@pytest.mark.zoo
@pytest.mark.parametrize("factory", ["informer_positional", "autoformer_positional"])
def test_time_series_models_take_none_in_positional_slots(lint, factory):
    report = lint(f"zoo_hf.py:{factory}")
    assert (report.verdict, report.tracer, report.max_q) == ("certified", "export", 1.0)
    assert len(report.blocks) == 10


@needs_transformers
@pytest.mark.zoo
def test_a_routing_loop_in_a_hugging_face_model_is_refused_without_a_remedy_that_cannot_work():
    """LongCat-Flash loops over the experts its router picked (``one_hot`` of the top-k, parameter-derived):
    refused, naming the line; declaring the experts' exponent is not offered as the remedy, because
    export and make_fx keep no module opaque (the factory registers it, and the refusal stands)."""
    run = _cli("zoo3.py:longcat_flash_declared")
    assert run.returncode == 2
    (message,) = [ln for ln in run.stderr.splitlines() if ln.startswith("qlint: error:")]
    assert "`layers.0.mlp.experts` (LongcatFlashExperts) at " in message
    assert "modeling_longcat_flash.py:185" in message and "reads the value of the parameter" in message
    assert "declaring its exponent would not help" in message and "qlint.register(" not in message
