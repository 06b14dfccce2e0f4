"""QL202-QL206: norm placement, branch scaling, DeepNorm and BatchNorm in eval mode (source 001, Parts IV-V)."""

import math
from functools import lru_cache

import pytest
import torch
from torch import nn

from conftest import FIXTURES, load_module
from qlint.analysis import Options, load_model, run
from qlint.lint.branch_scale import branch_scales
from qlint.lint.placement import ALPHA_TOLERANCE, BETA_TOLERANCE, deepnorm
from qlint.probe.init import diagnose

TRACERS = ["symbolic_trace", "export"]


def findings(report, code):
    return [f for f in report.findings if f.code == code]


@lru_cache(maxsize=None)
def analysed(name):
    loaded = load_model(f"{FIXTURES / 'placement.py'}:{name}", Options())
    return run(loaded.model, loaded.inputs, spec=name, options=Options())


def codes(analysis):
    return {f.code for f in analysis.report.findings}


@pytest.mark.parametrize("tracer", TRACERS)
def test_post_ln_stack_warns_once_with_the_stack_path(lint, tracer):
    report = lint("placement.py:post_ln", tracer=tracer)
    assert [b.form for b in report.blocks] == ["post-norm"] * 3
    [finding] = findings(report, "QL202")
    assert finding.severity == "warning" and finding.block == "layers"
    assert finding.message.startswith("Post-LN stack `layers` of 3 blocks")
    assert "warmup" in finding.message


def test_opaque_torch_post_ln_encoder_counts_its_sublayers(lint):
    report = lint("placement.py:torch_post_ln")
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
    assert finding.message == (
        "deep residual stack `layers`: 8 of 8 branches enter the stream unscaled (scale next to the model's own layers "
        "> 8^-1/4 = 0.59, halfway in log scale to 1/sqrt(8) = 0.35; first: `layers.0` at 0.99); "
        "use 1/sqrt(2L) init, LayerScale or DeepNorm")


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
    scales = branch_scales(analysed(name))
    # default init everywhere: the head (the one layer off the value paths) has the branches' gain 1/sqrt(3)
    assert [s.projection for s in scales] == [f"layers.{i}.mlp.2" for i in range(8)]
    assert all(abs(s.relative_std / expected - 1) < 0.1 for s in scales), scales
    assert all(s.multiplier == pytest.approx(0.1 if name == "deep_layer_scale" else 1.0) for s in scales)
    assert all(s.expected == pytest.approx(1 / math.sqrt(8)) and s.scaled == (name != "deep_unscaled") for s in scales)
    assert all(s.limit == pytest.approx(8**-0.25) and not s.fixed_std for s in scales)  # one fan_in: a fan-in init


# --- GPT-2's init: QL204 and the init diagnostics are one measurement ----------------------


@pytest.mark.parametrize("name,expected", [("gpt2_scaled", 1 / math.sqrt(24)), ("gpt2_unscaled", 1.0)])
def test_gpt2_branches_measured_against_q_and_k(name, expected):
    # std 0.02 everywhere: the reference is q_proj / k_proj at 0.02 sqrt(32). The MLP's projection reads 4d = 128
    # inputs at the attention projection's std: a fixed-std init, whose base gain for 128 inputs is 0.02 sqrt(128)
    scales = branch_scales(analysed(name))
    assert [s.block for s in scales[:2]] == ["h.0:attn", "h.0:mlp"] and len(scales) == 24
    assert [s.projection for s in scales[:2]] == ["h.0.attn.out_proj", "h.0.mlp.2"]
    assert all(s.relative_std == pytest.approx(expected, rel=0.06) and s.fixed_std for s in scales), scales
    assert all(s.limit == pytest.approx(24**-0.25) for s in scales)
    assert {s.scaled for s in scales} == {name == "gpt2_scaled"}


