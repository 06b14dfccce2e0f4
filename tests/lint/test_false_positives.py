"""Regressions of issue 13 (items 3, 4): QL2xx false positives, block discovery and naming.

Each false warning or wrong block seen on a real architecture has a hand-written twin in
``fixtures/regressions_lint.py`` (and, where the rule should still fire, a fixture that
makes it fire); the real architectures themselves run under ``-m zoo``.
"""

import importlib.util
import os

import pytest
import torch
from torch import nn

TRACERS = ["symbolic_trace", "export"]
SPEC = "regressions_lint.py"

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the [zoo] extra (transformers)")
needs_timm = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs the [zoo] extra (timm)")


def blocks(report):
    return [(b.name, b.q) for b in report.blocks]


def found(report, prefix="QL2"):
    """(code, block) of the findings whose code starts with ``prefix``, sorted."""
    return sorted((f.code, f.block) for f in report.findings if f.code.startswith(prefix))


def layers(branches, count=2, base="layers", q=0.0):
    return [(f"{base}.{i}:{branch}", q) for i in range(count) for branch in branches]


# --- QL203: a dtype reference is not a data path; stacks split at norms -----------------------------


@pytest.mark.parametrize("tracer", TRACERS)
def test_final_norm_ending_in_type_as_is_a_final_norm(lint, tracer):
    report = lint(f"{SPEC}:gemma_like", tracer=tracer)
    assert blocks(report) == layers(["self_attn", "mlp"])
    assert found(report) == []  # no QL203, and no QL201: q and k pass `alpha` / `beta`, RMSNorms


@pytest.mark.parametrize("tracer", TRACERS)
def test_sandwich_stack_without_final_norm_is_reported(lint, tracer):
    report = lint(f"{SPEC}:gemma_like_without_final_norm", tracer=tracer)
    assert found(report) == [("QL203", "layers")]
    [finding] = [f for f in report.findings if f.code == "QL203"]
    assert finding.message.startswith("pre-norm stack `layers` of 4 blocks reaches the output without a final norm after `layers.1:mlp`")


@pytest.mark.parametrize("tracer", TRACERS)
def test_pooling_head_after_post_layernorm_is_its_own_stack(lint, tracer):
    report = lint(f"{SPEC}:pooled_encoder", tracer=tracer)
    assert blocks(report) == layers(["attn", "mlp"]) + [("head", 0.0)]
    assert found(report, "QL203") == []


# --- QL201: QK-norm found whatever the module names ---------------------------------------------------


@pytest.mark.parametrize("tracer", TRACERS)
def test_qk_norm_written_out_in_the_attention_is_found(lint, tracer):
    assert found(lint(f"{SPEC}:gemma_like_inline_qk_norm", tracer=tracer)) == []


@pytest.mark.parametrize("tracer", TRACERS)
def test_attention_without_qk_norm_is_reported(lint, tracer):
    report = lint(f"{SPEC}:gemma_like_without_qk_norm", tracer=tracer)
    assert found(report) == [("QL201", "layers.0.self_attn"), ("QL201", "layers.1.self_attn")]


# --- QL204: encoder and decoder are separate stacks ---------------------------------------------------


@pytest.mark.parametrize("tracer", TRACERS)
def test_encoder_and_decoder_are_separate_stacks(lint, tracer):
    report = lint(f"{SPEC}:encoder_decoder", tracer=tracer)
    assert blocks(report) == layers(["attn", "mlp"], base="encoder") + layers(["attn", "mlp"], base="decoder")
    assert found(report, "QL203") == found(report, "QL204") == []  # 4 + 4 blocks, not one stack of 8


def test_deep_encoder_is_reported_alone_with_its_own_depth(lint):
    report = lint(f"{SPEC}:deep_encoder_decoder")
    assert found(report, "QL204") == [("QL204", "encoder")]
    [finding] = [f for f in report.findings if f.code == "QL204"]
    assert finding.message.startswith("deep residual stack `encoder`: 8 of 8 branches enter the stream unscaled")
    assert "8^-1/4 = 0.59" in finding.message


# --- blocks: terms independent of X_k, decompositions, readouts, names ---------------------------


def test_terms_independent_of_the_stream_are_not_blocks(lint):
    report = lint(f"{SPEC}:positioned_stack")
    assert blocks(report) == layers(["attn", "mlp"], base="blocks")
    assert report.verdict == "certified"


