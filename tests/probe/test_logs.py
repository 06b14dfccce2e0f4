"""The init logs QL401-QL405 (qlint.probe.logs): the measured figures, the thresholds, the wiring."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from qlint.analysis import Options
from qlint.cli import main
from qlint.lint.graph_queries import op
from qlint.loader import load
from qlint.probe import logs
from qlint.probe.init import StackLayer
from qlint.probe.measure import trace_float64
from qlint.zoo.transformer import CausalSelfAttention, LlamaRMSNorm

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
QUICK = ["--directions", "0", "--no-perturb", "--iterations", "1"]  # the logs do not read the exponent fits


def spec(name: str) -> str:
    return str(FIXTURES / "init_logs.py") + ":" + name


def measured(model: nn.Module, inputs: tuple, stack: tuple = ()) -> logs.InitLogs:
    analysis, trajectory = trace_float64(model, inputs, spec=type(model).__name__, options=Options())
    return logs.measure(analysis, trajectory, list(stack))


def fixture_logs(name: str) -> logs.InitLogs:
    fixture = load(spec(name))
    return measured(fixture.model, fixture.inputs)


class Residual(nn.Module):
    """x + inner(x): one residual block around the module under test."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(x)


# --- attention ------------------------------------------------------------------------


def test_uniform_attention_has_entropy_log_n():
    """Zero logits: every row uniform over its keys, H = log(keys), normalised 1 (causal rows too)."""
    n = 6
    logits = torch.zeros(n, n, dtype=torch.float64)
    assert logs.attention_stats(logits, logits.softmax(-1)) == (0.0, pytest.approx(1.0), n)
    causal = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    probs = causal.softmax(-1)
    assert float(-torch.xlogy(probs[-1], probs[-1]).sum()) == pytest.approx(math.log(n))
    assert logs.attention_stats(causal, probs)[1] == pytest.approx(1.0)  # row i over its own i + 1 keys


def test_one_hot_attention_has_zero_entropy_and_masks_are_not_logits():
    logits = torch.tensor([[40.0, 0.0, 0.0, -1e9]], dtype=torch.float64)  # -1e9: an additive mask
    max_logit, entropy, keys = logs.attention_stats(logits, logits.softmax(-1))
    assert max_logit == 40.0 and keys == 3
    assert entropy == pytest.approx(0.0, abs=1e-15)


def test_a_minus_100_window_mask_is_a_mask_not_a_logit():
    """timm's Swin adds -100 to the keys outside a shifted window: 50 below the row's top, they are not keys."""
    logits = torch.tensor([[0.1, 0.2, -99.9, -99.8]], dtype=torch.float64)
    max_logit, entropy, keys = logs.attention_stats(logits, logits.softmax(-1))
    assert (max_logit, keys) == (pytest.approx(0.2), 2) and entropy == pytest.approx(0.9982, abs=1e-4)  # two live keys, p = 0.475, 0.525


