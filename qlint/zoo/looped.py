"""Looped (weight-shared) transformers after Parcae and source 003.

One pre-LN transformer block is applied ``n_loops`` times to a hidden state h,
with the prelude's encoding e re-injected at every iteration (003, eq. 1):

    h_{t+1} = Ā ⊙ h_t + f(h_t, e),    f(h, e) = Block(h + e) - (h + e)

``carry`` chooses Ā:
    constrained  Ā = exp(-Δ·exp(log_A)) ∈ (0, 1) per channel (Parcae, Δ = 1)
    free         Ā is a raw parameter: gradient descent can drive it past 1 (003 Table 6)
    unit         no carry factor: the plain weight-shared residual h_{t+1} = h_t + f(h_t, e)
    clamped      Ā = clamp(A, 0, 0.99): in [0, 0.99] whatever A is
    forget       Ā = 1 - sigmoid(b), the forget-gate spelling: in (0, 1)
    buffer       Ā is a buffer (not trained): a constant, fine when its value is in [0, 1)
    frozen       Ā is a parameter with requires_grad=False: a constant too
    tanh         Ā = tanh(a): |Ā| < 1, but negative entries are allowed

``increment="identity"`` makes f the whole block output Block(h + e), which
contains h: the recurrence then carries (Ā + I) ⊙ h, diagonal entries above 1.
"""
import math

import torch
from torch import nn

from qlint.zoo import mlp
from qlint.zoo.transformer import CausalSelfAttention

__all__ = ["PreLNIncrement", "Carry", "LoopedTransformer", "CARRIES", "INCREMENTS"]

CARRIES = ("constrained", "free", "unit", "clamped", "forget", "buffer", "frozen", "tanh")
INCREMENTS = ("delta", "identity")


class PreLNIncrement(nn.Module):
    """A pre-LN attention + MLP block; returns Block(x) - x, or Block(x) with ``identity``."""

    def __init__(self, d_model: int, n_heads: int, max_len: int, identity: bool):
        super().__init__()
        self.identity = identity
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, max_len)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = mlp(d_model, 4 * d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.attn(self.ln_1(x))
        u = u + self.mlp(self.ln_2(x + u))
        return x + u if self.identity else u


class Carry(nn.Module):
    """The diagonal carry Ā (one entry per channel), initialised to ``rho``."""

    def __init__(self, d_model: int, kind: str, rho: float):
        super().__init__()
        self.kind = kind
        if kind == "constrained":
            self.log_A = nn.Parameter(torch.full((d_model,), math.log(-math.log(rho))))
        elif kind == "forget":
            self.b = nn.Parameter(torch.full((d_model,), math.log((1 - rho) / rho)))  # 1 - sigmoid(b) = rho
        elif kind == "tanh":
            self.a = nn.Parameter(torch.full((d_model,), math.atanh(rho)))
        elif kind == "buffer":
            self.register_buffer("A", torch.full((d_model,), rho))
        else:
            self.A = nn.Parameter(torch.full((d_model,), rho), requires_grad=kind != "frozen")

    def forward(self) -> torch.Tensor:
        if self.kind == "constrained":
            return torch.exp(-torch.exp(self.log_A))
        if self.kind == "clamped":
            return torch.clamp(self.A, 0.0, 0.99)
        if self.kind == "forget":
            return 1 - torch.sigmoid(self.b)
        if self.kind == "tanh":
            return torch.tanh(self.a)
        return self.A


class LoopedTransformer(nn.Module):
    """Float (batch, seq, d_in) -> (batch, seq, d_out): prelude, ``n_loops`` shared iterations, coda."""

    def __init__(self, d_in: int = 8, d_model: int = 32, n_heads: int = 4, n_loops: int = 8,
                 carry: str = "constrained", rho: float = 0.5, increment: str = "delta", max_len: int = 64,
                 d_out: int = 8):
        super().__init__()
        if carry not in CARRIES or increment not in INCREMENTS:
            raise ValueError(f"carry must be one of {CARRIES} and increment one of {INCREMENTS}")
        self.n_loops = n_loops
        self.prelude = nn.Linear(d_in, d_model)
        self.carry = Carry(d_model, carry, rho) if carry != "unit" else None
        self.block = PreLNIncrement(d_model, n_heads, max_len, identity=increment == "identity")
        self.norm_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.prelude(x)
        h = torch.zeros_like(e)
        carry = self.carry() if self.carry is not None else None
        for _ in range(self.n_loops):
            update = self.block(h + e)
            h = h + update if carry is None else carry * h + update
        return self.head(self.norm_f(h))
