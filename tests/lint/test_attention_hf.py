"""Issue 29: QL201 finds the logits of Hugging Face attention and of attention with sinks.

Hugging Face GPT-2 projects q, k and v with one fused Conv1D, an ``addmm`` (a sum with its bias):
the walk back from q·k went through it to the block's pre-attention LayerNorm and took that for
QK-norm, so no GPT-2 got QL201 (eager, sdpa and the attention-interface path alike). A norm counts
only between the projection and the product now. gpt-oss appends its attention sinks as an extra
logit column, ``softmax(cat([q·k, sinks]) - max)``: the walk from the softmax stopped at the cat.
The report shows the library's source lines relative to the distribution (issue 29, last bullet).

Random init, tiny configs, no download (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import re

import pytest
import torch
from torch import nn

from qlint.analysis import Options, run
from qlint.ci.formats import render

os.environ["HF_HUB_OFFLINE"] = "1"
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs the [zoo] extra (transformers)")

TRACERS = ["symbolic_trace", "export"]
GPT2_FILE = "transformers/models/gpt2/modeling_gpt2.py"


def ql201(report) -> list:
    return [f for f in report.findings if f.code == "QL201"]


def _tokens(vocab: int = 64) -> tuple:
    torch.manual_seed(1)
    return (torch.randint(0, vocab, (1, 8)),)


def gpt2(implementation: str):
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                     eos_token_id=1)
    config._attn_implementation = implementation
    return transformers.GPT2Model(config).eval(), _tokens()


def qwen3():
    """QK-norm (q_norm / k_norm after the projections) through the same attention interface: silent."""
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    return transformers.Qwen3Model(config).eval(), _tokens()


@functools.cache
def analysed(name: str, *args):
    model, inputs = {"gpt2": gpt2, "qwen3": qwen3, "gpt_oss": gpt_oss}[name](*args)
    return run(model, inputs, spec=f"{name}{list(args)}", options=Options()).report


@pytest.mark.zoo
@needs_transformers
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_hugging_face_gpt2_gets_ql201_on_every_attention(implementation):
    report = analysed("gpt2", implementation)
    assert report.tracer == "export" and report.verdict == "certified"
    findings = ql201(report)
    assert [f.block for f in findings] == ["h.0.attn", "h.1.attn"]
    for finding in findings:
        assert finding.severity == "warning"
        assert finding.message == (f"attention `{finding.block}`: its logits q·k have neither QK-norm nor tanh soft-capping; "
                                   "the logits grow with ||W_Q||·||W_K|| (entropy collapse, fp16 overflow)")
        assert finding.source.file.replace(os.sep, "/").endswith(GPT2_FILE)


@pytest.mark.zoo
@needs_transformers
def test_the_text_report_shows_library_lines_relative_to_their_distribution():
    from qlint.core.results import Report

    report = analysed("gpt2", "sdpa")
    lines = render(Report([report]), "concise").splitlines()
    located = [line for line in lines if "QL201" in line]
    assert len(located) == 2
    for line in located:
        assert re.match(rf"{re.escape(GPT2_FILE)}:\d+: QL201 attention `h\.[01]\.attn`: ", line), line
        assert "site-packages" not in line


@pytest.mark.zoo
@needs_transformers
def test_qk_norm_through_the_attention_interface_stays_silent():
    report = analysed("qwen3")
    assert report.verdict == "certified"
    assert ql201(report) == []


# --- attention sinks and extra logit columns ----------------------------------------------------------


class SinkAttention(nn.Module):
    """gpt-oss's eager attention: the sinks are one more logit column, dropped after the softmax."""

    def __init__(self, d: int = 16, heads: int = 2, extra: str = "sinks", qk_norm: bool = False):
        super().__init__()
        self.heads, self.head_dim, self.extra = heads, d // heads, extra
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))
        self.sinks = nn.Parameter(torch.randn(heads))
        self.q_norm = nn.RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim) if qk_norm else nn.Identity()

    def split(self, x):
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim)

    def forward(self, x):
        b, t, d = x.shape
        q = self.q_norm(self.split(self.q_proj(x))).transpose(1, 2)
        k = self.k_norm(self.split(self.k_proj(x))).transpose(1, 2)
        v = self.split(self.v_proj(x)).transpose(1, 2)
        logits = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if self.extra == "sinks":
            column = self.sinks.reshape(1, -1, 1, 1).expand(b, -1, t, 1)
        else:  # "zero": the off-by-one softmax's extra 0 logit
            column = torch.zeros_like(logits[..., :1])
        combined = torch.cat([logits, column], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1)[..., :-1]
        return self.o_proj((probs @ v).transpose(1, 2).reshape(b, t, d))


class Stack(nn.Module):
    def __init__(self, **attention):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(16) for _ in range(2))
        self.attns = nn.ModuleList(SinkAttention(**attention) for _ in range(2))

    def forward(self, x):
        for norm, attn in zip(self.norms, self.attns):
            x = x + attn(norm(x))
        return x


def _stack(tracer: str, **attention):
    torch.manual_seed(0)
    model = Stack(**attention).eval()
    return run(model, (torch.randn(2, 8, 16),), spec="Stack", options=Options(tracer=tracer)).report


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("extra", ["sinks", "zero"])
def test_attention_with_sinks_or_an_extra_column_gets_ql201(tracer, extra):
    report = _stack(tracer, extra=extra)
    assert report.tracer == tracer and report.verdict == "certified"
    findings = ql201(report)
    assert [f.block for f in findings] == ["attns.0", "attns.1"]
    assert all("neither QK-norm nor tanh soft-capping" in f.message for f in findings)
    assert all(f.source.file.endswith("tests/lint/test_attention_hf.py") for f in findings)


@pytest.mark.parametrize("tracer", TRACERS)
def test_qk_normed_attention_with_sinks_stays_silent(tracer):
    report = _stack(tracer, extra="sinks", qk_norm=True)
    assert report.tracer == tracer
    assert ql201(report) == []


# --- gpt-oss itself ---------------------------------------------------------------------------------------


def gpt_oss():
    import transformers

    torch.manual_seed(0)
    config = transformers.GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=2,
                                       num_experts_per_tok=1, max_position_embeddings=64, sliding_window=8,
                                       layer_types=["sliding_attention", "full_attention"])
    config._attn_implementation = "eager"
    return transformers.GptOssModel(config).eval(), _tokens()


def _has_gpt_oss() -> bool:
    import transformers

    return hasattr(transformers, "GptOssModel")


@pytest.mark.zoo
@needs_transformers
def test_gpt_oss_attention_sinks_get_ql201():
    if not _has_gpt_oss():
        pytest.skip("this transformers has no gpt-oss")
    report = analysed("gpt_oss")
    assert [f.block for f in ql201(report)] == ["layers.0.self_attn", "layers.1.self_attn"]
