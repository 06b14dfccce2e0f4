"""Transfers of the entries in ``rules/primitives/activations.toml``: the activations whose
parameters or bounds the default transfer (``q * q_input``) cannot state.
"""

from __future__ import annotations

import math
from typing import Any

from qlint.core import algebra, domain
from qlint.core.domain import ANY, CONSTANT, Growth, Range, unknown
from qlint.core.ops import Call
from qlint.registry.transfers.base import default, transfer
from qlint.registry.transfers.combinators import (
    clamp_bound, combine_max, combine_product, eps_positive, is_number, plain_number, range_of,
)


FIXED_CLAMPS = {"relu6": (0.0, 6.0), "relu": (0.0, math.inf)}  # the activations that are clamps to fixed bounds


@transfer("hardtanh")
def hardtanh(call: Call, entry: Any) -> Any:
    """hardtanh(x, lo, hi) is a clamp to [lo, hi], relu6 and relu clamps to [0, 6] and [0, inf): the input's
    range clamped, exactly (relu of a value in [-1, 0] is 0, not merely non-negative)."""
    x = call.growth("input")
    low, high = FIXED_CLAMPS.get(entry.id, (call.param("min_val", -1.0), call.param("max_val", 1.0)))
    if x is None:
        return CONSTANT
    if x.real is False:
        return unknown(f"{entry.name} of a complex value")
    if not (is_number(low) and is_number(high)):
        return unknown(f"{entry.name} with bounds qlint cannot read")
    lo_g, hi_g = clamp_bound(low, -math.inf), clamp_bound(high, math.inf)
    r = range_of(x)
    if lo_g is not None:
        r = domain.maximum(r, lo_g.range)
    if hi_g is not None:
        r = domain.minimum(r, hi_g.range)
    if lo_g is not None and hi_g is not None:
        return Growth(0.0, depends=x.depends, range=r)
    return Growth(x.q if x.depends else 0.0, depends=x.depends, range=r, culprit=x.culprit)


@transfer("bounded")
def bounded(call: Call, entry: Any) -> Any:
    """A map whose output is bounded whatever all of its inputs are (atan2, cosine similarity
    with eps > 0, one_hot, angle). Named from three files alike: ``activations.toml`` (Gumbel-softmax),
    ``arithmetic.toml`` (atan2) and ``layers.toml`` (cosine similarity)."""
    if call.has("eps") and not eps_positive(call, "eps", 1e-8):
        call.every()
        return unknown(f"{entry.name} with eps <= 0")
    tau = plain_number(call, "tau", 1.0)
    if call.has("tau") and not (is_number(tau) and tau > 0 and math.isfinite(tau)):
        call.every()
        return unknown(f"{entry.name} with tau = {tau} (softmax(logits / tau) is NaN at tau = 0)")
    depends = any(g.depends for g in call.every())
    complex_input = any(g.real is False and g.depends for g in call.every())
    if complex_input and "complex" not in entry.family:
        return unknown(f"{entry.name} of a complex value")
    return Growth(0.0, depends=depends, range=entry.declared_range(ANY))


@transfer("softplus")
def softplus(call: Call, entry: Any) -> Any:
    """softplus(x) = log(1 + e^(beta x)) / beta: |.| <= |x| + log(2)/|beta| (q = 1) for beta != 0;
    positive only for beta > 0 with a threshold >= 0 (above the threshold it returns x)."""
    x = call.growth("input")
    beta, threshold = plain_number(call, "beta", 1), plain_number(call, "threshold", 20)
    if x is None:
        return CONSTANT
    if not is_number(beta) or beta == 0:
        return unknown("softplus with beta = 0 or a beta qlint cannot read")
    if x.real is False:
        return unknown("softplus of a complex value")
    r = Range(lo=0.0, pos=True) if beta > 0 and is_number(threshold) and threshold >= 0 else (
        Range(hi=0.0, neg=True) if beta < 0 and is_number(threshold) and threshold >= 0 else ANY)
    if not x.depends:
        return Growth(0.0, depends=False, range=r)
    return Growth(algebra.compose(1.0, x.q), range=r, culprit=x.culprit)