@pytest.mark.parametrize("tracer", TRACERS)
def test_blocks_are_named_after_the_branch_not_its_wrappers(lint, tracer):
    # x + gamma * cat([attn(norm(x))[:, :1], norm(x)[:, 1:]]) and x + drop_path(ls(dropout(mlp(norm(x)))))
    assert blocks(lint(f"{SPEC}:wrapped_branches", tracer=tracer)) == layers(["attn", "mlp"], base="blocks")


@pytest.mark.parametrize("tracer", TRACERS)
def test_decomposition_and_trend_sum_are_not_blocks(lint, tracer):
    report = lint(f"{SPEC}:decomposition_decoder", tracer=tracer)
    # the three residual adds, q = 1 (no pre-norm); x - moving_average(x), the seasonal layer
    # norm's x - mean_t(x) and trend1 + trend2 + trend3 are not updates of the stream
    assert blocks(report) == [("layers.0:self_attn", 1.0), ("layers.0:encoder_attn", 1.0), ("layers.0:fc2", 1.0)]
    assert report.verdict == "certified"


# --- the real architectures -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def zoo():
    """One analysis per Hugging Face / timm factory of the fixture file (tracing costs seconds)."""
    from conftest import fixture_spec
    from qlint.analysis import Options, run_specs

    os.environ["HF_HUB_OFFLINE"] = "1"
    cache = {}

    def run(name):
        if name not in cache:
            cache[name] = run_specs([fixture_spec(f"{SPEC}:{name}")], Options()).models[0]
        return cache[name]

    return run


@pytest.mark.zoo
@needs_transformers
@pytest.mark.parametrize("family, warnings", [
    ("gemma", [("QL201", "layers.0.self_attn"), ("QL201", "layers.1.self_attn")]),  # no QK-norm, no soft-cap
    ("gemma2", []),  # tanh soft-capping
    ("gemma3", []),  # q_norm / k_norm
])
def test_gemma_family_has_no_final_norm_warning(zoo, family, warnings):
    report = zoo(family)
    assert report.verdict == "certified"
    assert blocks(report) == layers(["self_attn", "mlp"])  # Gemma 2 / 3: not `post_attention_layernorm`
    assert found(report) == warnings


@pytest.mark.zoo
@needs_transformers
def test_recurrent_gemma_has_no_final_norm_warning(zoo):
    report = zoo("recurrent_gemma")
    assert blocks(report) == layers(["temporal_block", "mlp_block"], count=3)
    assert found(report) == [("QL201", "layers.2.temporal_block")]


@pytest.mark.zoo
@needs_transformers
def test_t5_encoder_and_decoder_are_separate_stacks(zoo):
    shallow, deep = zoo("t5"), zoo("t5_deep")
    assert len(shallow.blocks) == 10 and found(shallow, "QL204") == []  # 4 + 6, not 10
    assert found(deep, "QL204") == [("QL204", "model.decoder.block"), ("QL204", "model.encoder.block")]
    counts = sorted(f.message.split(": ")[1].split(" branches")[0] for f in deep.findings if f.code == "QL204")
    assert counts == ["12 of 12", "8 of 8"]


@pytest.mark.zoo
@needs_transformers
def test_a_post_ln_encoder_and_decoder_are_two_post_ln_stacks(zoo):
    report = zoo("bart")
    assert found(report, "QL202") == [("QL202", "model.decoder.layers"), ("QL202", "model.encoder.layers")]
    counts = sorted(f.message.split(" of ")[1].split(" blocks")[0] for f in report.findings if f.code == "QL202")
    assert counts == ["4", "6"]  # encoder: attention + FFN per layer; decoder: + cross-attention


@pytest.mark.zoo
@needs_transformers
def test_siglip_pooling_head_is_not_in_the_encoder_stack(zoo):
    report = zoo("siglip")
    assert blocks(report) == layers(["self_attn", "mlp"], base="encoder.layers") + [("head", 0.0)]
    assert found(report, "QL203") == []


@pytest.mark.zoo
@needs_transformers
def test_autoformer_blocks_are_its_residual_adds(zoo):
    report = zoo("autoformer")
    assert blocks(report) == [
        ("model.encoder.layers.0:self_attn", 1.0), ("model.encoder.layers.0:fc2", 1.0),
        ("model.decoder.layers.0:self_attn", 1.0), ("model.decoder.layers.0:encoder_attn", 1.0),
        ("model.decoder.layers.0:fc2", 1.0)]
    # the decoder's cross-attention and FFN read LN(decomp(x)) on their skips too: Post-LN with the norm at the
    # sublayer's input, a bounded map whose velocity is q 1 (the cross-attention's branch alone is q 0)
    assert [b.form for b in report.blocks][3:] == ["post-norm", "post-norm"]
    assert report.verdict == "certified"


