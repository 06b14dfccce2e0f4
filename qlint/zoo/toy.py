"""Tiny single-block models on (batch, seq, d) floats, one per growth class.

Each is ``x + branch(x)`` with ``branch = W2 act(W1 x)`` unless noted, so the
block exponent is the activation's: PolyMLP q = p, SinhBlock and ExpBlock
super-polynomial, UnknownOpBlock an op no registry lists (torch.special.i0),
BoundedExpBlock q = 1 (exp of a non-positive argument is bounded),
LipschitzMLP q = 1.
"""
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ToyBlock", "PolyMLP", "SinhBlock", "ExpBlock", "UnknownOpBlock", "BoundedExpBlock",
           "LipschitzMLP", "StackOf"]


class ToyBlock(nn.Module):
    """``x + w2(act(w1 x))``; subclasses choose ``act`` (or override ``branch``)."""

    def __init__(self, d: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or d
        self.w1 = nn.Linear(d, hidden)
        self.w2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x)

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act(self.w1(x)))

    def act(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class PolyMLP(ToyBlock):
    """q = p."""

    def __init__(self, d: int, p: int = 3, hidden: int | None = None):
        super().__init__(d, hidden)
        self.p = p

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return h ** self.p


class SinhBlock(ToyBlock):
    """Exponential growth: no finite q."""

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return torch.sinh(h)


class ExpBlock(ToyBlock):
    """Exponential growth: no finite q."""

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return torch.exp(h)


class UnknownOpBlock(ToyBlock):
    """torch.special.i0 (grows like e^|h|) stands for an op the primitive registry does not list."""

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return torch.special.i0(h)


class LipschitzMLP(ToyBlock):
    """q = 1."""

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h)


class BoundedExpBlock(ToyBlock):
    """``x + w2(exp(-softplus(w1 x)) ⊙ w3 x)``: the exp factor lies in (0, 1], so q = 1."""

    def __init__(self, d: int, hidden: int | None = None):
        super().__init__(d, hidden)
        self.w3 = nn.Linear(d, self.w1.out_features)

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.exp(-F.softplus(self.w1(x))) * self.w3(x))


class StackOf(nn.Module):
    """``depth`` independent copies of a block class, applied in sequence as ``layers.i``."""

    def __init__(self, block_cls: type[nn.Module], depth: int, *args, **kw):
        super().__init__()
        self.layers = nn.ModuleList(block_cls(*args, **kw) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x
