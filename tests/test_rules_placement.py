"""QL202-QL205: norm placement, branch scaling and BatchNorm in eval mode (source 001, Parts IV-V)."""

import math

import pytest

from qlint.analysis import Options, load_model, run
from qlint.lint.placement import branch_scale

TRACERS = ["symbolic_trace", "export"]


def findings(report, code):
    return [f for f in report.findings if f.code == code]


@pytest.mark.parametrize("tracer", TRACERS)
def test_post_ln_stack_warns_once_with_the_stack_path(lint, tracer):
    report = lint("placement.py:post_ln", tracer=tracer)
    assert [b.form for b in report.blocks] == ["post-norm"] * 3
    [finding] = findings(report, "QL202")
    assert finding.severity == "warning" and finding.block == "layers"
    assert finding.message.startswith("Post-LN stack `layers` of 3 blocks")
    assert "warmup" in finding.message


def test_opaque_torch_post_ln_encoder_counts_its_sublayers(lint):
    report = lint("placement.py:torch_post_ln", tracer="symbolic_trace")
    # nn.TransformerEncoder is traced through (torch.export runs its forward): its sublayers are blocks
    assert [(b.name, b.form) for b in report.blocks] == [
        (f"encoder.layers.{i}:{part}", "post-norm") for i in range(2) for part in ("self_attn", "linear2")]
    [finding] = findings(report, "QL202")
    assert finding.message.startswith("Post-LN stack `encoder.layers` of 4 blocks")


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", ["pre_ln", "pre_ln_without_final_norm"])
def test_pre_ln_stacks_are_not_post_ln(lint, name, tracer):
    assert findings(lint(f"placement.py:{name}", tracer=tracer), "QL202") == []


@pytest.mark.parametrize("tracer", TRACERS)
def test_pre_norm_stack_without_final_norm_warns(lint, tracer):
    [finding] = findings(lint("placement.py:pre_ln_without_final_norm", tracer=tracer), "QL203")
    assert finding.severity == "warning" and finding.block == "layers"
    assert finding.message == (
        "pre-norm stack `layers` of 3 blocks reaches the output without a final norm after `layers.2`: "
        "the stream grows like sqrt(L)"
    )


@pytest.mark.parametrize("tracer", TRACERS)
def test_final_norm_silences_it(lint, tracer):
    assert findings(lint("placement.py:pre_ln", tracer=tracer), "QL203") == []


@pytest.mark.parametrize("spec", ["gpt2.py:build_model", "llama.py:with_norm", "patchtst.py:preln"])
def test_zoo_final_norms_are_seen(lint, spec):
    # llama's hand-written RMSNorm casts back with x.dtype: a metadata edge, not a path around the norm
    assert findings(lint(spec), "QL203") == []


@pytest.mark.parametrize("tracer", TRACERS)
def test_deep_unscaled_stack_warns(lint, tracer):
    report = lint("placement.py:deep_unscaled", tracer=tracer)
    assert len(report.blocks) == 8
    [finding] = findings(report, "QL204")
    assert finding.block == "layers"
    assert "8 of 8 branches enter the stream unscaled (relative scale > 2/sqrt(8) = 0.71; first: `layers.0`)" in finding.message


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", ["deep_layer_scale", "deep_scaled_init"])
def test_layer_scale_and_scaled_init_silence_it(lint, name, tracer):
    assert findings(lint(f"placement.py:{name}", tracer=tracer), "QL204") == []


def test_shallow_stacks_are_not_checked(lint):
    assert len(lint("placement.py:pre_ln").blocks) == 3
    assert findings(lint("placement.py:pre_ln"), "QL204") == []


@pytest.mark.parametrize(
    "name,expected",
    [("deep_unscaled", 1.0), ("deep_layer_scale", 0.1), ("deep_scaled_init", 1 / math.sqrt(8))],
)
def test_branch_scale_measures_multiplier_times_relative_gain(name, expected):
    loaded = load_model(f"fixtures/placement.py:{name}", Options())
    analysis = run(loaded.model, loaded.inputs, spec=name, options=Options())
    scales = [branch_scale(b.terms[0].entry, analysis) for b in analysis.stream.blocks]
    # default init: std(W) sqrt(fan_in) = 1/sqrt(3) up to sampling error of a 16 x 64 matrix
    assert all(abs(scale / expected - 1) < 0.1 for scale in scales), scales


@pytest.mark.parametrize("tracer", TRACERS)
def test_batchnorm_in_eval_mode_warns_per_block(lint, tracer):
    report = lint("placement.py:batchnorm_eval", tracer=tracer)
    assert report.mode == "eval" and [b.q for b in report.blocks] == [1.0, 1.0]
    found = findings(report, "QL205")
    assert [f.block for f in found] == ["0", "1"]
    assert found[0].message == (
        "block `0`: BatchNorm `0.bn` uses running statistics in eval mode, an affine map that does not bound "
        "the block (q = 1 here; batch statistics would normalize it)"
    )


@pytest.mark.parametrize("tracer", TRACERS)
def test_batchnorm_in_train_mode_normalizes(lint, tracer):
    report = lint("placement.py:batchnorm_train", tracer=tracer)
    assert report.mode == "train" and [b.q for b in report.blocks] == [0.0, 0.0]
    assert findings(report, "QL205") == []


def test_eval_mode_option_turns_the_train_fixture_into_the_positive_case(lint):
    report = lint("placement.py:batchnorm_train", mode="eval")
    assert [f.block for f in findings(report, "QL205")] == ["0", "1"]
