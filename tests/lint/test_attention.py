"""QL201: attention logits unbounded in the weights (source 001, Part VI)."""

import json

import pytest
from click.testing import CliRunner

from qlint.cli import main
from tests.conftest import fixture_spec

TRACERS = ["symbolic_trace", "export"]


def ql201(report):
    return [f for f in report.findings if f.code == "QL201"]


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", ["plain", "plain_einsum", "plain_sdpa"])
def test_plain_logits_warn_once_per_attention_module(lint, name, tracer):
    report = lint(f"attention.py:{name}", tracer=tracer)
    assert report.tracer == tracer
    findings = ql201(report)
    assert [f.block for f in findings] == ["attns.0", "attns.1"]
    for finding in findings:
        assert finding.severity == "warning"
        assert f"attention `{finding.block}`" in finding.message
        assert "neither QK-norm nor tanh soft-capping" in finding.message
        assert finding.source.file.endswith("fixtures/attention.py")


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", ["qk_norm", "qk_norm_sdpa", "softcap"])
def test_qk_norm_and_soft_capping_silence_it(lint, name, tracer):
    report = lint(f"attention.py:{name}", tracer=tracer)
    assert report.tracer == tracer
    assert ql201(report) == []
    assert [b.q for b in report.blocks] == [0.0, 0.0]


def test_torch_multihead_attention_is_opaque_and_warns(lint):
    report = lint("patchtst.py:preln")  # nn.MultiheadAttention stays a call_module leaf
    assert report.tracer == "symbolic_trace"
    findings = ql201(report)
    assert [f.block for f in findings] == ["layers.0.attn.fn.mha", "layers.1.attn.fn.mha"]
    assert "`MultiheadAttention` computes its logits internally" in findings[0].message


def test_torch_encoder_through_export_warns_per_self_attention(lint):
    report = lint("attention.py:multihead")  # nn.TransformerEncoder root: export decomposes it
    assert report.tracer == "export"
    assert [f.block for f in ql201(report)] == ["layers.0.self_attn", "layers.1.self_attn"]


def test_zoo_gpt2_and_rotary_llama_warn(lint):
    assert [f.block for f in ql201(lint("gpt2.py:build_model"))] == ["h.0.attn", "h.1.attn"]
    assert [f.block for f in ql201(lint("llama.py:with_norm"))] == ["layers.0.self_attn", "layers.1.self_attn"]


def test_mlp_only_models_have_no_attention(lint):
    assert ql201(lint("placement.py:pre_ln")) == []
    assert ql201(lint("toy.py:lipschitz_mlp")) == []


@pytest.mark.parametrize("selection,expected", [(["--select", "QL201"], ["QL201", "QL201"]), (["--ignore", "QL201"], [])])
def test_selectable_like_the_other_rules(selection, expected):
    result = CliRunner().invoke(main, ["check", fixture_spec("attention.py:plain"), "--isolated", "--format", "json", *selection])
    codes = [f["code"] for f in json.loads(result.output)["models"][0]["findings"] if f["code"].startswith("QL2")]
    assert codes == expected
