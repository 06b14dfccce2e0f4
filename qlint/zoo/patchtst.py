"""PatchTST encoder (channel-independent) for multivariate forecasting.

Each series is cut into overlapping patches, embedded, and passed through
PatchTSTBlocks that make two residual updates, attention then FFN.  Both
branches are q = 1, so a "free" block is q = 1 and the normed variants are q = 0.
Defaults follow PatchTST's ETTh1 configuration (d_model 16, 4 heads, d_ff 128).
"""
import torch
import torch.nn.functional as F
from torch import nn

from qlint.zoo import Forecaster, NormedBranch, example_inputs, make_norm, mlp, norm_kinds

__all__ = ["SelfAttention", "PatchTSTBlock", "PatchTST", "build", "example_inputs"]


class SelfAttention(nn.Module):
    """Unmasked self-attention over patches; wraps nn.MultiheadAttention as a one-tensor branch."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.mha = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=False)[0]


class PatchTSTBlock(nn.Module):
    """``x = x + attn(x); x = x + ffn(x)``, each branch wrapped per ``variant``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, variant: str):
        super().__init__()
        self.attn = NormedBranch(SelfAttention(d_model, n_heads), d_model, variant)
        self.ffn = NormedBranch(mlp(d_model, d_ff), d_model, variant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.ffn(x)


class PatchTST(Forecaster):
    """(batch, seq_len, n_vars) -> (batch, horizon, n_vars); channels share all weights.

    The series is right-padded by ``stride`` (replicating the last value) before
    patching, as in PatchTST, giving (seq_len - patch_len) // stride + 2 patches.
    """

    def __init__(self, n_vars: int = 7, seq_len: int = 96, horizon: int = 96, patch_len: int = 16,
                 stride: int = 8, d_model: int = 16, n_heads: int = 4, d_ff: int = 128, depth: int = 3,
                 variant: str = "free", revin: bool = False):
        super().__init__(revin)
        self.n_vars, self.patch_len, self.stride = n_vars, patch_len, stride
        n_patches = (seq_len - patch_len) // stride + 2
        self.embed = nn.Linear(patch_len, d_model)
        self.pos = nn.Parameter(torch.empty(n_patches, d_model).uniform_(-0.02, 0.02))
        self.layers = nn.ModuleList(PatchTSTBlock(d_model, n_heads, d_ff, variant) for _ in range(depth))
        self.norm_f = make_norm(norm_kinds(variant)[0], d_model)
        self.head = nn.Linear(n_patches * d_model, horizon)

    def forecast(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x.transpose(1, 2), (0, self.stride), mode="replicate")  # (batch, vars, seq_len + stride)
        patches = x.unfold(-1, self.patch_len, self.stride)               # (batch, vars, patches, patch_len)
        h = (self.embed(patches) + self.pos).flatten(0, 1)                # (batch * vars, patches, d_model)
        for layer in self.layers:
            h = layer(h)
        h = self.norm_f(h).unflatten(0, (-1, self.n_vars)).flatten(2)     # (batch, vars, patches * d_model)
        return self.head(h).transpose(1, 2)


def build(variant: str = "free", **kw) -> PatchTST:
    """PatchTST with the given norm variant ("free", "rmsnorm", "preln", "periln")."""
    return PatchTST(variant=variant, **kw)
