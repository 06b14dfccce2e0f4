"""Random residual architectures built from the registry's primitives.

The soundness law of the probe (``tests/test_soundness.py``,
``bench/probe_soundness_long.py``): for every architecture ``x + v(x)`` generated
here, the measured exponent of v never exceeds the static one, and equals it
where the arithmetic is tight.

An :class:`Expr` is a tree over one input of width :data:`WIDTH`: affine maps,
activations, norms, softmax, integer powers, sums, Hadamard products and nested
residuals ``h + g(h)``. Each node knows its reference exponent (Theorem 9 applied by
hand, independently of qlint) and whether that exponent is *tight*, i.e. attained
with generic random weights:

* tight: affine maps, powers x^p, sums, Hadamard products, nested residuals,
  LayerNorm / RMSNorm / L2 normalisation, tanh and softmax, when their inputs are
  tight. Their leading term is a generic nonzero vector (u^p, u ⊙ w, (I + W)u,
  sign(u), LN(u), a one-hot softmax), so the exponent is reached.
* not tight: ReLU, GELU, SiLU and sigmoid select a sign: along a direction whose
  leading coefficients are all negative they vanish, so the exponent (q for the
  first three, 0 for sigmoid) is an upper bound that may not be attained; anything
  computed from them inherits that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 5
SHAPE = (2, 3, WIDTH)  # (batch, tokens, width): single-token probes are meaningful
MAX_EXPONENT = 12.0  # alpha^12 at alpha = 1e7 keeps norms of squares inside float64

ACTIVATIONS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], bool, bool]] = {
    # name: (function, bounded, tight)
    "relu": (F.relu, False, False),
    "gelu": (F.gelu, False, False),
    "silu": (F.silu, False, False),
    "tanh": (torch.tanh, True, True),
    "sigmoid": (torch.sigmoid, True, False),
}
NORMS = ("layer_norm", "rms_norm", "l2")
POWERS = (2, 3)


class Expr:
    """A node of the velocity's expression tree."""

    def exponent(self, input_q: float = 1.0) -> float:
        """The Theorem 9 exponent when the tree's input grows like ||x||^input_q."""
        raise NotImplementedError

    def tight(self) -> bool:
        raise NotImplementedError

    def peak(self, input_q: float = 1.0) -> float:
        """The largest exponent of any subexpression (bounds the magnitudes probed)."""
        raise NotImplementedError

    def build(self) -> nn.Module:
        raise NotImplementedError


@dataclass(frozen=True)
class Input(Expr):
    def exponent(self, input_q: float = 1.0) -> float:
        return input_q

    def tight(self) -> bool:
        return True

    def peak(self, input_q: float = 1.0) -> float:
        return input_q

    def build(self) -> nn.Module:
        return nn.Identity()


@dataclass(frozen=True)
class Unary(Expr):
    child: Expr

    def tight(self) -> bool:
        return self.child.tight()

    def peak(self, input_q: float = 1.0) -> float:
        return max(self.exponent(input_q), self.child.peak(input_q))


@dataclass(frozen=True)
class Affine(Unary):
    def exponent(self, input_q: float = 1.0) -> float:
        return self.child.exponent(input_q)

    def build(self) -> nn.Module:
        return _Chain(self.child.build(), nn.Linear(WIDTH, WIDTH))


@dataclass(frozen=True)
class Activation(Unary):
    kind: str = "relu"

    def exponent(self, input_q: float = 1.0) -> float:
        return 0.0 if ACTIVATIONS[self.kind][1] else self.child.exponent(input_q)

    def tight(self) -> bool:
        return ACTIVATIONS[self.kind][2] and self.child.tight()

    def build(self) -> nn.Module:
        return _Chain(self.child.build(), _Function(ACTIVATIONS[self.kind][0]))


@dataclass(frozen=True)
class Normalization(Unary):
    kind: str = "layer_norm"

    def exponent(self, input_q: float = 1.0) -> float:
        return 0.0

    def build(self) -> nn.Module:
        norm = {"layer_norm": lambda: nn.LayerNorm(WIDTH), "rms_norm": lambda: nn.RMSNorm(WIDTH), "l2": lambda: _L2()}[self.kind]()
        return _Chain(self.child.build(), norm)