def test_max_logit_of_a_known_q_k_scale():
    """W_q = W_k = c·I: head h's logits are c² x_h·x_hᵀ / sqrt(d_head) on and below the diagonal."""
    c, d, heads, tokens = 3.0, 16, 2, 8
    attention = CausalSelfAttention(d, heads, tokens)
    with torch.no_grad():
        for projection in (attention.q_proj, attention.k_proj):
            projection.weight.copy_(c * torch.eye(d))
            projection.bias.zero_()
    x = torch.randn(1, tokens, d, generator=torch.Generator().manual_seed(0))
    [log] = measured(Residual(attention), (x,)).attentions
    per_head = x.double().unflatten(-1, (heads, d // heads)).transpose(1, 2)
    expected = c**2 * per_head @ per_head.transpose(-2, -1) / math.sqrt(d // heads)
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    assert log.max_logit == pytest.approx(float(expected[..., causal].abs().max()), rel=1e-6)
    assert log.path == "inner" and log.keys == tokens


def test_zero_queries_give_uniform_rows_through_the_model():
    attention = CausalSelfAttention(16, 2, 8)
    with torch.no_grad():
        attention.q_proj.weight.zero_()
        attention.q_proj.bias.zero_()
    [log] = measured(Residual(attention), (torch.randn(2, 8, 16),)).attentions
    assert log.max_logit == 0.0 and log.entropy == pytest.approx(1.0)


def test_sdpa_is_measured_like_the_softmax_it_computes():
    explicit, fused = fixture_logs("attention_unit_std"), fixture_logs("attention_unit_std_sdpa")
    assert [log.path for log in fused.attentions] == ["attns.0", "attns.1"]
    for a, b in zip(explicit.attentions, fused.attentions):
        assert b.max_logit == pytest.approx(a.max_logit, rel=1e-9) and b.entropy == pytest.approx(a.entropy, rel=1e-9)
    assert min(log.max_logit for log in fused.attentions) > logs.MAX_LOGIT
    assert {f.code for f in fused.findings} == {"QL401", "QL402"}


def test_entropy_collapses_before_the_logits_reach_the_threshold():
    found = fixture_logs("attention_sharp")
    assert max(log.max_logit for log in found.attentions) < logs.MAX_LOGIT
    assert min(log.entropy for log in found.attentions) < logs.ENTROPY_FLOOR
    [finding] = found.findings
    assert finding.code == "QL402" and finding.block == "attns.1"


def test_default_init_logits_are_of_order_one():
    found = fixture_logs("attention_default")
    assert all(log.max_logit < 2 and log.entropy > 0.95 for log in found.attentions)
    assert found.findings == []


def test_a_softmax_that_is_not_attention_is_not_measured():
    router = nn.Sequential(nn.Linear(8, 4), nn.Softmax(-1), nn.Linear(4, 8))  # a softmax over a projection
    analysis, trajectory = trace_float64(Residual(router), (torch.randn(2, 5, 8),), spec="router", options=Options())
    assert [op(node) for node in analysis.graph.nodes].count("softmax") == 1
    assert logs.attention_logs(analysis, trajectory) == []


# --- per-token spread -------------------------------------------------------------------


class LayerNormWrittenOut(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(-1, keepdim=True)
        return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5)


@pytest.mark.parametrize("norm, statistic", [(nn.LayerNorm(8), "std"), (LayerNormWrittenOut(), "std"), (nn.RMSNorm(8), "rms"), (LlamaRMSNorm(8), "rms")],
                         ids=["LayerNorm", "written-out LayerNorm", "RMSNorm", "written-out RMSNorm"])
def test_min_token_spread_is_what_the_norm_divides_by(norm, statistic):
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))
    x[1, 3] *= 1e-3
    [log] = measured(Residual(nn.Sequential(norm, nn.Linear(8, 8))), (x,)).spreads
    token = x.double()[1, 3]
    expected = token.std(unbiased=False) if statistic == "std" else token.pow(2).mean().sqrt()
    assert (log.statistic, log.token) == (statistic, (1, 3))
    assert log.min_spread == pytest.approx(float(expected), rel=1e-6)
    assert log.rms == pytest.approx(float(x.double().pow(2).mean().sqrt()), rel=1e-12)


def test_a_class_token_near_zero_implodes():
    fixture = load(spec("class_token_tiny"))
    found = measured(fixture.model, fixture.inputs)
    first = found.spreads[0]
    assert first.path == "norms.0" and first.token[1] == 0  # the class token leads every sequence
    assert first.min_spread == pytest.approx(float(fixture.model.cls.detach().double().std(unbiased=False)), rel=1e-6)
    [finding] = found.findings
    assert finding.code == "QL403" and finding.block == "norms.0"
    assert f"{first.ratio:.3g} of the input's RMS" in finding.message and "< 0.01" in finding.message
    assert all(log.ratio > logs.SPREAD_FLOOR for log in fixture_logs("class_token_unit").spreads)


# --- carry ------------------------------------------------------------------------------


def test_max_not_mean_of_the_carry():
    found = fixture_logs("carry_one_slow_channel")
    [carry] = found.carries
    assert carry.max == pytest.approx(0.995, abs=1e-6) and carry.mean == pytest.approx((31 * 0.5 + 0.995) / 32, abs=1e-6)
    assert carry.channels == 32
    assert [f.code for f in found.findings] == ["QL404"]
    assert "Ā = 0.995 >= 0.99" in found.findings[0].message and "mean 0.515" in found.findings[0].message
    [half] = fixture_logs("carry_half").carries
    assert half.max == pytest.approx(0.5) and fixture_logs("carry_half").findings == []


# --- the residual stream ----------------------------------------------------------------


def _stack(ratios: list[float]) -> list[StackLayer]:
    outs = [1.0, *ratios]
    return [StackLayer(f"b{k}", outs[k], outs[k + 1], None, None) for k in range(len(ratios))]


@pytest.mark.parametrize("embedding", [1.0, 0.02, 1e-4])  # sigma_0 against a branch variance v = 1
def test_additive_variance_never_crosses_two_sqrt_l(embedding):
    """sigma_k^2 = sigma_0^2 + k v (001 Part III): measured from the first block's output, the ratio is at most
    sqrt(k) whatever the embedding's scale (a std-0.02 embedding is no geometric growth)."""
    rms = [math.sqrt(embedding**2 + k) for k in range(0, 2001)]
    stack = [StackLayer(f"b{k}", rms[k], rms[k + 1], None, None) for k in range(2000)]
    additive = logs.stream_growth(stack)
    assert additive.crossing is None and additive.final <= math.sqrt(2000)
    geometric = logs.StreamGrowth([f"b{k}" for k in range(60)], [1.1**k for k in range(1, 61)], [None] * 60)
    assert geometric.crossing is not None and geometric.ratios[geometric.crossing] > 2 * math.sqrt(geometric.crossing + 1)


def test_stream_growth_names_the_block_where_it_crosses():
    found = logs.findings(logs.InitLogs(stream=logs.stream_growth(_stack([1.0, 1.5, 4.5, 5.0]))))
    [finding] = found
    assert finding.code == "QL405" and finding.block == "b2"  # 4.5 > 2·sqrt(3) = 3.46; 5.0 > 2·sqrt(4) = 4
    assert "x5 over 4 blocks" in finding.message and "block 3: x4.5 > 3.46" in finding.message
    assert logs.findings(logs.InitLogs(stream=logs.stream_growth(_stack([1.0, 1.5, 4.5, 3.9])))) == []  # back under 4


def test_unnormalised_residuals_grow_geometrically_pre_ln_like_sqrt_l():
    from qlint.probe.init import _stack as init_stack

    for name, expected in (("stream_unnormalised", 2**3.5), ("stream_pre_ln", 3 / math.sqrt(2))):  # sqrt(2)^7; sqrt((1 + 8) / (1 + 1))
        fixture = load(spec(name))
        analysis, trajectory = trace_float64(fixture.model, fixture.inputs, spec=name, options=Options())
        found = logs.measure(analysis, trajectory, init_stack(analysis, 0))
        assert found.stream.final == pytest.approx(expected, rel=0.15)
        assert [f.code for f in found.findings] == (["QL405"] if name == "stream_unnormalised" else [])


# --- thresholds --------------------------------------------------------------------------


def test_each_threshold_is_where_its_finding_starts():
    def codes(**kw) -> list[str]:
        return [f.code for f in logs.findings(logs.InitLogs(**kw))]

    def attention(max_logit: float, entropy: float) -> logs.AttentionLog:
        return logs.AttentionLog("a", "a", max_logit, entropy, 8)

    assert codes(attentions=[attention(30.0, 0.1)]) == []
    assert codes(attentions=[attention(30.01, 0.0999)]) == ["QL401", "QL402"]
    assert codes(spreads=[logs.SpreadLog("n", "n", "std", 0.01, (0, 0), 1.0)]) == []
    assert codes(spreads=[logs.SpreadLog("n", "n", "std", 0.00999, (0, 0), 1.0)]) == ["QL403"]
    assert codes(carries=[logs.CarryLog("loop", 0.98999, 0.5, 4)]) == []
    assert codes(carries=[logs.CarryLog("loop", 0.99, 0.5, 4)]) == ["QL404"]


def test_a_looped_attention_is_reported_once_with_its_worst_call():
    calls = [logs.AttentionLog(f"block.attn#{k}", "block.attn", value, 0.5, 8) for k, value in enumerate((31.0, 45.0, 33.0), 1)]
    [finding] = logs.findings(logs.InitLogs(attentions=calls))
    assert finding.block == "block.attn" and "max |logit| = 45 > 30" in finding.message and "the worst of its 3 calls" in finding.message


# --- wiring: qlint probe -----------------------------------------------------------------


@pytest.fixture(scope="module")
def probed_json():
    result = CliRunner().invoke(main, ["probe", spec("attention_unit_std"), "--format", "json", *QUICK])
    assert result.exit_code == 0, result.output  # warnings do not change the exit code
    return json.loads(result.stdout)["models"][0]


def test_cli_json_carries_the_logs_and_their_findings(probed_json):
    attention = probed_json["init_logs"]["attention"]
    assert [log["name"] for log in attention] == ["attns.0", "attns.1"]
    assert all(log["max_logit"] > 30 and log["normalised_entropy"] < 0.1 for log in attention)
    assert probed_json["init_logs"]["stream_growth"]["blocks"] == 2
    found = [f for f in probed_json["findings"] if f["code"].startswith("QL40")]
    assert sorted(f["code"] for f in found) == ["QL401", "QL401", "QL402", "QL402"]
    assert all(f["severity"] == "warning" and f["source"] for f in found)


def test_cli_full_output_prints_the_logs():
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["probe", spec("carry_one_slow_channel"), *QUICK])
    assert result.exit_code == 0, result.output
    for text in ("init logs", "max carry Ā", "0.995 (mean 0.515)", "QL404 looped recurrence `block`"):
        assert text in result.stdout