@transfer("activation")
def activation(call: Call, entry: Any) -> Any:
    """Lipschitz activations with a parameter (ELU/CELU alpha, LeakyReLU slope, RReLU bounds,
    shrinkage lambda, threshold value): |sigma(x)| <= L|x| + b for every parameter value, so
    q = 1; the declared lower bound holds only at the default parameters.

    Every such parameter must be finite. Except CELU with alpha <= 0 (and ATen's ELU with
    input_scale <= 0, the same exponential on -x): celu(x) = max(0, x) + min(0, alpha (exp(x/alpha) - 1)), and
    for alpha < 0 the exponential runs on -x/|alpha|, unbounded as x -> -inf (alpha = 0 divides
    by 0). ELU's alpha (exp(x) - 1) for x < 0 is bounded by |alpha| whatever its sign."""
    for name in ("alpha", "scale", "input_scale", "negative_slope", "lower", "upper", "lambd", "value"):
        number = plain_number(call, name, 0.0)
        if is_number(number) and not math.isfinite(number):
            call.every()
            return unknown(f"{call.op} with {name} = {number}")
    if call.op == "celu":
        alpha = plain_number(call, "alpha", 1.0)
        if not (is_number(alpha) and alpha > 0):
            call.every()
            return unknown(f"celu with alpha = {alpha} (not > 0): it grows like exp(|x|/|alpha|)")
    # aten.elu(x, alpha, scale, input_scale): alpha (exp(input_scale x) - 1)
    if call.op == "elu" and call.has("input_scale"):
        input_scale = plain_number(call, "input_scale", 1.0)
        if not (is_number(input_scale) and input_scale > 0):
            call.every()
            return unknown(f"elu with input_scale = {input_scale} (not > 0): its negative branch grows like exp(|x|)")
    return default(call, entry)


@transfer("prelu")
def prelu(call: Call, entry: Any) -> Any:
    """prelu(x, w) = max(0, x) + w min(0, x): with a weight computed from the input the exponents
    add (Theorem 9(iii))."""
    x, weight = call.growth("input"), call.growth("weight")
    if x is None:
        return CONSTANT
    if x.real is False:
        return unknown("prelu of a complex value")
    return combine_product(x, weight)


@transfer("glu")
def glu(call: Call, entry: Any) -> Any:
    """glu(x) = a * sigmoid(b) for the two halves of x: q_a + 0 (Theorem 9(iii))."""
    x = call.growth("input")
    call.value("dim")
    if x is None:
        return CONSTANT
    if x.real is False:
        return unknown("glu of a complex value")
    return Growth(x.q if x.depends else 0.0, depends=x.depends, culprit=x.culprit)


@transfer("threshold")
def threshold(call: Call, entry: Any) -> Any:
    """threshold(x, t, v) is x where x > t and the constant v elsewhere: |out| <= |x| + |v|."""
    x = call.growth("input")
    call.param("threshold")
    value = call.growth("value")
    if x is None:
        return CONSTANT
    return combine_max(x, value)


@transfer("erfcx")
def erfcx(call: Call, entry: Any) -> Any:
    """erfcx(x) in (0, 1] for x >= 0; bounded for a bounded argument; else e^(x^2) growth."""
    x = call.growth("input")
    if x is None or not x.depends:
        return Growth(0.0, depends=False) if x is not None else CONSTANT
    if x.real is not True:
        return unknown("erfcx of a complex (or unknown-dtype) value")
    if x.range.nonneg:
        return Growth(0.0, range=domain.interval(0.0, 1.0))
    if x.q == 0:
        return Growth(0.0, range=Range(lo=0.0))
    return Growth(algebra.SUPERPOLYNOMIAL if x.known else None,
                  culprit="erfcx of an argument that may be negative (grows like e^(x^2))")