@dataclass(frozen=True)
class Softmax(Unary):
    def exponent(self, input_q: float = 1.0) -> float:
        return 0.0

    def build(self) -> nn.Module:
        return _Chain(self.child.build(), nn.Softmax(dim=-1))


@dataclass(frozen=True)
class Power(Unary):
    p: int = 2

    def exponent(self, input_q: float = 1.0) -> float:
        return self.p * self.child.exponent(input_q)

    def build(self) -> nn.Module:
        return _Chain(self.child.build(), _Power(self.p))


@dataclass(frozen=True)
class Binary(Expr):
    left: Expr
    right: Expr

    def peak(self, input_q: float = 1.0) -> float:
        return max(self.exponent(input_q), self.left.peak(input_q), self.right.peak(input_q))


@dataclass(frozen=True)
class Sum(Binary):
    def exponent(self, input_q: float = 1.0) -> float:
        return max(self.left.exponent(input_q), self.right.exponent(input_q))

    def tight(self) -> bool:
        """The dominant term must be tight (both, when they tie)."""
        left, right = self.left.exponent(), self.right.exponent()
        return (left < right or self.left.tight()) and (right < left or self.right.tight())

    def build(self) -> nn.Module:
        return _Sum(self.left.build(), self.right.build())


@dataclass(frozen=True)
class Product(Binary):
    def exponent(self, input_q: float = 1.0) -> float:
        return self.left.exponent(input_q) + self.right.exponent(input_q)

    def tight(self) -> bool:
        return self.left.tight() and self.right.tight()

    def build(self) -> nn.Module:
        return _Product(self.left.build(), self.right.build())


@dataclass(frozen=True)
class NestedResidual(Binary):
    """``h + right(h)`` with ``h = left(x)``: the right tree reads h, not x."""

    def exponent(self, input_q: float = 1.0) -> float:
        inner = self.left.exponent(input_q)
        return max(inner, self.right.exponent(inner))

    def tight(self) -> bool:
        return self.left.tight() and self.right.tight()

    def peak(self, input_q: float = 1.0) -> float:
        return max(self.exponent(input_q), self.left.peak(input_q), self.right.peak(self.left.exponent(input_q)))

    def build(self) -> nn.Module:
        return _NestedResidual(self.left.build(), self.right.build())


class _Chain(nn.Module):
    def __init__(self, inner: nn.Module, outer: nn.Module) -> None:
        super().__init__()
        self.inner, self.outer = inner, outer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(self.inner(x))


class _Function(nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class _L2(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)


class _Power(nn.Module):
    def __init__(self, p: int) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x**self.p


class _Sum(nn.Module):
    def __init__(self, left: nn.Module, right: nn.Module) -> None:
        super().__init__()
        self.left, self.right = left, right

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.right(x)


class _Product(_Sum):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left(x) * self.right(x)


class _NestedResidual(_Sum):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.left(x)
        return h + self.right(h)


class ResidualArchitecture(nn.Module):
    """``x + v(x)`` with v built from an :class:`Expr`."""

    def __init__(self, velocity: Expr) -> None:
        super().__init__()
        self.expression = velocity
        self.velocity = velocity.build()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.velocity(x)


def build(velocity: Expr, seed: int) -> tuple[ResidualArchitecture, tuple[torch.Tensor]]:
    """The model (generic random weights from ``seed``) and one example input."""
    torch.manual_seed(seed)
    return ResidualArchitecture(velocity), (torch.randn(SHAPE),)


def expressions(max_leaves: int = 6):
    """A hypothesis strategy of velocity trees whose exponents stay <= MAX_EXPONENT."""
    from hypothesis import strategies as st

    def extend(children):
        return st.one_of(
            st.builds(Affine, children),
            st.builds(Activation, children, st.sampled_from(sorted(ACTIVATIONS))),
            st.builds(Normalization, children, st.sampled_from(NORMS)),
            st.builds(Softmax, children),
            st.builds(Power, children, st.sampled_from(POWERS)),
            st.builds(Sum, children, children),
            st.builds(Product, children, children),
            st.builds(NestedResidual, children, children),
        )

    return st.recursive(st.just(Input()), extend, max_leaves=max_leaves).filter(lambda e: e.peak() <= MAX_EXPONENT)


def architectures(max_leaves: int = 6):
    """(velocity tree, weight seed) pairs."""
    from hypothesis import strategies as st

    return st.tuples(expressions(max_leaves), st.integers(0, 2**31 - 1))
