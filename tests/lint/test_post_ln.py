"""Post-LN variants (issue 29): plain and shifted Post-LN, learned skip scales, DeepNorm stacks.

The convention under test (QL104): a Post-LN block is the stream map F = LN(X + f(X)) (or, with the
norm moved to the next sublayer's input, F = a LN(X) + f(LN(X))); F is bounded (Theorem 9(v)), so its
velocity F - X has q = max(1, 0) = 1 whatever f is, and QL101 fires only when F itself grows faster
than linearly. Fixtures: fixtures/post_ln_variants.py.
"""

from functools import lru_cache

import pytest
import torch

import qlint
from conftest import FIXTURES
from qlint.analysis import Options, load_model, run
from qlint.lint.placement import deepnorm, deepnorm_stacks

SPEC = FIXTURES / "post_ln_variants.py"


@lru_cache(maxsize=None)
def analysed(name):
    loaded = load_model(f"{SPEC}:{name}", Options())
    return run(loaded.model, loaded.inputs, spec=name, options=Options())


def blocks(name):
    return [(b.name, b.form, b.q) for b in analysed(name).report.blocks]


def codes(name, *wanted):
    return sorted((f.code, f.block) for f in analysed(name).report.findings if f.code in wanted)


def messages(name, code):
    return [f.message for f in analysed(name).report.findings if f.code == code]


LAYERS3 = [f"layers.{i}" for i in range(3)]
MINIMAX = [f"layers.{i}:{part}" for i in range(2) for part in ("self_attn", "mlp")]


# --- plain Post-LN: the normalised map's velocity, not f's exponent --------------------------------


@pytest.mark.parametrize("name", ["post_ln_swiglu", "post_rmsnorm_swiglu"])
def test_post_ln_of_a_norm_free_swiglu_is_q1_not_q2(name):
    # swiglu alone is q 2 (1 + 1); LN(x + swiglu(x)) is bounded, its velocity LN(.) - x linear: q 1. The
    # hand-written RMSNorm (float32 statistics, weight after the cast back) is a Post-LN norm too
    assert blocks(name) == [(n, "post-norm", 1.0) for n in LAYERS3]
    assert analysed(name).report.verdict == "certified"
    assert codes(name, "QL101", "QL104", "QL202") == [("QL104", n) for n in LAYERS3] + [("QL202", "layers")]
    assert messages(name, "QL104")[0] == (
        "block `layers.0` is a Post-LN update LN(X + f(X)): outside the additive analysis; q = 1 is that of its "
        "stream map's velocity F(X) - X at fixtures/post_ln_variants.py:63")


def test_a_post_ln_block_is_witnessed_on_its_normalised_map():
    """The witness measures LN(X + f(X)) - X, what is certified, not f (q 2 would refute it)."""
    report = qlint.analyze(*_build("post_ln_swiglu"))
    assert report.verdict == "certified" and not [f for f in report.findings if f.code == "QL107"]
    report = qlint.analyze(*_build("shifted_post_ln"))
    assert report.verdict == "certified" and not [f for f in report.findings if f.code == "QL107"]


def _build(name):
    loaded = load_model(f"{SPEC}:{name}", Options())
    return loaded.model, loaded.inputs


def test_a_norm_that_does_not_normalise_passes_f_through():
    """Breaker: BatchNorm on running statistics after the add is affine: BN(x + swiglu(x)) is q 2, QL101."""
    assert blocks("post_batchnorm_eval_swiglu") == [("1", "post-norm", 2.0), ("2", "post-norm", 2.0)]
    assert codes("post_batchnorm_eval_swiglu", "QL101") == [("QL101", "1"), ("QL101", "2")]


def test_a_super_polynomial_f_stays_super_polynomial():
    """Breaker: LN(x + w exp(w x)) overflows before the norm: QL103 as before, never certified."""
    assert blocks("post_ln_exp") == [("layers.0", "post-norm", float("inf")), ("layers.1", "post-norm", float("inf"))]
    assert codes("post_ln_exp", "QL103") == [("QL103", "layers.0"), ("QL103", "layers.1")]


def test_a_single_post_ln_block_is_reported_without_a_stack():
    assert blocks("post_ln_single_swiglu") == [("layers.0", "post-norm", 1.0), ("layers.1", "additive", 0.0)]
    assert codes("post_ln_single_swiglu", "QL101", "QL104", "QL202") == [("QL104", "layers.0")]


# --- shifted Post-LN (MiniMax-01): the norm moved to the next sublayer's input ----------------------


@pytest.mark.parametrize("name", ["shifted_post_ln", "shifted_post_ln_layernorm", "shifted_post_ln_learned_scalar",
                                  "shifted_post_ln_learned_vector"])
def test_shifted_post_ln_is_post_ln_with_its_normalised_exponent(name):
    # h = LN(x); a h + f(h): the block's input is x, its map a LN(x) + f(LN(x)) bounded, q = max(1, 0) = 1
    assert blocks(name) == [(n, "post-norm", 1.0) for n in MINIMAX]
    analysis = analysed(name)
    assert analysis.report.verdict == "certified"
    assert [t.extra["kind"] for t in analysis.report.transitions] == ["stem", "head"]  # the norms are in the blocks
    expected = sorted(("QL104", n) for n in MINIMAX) + [("QL202", "layers")]
    assert codes(name, "QL101", "QL104", "QL202", "QL203", "QL206") == expected
    assert "Post-LN update a LN(X) + f(LN(X))" in messages(name, "QL104")[0]
    assert messages(name, "QL202") == [
        "Post-LN stack `layers` of 4 blocks: LayerNorm on the identity path rescales the gradient by sqrt(d)/||x|| "
        "at every block; needs learning-rate warmup (or Pre-LN)"]