@pytest.mark.parametrize("n_layers", [4, 6])
def test_shallow_gpt2_init_keeps_its_mlp_branches_scaled(n_layers):
    # measured against a fan-in base, the MLP's 2/sqrt(2L) would exceed (2L)^-1/4 below 8 layers (nanoGPT's 6)
    fixtures = load_module(FIXTURES / "placement.py", "placement_fixtures")
    for scaled in (True, False):
        analysis = run(*fixtures.gpt2(scaled, n_layers=n_layers), spec="gpt2", options=Options())
        mlp = [s for s in branch_scales(analysis) if s.block.endswith("mlp")]
        assert all(s.relative_std == pytest.approx(1 / math.sqrt(2 * n_layers) if scaled else 1.0, rel=0.06) for s in mlp)
        assert all(s.scaled is scaled for s in mlp)
        assert bool(findings(analysis.report, "QL204")) is not scaled


def test_kaiming_branches_read_as_a_fan_in_init():
    # W1 kaiming (gain sqrt 2, the reference), W2 at gain 1: 1/sqrt(2), unscaled for 8 blocks (> 0.59); with
    # every projection at one fan_in nothing says the init is a fixed std, under which this would be 1/sqrt(8)
    torch.manual_seed(0)
    model = nn.Sequential(*(ReluBlock(16) for _ in range(8)))
    analysis = run(model, (torch.randn(2, 8, 16),), spec="kaiming", options=Options())
    scales = branch_scales(analysis)
    assert all(s.relative_std == pytest.approx(1 / math.sqrt(2), rel=0.1) and not s.fixed_std and not s.scaled for s in scales)
    assert len(findings(analysis.report, "QL204")) == 1


class ReluBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        nn.init.kaiming_normal_(self.w1.weight, nonlinearity="relu")
        nn.init.normal_(self.w2.weight, std=1 / math.sqrt(4 * d))

    def forward(self, x):
        return x + self.w2(torch.relu(self.w1(x)))


@pytest.mark.parametrize("name", ["gpt2_scaled", "gpt2_unscaled", "deepnorm", "deep_unscaled", "deep_layer_scale"])
def test_ql204_and_the_init_diagnostics_agree_per_block(name):
    analysis = analysed(name)
    branches = diagnose(analysis, seed=0).branches
    assert [b.block for b in branches] == [b.name for b in analysis.stream.blocks]
    unscaled = [b for b in branches if b.scaled is False]
    found = findings(analysis.report, "QL204")
    assert bool(found) == bool(unscaled)
    if found:
        assert f"{len(unscaled)} of {len(branches)} branches" in found[0].message
        assert f"first: `{unscaled[0].block}` at {unscaled[0].relative_std:.2f})" in found[0].message


def test_gpt2_unscaled_warns_at_small_width():
    [finding] = findings(analysed("gpt2_unscaled").report, "QL204")
    assert finding.block == "h"
    assert "24 of 24 branches enter the stream unscaled (scale next to the model's own layers > 24^-1/4 = 0.45, " \
           "halfway in log scale to 1/sqrt(24) = 0.20; first: `h.0:attn` at 0.99)" in finding.message
    assert findings(analysed("gpt2_scaled").report, "QL204") == []


@pytest.mark.parametrize("scaled", [True, False])
def test_hf_gpt2_conv1d_with_fused_qkv(scaled):
    # HF's own init (c_proj at 0.02 / sqrt(2 n_layer)); every Conv1D lies on a value path (c_attn carries V),
    # so c_attn and c_fc are the reference; the two c_proj share one std: a fixed-std init
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=12, n_head=4, bos_token_id=0, eos_token_id=1)
    model = transformers.GPT2Model(config).eval()
    if not scaled:
        for block in model.h:
            for projection in (block.attn.c_proj, block.mlp.c_proj):
                torch.nn.init.normal_(projection.weight, std=0.02)
    analysis = run(model, (torch.randint(0, 64, (1, 8)),), spec="hf-gpt2", options=Options())
    scales = branch_scales(analysis)
    assert [s.projection for s in scales[:2]] == ["h.0.attn.c_proj", "h.0.mlp.c_proj"]
    expected = 1 / math.sqrt(24) if scaled else 1.0
    assert all(s.relative_std == pytest.approx(expected, rel=0.06) and s.fixed_std for s in scales), scales
    assert bool(findings(analysis.report, "QL204")) is not scaled
    assert [b.scaled for b in diagnose(analysis, seed=0).branches] == [s.scaled for s in scales]


# --- DeepNorm: QL202's remedy recognised, its constants checked (QL206) --------------------


