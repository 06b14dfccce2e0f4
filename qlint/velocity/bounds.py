"""The paper's stability bounds from per-block constants (source 000).

One block with ``||v(x)|| <= c||x||^q + b`` allows ``||X_{k+1}|| <= r + dt(c r^q + b)``
for ``r = ||X_k||``. For exponents in {0, 1} that recursion is affine and its product
over a stack is the mixed-stack forward bound (eq. 38; Theorem 5 for one exponent).
For q > 1 no depth-uniform bound exists (Theorem 5 needs q <= 1) but the recursion
still bounds a given depth, and says how fast the bound leaves a number format.
The backward bound is eq. 39: ``||J|| <= prod(1 + L_k dt) <= exp(sum L_k dt)``.

Overflow depths extend the stack by repeating its blocks and return the first depth
at which the bound exceeds a format's largest finite value (Remark 6: c = 1, q = 1
gives 2^D, past the float16 maximum 65504 at D = 16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence

import torch

FLOAT_FORMATS = ("float16", "bfloat16", "float32")  # the dtypes whose overflow depth is reported
MAX_STEPS = 1_000_000  # the q > 1 recursion is followed block by block up to this depth


def largest_finite(format_name: str) -> float:
    """The largest finite value of a torch floating dtype, e.g. 65504 for float16."""
    return float(torch.finfo(getattr(torch, format_name)).max)


@dataclass(frozen=True)
class BlockConstants:
    """``||v(x)|| <= c ||x||^q + b`` for one block."""

    q: float
    c: float
    b: float

    def folded(self) -> "BlockConstants":
        """q in (0, 1) as q = 1: r^q <= 1 + r, so ``c r^q + b <= c r + (b + c)``.

        Eq. 38 takes q_k in {0, 1}; folding keeps it an upper bound.
        """
        if 0.0 < self.q < 1.0:
            return BlockConstants(1.0, self.c, self.b + self.c)
        return self


def _power(r: float, q: float) -> float:
    try:
        return r**q
    except OverflowError:
        return math.inf


def step(r: float, block: BlockConstants, dt: float = 1.0) -> float:
    """The bound on ||X_{k+1}|| that one block allows when ||X_k|| <= r."""
    growth = block.c * _power(r, block.q) if block.c else 0.0
    return r + dt * (growth + block.b)


def is_mixed_stack(blocks: Sequence[BlockConstants]) -> bool:
    """Every exponent in {0, 1} (after folding): eq. 38 applies."""
    return all(block.q in (0.0, 1.0) for block in blocks)


def mixed_stack_map(blocks: Sequence[BlockConstants], dt: float = 1.0) -> tuple[float, float]:
    """Eq. 38 as the map ``||X_0|| -> A ||X_0|| + B`` (A = prod over S_1 of (1 + c_k dt))."""
    factor_product, offset = 1.0, 0.0
    for block in blocks:
        factor = 1.0 + block.c * dt if block.q == 1.0 else 1.0
        factor_product, offset = factor_product * factor, offset * factor + block.b * dt
    return factor_product, offset


def forward_bound(x0: float, blocks: Sequence[BlockConstants], dt: float = 1.0) -> tuple[float, str]:
    """The bound on ||X_D|| after the stack, and which rule gave it."""
    blocks = [block.folded() for block in blocks]
    if is_mixed_stack(blocks):
        factor, offset = mixed_stack_map(blocks, dt)
        return factor * x0 + offset, "eq. 38"
    r = x0
    for block in blocks:
        r = step(r, block, dt)
    return r, "layerwise recursion (q > 1: Theorem 5 does not apply)"


def backward_bound(lipschitz: Sequence[float], dt: float = 1.0) -> tuple[float, float]:
    """Eq. 39: (prod of (1 + L_k dt), exp(sum of L_k dt)) bounding ||J_{0:D}||_2."""
    product = math.prod(1.0 + value * dt for value in lipschitz)
    total = sum(lipschitz) * dt
    return product, math.exp(total) if total < 709.0 else math.inf


def overflow_depth(x0: float, blocks: Sequence[BlockConstants], limit: float, dt: float = 1.0) -> Optional[int]:
    """The first depth at which the bound on ||X_D|| exceeds ``limit``, the stack repeated.

    None when it never does (a bounded stack) or, for q > 1, not within MAX_STEPS.
    """
    blocks = [block.folded() for block in blocks]
    if x0 > limit:
        return 0
    if not blocks:
        return None
    if is_mixed_stack(blocks):
        return _mixed_overflow_depth(x0, blocks, limit, dt)
    r = x0
    for depth in range(1, MAX_STEPS + 1):
        r = step(r, blocks[(depth - 1) % len(blocks)], dt)
        if r > limit:
            return depth
    return None


def _mixed_overflow_depth(x0: float, blocks: list[BlockConstants], limit: float, dt: float) -> Optional[int]:
    """Whole periods in closed form, then block by block (exact rationals when A = 1)."""
    factor, offset = mixed_stack_map(blocks, dt)
    period = len(blocks)
    if factor == 1.0:
        if offset <= 0.0:
            return None
        # Linear growth can take ~1e37 blocks: exact arithmetic keeps the last steps visible.
        periods = math.floor((Fraction(limit) - Fraction(x0)) / Fraction(offset))
        r = Fraction(x0) + periods * Fraction(offset)
        for within, block in enumerate(blocks, 1):  # crosses within this period, by the floor above
            r += Fraction(block.b) * Fraction(dt)
            if r > limit:
                break
        return periods * period + within
    if x0 + offset == 0.0:
        return None  # zero state and no offset: the bound stays 0
    shift = offset / (factor - 1.0)  # r_n + shift = factor**n (x0 + shift)
    periods = max(0, math.floor(math.log((limit + shift) / (x0 + shift)) / math.log(factor)) - 1)
    r = math.exp(periods * math.log(factor) + math.log(x0 + shift)) - shift
    depth = periods * period
    while r <= limit:
        r = step(r, blocks[depth % period], dt)
        depth += 1
    return depth


@dataclass
class StackBounds:
    """The model-level numbers: forward and backward bounds and overflow depths."""

    x0_norm: float
    depth: int
    dt: float
    forward: Optional[float]
    forward_rule: str
    backward: Optional[float]
    backward_exp: Optional[float]
    overflow_depths: dict[str, Optional[int]]
    note: str = ""

    def to_dict(self) -> dict:
        return {
            "x0_norm": _finite(self.x0_norm),
            "depth": self.depth,
            "dt": self.dt,
            "constants": "estimated from the sampled directions (not certified)",
            "forward": _finite(self.forward),
            "forward_rule": self.forward_rule,
            "backward": _finite(self.backward),
            "backward_exp": _finite(self.backward_exp),
            "note": self.note,
        }


def _finite(value: Optional[float]) -> Optional[float]:
    """JSON has no infinity: a bound past float64 is null (the note says why)."""
    return value if value is not None and math.isfinite(value) else None


def stack_bounds(
    x0_norm: float,
    constants: Sequence[Optional[BlockConstants]],
    lipschitz: Sequence[Optional[float]],
    names: Sequence[str],
    dt: float = 1.0,
) -> StackBounds:
    """Everything :class:`StackBounds` holds; a block without constants voids the forward bound."""
    missing = [name for name, block in zip(names, constants) if block is None]
    known = [block for block in constants if block is not None]
    if missing:
        forward, rule, depths = None, "", {name: None for name in FLOAT_FORMATS}
        note = f"no forward bound: {', '.join(missing)} has no finite exponent"
    else:
        forward, rule = forward_bound(x0_norm, known, dt)
        depths = {name: overflow_depth(x0_norm, known, largest_finite(name), dt) for name in FLOAT_FORMATS}
        note = "" if math.isfinite(forward) else "the forward bound exceeds float64"
    if any(value is None for value in lipschitz):
        backward = backward_exp = None
    else:
        backward, backward_exp = backward_bound([value for value in lipschitz if value is not None], dt)
    return StackBounds(x0_norm, len(constants), dt, forward, rule, backward, backward_exp, depths, note)