@pytest.mark.zoo
@needs_timm
def test_xcit_blocks_are_named_after_their_branches(zoo):
    report = zoo("xcit")
    # the class-attention MLP block adds cat([gamma2 * mlp(cls), x[:, 1:]]): the patch tokens
    # pass into its velocity unchanged, q = 1; between the two, cat([norm2(x[:, :1]), x[:, 1:]])
    # overwrites the class token with its norm: a partial update found by dataflow, q = max(1, 0)
    assert blocks(report) == layers(["attn", "local_mp", "mlp"], base="blocks") + [
        ("cls_attn_blocks.0:attn", 0.0), ("cls_attn_blocks.0:norm2", 1.0), ("cls_attn_blocks.0:mlp", 1.0),
        ("cls_attn_blocks.1:attn", 0.0), ("cls_attn_blocks.1:norm2", 1.0), ("cls_attn_blocks.1:mlp", 1.0)]
    assert "Xcit" not in {b.name for b in report.blocks}


# --- a join that reads inner blocks is a readout only when it is linear in what it reads -------------


class _ReadsInner(nn.Module):
    """a = x + f(x); b = a + g(a); c = x + h(b), returning (c.sum(-1), a, b): the outer join's velocity
    holds both inner blocks, which also go on to the output."""

    def __init__(self, h):
        super().__init__()
        self.f, self.g, self.h = nn.Linear(8, 8), nn.Linear(8, 8), h

    def forward(self, x):
        a = x + self.f(x)
        b = a + self.g(a)
        c = x + self.h(b)
        return c.sum(-1), a, b


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
@pytest.mark.parametrize("h, q", [(lambda b: b ** 3, 3.0), (lambda b: b * b, 2.0), (lambda b: b + b * b, 2.0),
                                  (lambda b: 0.5 * b - b * b.mean(-1, keepdim=True), 2.0)])
def test_a_nonlinear_outer_join_that_reads_inner_blocks_stays_a_block(h, q, tracer):
    from qlint.analysis import Options, run

    torch.manual_seed(0)
    report = run(_ReadsInner(h), (torch.randn(4, 8),), spec="m", options=Options(tracer=tracer)).report
    assert sorted((b.q, b.status) for b in report.blocks) == [(1.0, "ok"), (1.0, "ok"), (q, "supercritical")]
    assert report.verdict == "supercritical"


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
def test_a_linear_readout_of_inner_blocks_is_not_a_block(tracer):
    """c = x + b: a sum of stream values read at two depths (Autoformer's trend1 + trend2 + trend3)."""
    from qlint.analysis import Options, run

    torch.manual_seed(0)
    report = run(_ReadsInner(lambda b: b), (torch.randn(4, 8),), spec="m", options=Options(tracer=tracer)).report
    assert [(b.q, b.status) for b in report.blocks] == [(1.0, "ok"), (1.0, "ok")]


# --- a join of averages of X_k is not a block; anything more than averages is -------------------------


class _Averaged(nn.Module):
    """x + g(avg(x)), avg a moving average over the last dim (edges kept by padding)."""

    def __init__(self, g):
        super().__init__()
        self.g = g

    def forward(self, x):
        average = torch.nn.functional.avg_pool1d(torch.nn.functional.pad(x, (1, 1), mode="replicate"), 3, stride=1)
        return self.g(x, average)


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
@pytest.mark.parametrize("g, q", [(lambda x, a: x + a ** 3, 3.0), (lambda x, a: x + a * a, 2.0),
                                  (lambda x, a: x + torch.cumsum(x, -1) ** 2, 2.0)])
def test_a_power_or_product_of_an_average_stays_a_block(g, q, tracer):
    from qlint.analysis import Options, run

    report = run(_Averaged(g), (torch.randn(2, 4, 8),), spec="m", options=Options(tracer=tracer)).report
    assert [(b.q, b.status) for b in report.blocks] == [(q, "supercritical")]


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
def test_a_series_decomposition_alone_is_not_a_block_and_is_reported_uncovered(tracer):
    """x - avg(x) is not an update; a model that is nothing else has no block, and the stream no block
    covers is QL106 (uncertified), never certified."""
    from qlint.analysis import Options, run

    report = run(_Averaged(lambda x, a: x - a), (torch.randn(2, 4, 8),), spec="m", options=Options(tracer=tracer)).report
    assert report.blocks == [] and report.verdict == "uncertified"
    assert [f.code for f in report.findings] == ["QL106"]
