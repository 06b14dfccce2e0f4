"""Transformer reference blocks: GPT-2 (pre-LN), LLaMA (RMSNorm, RoPE, SwiGLU), Hymba.

Expected exponents: GPT-2 and normed LLaMA blocks q = 0; LLaMA without norms
q = 2 (silu(gate x) ⊙ up x; its attention branch is q = 1); Hymba q = 0, or q = 5
when its SSM head reads the raw stream (``ssm_norm=False``).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from qlint.zoo import make_norm, mlp
from qlint.zoo.mamba import MambaMixer

__all__ = ["CausalSelfAttention", "GPT2Block", "GPT2Model", "LlamaRMSNorm", "SwiGLU", "LlamaBlock",
           "LlamaModel", "SwiGLUResidual", "HymbaBlock", "HymbaModel"]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class CausalSelfAttention(nn.Module):
    """Hand-written causal multi-head attention (q = 1); ``rotary=True`` applies RoPE to q and k."""

    def __init__(self, d_model: int, n_heads: int, max_len: int = 64, bias: bool = True,
                 rotary: bool = False):
        super().__init__()
        self.n_heads, self.d_head, self.rotary = n_heads, d_model // n_heads, rotary
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.register_buffer("mask", torch.ones(max_len, max_len, dtype=torch.bool).tril(), persistent=False)
        if rotary:
            inv_freq = 1.0 / 10000 ** (torch.arange(0, self.d_head, 2).float() / self.d_head)
            freqs = torch.outer(torch.arange(max_len).float(), inv_freq)
            self.register_buffer("cos", torch.cat((freqs, freqs), -1).cos(), persistent=False)
            self.register_buffer("sin", torch.cat((freqs, freqs), -1).sin(), persistent=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.n_heads, self.d_head)).transpose(1, 2)  # (batch, heads, seq, d_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]  # buffers are cut with narrow(): fx cannot slice a tensor by a traced length
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        if self.rotary:
            cos, sin = self.cos.narrow(0, 0, t), self.sin.narrow(0, 0, t)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)
        att = att.masked_fill(~self.mask.narrow(0, 0, t).narrow(1, 0, t), float("-inf")).softmax(dim=-1)
        return self.out_proj((att @ v).transpose(1, 2).flatten(-2))


class GPT2Block(nn.Module):
    """Pre-LN: ``x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))`` (q = 0)."""

    def __init__(self, d_model: int, n_heads: int, n_positions: int = 64):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, n_positions)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = mlp(d_model, 4 * d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    """Token ids (batch, seq) -> hidden states (batch, seq, d_model)."""

    def __init__(self, vocab: int = 512, n_positions: int = 64, d_model: int = 64, n_layers: int = 4,
                 n_heads: int = 4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(n_positions, d_model)
        self.h = nn.ModuleList(GPT2Block(d_model, n_heads, n_positions) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class LlamaRMSNorm(nn.Module):
    """RMSNorm exactly as HF LLaMA computes it: in float32, cast back, then scaled."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def llama_norm(norm: bool, d: int) -> nn.Module:
    return LlamaRMSNorm(d) if norm else nn.Identity()


class SwiGLU(nn.Module):
    """``down(silu(gate x) ⊙ up x)``: a Hadamard product of two q = 1 paths, so q = 2."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """Pre-norm LLaMA block; ``norm=False`` drops both RMSNorms (q = 2 from the SwiGLU branch)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, norm: bool = True, max_len: int = 64):
        super().__init__()
        self.input_layernorm = llama_norm(norm, d_model)
        self.self_attn = CausalSelfAttention(d_model, n_heads, max_len, bias=False, rotary=True)
        self.post_attention_layernorm = llama_norm(norm, d_model)
        self.mlp = SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Token ids (batch, seq) -> hidden states; final RMSNorm only when ``norm``."""

    def __init__(self, vocab: int = 512, d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                 d_ff: int = 172, norm: bool = True, max_len: int = 64):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(LlamaBlock(d_model, n_heads, d_ff, norm, max_len)
                                    for _ in range(n_layers))
        self.norm = llama_norm(norm, d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class SwiGLUResidual(nn.Module):
    """Single block ``x + mlp(norm(x))`` on (batch, seq, d_model): q = 2 without norm, q = 0 with."""

    def __init__(self, d_model: int, d_ff: int, norm: bool):
        super().__init__()
        self.norm = llama_norm(norm, d_model)
        self.mlp = SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class HymbaBlock(nn.Module):
    """Parallel attention and SSM heads summed into one residual update.

    ``ssm_norm=False`` feeds the SSM head the raw stream, so the block inherits
    Mamba's q = 5 even though the attention head is normalised.
    """

    def __init__(self, d_model: int, n_heads: int, ssm_norm: bool = True, max_len: int = 64, **mixer_kw):
        super().__init__()
        self.norm_attn = nn.RMSNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, max_len)
        self.norm_ssm = make_norm("rmsnorm" if ssm_norm else None, d_model)
        self.ssm = MambaMixer(d_model, **mixer_kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm_attn(x)) + self.ssm(self.norm_ssm(x))


class HymbaModel(nn.Module):
    """Float (batch, seq, d_model) -> (batch, seq, d_model) through HymbaBlocks and a final RMSNorm."""

    def __init__(self, d_model: int = 32, n_layers: int = 2, ssm_norm: bool = True, n_heads: int = 4,
                 max_len: int = 64):
        super().__init__()
        self.layers = nn.ModuleList(HymbaBlock(d_model, n_heads, ssm_norm, max_len)
                                    for _ in range(n_layers))
        self.norm_f = nn.RMSNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm_f(x)