def test_a_shifted_block_inside_its_module_is_post_ln_on_its_own():
    assert blocks("shifted_single") == [("layers.0", "post-norm", 1.0), ("layers.1", "additive", 0.0)]
    assert codes("shifted_single", "QL101", "QL104", "QL202") == [("QL104", "layers.0")]


def test_a_branch_reading_the_raw_stream_beside_the_norm_is_still_supercritical():
    """Breaker: h = LN(x); h + mlp(h) + swiglu(x): the shifted map reads x itself, q 2."""
    assert blocks("shifted_raw_read") == [(n, "post-norm", 2.0) for n in LAYERS3]
    assert codes("shifted_raw_read", "QL101") == [("QL101", n) for n in LAYERS3]


def test_a_stem_norm_before_pre_ln_blocks_is_not_post_ln():
    """Precision: CLIP's ln_pre then x + swiglu(ln(x)) at the top level: the first block is additive, q 0."""
    assert blocks("stem_norm_pre_ln") == [(f"StemNormStack#{i}", "additive", 0.0) for i in (1, 2, 3)]
    assert codes("stem_norm_pre_ln", "QL104", "QL202") == []


# --- a learned skip scale is not DeepNorm's constant -----------------------------------------------


@pytest.mark.parametrize("name", ["post_ln_learned_alpha", "post_ln_learned_alpha_vector",
                                  "post_ln_learned_alpha_deepnorm_init", "post_ln_learned_alpha_beta"])
def test_a_learned_alpha_is_plain_post_ln(name):
    # at its default init (1, ones per channel) it is plain Post-LN; initialised at (2N)^1/4 (with DeepNet's beta,
    # too) it is still a parameter training moves, not the constant DeepNet's bound is derived for
    assert deepnorm(analysed(name)) is None
    assert codes(name, "QL202", "QL206") == [("QL202", "layers")]
    assert all(b.skip.coefficient is None for b in analysed(name).stream.blocks)


# --- DeepNorm: beta right, QL204 quiet -------------------------------------------------------------


def test_an_mlp_only_deepnorm_stack_with_deepnets_constants_is_quiet():
    found = deepnorm(analysed("deepnorm_mlp"))
    assert found.sublayers == 12 and found.role == "" and found.correct
    assert found.alpha == pytest.approx(12 ** 0.25) and found.beta == pytest.approx(0.41, abs=0.02)
    assert codes("deepnorm_mlp", "QL202", "QL204", "QL206") == []


def test_a_deepnorm_stack_without_beta_is_reported_by_ql206():
    """Breaker: DeepNorm's alpha without its beta: QL206 names beta (QL204 leaves a DeepNorm stack to it)."""
    assert codes("deepnorm_mlp_without_beta", "QL202", "QL204", "QL206") == [("QL206", "layers")]
    assert messages("deepnorm_mlp_without_beta", "QL206")[0].startswith(
        "DeepNorm stack `layers` of 12 sublayers (N = 6 layers): expected alpha = (2N)^1/4 = 1.86 and branch init "
        "beta = (8N)^-1/4 = 0.38, found alpha = 1.86 and beta = 1.")


def test_a_deepnorm_encoder_decoder_uses_deepnets_encoder_and_decoder_constants():
    # N = 6 encoder layers (12 sublayers), M = 4 decoder layers (12 sublayers of three per layer):
    # encoder alpha = 0.81 (N^4 M)^1/16 = 1.38, beta = 0.87 (N^4 M)^-1/16 = 0.51;
    # decoder alpha = (3M)^1/4 = 1.86, beta = (12M)^-1/4 = 0.38
    found = {d.role: d for _, d in deepnorm_stacks(analysed("deepnorm_encoder_decoder"))}
    assert sorted(found) == ["decoder", "encoder"]
    encoder, decoder = found["encoder"], found["decoder"]
    assert (encoder.layers, encoder.partner, decoder.layers) == (6, 12, 4)
    assert [encoder.alpha_expected, encoder.beta_expected] == pytest.approx([1.382, 0.510], abs=1e-3)
    assert [decoder.alpha_expected, decoder.beta_expected] == pytest.approx([1.861, 0.380], abs=1e-3)
    assert encoder.correct and decoder.correct
    # the encoder's beta is above 12^-1/4 = 0.54 for its FFN (xavier's fan-in and fan-out terms): QL204 would fire
    assert codes("deepnorm_encoder_decoder", "QL202", "QL204", "QL206") == []


def test_a_deepnorm_encoder_decoder_without_beta_is_reported_per_stack():
    """Breaker: both stacks at gain 1: QL206 on each, with its own constants."""
    found = messages("deepnorm_encoder_decoder_without_beta", "QL206")
    assert [m.split(":")[0] for m in found] == [
        "DeepNorm encoder stack `encoder` of 12 sublayers (N = 6 layers, decoder M = 4)",
        "DeepNorm decoder stack `decoder` of 12 sublayers (M = 4 layers of three sublayers)"]
    assert "expected alpha = 0.81 (N^4 M)^1/16 = 1.38 and branch init beta = 0.87 (N^4 M)^-1/16 = 0.51" in found[0]
    assert "expected alpha = (3M)^1/4 = 1.86 and branch init beta = (12M)^-1/4 = 0.38" in found[1]
    assert codes("deepnorm_encoder_decoder_without_beta", "QL202") == []


def test_plain_post_ln_deep_and_unscaled_still_gets_ql204():
    """Breaker: QL204 leaves only DeepNorm stacks (a constant alpha > 1) to QL206."""
    assert codes("post_ln_learned_alpha", "QL204") == [("QL204", "layers")]


def test_fixtures_seed_their_weights():
    a, b = _build("deepnorm_mlp")[0], _build("deepnorm_mlp")[0]
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