def test_deepnorm_with_deepnets_constants_is_recognised():
    analysis = analysed("deepnorm")
    found = deepnorm(analysis)
    assert found.sublayers == 12 and found.alpha == pytest.approx(12**0.25)
    assert found.alpha_expected == pytest.approx(1.861, abs=1e-3) and found.beta_expected == pytest.approx(0.380, abs=1e-3)
    # xavier at gain beta: std sqrt(fan_in) = beta for the square out_proj, sqrt(8/5) beta for the FFN's 4d -> d
    scales = {s.block: s.relative_std for s in branch_scales(analysis)}
    beta = found.beta_expected
    assert all(scales[f"layers.{i}:attn"] == pytest.approx(beta, rel=0.1) for i in range(6))
    assert all(scales[f"layers.{i}:mlp"] == pytest.approx(math.sqrt(8 / 5) * beta, rel=0.1) for i in range(6))
    assert found.beta == pytest.approx(0.428, abs=0.01) and found.correct
    assert not codes(analysis) & {"QL202", "QL204", "QL206"}


@pytest.mark.parametrize(
    "name,message",
    [
        ("deepnorm_without_beta", "found alpha = 1.86 and beta = 1.13"),
        ("deepnorm_wrong_alpha", "found alpha = 4 and beta = 0.43"),
        ("post_ln_alpha2", "found alpha = 2 and beta = 0.97"),
    ],
)
def test_deepnorm_with_wrong_constants_names_them(name, message):
    analysis = analysed(name)
    [finding] = findings(analysis.report, "QL206")
    assert finding.severity == "warning" and finding.block == "layers"
    assert finding.message == (
        "DeepNorm stack `layers` of 12 sublayers (N = 6 layers): expected alpha = (2N)^1/4 = 1.86 and "
        f"branch init beta = (8N)^-1/4 = 0.38, {message}")
    assert findings(analysis.report, "QL202") == []  # the stack is DeepNorm's, reported once


def test_which_constant_is_off():
    # LN(2x + f(x)): alpha = 2 is within 10% of 12^1/4 = 1.86 (ln 1.075 = 0.072); beta is missing
    found = deepnorm(analysed("post_ln_alpha2"))
    assert abs(math.log(found.alpha / found.alpha_expected)) < ALPHA_TOLERANCE
    assert abs(math.log(found.beta / found.beta_expected)) > 2.5 * BETA_TOLERANCE
    wrong_alpha = deepnorm(analysed("deepnorm_wrong_alpha"))
    assert abs(math.log(wrong_alpha.beta / wrong_alpha.beta_expected)) < BETA_TOLERANCE and not wrong_alpha.correct
    assert findings(analysed("deepnorm_wrong_alpha").report, "QL204") == []  # its branches are scaled
    # a DeepNorm stack's branch init is QL206's (DeepNet's beta for the stack's role): a missing beta is named there
    assert findings(analysed("deepnorm_without_beta").report, "QL204") == []
    [missing] = findings(analysed("deepnorm_without_beta").report, "QL206")
    assert missing.message.endswith("found alpha = 1.86 and beta = 1.13")


def test_plain_post_ln_is_not_deepnorm(lint):
    assert deepnorm(analysed("post_ln")) is None
    report = lint("placement.py:post_ln")
    assert findings(report, "QL206") == [] and len(findings(report, "QL202")) == 1


def test_weights_on_meta_are_not_judged():
    fixtures = load_module(FIXTURES / "placement.py", "placement_fixtures")
    with torch.device("meta"):
        stack, encoder = fixtures.Stack(8, "pre", final_norm=True), fixtures.DeepNormEncoder(6, 4.0, 1.0)
        inputs = (torch.randn(2, 8, 16),)
    stack_analysis = run(stack, inputs, spec="meta-stack", options=Options())
    assert [s.relative_std for s in branch_scales(stack_analysis)] == [None] * 8
    assert findings(stack_analysis.report, "QL204") == []
    # alpha is a number in the code; beta needs the weights
    [finding] = findings(run(encoder, inputs, spec="meta-deepnorm", options=Options()).report, "QL206")
    assert finding.message.endswith("found alpha = 4 and beta = unknown (weights not readable)")


