"""Reference architectures for qlint: small, pure-PyTorch, traceable models.

Every residual block is one ``nn.Module`` whose forward performs ``x = x + branch(x)``,
so qlint can attribute a velocity exponent q to each block by its module path
(``layers.3``).  Where the norms go is chosen by one ``variant`` string shared by
all families:

    free     x + f(x)                    no normalisation: the block's own growth shows
    rmsnorm  x + f(rmsnorm(x))           the conventional pre-norm baseline
    preln    x + f(layernorm(x))         pre-norm with LayerNorm
    periln   x + ln_out(f(ln_in(x)))     Peri-LN

Absent norms are ``nn.Identity`` placeholders at fixed names (``norm_in``,
``norm_out``), so forwards read the same for every variant and a remedy can
swap a real norm in without rewriting the block.
"""
import torch
from torch import nn

# variant -> (norm on the branch input, norm on the branch output)
VARIANTS = {
    "free": (None, None),
    "rmsnorm": ("rmsnorm", None),
    "preln": ("layernorm", None),
    "periln": ("layernorm", "layernorm"),
}


def norm_kinds(variant: str) -> tuple:
    """(input norm kind, output norm kind) of a branch; rejects unknown variants early."""
    try:
        return VARIANTS[variant]
    except KeyError:
        raise ValueError(f"unknown variant {variant!r}; expected one of {sorted(VARIANTS)}") from None


def make_norm(kind: str | None, d: int) -> nn.Module:
    """``nn.RMSNorm`` / ``nn.LayerNorm`` by name, ``nn.Identity`` for None."""
    if kind is None:
        return nn.Identity()
    if kind == "rmsnorm":
        return nn.RMSNorm(d)
    if kind == "layernorm":
        return nn.LayerNorm(d)
    raise ValueError(f"unknown norm kind {kind!r}")


class NormedBranch(nn.Module):
    """``norm_out(fn(norm_in(x)))``: a residual branch wrapped per variant; the add stays in the block."""

    def __init__(self, fn: nn.Module, d: int, variant: str):
        super().__init__()
        kind_in, kind_out = norm_kinds(variant)
        self.norm_in = make_norm(kind_in, d)
        self.fn = fn
        self.norm_out = make_norm(kind_out, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_out(self.fn(self.norm_in(x)))


def mlp(d: int, d_ff: int) -> nn.Sequential:
    """Linear-GELU-Linear feed-forward (q = 1), shared by GPT-2 and PatchTST."""
    return nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), nn.Linear(d_ff, d))


class Forecaster(nn.Module):
    """(batch, seq_len, n_vars) -> (batch, horizon, n_vars) around ``self.forecast``.

    ``revin=True`` adds RevIN-style instance normalisation (per series, over time,
    no affine parameters) and undoes it on the output; it is off by default so the
    blocks see the raw scale the experiments are about.
    """

    def __init__(self, revin: bool):
        super().__init__()
        self.revin = revin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.revin:
            return self.forecast(x)
        mean = x.mean(1, keepdim=True)
        std = torch.sqrt(x.var(1, keepdim=True, unbiased=False) + 1e-5)
        return self.forecast((x - mean) / std) * std + mean


def example_inputs(batch: int = 2, seq_len: int = 96, n_vars: int = 7) -> tuple[torch.Tensor]:
    """One random multivariate window, shaped like an ETTh1 batch."""
    return (torch.randn(batch, seq_len, n_vars),)