@pytest.mark.parametrize("tracer", ["export"])  # symbolic_trace stops at BatchNorm's `input.dim()` check
def test_batchnorm_in_eval_mode_warns_per_block(lint, tracer):
    report = lint("placement.py:batchnorm_eval", tracer=tracer)
    assert report.mode == "eval" and [b.q for b in report.blocks] == [1.0, 1.0]
    found = findings(report, "QL205")
    assert [f.block for f in found] == ["0", "1"]
    assert found[0].message == (
        "block `0`: BatchNorm `0.bn` uses running statistics in eval mode, an affine map that does not bound "
        "the block (q = 1 here; batch statistics would normalize it)"
    )


@pytest.mark.parametrize("tracer", ["export"])  # symbolic_trace stops at BatchNorm's `input.dim()` check
def test_batchnorm_in_train_mode_normalizes(lint, tracer):
    """Batch statistics normalise (no QL205); the report is that of the worse graph, the one with the BatchNorm
    layers frozen (running statistics: affine, q 1), which training also runs (capture/histories)."""
    report = lint("placement.py:batchnorm_train", tracer=tracer)
    assert report.mode == "train" and [b.q for b in report.blocks] == [1.0, 1.0]
    assert "with its BatchNorm layers in eval mode while it trains" in report.extra["modes"]
    assert findings(report, "QL205") == []


def test_eval_mode_option_turns_the_train_fixture_into_the_positive_case(lint):
    report = lint("placement.py:batchnorm_train", mode="eval")
    assert [f.block for f in findings(report, "QL205")] == ["0", "1"]


class NormEndedBranch(nn.Module):
    """x + LN(fc2(relu(fc1(x)))) ten times: the branch's scale is the norm's gamma, whatever fc2 is."""

    def __init__(self, gamma: float):
        super().__init__()
        self.stem, self.head = nn.Linear(16, 16), nn.Linear(16, 16)
        self.branches = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.LayerNorm(16)) for _ in range(10))
        for branch in self.branches:
            nn.init.constant_(branch[3].weight, gamma)

    def forward(self, x):
        x = self.stem(x)
        for branch in self.branches:
            x = x + branch(x)
        return self.head(x)


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
@pytest.mark.parametrize("gamma,scaled", [(0.0, True), (1.0, False)])
def test_a_zero_initialised_norm_ending_the_branch_scales_it(tracer, gamma, scaled):
    """timm's ResNet zero_init_last (bn2.weight = 0) and Swin v2's res-post-norm: the branch enters at gamma."""
    torch.manual_seed(0)
    analysis = run(NormEndedBranch(gamma), (torch.randn(2, 5, 16),), spec="norm_ended", options=Options(tracer=tracer))
    scales = branch_scales(analysis)
    assert [s.relative_std for s in scales] == [pytest.approx(gamma)] * 10
    assert all(s.scaled is scaled for s in scales)
    assert ("QL204" in [f.code for f in analysis.report.findings]) is not scaled


# --- a branch ending in BatchNorm on running statistics ---------------------------------------


class ConvBranch(nn.Module):
    """relu(x + bn(conv(relu(conv(x))))) in eval mode, the last BatchNorm's gamma set to ``gamma``."""

    def __init__(self, gamma):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        nn.init.constant_(self.bn.weight, gamma)

    def forward(self, x):
        return torch.relu(x + self.bn(self.conv2(torch.relu(self.conv1(x)))))


@pytest.mark.parametrize("tracer", ["export", "make_fx"])  # BatchNorm2d's input check stops symbolic_trace
@pytest.mark.parametrize("gamma, fires", [(0.0, False), (1.0, True)])
def test_a_zero_initialised_last_batchnorm_scales_its_branch(gamma, fires, tracer):
    """timm's zero_init_last: the branch enters at 0 at init, scaled whatever the conv's gain."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 1), *[ConvBranch(gamma) for _ in range(8)]).eval()
    analysis = run(model, (torch.randn(1, 3, 8, 8),), spec="m", options=Options(tracer=tracer))
    assert bool(findings(analysis.report, "QL204")) is fires
    scales = branch_scales(analysis)
    assert {round(s.multiplier, 6) for s in scales} == {round(gamma / math.sqrt(1 + 1e-5), 6)}
